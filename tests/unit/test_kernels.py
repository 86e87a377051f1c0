"""Transform kernels on the CPU: every op's edge cases, policies, dtypes, hashing, and the
generated CUDA translation unit compiled by g++ against the NumPy program, bit for bit
(``tests/kernel_emulation.py``), and the CuPy backend's wiring with a g++-built stand-in."""

from __future__ import annotations

import ctypes
import datetime as dt
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest

from features.errors import CompileError, DeviceUnavailable, SourceError
from features.kernels import REJECT_SCHEMA, TransformResult, compile_transforms
from features.kernels.columns import decimal_to_float64, prepare_slots
from features.kernels.cupy_backend import generate_source
from features.kernels.device import find_gpu, resolve_device
from features.kernels.hashing import fnv1a64, fnv1a64_reference, hash_buckets
from features.kernels.numpy_backend import NumpyBackend, log1p
from features.kernels.ops import plan_program
from features.schema.model import (
    Constraints,
    Feature,
    Field,
    FieldType,
    ScalarValue,
    Schema,
    Step,
    TypeKind,
)

ROOT = Path(__file__).resolve().parents[2]
UTC = dt.UTC

# --- building schemas and batches in Python ------------------------------------------------


def ft(kind: str, **kw: Any) -> FieldType:
    return FieldType(TypeKind(kind), **kw)


def step(op: str, **args: ScalarValue | tuple[ScalarValue, ...]) -> Step:
    return Step(op, tuple(args.items()))  # type: ignore[arg-type]


def feature(
    name: str, source: str, steps: list[Step], dtype: str = "float64", on_invalid: str = "null",
) -> Feature:
    return Feature(name, source, tuple(steps), ft(dtype), frozenset({"hot"}), on_invalid)  # type: ignore[arg-type]


def schema(fields: list[Field], features: list[Feature], event_time: str | None = None) -> Schema:
    entity = fields[0].name if event_time else None
    return Schema("t", (1, 0, 0), tuple(fields), entity=entity, event_time=event_time,
                  features=tuple(features))


def fld(name: str, kind: str, values: tuple[str, ...] = (), **kw: Any) -> Field:
    return Field(name, ft(kind, **kw), Constraints(), values=values)


def run(
    feats: list[Feature], fields: list[Field], columns: dict[str, pa.Array], **kw: Any,
) -> TransformResult:
    program = compile_transforms(schema(fields, feats, kw.pop("event_time", None)), device="cpu",
                                 chunk_rows=kw.pop("chunk_rows", 16_384))
    return program.run(pa.RecordBatch.from_pydict(columns), **kw)


def one(steps: list[Step], values: list[Any], *, dtype: str = "float64", kind: str = "float64",
        on_invalid: str = "null", arrow: pa.DataType | None = None) -> TransformResult:
    """One feature ``f`` from one field ``x``."""
    arrow = arrow or {"float64": pa.float64(), "int64": pa.int64(), "int32": pa.int32(),
                      "bool": pa.bool_(), "string": pa.string()}[kind]
    return run([feature("f", "x", steps, dtype, on_invalid)], [fld("x", kind)],
               {"x": pa.array(values, arrow)})


def col(result: TransformResult, name: str = "f") -> list[Any]:
    values: list[Any] = result.features.column(name).to_pylist()
    return values


# --- hashing ---------------------------------------------------------------------------------


def test_fnv1a64_matches_the_published_test_vectors() -> None:
    # FNV-1a 64 test vectors (Fowler/Noll/Vo reference suite), not computed by our code.
    got = fnv1a64(pa.array(["", "a", "foobar"]))
    assert [int(h) for h in got] == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0x85944171F73967E8]


def test_fnv1a64_equals_the_plain_loop_on_unicode_slices_and_large_strings() -> None:
    texts = ["", "é", "日本語", "a" * 300, "employed", "self_employed", "x\x00y", "😀 emoji"]
    expected = [fnv1a64_reference(t) for t in texts]
    assert [int(h) for h in fnv1a64(pa.array(texts))] == expected
    assert [int(h) for h in fnv1a64(pa.array(texts, pa.large_string()))] == expected
    sliced = pa.array(["zz", *texts]).slice(1)
    assert [int(h) for h in fnv1a64(sliced)] == expected
    assert [int(h) for h in fnv1a64(pa.array(texts).dictionary_encode())] == expected


