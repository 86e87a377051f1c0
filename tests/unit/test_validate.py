"""The compiled validator: conversions, every rule kind, messages, counts, inputs, CLI."""

from __future__ import annotations

import datetime as dt
import json
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from features.cli import main as cli_main
from features.compile import CompiledSchema, compile_schema
from features.compile.arrow import arrow_schema, arrow_type
from features.compile.rules import ReasonCode
from features.errors import CompileError, RowsRejected, SourceError
from features.schema.model import FieldType, TypeKind
from features.schema.parse import parse_schema
from features.validation import REJECT_SCHEMA, ValidationResult, validate
from features.validation import masks as masks_module
from features.validation import result as result_module
from features.validation import validator as validator_module
from features.validation.masks import (
    compile_fixed_width,
    decimal_words,
    filter_rows,
    fixed_width_pattern,
    string_lengths,
)

UTC = dt.UTC


def compiled(fields_yaml: str, name: str = "t") -> CompiledSchema:
    """Compile a schema whose ``fields:`` list is ``fields_yaml``."""
    text = f"name: {name}\nversion: 1.0.0\nfields:\n" + textwrap.indent(textwrap.dedent(fields_yaml), "  ")
    return compile_schema(parse_schema(text))


def one(field_yaml: str, values: pa.Array | list[Any], name: str = "x") -> ValidationResult:
    """Validate a single column ``name`` against a one-field schema."""
    c = compiled(field_yaml)
    arr = values if isinstance(values, pa.Array) else pa.array(values)
    return validate(pa.record_batch([arr], names=[name]), c)


def rejects(result: ValidationResult) -> list[tuple[int, str]]:
    return list(zip(result.rejects.column("row").to_pylist(), result.rejects.column("rule").to_pylist(),
                    strict=True))


def messages(result: ValidationResult) -> list[Any]:
    return list(result.rejects.column("message").to_pylist())


def valid_values(result: ValidationResult, name: str = "x") -> list[Any]:
    return list(result.valid.column(name).to_pylist())


def check_invariants(result: ValidationResult, compiled_schema: CompiledSchema) -> None:
    """Counts conserved, valid typed exactly as declared, rejects in the fixed schema."""
    assert result.valid.schema.equals(compiled_schema.arrow_schema, check_metadata=True)
    assert result.rejects.schema.equals(REJECT_SCHEMA)
    distinct = len(set(result.rejects.column("row").to_pylist()))
    assert distinct == result.rejected_rows
    assert result.valid.num_rows + result.rejected_rows == result.input_rows
    index = result.valid_row_index.to_pylist()
    assert index == sorted(index)
    assert not set(index) & set(result.rejects.column("row").to_pylist())
    assert len(index) == result.valid.num_rows


# --------------------------------------------------------------------------- arrow types


@pytest.mark.parametrize(
    ("field_type", "expected"),
    [
        (FieldType(TypeKind.STRING), pa.string()),
        (FieldType(TypeKind.ENUM), pa.string()),
        (FieldType(TypeKind.BOOL), pa.bool_()),
        (FieldType(TypeKind.INT8), pa.int8()),
        (FieldType(TypeKind.INT16), pa.int16()),
        (FieldType(TypeKind.INT32), pa.int32()),
        (FieldType(TypeKind.INT64), pa.int64()),
        (FieldType(TypeKind.FLOAT32), pa.float32()),
        (FieldType(TypeKind.FLOAT64), pa.float64()),
        (FieldType(TypeKind.DECIMAL, precision=18, scale=2), pa.decimal128(18, 2)),
        (FieldType(TypeKind.DATE), pa.date32()),
        (FieldType(TypeKind.TIMESTAMP, unit="ms"), pa.timestamp("ms")),
        (FieldType(TypeKind.TIMESTAMP, unit="us", tz="UTC"), pa.timestamp("us", tz="UTC")),
    ],
)
def test_arrow_type_mapping(field_type: FieldType, expected: pa.DataType) -> None:
    assert arrow_type(field_type) == expected


@pytest.mark.parametrize(
    "field_type",
    [
        FieldType(TypeKind.TIMESTAMP, unit="ns"),
        FieldType(TypeKind.DECIMAL, precision=39, scale=2),
        FieldType(TypeKind.DECIMAL, precision=5, scale=6),
        FieldType(TypeKind.TIMESTAMP, unit="us", tz="Not/AZone"),
    ],
)
def test_arrow_type_refuses_what_cannot_be_held_exactly(field_type: FieldType) -> None:
    with pytest.raises(CompileError):
        arrow_type(field_type)


def test_arrow_schema_nullability_and_metadata() -> None:
    c = compiled("""
        - name: a
          type: string
          constraints: {required: true}
        - name: b
          type: int32
          constraints: {nullable: false}
        - name: c
          type: decimal(18,2)
    """, name="credit")
    schema = arrow_schema(c.schema)
    assert [(f.name, f.nullable) for f in schema] == [("a", False), ("b", False), ("c", True)]
    assert schema.metadata == {b"featureline.schema": b"credit", b"featureline.version": b"1.0.0"}
    assert schema.field("c").metadata == {b"featureline.type": b"decimal(18,2)"}
    assert c.arrow_schema.equals(schema, check_metadata=True)


# --------------------------------------------------------------------------- integers


def test_int64_beyond_int32_is_a_type_reject() -> None:
    r = one("- {name: x, type: int32}", pa.array([2**40, 7, -(2**31), 2**31 - 1, 2**31, None], pa.int64()))
    assert rejects(r) == [(0, "x.type"), (4, "x.type")]
    assert messages(r) == [
        "field x violates constraint type: got 1099511627776, expected int32",
        "field x violates constraint type: got 2147483648, expected int32",
    ]
    assert r.rejects.column("value").to_pylist() == ["1099511627776", "2147483648"]
    assert valid_values(r) == [7, -(2**31), 2**31 - 1, None]
    assert r.valid.column("x").type == pa.int32()


def test_huge_uint64_is_a_type_reject() -> None:
    r = one("- {name: x, type: int64}", pa.array([2**64 - 1, 2**63, 2**63 - 1, 0], pa.uint64()))
    assert rejects(r) == [(0, "x.type"), (1, "x.type")]
    assert messages(r)[0] == "field x violates constraint type: got 18446744073709551615, expected int64"
    assert valid_values(r) == [2**63 - 1, 0]


