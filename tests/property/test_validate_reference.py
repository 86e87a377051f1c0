"""The vectorised validator agrees, row by row, with a plain-Python reference.

Rows are generated near every boundary of a schema (type ranges, bounds, lengths,
pattern edges, NaN/inf/null, empty strings); the reference below judges one value at
a time with ``int``/``Decimal``/``re`` and must produce the same reject rows (same
row, same rule, same order) and the same valid values. Counts must be conserved.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from features.compile import CompiledSchema, compile_schema
from features.schema.parse import parse_schema
from features.validation import ValidationResult, validate
from features.validation.masks import compile_fixed_width, filter_rows, fixed_width_pattern, string_lengths

SCHEMA = textwrap.dedent("""\
    name: reference
    version: 1.0.0
    fields:
      - name: i
        type: int32
        constraints: {min: -100, max: 100, default: 0}
      - name: d
        type: 'decimal(6,2)'
        accept_strings: true
        constraints: {min: -99.99, max: 999.99, nullable: false}
      - name: f
        type: float64
        constraints: {min: -1.5, max: 1000000}
      - name: s
        type: string
        constraints: {pattern: '^[A-C]{2}[0-9]{1,3}$', min_length: 3, max_length: 4, empty_as_null: true}
      - name: code
        type: string
        constraints: {pattern: '^[A-C]{2}-[0-9]{2}$'}
      - name: e
        type: enum
        values: [red, green]
        constraints: {required: true}
      - name: g
        type: float32
      - name: q
        type: 'decimal(6,2)'