def test_fnv1a64_nulls_hash_as_empty_string_and_buckets_are_stable() -> None:
    assert [int(h) for h in fnv1a64(pa.array([None, "a", None], pa.string()))] == [
        0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0xCBF29CE484222325]
    # Pinned buckets: a change here breaks every stored hash feature.
    buckets = hash_buckets(pa.array(["employed", "student", "retired", "a"]), 64)
    assert buckets.tolist() == [fnv1a64_reference(s) % 64 for s in ["employed", "student", "retired", "a"]]
    assert buckets.tolist()[3] == 0xAF63DC4C8601EC8C % 64 == 12
    with pytest.raises(ValueError, match="n must be in"):
        hash_buckets(pa.array(["a"]), 0)


def test_hash_bucket_feature_with_fill_null_and_enum() -> None:
    fields = [fld("s", "string"), fld("e", "enum", values=("a", "b"))]
    feats = [
        feature("hs", "s", [step("hash_bucket", n=1000)], "int32"),
        feature("hf", "s", [step("fill_null", value="a"), step("hash_bucket", n=1000)], "int64"),
        feature("he", "e", [step("hash_bucket", n=7)], "int16"),
    ]
    r = run(feats, fields, {"s": pa.array(["foobar", None, "a"]), "e": pa.array(["b", "a", None])})
    assert col(r, "hs") == [0x85944171F73967E8 % 1000, None, 0xAF63DC4C8601EC8C % 1000]
    assert col(r, "hf") == [0x85944171F73967E8 % 1000, 0xAF63DC4C8601EC8C % 1000, 0xAF63DC4C8601EC8C % 1000]
    assert col(r, "he") == [fnv1a64_reference("b") % 7, fnv1a64_reference("a") % 7, None]
    assert r.features.schema.field("hs").type == pa.int32()
    assert r.features.schema.field("he").type == pa.int16()


# --- numeric ops -----------------------------------------------------------------------------


def test_fill_null_fills_only_nulls_and_nulls_otherwise_stay_null() -> None:
    r = one([step("fill_null", value=-3)], [1.5, None, 0.0])
    assert col(r) == [1.5, -3.0, 0.0]
    r = one([step("clip", lo=0)], [None, -1.0])
    assert col(r) == [None, 0.0]


def test_fill_null_on_bool_then_cast() -> None:
    r = one([step("fill_null", value=True), step("cast", dtype="int8")], [False, None, True],
            kind="bool", dtype="int8")
    assert col(r) == [0, 1, 1]
    assert r.features.schema.field("f").type == pa.int8()


def test_clip_bounds_one_or_both_and_negative_zero() -> None:
    assert col(one([step("clip", lo=0, hi=10)], [-5.0, 0.0, 5.5, 10.0, 1e308, -1e308])) == [
        0.0, 0.0, 5.5, 10.0, 10.0, 0.0]
    assert col(one([step("clip", hi=1)], [-1e308, 2.0])) == [-1e308, 1.0]
    assert col(one([step("clip", lo=-1)], [-2.0, 5e-324])) == [-1.0, 5e-324]
    out = col(one([step("clip", lo=0.0)], [-0.0]))[0]
    assert out == 0.0 and math.copysign(1.0, out) == -1.0  # -0.0 is not < 0.0: kept as is


def test_log1p_values_and_invalid_inputs_become_null() -> None:
    r = one([step("log1p")], [0.0, 1.0, -0.5, 5e-324, 1.7976931348623157e308, -1.0, -2.0, None])
    got = col(r)
    assert got[:5] == [0.0, math.log1p(1.0), math.log1p(-0.5), 5e-324, math.log1p(1.7976931348623157e308)]
    assert got[5:] == [None, None, None]
    assert r.rejects.num_rows == 0


def test_log1p_reject_policy_message_and_kept_rows() -> None:
    r = one([step("log1p")], [3.0, -2.0, -1.0, None], on_invalid="reject")
    assert col(r) == [math.log1p(3.0), None]
    assert r.kept_row_index.to_pylist() == [0, 3]
    assert r.rejects.schema == REJECT_SCHEMA
    assert r.rejects.to_pylist() == [
        {"row": 1, "field": "f", "rule": "f.transform", "reason": "transform",
         "message": "feature f violates transform log1p: got -2.0, expected a value > -1", "value": "-2.0"},
        {"row": 2, "field": "f", "rule": "f.transform", "reason": "transform",
         "message": "feature f violates transform log1p: got -1.0, expected a value > -1", "value": "-1.0"},
    ]
    assert r.features.num_rows + r.rejected_rows == r.input_rows == 4