def test_narrow_ints_widen_and_unsigned_checks_range() -> None:
    assert valid_values(one("- {name: x, type: int64}", pa.array([-128, 127], pa.int8()))) == [-128, 127]
    r = one("- {name: x, type: int8}", pa.array([127, 128, 255], pa.uint8()))
    assert rejects(r) == [(1, "x.type"), (2, "x.type")]


@pytest.mark.parametrize(
    ("value", "ok"),
    [(12.0, True), (12.5, False), (-0.0, True), (float("nan"), False), (float("inf"), False),
     (2.0**31, False), (-(2.0**31), True), (1e400, False)],
)
def test_floats_into_int32_only_when_integral_and_in_range(value: float, ok: bool) -> None:
    r = one("- {name: x, type: int32}", pa.array([value], pa.float64()))
    assert (r.valid.num_rows == 1) is ok
    if ok:
        assert valid_values(r) == [int(value)]
    else:
        assert rejects(r) == [(0, "x.type")]


def test_float_type_reject_messages() -> None:
    r = one("- {name: x, type: int32}", pa.array([12.5, float("nan"), float("inf")]))
    assert messages(r) == [
        "field x violates constraint type: got 12.5, expected int32",
        "field x violates constraint type: got NaN, expected int32",
        "field x violates constraint type: got inf, expected int32",
    ]


def test_decimals_into_int_only_when_integral() -> None:
    arr = pa.array([Decimal("12.00"), Decimal("12.50"), Decimal("99999999999.00")], pa.decimal128(20, 2))
    r = one("- {name: x, type: int32}", arr)
    assert rejects(r) == [(1, "x.type"), (2, "x.type")]
    assert messages(r)[0] == "field x violates constraint type: got 12.50, expected int32"
    assert valid_values(r) == [12]


def test_bools_are_not_ints() -> None:
    r = one("- {name: x, type: int32}", pa.array([True, None]))
    assert rejects(r) == [(0, "x.type")]
    assert messages(r) == ["field x violates constraint type: got true, expected int32"]


# --------------------------------------------------------------------------- floats


def test_inf_is_a_type_reject_and_nan_a_nan_reject() -> None:
    r = one("- {name: x, type: float64}", [1.5, float("inf"), float("-inf"), float("nan"), None])
    assert rejects(r) == [(1, "x.type"), (2, "x.type"), (3, "x.nan")]
    assert messages(r) == [
        "field x violates constraint type: got inf, expected float64",
        "field x violates constraint type: got -inf, expected float64",
        "field x violates constraint nan: got NaN, expected a number",
    ]
    assert r.rejects.column("value").to_pylist() == ["inf", "-inf", "NaN"]
    assert valid_values(r) == [1.5, None]


def test_null_and_nan_are_different() -> None:
    nullable = one("- {name: x, type: float64}", [None, float("nan")])
    assert rejects(nullable) == [(1, "x.nan")]
    strict = one("- {name: x, type: float64, constraints: {nullable: false}}", [None, float("nan")])
    assert rejects(strict) == [(0, "x.not_null"), (1, "x.nan")]
    assert messages(strict)[0] == "field x violates constraint not_null: got null, expected a value"


def test_float64_into_float32_only_when_exact() -> None:
    r = one("- {name: x, type: float32}", pa.array([0.5, 0.1, 1e300, float("nan"), 3.0], pa.float64()))
    assert rejects(r) == [(1, "x.type"), (2, "x.type"), (3, "x.nan")]
    assert messages(r)[0] == "field x violates constraint type: got 0.1, expected float32"
    assert valid_values(r) == [0.5, 3.0]
    assert r.valid.column("x").type == pa.float32()


def test_float32_widens_to_float64_exactly() -> None:
    r = one("- {name: x, type: float64}", pa.array([0.1], pa.float32()))
    assert valid_values(r) == [float(np.float32(0.1))]


def test_ints_into_floats_only_when_exactly_representable() -> None:
    r = one("- {name: x, type: float64}", pa.array([2**53, 2**53 + 1, -(2**63)], pa.int64()))
    assert rejects(r) == [(1, "x.type")]
    r32 = one("- {name: x, type: float32}", pa.array([2**24, 2**24 + 1], pa.int32()))
    assert rejects(r32) == [(1, "x.type")]
    assert messages(r32) == ["field x violates constraint type: got 16777217, expected float32"]


def test_decimals_into_floats_take_the_nearest_float() -> None:
    arr = pa.array([Decimal("0.10"), Decimal("1234567.89")], pa.decimal128(18, 2))
    assert valid_values(one("- {name: x, type: float64}", arr)) == [0.1, 1234567.89]
    assert valid_values(one("- {name: x, type: float32}", arr)) == [
        float(np.float32(0.1)), float(np.float32(1234567.89))]


def test_float_bounds_compare_in_float64() -> None:
    r = one("- {name: x, type: float32, constraints: {min: 0.5, max: 10}}",
            pa.array([0.5, 0.25, 10.0, 10.5, None, float("nan")], pa.float32()))
    assert rejects(r) == [(1, "x.min"), (3, "x.max"), (5, "x.nan")]
    assert messages(r)[:2] == [
        "field x violates constraint min: got 0.25, expected >= 0.5",
        "field x violates constraint max: got 10.5, expected <= 10.0",
    ]


# --------------------------------------------------------------------------- decimals


def test_decimal_rescale_is_exact() -> None:
    arr = pa.array([Decimal("12.500"), Decimal("12.505"), Decimal("-0.010"), None], pa.decimal128(10, 3))
    r = one("- {name: x, type: 'decimal(18,2)'}", arr)
    assert rejects(r) == [(1, "x.type")]
    assert messages(r) == ["field x violates constraint type: got 12.505, expected decimal(18,2)"]
    assert valid_values(r) == [Decimal("12.50"), Decimal("-0.01"), None]
    assert r.valid.column("x").type == pa.decimal128(18, 2)


def test_decimal_rescale_near_the_input_precision() -> None:
    # rounding 99.995 (decimal(5,3)) would need a sixth digit: the check must not overflow
    arr = pa.array([Decimal("99.995"), Decimal("99.990")], pa.decimal128(5, 3))
    r = one("- {name: x, type: 'decimal(6,2)'}", arr)
    assert rejects(r) == [(0, "x.type")]
    assert valid_values(r) == [Decimal("99.99")]
    assert rejects(one("- {name: x, type: int32}", pa.array([Decimal("9.5")], pa.decimal128(2, 1)))) == [
        (0, "x.type")]


