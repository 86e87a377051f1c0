"""Properties of the transform kernels over random step chains and extreme inputs.

- No transform emits NaN or ±inf into any output column (every column is checked).
- Every row is either kept or rejected (counts are conserved), rejects carry reason
  ``transform`` and the row they refer to is absent from the features.
- The vectorised NumPy program equals a plain row-by-row Python reference of the
  semantics in ``features/kernels/ops.py``, whatever the chunk size.

Inputs never contain NaN (the validator rejects it); they include ±1e308, subnormals,
±0, huge int64 values, and constants that make ops overflow.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from features.kernels import compile_transforms
from features.kernels.numpy_backend import log1p
from features.kernels.ops import INT_BOUNDS, TIME_UNITS_US
from features.schema.model import (
    Constraints,
    Feature,
    Field,
    FieldType,
    OnInvalid,
    OpName,
    Schema,
    Step,
    TypeKind,
)

EXTREMES = [0.0, -0.0, 1.0, -1.0, -2.0, 0.5, 2.5, -0.5, 5e-324, -5e-324, 2.2250738585072014e-308,
            1e308, -1e308, 1.7976931348623157e308, -1.7976931348623157e308, 2.0**53, 2.0**63,
            3.4028235e38, 3.5e38, 127.5, -128.5, 2.0**31]
finite = st.floats(allow_nan=False, allow_infinity=False)
x_values = st.one_of(finite, st.sampled_from(EXTREMES), st.none())
y_values = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, 2**62, -(2**63)]),
                     st.none())
constants = st.one_of(finite, st.sampled_from(EXTREMES))
OUT_KINDS = ["int8", "int16", "int32", "int64", "float32", "float64", "bool"]


def mk(op: str, *args: tuple[str, Any]) -> Step:
    return Step(cast(OpName, op), tuple(args))


def num(s: Step, name: str) -> float:
    value = s.arg(name)
    assert isinstance(value, int | float)
    return float(value)


def has(s: Step, name: str) -> bool:
    return any(key == name for key, _ in s.args)


@st.composite
def steps(draw: st.DrawFn) -> Step:
    op = draw(st.sampled_from(["fill_null", "clip", "log1p", "zscore", "minmax", "bucketize", "ratio",
                               "cast", "difference", "product"]))
    if op == "fill_null":
        return mk(op, ("value", draw(constants)))
    if op == "clip":
        lo, hi = sorted([draw(constants), draw(constants)])
        which = draw(st.sampled_from(["lo", "hi", "both"]))
        if which == "both":
            return mk(op, ("lo", lo), ("hi", hi))
        return mk(op, (which, lo if which == "lo" else hi))
    if op == "log1p":
        return mk(op)
    if op == "zscore":
        std = draw(st.one_of(st.floats(min_value=5e-324, max_value=1e308), st.sampled_from([1e-300, 1.0])))
        return mk(op, ("mean", draw(constants)), ("std", std))
    if op == "minmax":
        lo, hi = sorted(draw(st.lists(constants, min_size=2, max_size=2, unique=True)))
        return mk(op, ("lo", lo), ("hi", hi))
    if op == "bucketize":
        # -0.0 and 0.0 are one boundary: keep the boundaries strictly increasing.
        bounds = sorted({float(b) for b in draw(st.lists(constants, min_size=1, max_size=40))})
        return mk(op, ("boundaries", tuple(bounds)))
    if op == "ratio":
        return mk(op, ("denominator", "y"), ("on_zero", draw(st.one_of(st.none(), constants))))
    if op in ("difference", "product"):
        on_null = draw(st.one_of(st.none(), constants))
        return mk(op, ("other", "y")) if on_null is None else mk(op, ("other", "y"), ("on_null", on_null))
    # Not bool mid-chain: only fill_null and cast may follow a bool (the parser refuses the rest).
    return mk(op, ("dtype", draw(st.sampled_from(OUT_KINDS[:-1]))))


def _schema(chain: list[Step], dtype: str, on_invalid: str) -> Schema:
    fields = (Field("x", FieldType(TypeKind.FLOAT64), Constraints()),
              Field("y", FieldType(TypeKind.INT64), Constraints()))
    feats = (
        Feature("f", "x", tuple(chain), FieldType(TypeKind(dtype)), frozenset({"hot"}),
                cast(OnInvalid, on_invalid)),
        Feature("g", "y", (mk("clip", ("lo", -1e300)), *chain), FieldType(TypeKind.FLOAT32),
                frozenset({"hot"}), "null"),
    )
    return Schema("props", (1, 0, 0), fields, features=feats)


# --- a plain, row-by-row reference of ops.py ---------------------------------------------------


def _apply(s: Step, v: float, y: float | None) -> tuple[str, float]:
    """One op on an OK value: ('ok', v) | ('null', _) | ('invalid', _)."""
    with np.errstate(all="ignore"):
        if s.op == "clip":
            if has(s, "lo") and v < num(s, "lo"):
                v = num(s, "lo")
            if has(s, "hi") and v > num(s, "hi"):
                v = num(s, "hi")
            return "ok", v
        if s.op == "log1p":
            return ("ok", float(log1p(np.array([v]))[0])) if v > -1.0 else ("invalid", v)
        if s.op == "bucketize":
            bounds = s.arg("boundaries")
            assert isinstance(bounds, tuple)
            return "ok", float(sum(1 for b in bounds if isinstance(b, float) and v >= b))
        if s.op in ("difference", "product"):
            assert y is not None
            r = float(np.float64(v) - np.float64(y)) if s.op == "difference" else float(
                np.float64(v) * np.float64(y))
        elif s.op == "ratio":
            if y is None:
                return "null", v  # a later fill_null may still fill it
            if y == 0.0:
                on_zero = s.arg("on_zero")
                return ("null", v) if on_zero is None else ("ok", num(s, "on_zero"))
            r = float(np.float64(v) / np.float64(y))
        elif s.op in ("zscore", "minmax"):
            shift, scale = ((num(s, "mean"), num(s, "std")) if s.op == "zscore"
                            else (num(s, "lo"), num(s, "hi") - num(s, "lo")))
            r = float(np.float64(v - shift) / np.float64(scale))
        else:
            kind = TypeKind(str(s.arg("dtype")))
            if kind in INT_BOUNDS:
                lo, hi = INT_BOUNDS[kind]
                r = float(round(v))  # Python rounds half to even; round(-0.0) is 0
                return ("ok", r) if lo <= r < hi else ("invalid", v)
            if kind is TypeKind.BOOL:
                return "ok", 1.0 if v != 0.0 else 0.0
            r = float(np.float32(v)) if kind is TypeKind.FLOAT32 else v
    return ("ok", r) if math.isfinite(r) else ("invalid", v)


def _reference(chain: list[Step], dtype: str, x: float | None, y: float | None) -> tuple[str, float | None]:
    """('ok', value) | ('null', None) | ('invalid', None) for one row of one feature."""
    state, v = ("null", 0.0) if x is None else ("ok", float(x))
    for s in [*chain, mk("cast", ("dtype", dtype))]:
        if s.op == "fill_null":
            if state == "null":
                state, v = "ok", num(s, "value")
        elif s.op in ("difference", "product") and state != "invalid" and (state == "null" or y is None):
            state, v = ("ok", num(s, "on_null")) if has(s, "on_null") else ("null", v)
        elif state == "ok":
            state, v = _apply(s, v, y)
        if state == "invalid":
            return state, None
    return (state, v) if state == "ok" else (state, None)


def _check_no_nan_or_inf(batch: pa.RecordBatch) -> None:
    for name in batch.schema.names:
        column = batch.column(name)
        if pa.types.is_floating(column.type):
            values = column.drop_null().to_numpy()
            assert np.isfinite(values).all(), f"{name} holds NaN or inf"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chain=st.lists(steps(), min_size=1, max_size=6),
    dtype=st.sampled_from(OUT_KINDS),
    on_invalid=st.sampled_from(["null", "reject"]),
    rows=st.lists(st.tuples(x_values, y_values), min_size=0, max_size=40),
    chunk=st.sampled_from([1, 3, 16_384]),
)
def test_no_output_is_nan_or_inf_and_numpy_equals_the_row_reference(
    chain: list[Step], dtype: str, on_invalid: str, rows: list[tuple[Any, Any]], chunk: int,
) -> None:
    program = compile_transforms(_schema(chain, dtype, on_invalid), device="cpu", chunk_rows=chunk)
    xs = [r[0] for r in rows]
    ys = [r[1] for r in rows]
    batch = pa.RecordBatch.from_pydict({"x": pa.array(xs, pa.float64()), "y": pa.array(ys, pa.int64())})
    result = program.run(batch)

    _check_no_nan_or_inf(result.features)
    assert result.features.num_rows + result.rejected_rows == len(rows)
    kept = result.kept_row_index.to_pylist()
    rejected = set(result.rejects.column("row").to_pylist())
    assert sorted(set(kept) | rejected) == list(range(len(rows))) and not set(kept) & rejected
    assert set(result.rejects.column("reason").to_pylist()) <= {"transform"}

    expected_f = [_reference(chain, dtype, x, None if y is None else float(np.float64(y))) for x, y in rows]
    expected_rejected = {i for i, (state, _) in enumerate(expected_f) if state == "invalid"}
    assert rejected == (expected_rejected if on_invalid == "reject" else set())
    got_f = result.features.column("f").to_pylist()
    for got, row in zip(got_f, kept, strict=True):
        state, value = expected_f[row]
        if state != "ok":
            assert got is None, f"row {row}: expected {state}, got {got!r}"
        elif dtype == "bool":
            assert got is (value != 0.0)
        else:
            assert got == value and math.copysign(1, got) == math.copysign(1, value), (row, got, value)

    g_chain = [mk("clip", ("lo", -1e300)), *chain]
    got_g = result.features.column("g").to_pylist()
    for got, row in zip(got_g, kept, strict=True):
        y = rows[row][1]
        state, value = _reference(g_chain, "float32", None if y is None else float(np.float64(y)),
                                  None if y is None else float(np.float64(y)))
        assert got == (value if state == "ok" else None), (row, got, value)


@settings(max_examples=100, deadline=None)
@given(
    days=st.lists(st.one_of(st.integers(-719_162, 2_932_896), st.none()), max_size=30),
    unit=st.sampled_from(sorted(TIME_UNITS_US)),
)
def test_time_since_is_finite_and_exact_in_microseconds(days: list[int | None], unit: str) -> None:
    import datetime as dt

    fields = (Field("d", FieldType(TypeKind.DATE), Constraints()),)
    feats = (Feature("t", "d", (Step("time_since", (("unit", unit),)),), FieldType(TypeKind.FLOAT64),
                     frozenset({"cold"})),)
    program = compile_transforms(Schema("ts", (1, 0, 0), fields, features=feats), device="cpu")
    ref = dt.datetime(2024, 6, 1, 12, tzinfo=dt.UTC)
    batch = pa.RecordBatch.from_pydict({"d": pa.array(days, pa.date32())})
    result = program.run(batch, reference_time=ref)
    _check_no_nan_or_inf(result.features)
    ref_us = (ref - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    expected = [None if d is None else float(ref_us - d * 86_400_000_000) / TIME_UNITS_US[unit] for d in days]
    assert result.features.column("t").to_pylist() == expected