def test_portable_log1p_is_within_one_ulp_of_libm() -> None:
    rng = np.random.default_rng(7)
    xs = np.concatenate([
        rng.uniform(-0.999, 1, 200_000), np.exp(rng.uniform(-740, 709, 200_000)),
        -np.exp(rng.uniform(-740, -1e-9, 200_000)), [0.0, 5e-324, 2.0**53, 2.0**53 + 2, 1e16],
    ])
    ours, libm = log1p(xs).view(np.int64), np.log1p(xs).view(np.int64)
    assert np.abs(ours - libm).max() <= 1


def test_zscore_and_minmax_overflow_and_zero_std_are_invalid() -> None:
    r = one([step("zscore", mean=2.0, std=4.0)], [10.0, 1e308, -1e308], on_invalid="reject")
    assert col(r) == [2.0, (1e308 - 2.0) / 4.0, (-1e308 - 2.0) / 4.0]
    r = one([step("zscore", mean=-1e308, std=0.5)], [1e308, -1e308, None])
    assert col(r) == [None, 0.0, None]  # (1e308 + 1e308) / 0.5 overflows: null under on_invalid null
    r = one([step("zscore", mean=0.0, std=0.0)], [1.0, 0.0], on_invalid="reject")  # parse forbids std 0
    assert r.rejects.column("message").to_pylist() == [
        "feature f violates transform zscore: got 1.0, expected a finite result",
        "feature f violates transform zscore: got 0.0, expected a finite result",
    ]
    assert col(one([step("minmax", lo=10, hi=20)], [10.0, 15.0, 30.0, 0.0])) == [0.0, 0.5, 2.0, -1.0]
    assert col(one([step("minmax", lo=0, hi=1e-300)], [1e300])) == [None]


def test_bucketize_counts_boundaries_at_or_below_the_value() -> None:
    values = [0.5, 1.0, 2.5, 3.0, 1e308, -1e308, None]
    r = one([step("bucketize", boundaries=(1, 2, 3))], values, dtype="int32")
    assert col(r) == [0, 1, 2, 3, 3, 0, None]
    assert r.features.schema.field("f").type == pa.int32()


def test_bucketize_many_boundaries_uses_search_with_the_same_result() -> None:
    bounds = tuple(float(b) for b in range(-50, 50, 2))  # 50 boundaries: binary search path
    values = [*np.linspace(-60, 60, 1001).tolist(), -50.0, 48.0, 49.0]
    r = one([step("bucketize", boundaries=bounds)], values, dtype="int64")
    assert col(r) == np.searchsorted(np.array(bounds), np.array(values), side="right").tolist()


def test_ratio_zero_null_and_overflow() -> None:
    fields = [fld("a", "float64"), fld("b", "float64")]
    feats = [
        feature("r0", "a", [step("ratio", denominator="b", on_zero=-1)], on_invalid="reject"),
        feature("rn", "a", [step("ratio", denominator="b", on_zero=None)]),
    ]
    a = pa.array([6.0, 1.0, 1.0, 1.0, None, 1e308])
    b = pa.array([3.0, 0.0, -0.0, None, 2.0, 1e-308])
    r = run(feats, fields, {"a": a, "b": b})
    assert col(r, "r0") == [2.0, -1.0, -1.0, None, None]
    assert col(r, "rn") == [2.0, None, None, None, None]
    assert r.rejects.to_pylist() == [{
        "row": 5, "field": "r0", "rule": "r0.transform", "reason": "transform",
        "message": "feature r0 violates transform ratio: got 1e+308 / 1e-308, expected a finite ratio",
        "value": "1e+308"}]


def test_time_since_is_relative_to_the_event_time_of_each_row() -> None:
    fields = [fld("id", "string"), fld("ts", "timestamp", unit="us", tz="UTC"), fld("d", "date"),
              fld("t2", "timestamp", unit="s")]
    feats = [feature("days", "d", [step("time_since", unit="days")]),
             feature("hours", "t2", [step("time_since", unit="hours")]),
             feature("secs", "t2", [step("time_since", unit="s")], "int64")]
    ts = pa.array([dt.datetime(2024, 1, 2, 12, tzinfo=UTC), dt.datetime(2024, 1, 1, tzinfo=UTC), None],
                  pa.timestamp("us", "UTC"))
    d = pa.array([dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2000, 1, 1)], pa.date32())
    t2 = pa.array([dt.datetime(2024, 1, 2, 11, 30), None, dt.datetime(2024, 1, 1)], pa.timestamp("s"))
    r = run(feats, fields, {"id": pa.array(["a", "b", "c"]), "ts": ts, "d": d, "t2": t2}, event_time="ts")
    assert col(r, "days") == [1.5, -1.0, None]
    assert col(r, "hours") == [0.5, None, None]
    assert col(r, "secs") == [1800, None, None]