def test_decimal_too_many_digits_is_a_type_reject() -> None:
    arr = pa.array([Decimal("99999999.99"), Decimal("100000000.00")], pa.decimal128(20, 2))
    r = one("- {name: x, type: 'decimal(10,2)'}", arr)
    assert rejects(r) == [(1, "x.type")]
    wide = pa.array([Decimal("1.5"), Decimal(10) ** 30], pa.decimal128(38, 1))
    assert rejects(one("- {name: x, type: 'decimal(18,2)'}", wide)) == [(1, "x.type")]


def test_ints_into_decimal() -> None:
    r = one("- {name: x, type: 'decimal(5,2)'}", pa.array([5, 999, 1000, -999, -1000], pa.int64()))
    assert rejects(r) == [(2, "x.type"), (4, "x.type")]
    assert valid_values(r) == [Decimal("5.00"), Decimal("999.00"), Decimal("-999.00")]


def test_floats_into_decimal_by_their_shortest_text() -> None:
    r = one("- {name: x, type: 'decimal(18,2)'}", [0.1, 12.505, 1234.56, 1e20, float("nan"), -0.5])
    assert rejects(r) == [(1, "x.type"), (3, "x.type"), (4, "x.type")]
    assert valid_values(r) == [Decimal("0.10"), Decimal("1234.56"), Decimal("-0.50")]
    r32 = one("- {name: x, type: 'decimal(18,2)'}", pa.array([0.1], pa.float32()))
    assert valid_values(r32) == [Decimal("0.10")]


def test_decimal_bounds_and_message_scale() -> None:
    r = one("- {name: x, type: 'decimal(18,2)', constraints: {min: 0.01, max: 99999999.99}}",
            pa.array([Decimal("0.00"), Decimal("0.01"), Decimal("100000000.00"), None], pa.decimal128(18, 2)))
    assert rejects(r) == [(0, "x.min"), (2, "x.max")]
    assert messages(r) == [
        "field x violates constraint min: got 0.00, expected >= 0.01",
        "field x violates constraint max: got 100000000.00, expected <= 99999999.99",
    ]
    assert r.rejects.column("value").to_pylist() == ["0.00", "100000000.00"]


def test_wide_decimal_bounds_use_the_general_path() -> None:
    # precision > 18: no int64 fast path; the Arrow comparison must agree
    r = one("- {name: x, type: 'decimal(30,2)', constraints: {min: 0.01}}",
            pa.array([Decimal("0.00"), Decimal("5.00"), Decimal(10) ** 27], pa.decimal128(30, 2)))
    assert rejects(r) == [(0, "x.min")]


# --------------------------------------------------------------------------- strings -> types


def test_strings_into_numbers_only_when_accepted() -> None:
    r = one("- {name: x, type: int32}", ["12"])
    assert rejects(r) == [(0, "x.type")]
    assert messages(r) == ["field x violates constraint type: got '12', expected int32 "
                           "(set accept_strings: true to parse text)"]
    assert r.rejects.column("value").to_pylist() == ["12"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12", 12), ("-7", -7), ("+3", 3), ("12.0", 12), ("1e3", 1000), ("12.5", None), (" 12", None),
     ("", None), ("0x10", None), ("2147483648", None), ("99999999999999999999999", None), ("1_0", None)],
)
def test_exact_string_parsing_into_int32(text: str, expected: int | None) -> None:
    r = one("- {name: x, type: int32, accept_strings: true}", [text])
    if expected is None:
        assert rejects(r) == [(0, "x.type")]
        assert messages(r) == [f"field x violates constraint type: got {text!r}, expected int32"]
    else:
        assert valid_values(r) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12.50", Decimal("12.50")), ("12.5", Decimal("12.50")), ("12.505", None), ("-0.01", Decimal("-0.01")),
     ("1.5e2", Decimal("150.00")), ("1250e-2", Decimal("12.50")), ("abc", None), ("1.", Decimal("1.00")),
     (".5", Decimal("0.50")), (".", None), ("nan", None), ("1e17", None), ("9999999999999999.99", Decimal(
         "9999999999999999.99"))],
)
def test_exact_string_parsing_into_decimal(text: str, expected: Decimal | None) -> None:
    r = one("- {name: x, type: 'decimal(18,2)', accept_strings: true}", [text])
    if expected is None:
        assert rejects(r) == [(0, "x.type")]
    else:
        assert valid_values(r) == [expected]


def test_string_parsing_into_floats_and_bools() -> None:
    r = one("- {name: x, type: float64, accept_strings: true}", ["0.1", "1e400", "nan", "inf", "-2.5e-3"])
    assert rejects(r) == [(1, "x.type"), (2, "x.type"), (3, "x.type")]
    assert valid_values(r) == [0.1, -0.0025]
    b = one("- {name: x, type: bool, accept_strings: true}", ["true", "false", "True", "1"])
    assert rejects(b) == [(2, "x.type"), (3, "x.type")]
    assert valid_values(b) == [True, False]


def test_string_parsing_into_dates() -> None:
    r = one("- {name: x, type: date, accept_strings: true}", ["2024-02-29", "2023-02-29", "2024-1-5", None])
    assert rejects(r) == [(1, "x.type"), (2, "x.type")]
    assert valid_values(r) == [dt.date(2024, 2, 29), None]


def test_string_parsing_into_zoned_timestamps() -> None:
    r = one("- {name: x, type: 'timestamp(us, UTC)', accept_strings: true}", [
        "2024-01-01T10:00:00Z", "2024-01-01T10:00:00+02:00", "2024-01-01 10:00:00.5-0130",
        "2024-01-01T10:00:00", "2024-01-01T10:00:00.1234567Z", "2024-01-01T10:00:00.1234560Z",
    ])
    assert rejects(r) == [(3, "x.type"), (4, "x.type")]
    assert messages(r)[0] == (
        "field x violates constraint type: got '2024-01-01T10:00:00' (no time zone), "
        "expected timestamp(us, UTC)"
    )
    assert valid_values(r) == [
        dt.datetime(2024, 1, 1, 10, tzinfo=UTC), dt.datetime(2024, 1, 1, 8, tzinfo=UTC),
        dt.datetime(2024, 1, 1, 11, 30, 0, 500000, tzinfo=UTC),
        dt.datetime(2024, 1, 1, 10, 0, 0, 123456, tzinfo=UTC),
    ]