""")

COMPILED: CompiledSchema = compile_schema(parse_schema(SCHEMA))
RULE_ORDER = {rule.id: i for i, rule in enumerate(COMPILED.rules)}
FIELDS = [f.name for f in COMPILED.schema.fields]
INPUT_TYPES = {
    "i": pa.int64(), "d": pa.string(), "f": pa.float64(), "s": pa.string(), "code": pa.string(),
    "e": pa.string(), "g": pa.float64(), "q": pa.decimal128(10, 3),
}

DECIMAL_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,6})?")


# --------------------------------------------------------------------------- the reference


def ref_int32(v: int | None) -> tuple[Any, list[str]]:
    if v is not None and not -(2**31) <= v <= 2**31 - 1:
        return None, ["i.type"]
    if v is None:
        v = 0  # default
    fails = []
    if v < -100:
        fails.append("i.min")
    if v > 100:
        fails.append("i.max")
    return v, fails


def ref_decimal_text(text: str | None) -> tuple[Any, list[str]]:
    if text is None:
        return None, ["d.not_null"]
    if DECIMAL_TEXT.fullmatch(text) is None:
        return None, ["d.type"]
    value = Decimal(text)
    if value != 0 and abs(value) >= 10**4:
        return None, ["d.type"]
    try:
        exact = value.quantize(Decimal("0.01"))
    except InvalidOperation:
        return None, ["d.type"]
    if exact != value:
        return None, ["d.type"]
    fails = []
    if exact < Decimal("-99.99"):
        fails.append("d.min")
    if exact > Decimal("999.99"):
        fails.append("d.max")
    return exact, fails


def ref_float64(v: float | None) -> tuple[Any, list[str]]:
    if v is None:
        return None, []
    if math.isinf(v):
        return None, ["f.type"]
    if math.isnan(v):
        return v, ["f.nan"]
    fails = []
    if v < -1.5:
        fails.append("f.min")
    if v > 1_000_000.0:
        fails.append("f.max")
    return v, fails


def ref_string(v: str | None) -> tuple[Any, list[str]]:
    if v == "":
        v = None  # empty_as_null
    if v is None:
        return None, []
    fails = []
    if len(v) < 3:
        fails.append("s.min_length")
    if len(v) > 4:
        fails.append("s.max_length")
    if re.fullmatch(r"[A-C]{2}[0-9]{1,3}", v) is None:
        fails.append("s.pattern")
    return v, fails


def ref_code(v: str | None) -> tuple[Any, list[str]]:
    if v is None:
        return None, []
    return v, [] if re.fullmatch(r"[A-C]{2}-[0-9]{2}", v) else ["code.pattern"]


def ref_enum(v: str | None) -> tuple[Any, list[str]]:
    if v is None:
        return None, ["e.not_null"]
    return v, [] if v in ("red", "green") else ["e.enum"]


def ref_float32(v: float | None) -> tuple[Any, list[str]]:
    if v is None:
        return None, []
    if math.isnan(v):
        return v, ["g.nan"]
    if math.isinf(v):
        return None, ["g.type"]
    with np.errstate(over="ignore"):
        narrow = np.float32(v)
    if not np.isfinite(narrow) or float(narrow) != v:
        return None, ["g.type"]
    return float(narrow), []


def ref_rescale(v: Decimal | None) -> tuple[Any, list[str]]:
    if v is None:
        return None, []
    exact = v.quantize(Decimal("0.01"))
    if exact != v or abs(exact) >= 10**4:
        return None, ["q.type"]
    return exact, []


REFERENCE: dict[str, Callable[[Any], tuple[Any, list[str]]]] = {
    "i": ref_int32, "d": ref_decimal_text, "f": ref_float64, "s": ref_string, "code": ref_code,
    "e": ref_enum, "g": ref_float32, "q": ref_rescale,
}


def reference(rows: list[dict[str, Any]]) -> tuple[list[tuple[int, str]], list[dict[str, Any]], list[int]]:
    """(reject (row, rule id) in order, valid rows as dicts, their input row numbers)."""
    rejected: list[tuple[int, str]] = []
    valid: list[dict[str, Any]] = []
    index: list[int] = []
    for n, row in enumerate(rows):
        out: dict[str, Any] = {}
        fails: list[str] = []
        for name in FIELDS:
            value, field_fails = REFERENCE[name](row[name])
            out[name] = value
            fails += field_fails
        fails.sort(key=RULE_ORDER.__getitem__)
        rejected += [(n, rule) for rule in fails]
        if not fails:
            valid.append(out)
            index.append(n)
    return rejected, valid, index


# --------------------------------------------------------------------------- generated rows


def near(*points: int) -> st.SearchStrategy[int]:
    return st.sampled_from([p + d for p in points for d in (-1, 0, 1)])


ints = st.one_of(st.none(), near(-100, 100, -(2**31), 2**31 - 1, 0), st.integers(-(2**63), 2**63 - 1))
decimal_texts = st.one_of(
    st.none(),
    st.sampled_from(["-99.99", "-100.00", "999.99", "1000.00", "999.995", "12.50", "12.505", "1e3", "1E-2",
                     "+5", "-0", ".5", "5.", ".", "", " 1", "abc", "1e999999", "1e-999999", "9999.99",
                     "10000", "0.001", "nan"]),
    st.decimals(min_value=-20000, max_value=20000, places=3, allow_nan=False).map(str),
    st.from_regex(r"[+-]?[0-9]{0,5}(\.[0-9]{0,3})?([eE][+-]?[0-9])?", fullmatch=True),
)
floats = st.one_of(
    st.none(),
    st.sampled_from([-1.5, math.nextafter(-1.5, -math.inf), 1e6, math.nextafter(1e6, math.inf), 0.0, -0.0,
                     math.inf, -math.inf, math.nan]),
    st.floats(allow_nan=True, allow_infinity=True),
)
texts = st.one_of(
    st.none(), st.sampled_from(["", "AB1", "AB12", "AB123", "AB1234", "CC9", "DD1", "ab1", "AB"]),
    st.text(alphabet="ABCD019é-", max_size=6),
)
codes = st.one_of(st.none(), st.sampled_from(["AB-12", "AB-1", "ab-12", "AB-123", "AB_12", "ÀB-12"]),
                  st.text(alphabet="ABCD-019é", max_size=6))
enums = st.one_of(st.none(), st.sampled_from(["red", "green", "blue", "", "Red"]))
float32s = st.one_of(
    st.none(), st.sampled_from([0.5, 0.1, 3.4028234663852886e38, 3.5e38, 1e-45, 2**-149, math.nan, math.inf]),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(float), st.floats(allow_nan=False),
)
rescales = st.one_of(st.none(), st.decimals(min_value=-20000, max_value=20000, places=3, allow_nan=False))

row_strategy = st.fixed_dictionaries(
    {"i": ints, "d": decimal_texts, "f": floats, "s": texts, "code": codes, "e": enums, "g": float32s,
     "q": rescales}
)


def as_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([r[name] for r in rows], INPUT_TYPES[name]) for name in FIELDS], names=FIELDS
    )


def same_values(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    def norm(v: Any) -> Any:
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return [{k: norm(v) for k, v in r.items()} for r in a] == [{k: norm(v) for k, v in r.items()} for r in b]


def verdict(result: ValidationResult) -> list[tuple[int, str]]:
    return list(zip(result.rejects.column("row").to_pylist(), result.rejects.column("rule").to_pylist(),
                    strict=True))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row_strategy, max_size=40))
def test_validator_equals_row_by_row_reference(rows: list[dict[str, Any]]) -> None:
    result = validate(as_batch(rows), COMPILED)
    expected_rejects, expected_valid, expected_index = reference(rows)
    assert verdict(result) == expected_rejects
    assert same_values(result.valid.to_pylist(), expected_valid)
    assert result.valid_row_index.to_pylist() == expected_index
    # counts are conserved
    counts = result.counts
    assert counts.input_rows == len(rows)
    assert counts.valid_rows + counts.rejected_rows == len(rows)
    assert counts.rejected_rows == len({r for r, _ in expected_rejects})
    assert sum(counts.by_rule.values()) == len(expected_rejects)
    assert result.valid.schema.equals(COMPILED.arrow_schema, check_metadata=True)


@settings(max_examples=100, deadline=None)
@given(st.lists(row_strategy, max_size=25))
def test_list_of_dicts_equals_arrow_input(rows: list[dict[str, Any]]) -> None:
    # the same values as Python objects: Decimals for q, everything else as generated
    from_dicts = validate(rows, COMPILED)
    from_arrow = validate(as_batch(rows), COMPILED)
    assert verdict(from_dicts) == verdict(from_arrow)
    assert from_dicts.rejects.column("message").equals(from_arrow.rejects.column("message"))
    assert same_values(from_dicts.valid.to_pylist(), from_arrow.valid.to_pylist())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), max_size=30))
def test_floats_into_decimal_follow_their_repr(values: list[float | None]) -> None:
    text = "name: t\nversion: 1.0.0\nfields:\n  - {name: x, type: 'decimal(9,3)'}\n"
    c = compile_schema(parse_schema(text))
    result = validate(pa.record_batch([pa.array(values, pa.float64())], names=["x"]), c)
    expected_valid: list[Decimal | None] = []
    expected_rejects: list[int] = []
    for n, v in enumerate(values):
        if v is None:
            expected_valid.append(None)
            continue
        if not math.isfinite(v):
            expected_rejects.append(n)
            continue
        shortest = Decimal(repr(v))
        exact = shortest.quantize(Decimal("0.001")) if abs(shortest) < 10**6 else None
        if exact is None or exact != shortest:
            expected_rejects.append(n)
        else:
            expected_valid.append(exact)
    assert result.rejects.column("row").to_pylist() == expected_rejects
    assert result.valid.column("x").to_pylist() == expected_valid


# --------------------------------------------------------------------------- the fast kernels


class_items = st.sampled_from(["A", "B", "a", "0", "9", "\\-", "_", "A-C", "0-9", "a-z", "\\d", "\\."])
atoms = st.one_of(
    st.sampled_from(["A", "b", "0", "-", "\\d", "\\.", "x"]),
    st.lists(class_items, min_size=1, max_size=3).map(lambda items: "[" + "".join(items) + "]"),
)
pattern_parts = st.lists(
    st.tuples(atoms, st.one_of(st.just(""), st.integers(0, 3).map(lambda k: f"{{{k}}}"))),
    min_size=1, max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(pattern_parts, st.lists(st.one_of(st.none(), st.text(alphabet="AaBbCx09-_.é\n", max_size=8)),
                               max_size=50), st.integers(0, 3))
def test_fixed_width_pattern_equals_re2(
    parts: list[tuple[str, str]], values: list[str | None], offset: int
) -> None:
    pattern = "^" + "".join(a + q for a, q in parts) + "$"
    runs = compile_fixed_width(pattern)
    if all(q == "{0}" for _, q in parts):
        assert runs is None  # zero width: left to RE2
        return
    assert runs is not None, pattern
    arr = pa.array(values, pa.string()).slice(min(offset, len(values)))
    fast = fixed_width_pattern(arr, runs)
    assert fast is not None
    expected = pc.fill_null(pc.invert(pc.match_substring_regex(arr, f"^(?:{pattern})$")), False)
    assert fast.tolist() == expected.to_pylist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=6)), max_size=30), st.integers(0, 3))
def test_string_lengths_equal_utf8_length(values: list[str | None], offset: int) -> None:
    arr = pa.array(values, pa.string()).slice(min(offset, len(values)))
    lengths = string_lengths(arr)
    expected = pc.fill_null(pc.utf8_length(arr), 0).to_pylist()
    if lengths is not None:
        assert lengths.tolist() == expected
    else:
        assert any(v is not None and not v.isascii() for v in arr.to_pylist())


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from([pa.int8(), pa.int32(), pa.uint64(), pa.float32(), pa.decimal128(12, 3),
                     pa.timestamp("ms"), pa.date32(), pa.string(), pa.bool_()]),
    st.lists(st.tuples(st.booleans(), st.booleans()), max_size=40),
    st.integers(0, 3),
)
def test_filter_rows_equals_arrow_filter(
    typ: pa.DataType, spec: list[tuple[bool, bool]], offset: int
) -> None:
    n = len(spec)
    base = pa.array(np.arange(n) % 100, pa.int64(), mask=np.array([not v for v, _ in spec], dtype=bool))
    if pa.types.is_decimal(typ):
        arr = base.cast(pa.decimal128(20, 0)).cast(typ)
    elif pa.types.is_string(typ):
        arr = base.cast(typ)
    elif pa.types.is_boolean(typ):
        arr = pc.greater(base, 50)
    elif pa.types.is_date32(typ):
        arr = base.cast(pa.int32()).view(typ)
    else:
        arr = base.cast(typ)
    start = min(offset, n)
    arr = arr.slice(start)
    keep = np.array([k for _, k in spec], dtype=bool)[start:]
    out = filter_rows(arr, keep, pa.array(keep, pa.bool_()))
    out.validate(full=True)
    assert out.equals(arr.filter(pa.array(keep, pa.bool_())))