def test_time_since_without_event_time_uses_reference_time() -> None:
    fields = [fld("d", "date")]
    feats = [feature("weeks", "d", [step("time_since", unit="weeks")])]
    cols = {"d": pa.array([dt.date(2024, 1, 1), None], pa.date32())}
    r = run(feats, fields, cols, reference_time=dt.datetime(2024, 1, 15))
    assert col(r, "weeks") == [2.0, None]
    plus_one = dt.timezone(dt.timedelta(hours=1))
    r = run(feats, fields, cols, reference_time=dt.datetime(2024, 1, 8, 1, tzinfo=plus_one))
    assert col(r, "weeks") == [1.0, None]
    with pytest.raises(ValueError, match="needs reference_time"):
        run(feats, fields, cols)


def test_one_hot_columns_dtypes_and_nulls() -> None:
    fields = [fld("e", "enum", values=("view", "click", "buy"))]
    feats = [feature("oh", "e", [step("one_hot")], "int8"),
             feature("ob", "e", [step("fill_null", value="buy"), step("one_hot")], "bool")]
    r = run(feats, fields, {"e": pa.array(["click", None, "view"])})
    assert r.features.schema.names == ["oh__view", "oh__click", "oh__buy", "ob__view", "ob__click", "ob__buy"]
    assert r.features.schema.field("oh__view").type == pa.int8()
    assert r.features.schema.field("ob__buy").type == pa.bool_()
    assert r.features.to_pydict() == {
        "oh__view": [0, None, 1], "oh__click": [1, None, 0], "oh__buy": [0, None, 0],
        "ob__view": [False, False, True], "ob__click": [True, False, False], "ob__buy": [False, True, False],
    }


def test_cast_rounds_half_to_even_and_range_checks() -> None:
    values = [0.5, 1.5, 2.5, -0.5, -1.5, 127.4, 127.5, -128.5, -128.6, 1e308]
    r = one([step("cast", dtype="int8")], values, dtype="int8", on_invalid="reject")
    assert col(r) == [0, 2, 2, 0, -2, 127, -128]
    assert r.kept_row_index.to_pylist() == [0, 1, 2, 3, 4, 5, 7]
    expected = "expected a value that rounds into int8 range [-128, 127]"
    assert r.rejects.column("message").to_pylist() == [
        f"feature f violates transform cast: got {v}, {expected}" for v in ("127.5", "-128.6", "1e+308")
    ]
    big = one([step("clip", lo=0)], [2.0**63, 2.0**63 - 1024, -(2.0**63)], dtype="int64")
    assert col(big) == [None, 2**63 - 1024, 0]


def test_casts_proven_exact_are_skipped_and_the_others_still_check() -> None:
    from features.kernels.ops import Cast

    fields = [fld("i8", "int8"), fld("i16", "int16"), fld("x", "float64"), fld("s", "string")]
    feats = [
        feature("widen", "i8", [step("cast", dtype="int16")], "int16"),
        feature("narrow", "i16", [step("cast", dtype="int8")], "int8"),
        feature("few", "x", [step("bucketize", boundaries=(1, 2))], "int8"),
        feature("many", "x", [step("bucketize", boundaries=tuple(range(200)))], "int8"),
        feature("hash", "s", [step("hash_bucket", n=300)], "int16"),
        feature("negzero", "x", [step("fill_null", value=-0.0), step("clip", lo=0, hi=0)], "int8"),
    ]
    plan = plan_program(schema(fields, feats))
    exact = {fp.name: [op.exact for op in fp.ops if isinstance(op, Cast)] for fp in plan.features}
    assert exact == {"widen": [True, True], "narrow": [False, True], "few": [True], "many": [False],
                     "hash": [True], "negzero": [False]}
    r = run(feats, fields, {"i8": pa.array([-128, None], pa.int8()), "i16": pa.array([300, -5], pa.int16()),
                            "x": pa.array([150.0, None]), "s": pa.array(["a", None])})
    assert r.features.to_pydict() == {"widen": [-128, None], "narrow": [None, -5], "few": [2, None],
                                      "many": [None, None], "hash": [0xAF63DC4C8601EC8C % 300, None],
                                      "negzero": [0, 0]}


def test_int64_input_beyond_2_53_rounds_to_float64() -> None:
    r = one([step("clip", lo=-(2.0**63))], [2**53 + 1, -(2**63), 2**63 - 1], kind="int64", dtype="int64")
    assert col(r) == [2**53, -(2**63), None]  # 2**63 - 1 rounds to 2**63: out of int64 range