def test_string_parsing_into_naive_timestamps_reads_offsets_as_utc() -> None:
    """A naive field holds UTC wall-clock times (docs/types.md, "Naive timestamps"):
    text with an offset converts to its UTC wall clock, on the fast path (one layout)
    and the general one (mixed layouts) alike."""
    texts = ["2024-01-01T10:00:00.123", "2024-01-01T10:00:00Z", "2024-01-01T10:00:00.1234",
             "2024-01-01T10:00:00.500+02:00", "2024-01-01 10:00:00-0130"]
    want = [dt.datetime(2024, 1, 1, 10, 0, 0, 123000), dt.datetime(2024, 1, 1, 10),
            dt.datetime(2024, 1, 1, 8, 0, 0, 500000), dt.datetime(2024, 1, 1, 11, 30)]
    r = one("- {name: x, type: timestamp(ms), accept_strings: true}", texts)
    assert rejects(r) == [(2, "x.type")]
    assert valid_values(r) == want
    assert r.valid.column("x").type == pa.timestamp("ms")
    for text in texts[3:4]:  # one layout per column: the fixed-layout reader
        assert valid_values(one("- {name: x, type: timestamp(ms), accept_strings: true}", [text] * 3)) == \
            [dt.datetime(2024, 1, 1, 8, 0, 0, 500000)] * 3


# --------------------------------------------------------------------------- timestamps, dates


def test_naive_timestamp_where_a_zone_is_required() -> None:
    arr = pa.array([dt.datetime(2024, 1, 1, 10)], pa.timestamp("us"))
    r = one("- {name: x, type: 'timestamp(us, UTC)'}", arr)
    assert rejects(r) == [(0, "x.type")]
    assert messages(r) == [
        "field x violates constraint type: got 2024-01-01 10:00:00.000000 (no time zone), "
        "expected timestamp(us, UTC)"
    ]


def test_zoned_timestamps_convert_to_the_declared_zone() -> None:
    moment = dt.datetime(2024, 6, 1, 12, tzinfo=UTC)
    arr = pa.array([moment], pa.timestamp("ms", tz="Europe/Paris"))
    r = one("- {name: x, type: 'timestamp(us, UTC)'}", arr)
    assert r.valid.column("x").type == pa.timestamp("us", tz="UTC")
    assert valid_values(r) == [moment]


def test_zoned_input_into_naive_field_converts_to_utc() -> None:
    """naive = UTC: a zoned value (any zone, any unit) into a naive field is its UTC wall
    clock, from Arrow columns and from Python datetimes alike."""
    moment = dt.datetime(2024, 6, 1, 12, 30, tzinfo=UTC)
    for zone in ("UTC", "Europe/Paris", "America/New_York"):
        arr = pa.array([moment, None], pa.timestamp("ms", tz=zone))
        r = one("- {name: x, type: timestamp(s)}", arr)
        assert messages(r) == []
        assert r.valid.column("x").type == pa.timestamp("s")
        assert valid_values(r) == [dt.datetime(2024, 6, 1, 12, 30), None]
    paris = moment.astimezone(ZoneInfo("Europe/Paris"))  # 14:30+02:00
    r = validate([{"x": paris}, {"x": dt.datetime(2024, 6, 1, 9)}, {"x": "2024-06-01T14:30:00+02:00"}],
                 compiled("- {name: x, type: timestamp(us)}"))
    assert valid_values(r) == [dt.datetime(2024, 6, 1, 12, 30), dt.datetime(2024, 6, 1, 9),
                               dt.datetime(2024, 6, 1, 12, 30)]
    # Truncation is still refused: a zoned value with milliseconds into timestamp(s).
    r = one("- {name: x, type: timestamp(s)}", pa.array([moment.replace(microsecond=1000)],
                                                        pa.timestamp("ms", tz="UTC")))
    assert rejects(r) == [(0, "x.type")]


def test_finer_units_must_not_truncate() -> None:
    ns = pa.array([1_000_000_000_123_456_000, 1_000_000_000_123_456_789], pa.int64()).cast(pa.timestamp("ns"))
    r = one("- {name: x, type: timestamp(us)}", ns)
    assert rejects(r) == [(1, "x.type")]
    assert r.valid.column("x").cast(pa.int64()).to_pylist() == [1_000_000_000_123_456]
    coarse = pa.array([1, 2], pa.int64()).cast(pa.timestamp("s"))
    assert one("- {name: x, type: timestamp(ms)}", coarse).valid.column("x").cast(pa.int64()).to_pylist() == [
        1000, 2000]