def test_float32_output_is_rounded_once_from_float64_and_overflow_is_invalid() -> None:
    values = [0.1, 1 / 3, 3.4028235e38, 3.4028236e38, 1e-46, -1e39]  # 3rd: just below the tie to inf
    r = one([step("clip", lo=-1e300)], values, dtype="float32")
    got = r.features.column("f")
    assert got.type == pa.float32()
    assert got.to_pylist() == [float(np.float32(v)) for v in values[:3]] + [None, 0.0, None]
    assert got.to_pylist()[2] == float(np.finfo(np.float32).max)
    assert r.features.column("f").null_count == 2


def test_bool_dtype_output() -> None:
    r = one([step("clip", lo=-1, hi=1)], [0.0, -0.0, 0.25, -5.0, None], dtype="bool")
    assert col(r) == [False, False, True, True, None]
    assert r.features.schema.field("f").type == pa.bool_()


def test_steps_compose_in_declared_order() -> None:
    steps = [step("fill_null", value=0), step("clip", lo=0, hi=1e6), step("log1p"),
             step("zscore", mean=8.1, std=1.2), step("minmax", lo=-10, hi=10), step("cast", dtype="float32")]
    r = one(steps, [None, 5000.0, -3.0, 2e6], dtype="float64")
    expected = []
    for v in [0.0, 5000.0, 0.0, 1e6]:
        z = (float(log1p(np.array([v]))[0]) - 8.1) / 1.2
        expected.append(float(np.float32((z - -10.0) / 20.0)))
    assert col(r) == expected


def test_empty_and_one_row_batches() -> None:
    steps = [step("fill_null", value=1), step("log1p")]
    empty = one(steps, [])
    assert empty.features.num_rows == 0 and empty.rejects.num_rows == 0 and empty.input_rows == 0
    assert empty.features.schema.field("f").type == pa.float64()
    assert col(one(steps, [None])) == [math.log1p(1.0)]
    assert col(one(steps, [-7.0], on_invalid="reject")) == []


def test_results_do_not_depend_on_chunk_size() -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(0, 1e3, 5_000)
    values[::7] = -2.0
    fields = [fld("x", "float64")]
    feats = [feature("f", "x", [step("log1p"), step("bucketize", boundaries=(0, 1, 2, 5))], "int32"),
             feature("g", "x", [step("clip", lo=-1), step("log1p"), step("zscore", mean=1, std=3)],
                     "float32")]
    results = [run(feats, fields, {"x": pa.array(values)}, chunk_rows=c) for c in (1, 7, 4096, 16_384)]
    for other in results[1:]:
        assert other.features.equals(results[0].features)


def test_decimals_convert_to_the_nearest_float64() -> None:
    texts = ["2500.00", "5339084.85", "-0.01", "99999999999999999.99", "12345678901234567.89", "0.00"]
    arr = pa.array([Decimal(t) for t in texts] + [None], pa.decimal128(20, 2))
    got = decimal_to_float64(arr)
    assert got[:-1].tolist() == [float(Decimal(t)) for t in texts]
    wide = pa.array([Decimal("1.0000000000000000000000001")], pa.decimal128(30, 25))  # scale > 22
    assert decimal_to_float64(wide).tolist() == [float(Decimal("1.0000000000000000000000001"))]
    r = one([step("clip", lo=0)], [Decimal("5339084.85"), None], kind="float64", arrow=pa.decimal128(18, 2))
    assert col(r) == [5339084.85, None]


def test_reject_rows_are_sorted_by_row_then_feature_and_match_the_validator_columns() -> None:
    from features.validation import REJECT_SCHEMA as VALIDATOR_REJECTS

    assert REJECT_SCHEMA.equals(VALIDATOR_REJECTS)
    fields = [fld("x", "float64")]
    feats = [feature("a", "x", [step("log1p")], on_invalid="reject"),
             feature("b", "x", [step("cast", dtype="int8")], "int8", on_invalid="reject"),
             feature("c", "x", [step("log1p")], on_invalid="null")]
    r = run(feats, fields, {"x": pa.array([-300.0, 1.0, 300.0, -5.0])})
    assert [(d["row"], d["field"]) for d in r.rejects.to_pylist()] == [(0, "a"), (0, "b"), (2, "b"), (3, "a")]
    assert r.kept_row_index.to_pylist() == [1]
    assert r.features.to_pylist() == [{"a": math.log1p(1.0), "b": 1, "c": math.log1p(1.0)}]