def test_dates_accept_midnight_only() -> None:
    ts = pa.array([dt.datetime(2024, 1, 2), dt.datetime(2024, 1, 2, 10)], pa.timestamp("us"))
    r = one("- {name: x, type: date}", ts)
    assert rejects(r) == [(1, "x.type")]
    assert valid_values(r) == [dt.date(2024, 1, 2)]
    d64 = pa.array([dt.date(2024, 1, 3)], pa.date64())
    assert valid_values(one("- {name: x, type: date}", d64)) == [dt.date(2024, 1, 3)]
    zoned = pa.array([dt.datetime(2024, 1, 2, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))
    assert rejects(one("- {name: x, type: date}", zoned)) == [(0, "x.type")]


def test_dates_into_naive_timestamps() -> None:
    r = one("- {name: x, type: timestamp(s)}", pa.array([dt.date(2024, 1, 2)], pa.date32()))
    assert valid_values(r) == [dt.datetime(2024, 1, 2)]
    assert rejects(one("- {name: x, type: 'timestamp(s, UTC)'}", pa.array([dt.date(2024, 1, 2)]))) == [
        (0, "x.type")]


def test_date_and_timestamp_bounds() -> None:
    r = one("- {name: x, type: date, constraints: {min: 2020-01-01, max: '2030-01-01'}}",
            pa.array([dt.date(2019, 12, 31), dt.date(2020, 1, 1), dt.date(2030, 1, 2)]))
    assert rejects(r) == [(0, "x.min"), (2, "x.max")]
    assert messages(r)[0] == "field x violates constraint min: got 2019-12-31, expected >= 2020-01-01"
    moments = [dt.datetime(2023, 12, 31, 22, 59, 59, tzinfo=UTC), dt.datetime(2023, 12, 31, 23, tzinfo=UTC)]
    ts = pa.array(moments, pa.timestamp("us", tz="UTC"))
    rt = one("- {name: x, type: 'timestamp(us, UTC)', constraints: {min: '2024-01-01T00:00:00+01:00'}}", ts)
    assert rejects(rt) == [(0, "x.min")]


# --------------------------------------------------------------------------- strings


def test_string_types_decode_and_non_strings_are_rejected() -> None:
    c = "- {name: x, type: string}"
    assert valid_values(one(c, pa.array(["a", None], pa.large_string()))) == ["a", None]
    assert valid_values(one(c, pa.array(["b", "a", "b"]).dictionary_encode())) == ["b", "a", "b"]
    r = one(c, pa.array([5], pa.int64()))
    assert messages(r) == ["field x violates constraint type: got 5, expected string"]


def test_empty_string_is_not_null_unless_declared() -> None:
    plain = one("- {name: x, type: string, constraints: {nullable: false}}", ["", None])
    assert rejects(plain) == [(1, "x.not_null")]
    assert valid_values(plain) == [""]
    as_null = one("- {name: x, type: string, constraints: {nullable: false, empty_as_null: true}}", ["", "a"])
    assert rejects(as_null) == [(0, "x.not_null")]
    assert as_null.rejects.column("value").to_pylist() == [None]


def test_lengths_count_characters() -> None:
    r = one("- {name: x, type: string, constraints: {min_length: 2, max_length: 3}}",
            ["a", "ab", "abc", "abcd", "é", "éé", "ééé", "éééé", None])
    assert rejects(r) == [(0, "x.min_length"), (3, "x.max_length"), (4, "x.min_length"), (7, "x.max_length")]
    assert messages(r)[:2] == [
        "field x violates constraint min_length: got length 1, expected >= 2",
        "field x violates constraint max_length: got length 4, expected <= 3",
    ]
    assert r.rejects.column("value").to_pylist()[:2] == ["a", "abcd"]


def test_pattern_is_a_full_match() -> None:
    r = one("- {name: x, type: string, constraints: {pattern: '^APP-[0-9]{12}$'}}",
            ["APP-000000000001", "abc", "APP-0000000000012", "xAPP-000000000001", None, "APP-00000000000é"])
    assert rejects(r) == [(1, "x.pattern"), (2, "x.pattern"), (3, "x.pattern"), (5, "x.pattern")]
    assert messages(r)[0] == (
        "field x violates constraint pattern: got 'abc', expected a full match of ^APP-[0-9]{12}$")
    unanchored = one("- {name: x, type: string, constraints: {pattern: 'a|b'}}", ["a", "ab", "b"])
    assert rejects(unanchored) == [(1, "x.pattern")]


def test_enum_values() -> None:
    r = one("- {name: x, type: enum, values: [a, b, c]}", ["a", "x", None, "c", "A"])
    assert rejects(r) == [(1, "x.enum"), (4, "x.enum")]
    assert messages(r) == [
        "field x violates constraint enum: got 'x', expected one of a, b, c",
        "field x violates constraint enum: got 'A', expected one of a, b, c",
    ]


def test_string_repr_in_messages_escapes_quotes() -> None:
    r = one("- {name: x, type: enum, values: [a]}", ["it's"])
    assert messages(r) == ["field x violates constraint enum: got \"it's\", expected one of a"]
    assert r.rejects.column("value").to_pylist() == ["it's"]


# --------------------------------------------------------------------------- defaults, missing


def test_default_fills_nulls_before_other_rules() -> None:
    r = one("- {name: x, type: int32, constraints: {default: 0, min: 0, nullable: false}}", [None, 5, -1])
    assert rejects(r) == [(2, "x.min")]
    assert valid_values(r) == [0, 5]


def test_default_fills_a_missing_column() -> None:
    c = compiled("""
        - {name: a, type: int32}
        - {name: b, type: 'decimal(10,2)', constraints: {default: 1.5}}
        - {name: d, type: date, constraints: {default: '2024-01-01'}}
    """)
    r = validate(pa.record_batch([pa.array([1, 2], pa.int32())], names=["a"]), c)
    assert r.valid.column("b").to_pylist() == [Decimal("1.50"), Decimal("1.50")]
    assert r.valid.column("d").to_pylist() == [dt.date(2024, 1, 1)] * 2
    check_invariants(r, c)


def test_empty_string_with_default() -> None:
    r = one("- {name: x, type: string, constraints: {empty_as_null: true, default: zz}}", ["", "a", None])
    assert valid_values(r) == ["zz", "a", "zz"]


def test_type_rejected_values_are_not_defaulted_or_checked_further() -> None:
    r = one("- {name: x, type: int32, constraints: {default: 10, min: 10, nullable: false}}",
            pa.array([12.5, None, 11.0, 5.0]))
    assert rejects(r) == [(0, "x.type"), (3, "x.min")]
    assert valid_values(r) == [10, 11]
    # a value that failed conversion is not also "null"
    strict = one("- {name: x, type: int32, constraints: {nullable: false, max: 1}}", pa.array([12.5, 2.0]))
    assert rejects(strict) == [(0, "x.type"), (1, "x.max")]


def test_a_key_absent_from_a_record_is_reported_as_a_missing_key() -> None:
    """A list of dicts (decoded JSON: the stream, the HTTP ingest) has keys, not columns:
    a required field's key absent from some records, or from every record, is a
    ``missing`` reject that says so (it said ``got no column``); an explicit null is a
    ``not_null`` reject, not a missing key."""
    c = compiled("""
        - {name: id, type: string, constraints: {required: true}}
        - {name: v, type: int32, constraints: {required: true}}
    """)
    some = validate([{"id": "a", "v": 1}, {"v": 2}, {"id": None, "v": 3}], c)
    assert rejects(some) == [(1, "id.missing"), (2, "id.not_null")]
    assert messages(some)[0] == "field id violates constraint missing: got no key, expected a key id"
    every = validate([{"v": 1}, {"v": 2}], c)
    assert rejects(every) == [(0, "id.missing"), (1, "id.missing")]
    assert set(messages(every)) == {"field id violates constraint missing: got no key, expected a key id"}
    check_invariants(some, c)
    check_invariants(every, c)


def test_missing_required_column_rejects_every_row() -> None:
    c = compiled("""
        - {name: id, type: string, constraints: {required: true}}
        - {name: v, type: int32}
    """)
    r = validate(pa.record_batch([pa.array([1, 2], pa.int32())], names=["v"]), c)
    assert rejects(r) == [(0, "id.missing"), (1, "id.missing")]
    assert messages(r)[0] == "field id violates constraint missing: got no column, expected a column id"
    assert r.rejects.column("value").to_pylist() == [None, None]
    assert r.valid.num_rows == 0
    check_invariants(r, c)


def test_missing_optional_column_is_null() -> None:
    c = compiled("""
        - {name: v, type: int32}
        - {name: w, type: float64}
        - {name: nn, type: int32, constraints: {nullable: false}}
    """)
    r = validate(pa.record_batch([pa.array([1], pa.int32())], names=["v"]), c)
    assert rejects(r) == [(0, "nn.not_null")]
    both = [pa.array([1], pa.int32()), pa.array([2], pa.int32())]
    r2 = validate(pa.record_batch(both, names=["v", "nn"]), c)
    assert r2.valid.to_pylist() == [{"v": 1, "w": None, "nn": 2}]


# --------------------------------------------------------------------------- rows, counts


def test_several_errors_in_one_row_are_all_reported() -> None:
    c = compiled("""
        - {name: id, type: string, constraints: {pattern: '^[A-Z]{3}$', max_length: 3}}
        - {name: amount, type: 'decimal(10,2)', constraints: {min: 0.01}}
        - {name: n, type: int32, constraints: {nullable: false}}
    """)
    batch = pa.record_batch(
        [pa.array(["abcd", "ABC"]), pa.array([Decimal("0.00"), Decimal("1.00")], pa.decimal128(10, 2)),
         pa.array([None, 1], pa.int32())],
        names=["id", "amount", "n"],
    )
    r = validate(batch, c)
    assert rejects(r) == [(0, "id.max_length"), (0, "id.pattern"), (0, "amount.min"), (0, "n.not_null")]
    assert r.rejects.column("reason").to_pylist() == ["max_length", "pattern", "min", "not_null"]
    assert r.rejects.column("field").to_pylist() == ["id", "id", "amount", "n"]
    assert r.rejected_rows == 1
    assert r.counts.input_rows == 2 and r.counts.valid_rows == 1 and r.counts.rejected_rows == 1
    assert dict(r.counts.by_rule) == {"amount.min": 1, "id.max_length": 1, "id.pattern": 1, "n.not_null": 1}
    assert r.counts.reject_count == 4
    assert r.valid_row_index.to_pylist() == [1]
    check_invariants(r, c)


def test_empty_batch() -> None:
    c = compiled("- {name: x, type: int32, constraints: {required: true}}")
    r = validate(pa.record_batch([pa.array([], pa.int64())], names=["x"]), c)
    assert r.valid.num_rows == 0 and r.rejects.num_rows == 0 and r.counts.input_rows == 0
    check_invariants(r, c)
    r2 = validate([], c)
    assert r2.valid.num_rows == 0
    check_invariants(r2, c)


def test_one_row_batch() -> None:
    c = compiled("- {name: x, type: int32, constraints: {min: 1}}")
    assert validate(pa.record_batch([pa.array([1])], names=["x"]), c).valid.to_pylist() == [{"x": 1}]
    r = validate(pa.record_batch([pa.array([0])], names=["x"]), c)
    assert rejects(r) == [(0, "x.min")]
    check_invariants(r, c)


def test_extra_columns_ignored_and_order_free() -> None:
    c = compiled("""
        - {name: a, type: int32}
        - {name: b, type: string}
    """)
    columns = [pa.array(["s"]), pa.array([9]), pa.array([1], pa.int32())]
    batch = pa.record_batch(columns, names=["b", "extra", "a"])
    r = validate(batch, c)
    assert r.valid.to_pylist() == [{"a": 1, "b": "s"}]
    check_invariants(r, c)


def test_duplicate_columns_are_a_source_error() -> None:
    c = compiled("- {name: a, type: int32}")
    batch = pa.record_batch([pa.array([1]), pa.array([2])], names=["a", "a"])
    with pytest.raises(SourceError, match="several columns named 'a'"):
        validate(batch, c)


def test_unknown_input_kind_is_a_type_error() -> None:
    c = compiled("- {name: a, type: int32}")
    with pytest.raises(TypeError, match="expected a pyarrow RecordBatch"):
        validate("a,b", c)
    with pytest.raises(TypeError, match="row 1 is a list"):
        validate([{"a": 1}, [1]], c)


def test_chunked_table_equals_batch() -> None:
    c = compiled("""
        - {name: a, type: int32, constraints: {min: 0}}
        - {name: b, type: string, constraints: {pattern: '[a-z]+'}}
    """)
    t1 = pa.table({"a": pa.array([1, -1, 2], pa.int64()), "b": ["x", "y", "Z"]})
    t2 = pa.table({"a": pa.array([3, 2**40], pa.int64()), "b": ["w", "v"]})
    table = pa.concat_tables([t1, t2])
    assert table.column("a").num_chunks == 2
    from_table = validate(table, c)
    from_batch = validate(table.combine_chunks().to_batches()[0], c)
    assert from_table.rejects.equals(from_batch.rejects)
    assert from_table.valid.equals(from_batch.valid)
    assert rejects(from_table) == [(1, "a.min"), (2, "b.pattern"), (4, "a.type")]
    check_invariants(from_table, c)


def test_raise_if_rejected() -> None:
    c = compiled("- {name: x, type: int32, constraints: {min: 1}}")
    validate(pa.record_batch([pa.array([1])], names=["x"]), c).raise_if_rejected()
    r = validate(pa.record_batch([pa.array([0, -1, 5])], names=["x"]), c)
    with pytest.raises(RowsRejected) as info:
        r.raise_if_rejected()
    assert info.value.rejected == 2
    assert "2 of 3 rows rejected" in str(info.value)
    assert "field x violates constraint min: got 0, expected >= 1" in str(info.value)


def test_reason_code_is_reexported() -> None:
    assert result_module.ReasonCode is ReasonCode
    assert REJECT_SCHEMA.names == ["row", "field", "rule", "reason", "message", "value"]
    assert REJECT_SCHEMA.field("row").type == pa.int64()


def test_result_refuses_unconserved_counts() -> None:
    c = compiled("- {name: x, type: int32}")
    good = validate(pa.record_batch([pa.array([1])], names=["x"]), c)
    with pytest.raises(ValueError, match="counts not conserved"):
        ValidationResult(good.valid, good.rejects, good.valid_row_index, input_rows=2)


# --------------------------------------------------------------------------- list of dicts


def test_list_of_dicts_mixed_python_values() -> None:
    c = compiled("""
        - {name: id, type: string, constraints: {required: true}}
        - {name: n, type: int64}
        - {name: amount, type: 'decimal(18,2)', accept_strings: true}
        - {name: f, type: float64}
    """)
    rows: list[dict[str, Any]] = [
        {"id": "a", "n": 2**70, "amount": 1234.56, "f": 1},
        {"id": "b", "n": True, "amount": "12.505", "f": 2**53 + 1},
        {"id": "c", "n": 12.0, "amount": "12.50", "f": 0.5, "extra": [1]},
        {"n": {"nested": 1}, "amount": Decimal("7.1")},
        {"id": 5, "n": None, "amount": None, "f": None},
        {"id": "d", "n": -(2**63), "amount": 2**70, "f": 2**70},
    ]
    r = validate(rows, c)
    assert rejects(r) == [
        (0, "n.type"), (1, "n.type"), (1, "amount.type"), (1, "f.type"), (3, "id.missing"), (3, "n.type"),
        (4, "id.type"), (5, "amount.type"),
    ]
    by_row = {(row, rule): m for row, rule, m in zip(
        r.rejects.column("row").to_pylist(), r.rejects.column("rule").to_pylist(), messages(r), strict=True)}
    assert by_row[(0, "n.type")] == (
        "field n violates constraint type: got 1180591620717411303424, expected int64")
    assert by_row[(1, "n.type")] == "field n violates constraint type: got true, expected int64"
    assert by_row[(3, "n.type")] == "field n violates constraint type: got {'nested': 1}, expected int64"
    assert by_row[(3, "id.missing")] == (
        "field id violates constraint missing: got no key, expected a key id")
    assert r.valid.to_pylist() == [
        {"id": "c", "n": 12, "amount": Decimal("12.50"), "f": 0.5},
    ]
    assert r.valid_row_index.to_pylist() == [2]
    check_invariants(r, c)
    # 2**70 is exactly a float64; a homogeneous int column beyond int64 still converts
    floats = validate([{"id": "x", "f": 2**70}, {"id": "y", "f": 2**70 + 1}], c)
    assert rejects(floats) == [(1, "f.type")]


def test_list_of_dicts_decimal_objects() -> None:
    c = compiled("""
        - {name: x, type: 'decimal(5,2)'}
        - {name: s, type: string}
    """)
    values = [Decimal("NaN"), Decimal("1.5"), Decimal("1E+2"), Decimal("1e-30"), Decimal("123456.7")]
    r = validate([{"x": v, "s": "a"} for v in values] + [{"x": None, "s": Decimal("1.5")}], c)
    assert rejects(r) == [(0, "x.type"), (3, "x.type"), (4, "x.type"), (5, "s.type")]
    assert messages(r) == [
        "field x violates constraint type: got NaN, expected decimal(5,2)",
        "field x violates constraint type: got 1E-30, expected decimal(5,2)",
        "field x violates constraint type: got 123456.7, expected decimal(5,2)",
        "field s violates constraint type: got 1.5, expected string",
    ]
    assert r.valid.column("x").to_pylist() == [Decimal("1.50"), Decimal("100.00")]


def test_list_of_dicts_absent_key_uses_default() -> None:
    c = compiled("- {name: n, type: int32, constraints: {default: 7}}")
    r = validate([{"n": 1}, {}, {"n": None}], c)
    assert valid_values(r, "n") == [1, 7, 7]


def test_list_of_dicts_datetimes() -> None:
    c = compiled("""
        - {name: t, type: 'timestamp(us, UTC)'}
        - {name: d, type: date}
    """)
    r = validate([
        {"t": dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2))),
         "d": dt.date(2024, 1, 1)},
        {"t": dt.datetime(2024, 1, 1, 12), "d": "2024-01-01"},
        # JSON has no date/time type: ISO 8601 text is accepted for them in dict rows
        {"t": "2024-01-01T12:00:00+02:00", "d": "2024-01-02"},
        {"t": "2024-01-01T12:00:00", "d": "2024-13-01"},
    ], c)
    assert r.valid.to_pylist() == [
        {"t": dt.datetime(2024, 1, 1, 10, tzinfo=UTC), "d": dt.date(2024, 1, 1)},
        {"t": dt.datetime(2024, 1, 1, 10, tzinfo=UTC), "d": dt.date(2024, 1, 2)},
    ]
    # naive datetime / naive text into a zoned field, and an impossible date: type rejects
    assert rejects(r) == [(1, "t.type"), (3, "t.type"), (3, "d.type")]


# --------------------------------------------------------------------------- fast paths


@pytest.mark.parametrize(
    ("pattern", "fixed"),
    [("^APP-[0-9]{12}$", True), ("[A-Z]{2}\\d{3}", True), ("^ab\\.c$", True), ("[a-cx]{2}", True),
     ("a+", False), ("a|b", False), ("[^a]", False), ("(ab)", False), ("a.c", False), ("a{1,3}", False),
     ("é", False), ("[a-z]?", False), ("", False)],
)
def test_fixed_width_patterns_compile_only_when_fixed(pattern: str, fixed: bool) -> None:
    assert (compile_fixed_width(pattern) is not None) is fixed


@pytest.mark.parametrize("block_rows", [7, 1 << 16])
@pytest.mark.parametrize("pattern", ["^APP-[0-9]{12}$", "[A-Z]{2}\\d{3}", "[a-cx-z_]{3}-\\d", "ab\\.c"])
def test_fixed_width_pattern_equals_re2(
    pattern: str, block_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(masks_module, "_BLOCK_ROWS", block_rows)
    rng = np.random.default_rng(7)
    alphabet = list("APP-0123456789abcxyzABC_.é- ")
    texts: list[str | None] = ["APP-000000000001", "AB123", "abc-1", "ab.c", "", None]
    for _ in range(3000):
        k = int(rng.integers(0, 18))
        texts.append("".join(rng.choice(alphabet, k)))
    arr = pa.array(texts).slice(1)  # an offset, to test sliced buffers
    runs = compile_fixed_width(pattern)
    assert runs is not None
    fast = fixed_width_pattern(arr, runs)
    assert fast is not None
    expected = pc.fill_null(pc.invert(pc.match_substring_regex(arr, f"^(?:{pattern})$")), False)
    assert fast.tolist() == expected.to_pylist()
    # the regular layout (every row the pattern's width) takes the no-gather branch
    same_width = pa.array(["APP-000000000001", "APP-00000000000x"] * 4)
    apps = compile_fixed_width("^APP-[0-9]{12}$")
    assert apps is not None
    regular = fixed_width_pattern(same_width, apps)
    assert regular is not None and regular.tolist() == [False, True] * 4


def test_fast_paths_ignore_data_under_null_slots() -> None:
    # Arrow allows a null slot to span bytes; they must not be read as a value
    data = b"APP-000000000001" + b"APP-00000000000x" + b"ABCD"
    offsets = np.array([0, 16, 32, 36], dtype=np.int32)
    validity = pa.py_buffer(np.packbits(np.array([True, False, True]), bitorder="little"))
    arr = pa.Array.from_buffers(pa.string(), 3, [validity, pa.py_buffer(offsets), pa.py_buffer(data)])
    r = one("- {name: x, type: string, constraints: {pattern: '^APP-[0-9]{12}$', max_length: 3}}", arr)
    assert rejects(r) == [(0, "x.max_length"), (2, "x.max_length"), (2, "x.pattern")]


def test_string_lengths_fast_path() -> None:
    arr = pa.array(["ab", None, "", "abcd"]).slice(1)
    lengths = string_lengths(arr)
    assert lengths is not None and lengths.tolist() == [0, 0, 4]
    assert string_lengths(pa.array(["é"])) is None
    assert string_lengths(pa.array([1])) is None


def test_decimal_words() -> None:
    arr = pa.array([Decimal("-1.50"), Decimal("2.25"), None], pa.decimal128(18, 2)).slice(1)
    words = decimal_words(arr)
    assert words is not None and words[:1].tolist() == [225]
    assert decimal_words(pa.array([Decimal("1")], pa.decimal128(19, 0))) is None


@pytest.mark.parametrize(
    "arr",
    [
        pa.array([1, None, 3, 4, 5], pa.int32()),
        pa.array([1.5, 2.5, None, 4.5, 5.5], pa.float64()),
        pa.array([Decimal("1.1"), None, Decimal("-3.3"), Decimal("4.4"), None], pa.decimal128(18, 1)),
        pa.array([0, 1, 2, None, 4], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array([dt.date(2024, 1, i) for i in range(1, 6)], pa.date32()),
        pa.array(["a", None, "c", "d", "e"]),
        pa.array([True, False, None, True, False]),
    ],
)
def test_filter_rows_equals_arrow_filter(arr: pa.Array) -> None:
    keep = np.array([True, False, True, True, False])
    for a, k in ((arr, keep), (arr.slice(1), keep[1:])):
        out = filter_rows(a, k, pa.array(k))
        out.validate(full=True)
        assert out.equals(a.filter(pa.array(k)))


def test_parallel_path_equals_sequential(monkeypatch: pytest.MonkeyPatch) -> None:
    c = compiled("""
        - {name: id, type: string, constraints: {pattern: '^[A-Z]{2}[0-9]{3}$'}}
        - {name: v, type: 'decimal(10,2)', constraints: {min: 0}}
        - {name: s, type: enum, values: [a, b]}
    """)
    rng = np.random.default_rng(3)
    n = 5000
    ids = [f"AB{i % 1000:03d}" if i % 37 else "bad" for i in range(n)]
    cents = rng.integers(-10, 100_000, n)
    batch = pa.record_batch([
        pa.array(ids), pa.array([Decimal(int(x)).scaleb(-2) for x in cents], pa.decimal128(10, 2)),
        pa.array(rng.choice(["a", "b", "c"], n)),
    ], names=["id", "v", "s"])
    sequential = validate(batch, c)
    monkeypatch.setattr(validator_module, "PARALLEL_MIN_ROWS", 1)
    parallel = validate(batch, c)
    assert parallel.rejects.equals(sequential.rejects)
    assert parallel.valid.equals(sequential.valid)
    check_invariants(parallel, c)


# --------------------------------------------------------------------------- CLI


SCHEMA_YAML = """\
name: cli_check
version: 1.2.3
fields:
  - name: id
    type: string
    constraints: {required: true, pattern: '^[a-z]+$'}
  - name: amount
    type: decimal(10,2)
    constraints: {min: 0.01}
"""


def _cli_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "cli_check.yaml").write_text(SCHEMA_YAML)
    good = tmp_path / "good.parquet"
    amounts = pa.array([Decimal("1.00")] * 2, pa.decimal128(10, 2))
    pq.write_table(pa.table({"id": ["a", "b"], "amount": amounts}), good)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": ["a", "B", "c", "D"],
                             "amount": pa.array([Decimal("0.00"), Decimal("1.00"), Decimal("0.00"), Decimal(
                                 "0.00")], pa.decimal128(10, 2))}), bad)
    return schemas, good, bad