def test_missing_input_column_is_a_source_error() -> None:
    sch = schema([fld("x", "float64")], [feature("f", "x", [step("log1p")])])
    program = compile_transforms(sch, device="cpu")
    with pytest.raises(SourceError, match="no column 'x'"):
        program.run(pa.RecordBatch.from_pydict({"y": pa.array([1.0])}))


@pytest.mark.parametrize(
    ("feat", "match"),
    [
        (feature("f", "nope", [step("log1p")]), "source field 'nope'"),
        (feature("f", "s", [step("log1p")]), "log1p needs numeric input"),
        (feature("f", "e", [step("one_hot"), step("cast", dtype="int8")], "int8"), "one_hot must be"),
        (feature("f", "s", [step("hash_bucket", n=2**60)], "int64"), "hash_bucket n"),
        (feature("f", "x", [step("clip", lo=float("inf"))]), "finite"),
        (feature("f", "x", [step("bucketize", boundaries=(2, 1))]), "strictly increasing"),
        (feature("f", "x", [step("ratio", denominator="s", on_zero=0)]), "numeric field"),
        (feature("f", "x", [step("log1p")], "string"), "dtype must be"),
        (feature("f", "s", [step("fill_null", value="a")]), "end with a string"),
    ],
)
def test_plans_no_backend_can_run_are_compile_errors(feat: Feature, match: str) -> None:
    fields = [fld("x", "float64"), fld("s", "string"), fld("e", "enum", values=("a",))]
    with pytest.raises(CompileError, match=match) as info:
        plan_program(schema(fields, [feat]))
    assert info.value.field == "f" and info.value.schema_name == "t"


def test_duplicate_output_columns_are_a_compile_error() -> None:
    fields = [fld("e", "enum", values=("a",)), fld("x", "float64")]
    feats = [feature("f", "e", [step("one_hot")], "int8"), feature("f__a", "x", [step("log1p")])]
    with pytest.raises(CompileError, match="also produced by feature f"):
        plan_program(schema(fields, feats))


# --- devices -----------------------------------------------------------------------------------


def test_device_cpu_and_auto_without_gpu() -> None:
    assert resolve_device("cpu") == ("cpu", None)
    cupy, why = find_gpu()
    if cupy is not None:
        pytest.skip("a GPU is present: the no-GPU behaviour cannot be observed here")
    assert why
    assert resolve_device("auto") == ("cpu", None)
    with pytest.raises(DeviceUnavailable, match="device gpu was requested") as info:
        compile_transforms(schema([fld("x", "float64")], [feature("f", "x", [step("log1p")])]), device="gpu")
    assert "cupy" in str(info.value)
    with pytest.raises(ValueError, match="auto, cpu or gpu"):
        resolve_device("tpu")  # type: ignore[arg-type]


# --- the generated kernel source, compiled by g++ (tests/kernel_emulation.py) ---------------


ALL_OPS_FIELDS = [fld("id", "string"), fld("ts", "timestamp", unit="us", tz="UTC"), fld("x", "float64"),
                  fld("y", "int64"), fld("s", "string"), fld("d", "date")]
ALL_OPS_FEATURES = [
    feature("a", "x", [step("fill_null", value=0.5), step("clip", lo=-0.999, hi=1e6), step("log1p")]),
    feature("b", "x", [step("log1p"), step("zscore", mean=3.0, std=2.5), step("bucketize",
                                                                              boundaries=(-1, 0, 0.5, 1))],
            "int16"),
    feature("c", "x", [step("ratio", denominator="y", on_zero=None), step("minmax", lo=-5, hi=5)], "float32",
            on_invalid="reject"),
    feature("d", "y", [step("cast", dtype="float32"), step("cast", dtype="int32")], "int64"),
    feature("e", "s", [step("fill_null", value="zz"), step("hash_bucket", n=97), step("cast", dtype="bool")],
            "bool"),
    feature("f", "d", [step("time_since", unit="hours"),
                       step("bucketize", boundaries=tuple(range(0, 2000, 40)))], "int32"),
    feature("g", "x", [step("zscore", mean=0, std=1e-300), step("ratio", denominator="x", on_zero=7)]),
]


def _all_ops_batch(n: int, seed: int) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 5, n) * np.exp(rng.uniform(-3, 3, n))
    x[rng.random(n) < 0.05] = rng.choice([0.0, -0.0, -1.0, -2.0, 1e308, -1e308, 5e-324, 0.5, 1.5, -0.999], 1)
    y = rng.integers(-(2**40), 2**40, n)
    y[rng.random(n) < 0.1] = 0
    y[rng.random(n) < 0.01] = 2**62 + 1
    ts = np.datetime64("2024-01-01") + rng.integers(0, 10**6, n).astype("timedelta64[m]")
    days = rng.integers(18_000, 20_000, n).astype(np.int32)

    def null(p: float) -> npt.NDArray[np.bool_]:
        return rng.random(n) < p

    return pa.RecordBatch.from_pydict({
        "id": pa.array([f"id{i}" for i in range(n)]),
        "ts": pa.array(ts.astype("datetime64[us]"), pa.timestamp("us", "UTC"), mask=null(0.02)),
        "x": pa.array(x, mask=null(0.1)),
        "y": pa.array(y, mask=null(0.1)),
        "s": pa.array([f"cat{v}" for v in rng.integers(0, 500, n)], mask=null(0.1)),
        "d": pa.array(days, pa.date32(), mask=null(0.05)),
    })


def test_generated_kernel_compiled_by_gxx_equals_the_numpy_program_bit_for_bit(tmp_path: Path) -> None:
    import kernel_emulation

    sch = schema(ALL_OPS_FIELDS, ALL_OPS_FEATURES, event_time="ts")
    plan = plan_program(sch)
    source = generate_source(plan)
    assert source == generate_source(plan_program(sch))  # deterministic
    lib = kernel_emulation.build(source, tmp_path)
    n = 20_000
    batch = _all_ops_batch(n, seed=11)
    slots = prepare_slots(plan, batch, None)
    packed = np.empty((len(plan.slots), n))
    from features.kernels.numpy_backend import load_slot

    for s, sv in enumerate(slots):
        load_slot(packed[s], sv, 0, n)
    k = len(plan.kernel)
    c_values, c_status = kernel_emulation.run(lib, packed, k)
    ref = NumpyBackend(plan, chunk_rows=1000).run(slots, n)
    assert np.array_equal(c_status, ref.status)
    for j in range(k):
        ok = ref.status[j] == 0
        expected = ref.values[j][ok]
        got = c_values[j][ok].astype(expected.dtype)
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8)), f"feature {j} differs"
    # every status kind occurs, so the comparison covers invalid and null paths too
    assert {0, 1}.issubset(set(np.unique(ref.status).tolist()))
    assert (ref.status >= 2).any()


# --- the schemas shipped in schemas/ ---------------------------------------------------------


def test_credit_applicant_schema_runs_end_to_end() -> None:
    from features.compile.arrow import arrow_schema
    from features.schema.parse import load_schema

    sch = load_schema(ROOT / "schemas" / "credit_applicant.yaml")
    program = compile_transforms(sch, device="cpu")
    base = {"application_id": "APP-000000000001", "employment_duration_months": 12, "age": 30,
            "requested_amount": Decimal("1000.00"), "region": "north",
            "submitted_at": dt.datetime(2024, 5, 1, tzinfo=UTC)}
    rows = [
        {**base, "income_monthly": Decimal("2500.00"), "employment_status": "employed",
         "existing_debt": Decimal("1000.00"), "credit_score": 700, "customer_since": dt.date(2020, 1, 1)},
        {**base, "income_monthly": Decimal("0.01"), "employment_status": None, "existing_debt": None,
         "credit_score": None, "customer_since": None},
    ]
    r = program.run(pa.RecordBatch.from_pylist(rows, schema=arrow_schema(sch)))
    assert r.features.to_pylist() == [
        {"income_log": math.log1p(2500.0), "debt_to_income": 0.4, "score_bucket": 2,
         "employment_status_hash": fnv1a64_reference("employed") % 64, "customer_tenure_days": 1582.0},
        {"income_log": math.log1p(0.01), "debt_to_income": 0.0, "score_bucket": None,
         "employment_status_hash": None, "customer_tenure_days": None},
    ]