def test_cli_validate_clean_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schemas, good, _ = _cli_files(tmp_path)
    code = cli_main(["validate", "--schema", "cli_check", "--schemas-dir", str(schemas), str(good)])
    out = capsys.readouterr().out
    assert code == 0
    assert "cli_check 1.2.3" in out and "2 rows: 2 valid, 0 rejected" in out


def test_cli_validate_reports_top_reasons(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schemas, good, bad = _cli_files(tmp_path)
    code = cli_main(["validate", "--schema", "cli_check", "--schemas-dir", str(schemas), str(good), str(bad)])
    out = capsys.readouterr().out
    assert code == 1
    assert "2 files, 6 rows: 2 valid, 4 rejected (66.67%)" in out
    lines = out.splitlines()
    top = lines.index("top reasons (2 of 2 rules):")
    assert lines[top + 1].split() == ["amount.min", "3"]
    assert lines[top + 2].strip() == (
        f"{bad}#0: field amount violates constraint min: got 0.00, expected >= 0.01")
    assert len([x for x in lines if "amount violates" in x]) == 3


def test_cli_validate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schemas, _, bad = _cli_files(tmp_path)
    code = cli_main(["validate", "--json", "--schema", "cli_check", "--schemas-dir", str(schemas), str(bad)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert doc["input_rows"] == 4 and doc["valid_rows"] == 0 and doc["rejected_rows"] == 4
    assert doc["by_rule"] == {"amount.min": 3, "id.pattern": 2}
    assert doc["top"][1]["examples"] == [
        f"{bad}#1: field id violates constraint pattern: got 'B', expected a full match of ^[a-z]+$",
        f"{bad}#3: field id violates constraint pattern: got 'D', expected a full match of ^[a-z]+$",
    ]


def test_cli_validate_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    schemas, good, _ = _cli_files(tmp_path)
    assert cli_main(["validate", "--schema", "nope", "--schemas-dir", str(schemas), str(good)]) == 2
    assert "no schema named 'nope'" in capsys.readouterr().err
    assert cli_main(["validate", "--schema", "cli_check", "--schemas-dir", str(schemas),
                     str(tmp_path / "absent.parquet")]) == 2
    assert "cannot read" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli_main(["validate", str(good)])
    assert info.value.code == 2