def test_cli_shows_the_program_and_the_kernel_source(capsys: pytest.CaptureFixture[str]) -> None:
    from features.cli import main

    assert main(["kernels", "--schema", str(ROOT / "schemas" / "clicks.yaml"), "--show-source"]) == 0
    out = capsys.readouterr().out
    assert "cupy.RawKernel 'fl_transform_clicks'" in out
    assert 'extern "C" __global__ void fl_transform_clicks(' in out
    assert "__device__ double fl_log1p(double x)" in out
    assert "hash_bucket(item_id, n=1024)" in out
    assert main(["kernels", "--schema", str(ROOT / "schemas" / "clicks.yaml"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "device cpu" in out and "event_type_onehot__purchase: int8" in out


# --- the CuPy backend's wiring, with a g++-built stand-in for CuPy ----------------------------


class _HostArray(np.ndarray):  # type: ignore[type-arg]
    """Stands in for a cupy.ndarray: ``set`` uploads, ``get(out=)`` downloads."""

    def set(self, host: npt.NDArray[np.float64]) -> None:
        assert host.shape == self.shape and host.flags.c_contiguous
        self[...] = host

    def get(self, out: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        assert out.shape == self.shape and out.flags.c_contiguous
        out[...] = self
        return out


def _fake_cupy(tmp_path: Path, launches: list[dict[str, Any]]) -> Any:
    import types

    import kernel_emulation

    class RawKernel:
        def __init__(self, code: str, name: str, *, options: tuple[str, ...]) -> None:
            self.lib = kernel_emulation.build((code, name), tmp_path)
            launches.append({"compiled": name, "options": options})

        def __call__(self, grid: tuple[int], block: tuple[int], args: tuple[Any, ...]) -> None:
            inp, nrows, outp = args
            assert isinstance(nrows, np.int64) and grid[0] * block[0] >= int(nrows) > (grid[0] - 1) * block[0]
            ptr = ctypes.POINTER(ctypes.c_double)
            self.lib.fl_run(inp.ctypes.data_as(ptr), ctypes.c_longlong(int(nrows)), outp.ctypes.data_as(ptr))
            launches.append({"rows": int(nrows)})

    def empty(n: int, dtype: Any) -> _HostArray:
        return np.full(n, np.nan, dtype=dtype).view(_HostArray)  # NaN: stale data would show

    return types.SimpleNamespace(RawKernel=RawKernel, empty=empty)


def test_cupy_backend_wiring_with_a_gxx_built_stand_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    from features.kernels.cupy_backend import CupyBackend
    from features.kernels.program import TransformProgram

    monkeypatch.setitem(sys.modules, "cupyx",
                        types.SimpleNamespace(empty_pinned=lambda shape, dtype: np.empty(shape, dtype)))
    launches: list[dict[str, Any]] = []
    sch = schema(ALL_OPS_FIELDS, ALL_OPS_FEATURES, event_time="ts")
    plan = plan_program(sch)
    gpu = TransformProgram(plan, CupyBackend(plan, _fake_cupy(tmp_path, launches)))
    cpu = compile_transforms(sch, device="cpu")
    assert gpu.device == "gpu"
    for rows, seed in [(3_000, 1), (17, 2), (3_000, 3), (0, 4), (1, 5)]:
        batch = _all_ops_batch(rows, seed)
        g, c = gpu.run(batch), cpu.run(batch)
        assert g.features.equals(c.features) and g.rejects.equals(c.rejects)
        assert g.kept_row_index.equals(c.kept_row_index)
    assert launches[0] == {"compiled": "fl_transform_t", "options": ("--std=c++17", "--fmad=false")}
    assert [entry["rows"] for entry in launches[1:]] == [3_000, 17, 3_000, 1]  # one launch per batch
    assert gpu.backend._capacity == 3_000  # type: ignore[attr-defined]  # grown once, then reused


def test_auto_falls_back_to_the_cpu_with_one_warning_when_the_gpu_kernel_cannot_compile(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A machine with a GPU but no working runtime compiler: ``auto`` checks at start
    (not on the first batch), runs on the CPU and says why once; ``gpu`` refuses."""
    import types

    import features.kernels.device as device
    from features.errors import DeviceUnavailable

    compiles: list[str] = []

    class RawKernel:
        def __init__(self, code: str, name: str, *, options: tuple[str, ...]) -> None:
            self.name = name

        def compile(self) -> None:
            compiles.append(self.name)
            raise RuntimeError("cannot load libnvrtc.so.12")

    fake = types.SimpleNamespace(RawKernel=RawKernel)
    monkeypatch.setattr(device, "find_gpu", lambda: (fake, ""))
    sch = schema(ALL_OPS_FIELDS, ALL_OPS_FEATURES, event_time="ts")
    with caplog.at_level("WARNING", logger="features.kernels"):
        program = compile_transforms(sch, device="auto")
    assert program.device == "cpu" and compiles == ["fl_transform_t"]
    warnings = [r for r in caplog.records if r.name == "features.kernels"]
    assert len(warnings) == 1 and "does not compile here" in warnings[0].getMessage()
    assert "cannot load libnvrtc.so.12" in warnings[0].getMessage()
    batch = _all_ops_batch(100, seed=3)
    assert program.run(batch).features.equals(compile_transforms(sch, device="cpu").run(batch).features)
    with pytest.raises(DeviceUnavailable, match=r"FEATURES_DEVICE=gpu.*does not compile here"):
        compile_transforms(sch, device="gpu")
