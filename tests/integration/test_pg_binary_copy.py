"""Binary COPY (features.sinks.pgbinary) against a real Postgres: every supported type
lands exactly as the CSV path lands it, and as the values themselves; what the encoder
cannot write exactly is refused (the sink then sends CSV)."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from features.compile.postgres import quote_ident
from features.sinks.pgbinary import copy_binary, encode_field
from features.sinks.postgres import copy_csv

pytestmark = pytest.mark.services

UTC = dt.UTC
BERLIN = dt.timezone(dt.timedelta(hours=1))


Rows = list[tuple[Any, ...]]


def _copy_both(conn: Any, table: pa.Table, ddl_types: list[str]) -> tuple[Rows, Rows]:
    """Load ``table`` into two fresh tables with columns of ``ddl_types``, by binary
    COPY (given the catalog's type names, as the sink does) and by CSV COPY; return both
    tables' rows in input order."""
    names = [quote_ident(n) for n in table.column_names]
    defs = ", ".join(f"{n} {t}" for n, t in zip(names, ddl_types, strict=True))
    with conn.transaction():  # a savepoint: a failure leaves the connection usable
        return _copy_into_two(conn, table, names, defs)


def _copy_into_two(conn: Any, table: pa.Table, names: list[str], defs: str) -> tuple[Rows, Rows]:
    out = []
    for fmt in ("binary", "csv"):
        conn.execute(f"CREATE TEMP TABLE t_{fmt} (_ord bigserial, {defs})")
        if fmt == "binary":
            types = dict(conn.execute("SELECT attname, atttypid::regtype::text FROM pg_attribute "
                                      "WHERE attrelid = 't_binary'::regclass AND attnum > 0").fetchall())
            encoded = copy_binary(table, [types[n] for n in table.column_names])
            assert encoded is not None
            parts, order = encoded
            cols, payload = [names[i] for i in order], parts
        else:
            cols, payload = names, [copy_csv(table)]
        copy = f"COPY t_{fmt} ({', '.join(cols)}) FROM STDIN (FORMAT {fmt})"
        with conn.cursor() as cur, cur.copy(copy) as cp:
            for part in payload:
                cp.write(part)
        out.append(conn.execute(f"SELECT {', '.join(names)} FROM t_{fmt} ORDER BY _ord",
                                prepare=False).fetchall())  # the tables' types change between calls
        conn.execute(f"DROP TABLE t_{fmt}")
    return out[0], out[1]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b) and type(a) is type(b)


@pytest.fixture()
def conn(pg_conn: Any) -> Any:
    pg_conn.execute("SET TimeZone = 'UTC'")  # what the sink's sessions use
    return pg_conn


def test_every_supported_type_lands_exactly_as_csv_and_as_the_values(conn: Any) -> None:
    decimals = [Decimal("1234.50"), Decimal("-0.07"), Decimal("0.00"), None, Decimal("9999999999999999.99"),
                Decimal("-9999999999999999.99"), Decimal("10000.00"), Decimal("0.01")]
    stamps = [dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
              dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), None,
              dt.datetime(1970, 1, 1, tzinfo=UTC), dt.datetime(1, 1, 1, tzinfo=UTC),
              dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), dt.datetime(2000, 1, 1, tzinfo=UTC),
              dt.datetime(2024, 2, 29, 12, tzinfo=BERLIN)]
    n = len(decimals)
    table = pa.table({
        "id": pa.array([f"k{i}" for i in range(n)]),
        "txt": pa.array(["plain", 'quote " and, comma', "line\nbreak\r\n", "", None, "ünïcødé ✓ 𝄞", "\\N",
                         "NULL"]),
        "dict_txt": pa.array(["a", "b", None, "a", "a", "c", "b", "a"]).dictionary_encode(),
        "const": pa.array(["same"] * n),
        "flag": pa.array([True, False, None, True, False, True, None, False]),
        "i8": pa.array([-128, 127, 0, None, 1, -1, 5, 6], pa.int8()),
        "i16": pa.array([-32768, 32767, 0, None, 1, -1, 5, 6], pa.int16()),
        "i32": pa.array([-2**31, 2**31 - 1, 0, None, 1, -1, 5, 6], pa.int32()),
        "i64": pa.array([-2**63, 2**63 - 1, 0, None, 1, -1, 5, 6], pa.int64()),
        "i64_small": pa.array([1, 2, 3, 4, None, 6, 7, 8], pa.int64()),
        "f32": pa.array([1.5, -0.0, float("nan"), float("inf"), None, 3.4e38, 1e-45, 0.1], pa.float32()),
        "f64": pa.array([0.1, -0.0, float("nan"), float("-inf"), None, 1.7976931348623157e308, 5e-324,
                         1 / 3]),
        "dec": pa.array(decimals, pa.decimal128(18, 2)),
        "dec_frac": pa.array([Decimal("0.12345"), Decimal("-0.99999"), None, Decimal("0"), Decimal("0.00001"),
                              Decimal("0.5"), Decimal("-0.1"), Decimal("0.10000")], pa.decimal128(5, 5)),
        "dec_int": pa.array([Decimal(10**17), Decimal(-(10**17) + 1), Decimal(0), None, Decimal(9999),
                             Decimal(10000), Decimal(-1), Decimal(123456789012345678)], pa.decimal128(18, 0)),
        "dec_odd": pa.array([Decimal("123.4567891"), Decimal("-0.0000001"), None,
                             Decimal("99999999999.9999999"), Decimal("1"), Decimal("-1.5"), Decimal("0"),
                             Decimal("10.0010001")],
                            pa.decimal128(18, 7)),
        "day": pa.array([dt.date(2000, 1, 1), dt.date(1999, 12, 31), None, dt.date(1, 1, 1),
                         dt.date(9999, 12, 31), dt.date(1970, 1, 1), dt.date(2024, 2, 29),
                         dt.date(2000, 3, 1)],
                        pa.date32()),
        "ts_utc": pa.array(stamps, pa.timestamp("us", "UTC")),
        "ts_berlin": pa.array(stamps, pa.timestamp("us", "Europe/Berlin")),
        "ts_ms": pa.array(stamps, pa.timestamp("ms", "UTC")),
        "ts_s": pa.array([s.replace(microsecond=0) if s else None for s in stamps], pa.timestamp("s", "UTC")),
        "naive": pa.array([s.replace(tzinfo=None) if s else None for s in stamps], pa.timestamp("us")),
    })
    ddl_types = ["text", "text", "text", "varchar(40)", "boolean", "smallint", "smallint", "integer",
                 "bigint", "integer", "real", "double precision", "numeric(18,2)", "numeric(5,5)",
                 "numeric(18,0)",
                 "numeric(18,7)", "date", "timestamptz", "timestamptz", "timestamptz", "timestamptz",
                 "timestamp"]
    binary, csv = _copy_both(conn, table, ddl_types)
    assert len(binary) == len(csv) == n
    for r, (b, c) in enumerate(zip(binary, csv, strict=True)):
        for name, bv, cv in zip(table.column_names, b, c, strict=True):
            assert _same(bv, cv), f"row {r} column {name}: binary {bv!r} != csv {cv!r}"
    # and the values are the input's (not merely the same mistake twice)
    expected = table.drop_columns(["ts_berlin"]).to_pylist()  # (Python cannot show 9999-12-31 in Berlin)
    for r, row in enumerate(binary):
        got = dict(zip(table.column_names, row, strict=True))
        assert got["dec"] == expected[r]["dec"] and got["dec_odd"] == expected[r]["dec_odd"]
        assert got["dec_frac"] == expected[r]["dec_frac"] and got["dec_int"] == expected[r]["dec_int"]
        assert got["ts_utc"] == expected[r]["ts_utc"] and got["ts_berlin"] == expected[r]["ts_utc"]
        assert got["naive"] == expected[r]["naive"] and got["day"] == expected[r]["day"]
        assert got["txt"] == expected[r]["txt"] and got["i64"] == expected[r]["i64"]
        assert got["const"] == "same" and got["dict_txt"] == expected[r]["dict_txt"]
    assert str(binary[0][table.column_names.index("dec")]) == "1234.50"  # the column's scale is kept


def test_sliced_and_chunked_columns_encode_their_own_rows(conn: Any) -> None:
    base = pa.table({
        "k": pa.chunked_array([["a", "b", "c"], [], ["d", "e"]]),
        "v": pa.chunked_array([pa.array([Decimal("1.10"), None, Decimal("-3.30")], pa.decimal128(10, 2)),
                               pa.array([], pa.decimal128(10, 2)),
                               pa.array([Decimal("4.40"), Decimal("5.50")], pa.decimal128(10, 2))]),
        "n": pa.chunked_array([[1, None, 3], [], [4, 5]], pa.int32()),
    })
    table = base.slice(1, 3)
    binary, csv = _copy_both(conn, table, ["text", "numeric(10,2)", "integer"])
    assert binary == csv == [("b", None, None), ("c", Decimal("-3.30"), 3), ("d", Decimal("4.40"), 4)]


def test_an_empty_table_is_a_valid_copy(conn: Any) -> None:
    table = pa.table({"k": pa.array([], pa.string()), "n": pa.array([], pa.int64())})
    assert _copy_both(conn, table, ["text", "bigint"]) == ([], [])


@pytest.mark.parametrize(("array", "pg_type"), [
    (pa.array(['{"a": 1}']), "jsonb"),                                  # a type the encoder does not write
    (pa.array([Decimal("1.5")], pa.decimal128(38, 2)), "numeric"),      # wider than int64
    (pa.array([0.1]), "real"),                                          # would round differently from CSV
    (pa.array([70000], pa.int32()), "smallint"),                        # too big: Postgres must refuse it
    (pa.array([1], pa.int64()), "text"),                                # types that do not match
    (pa.array([0], pa.timestamp("ns", "UTC")), "timestamp with time zone"),
    (pa.array([-2**63 + 1], pa.int64()).cast(pa.timestamp("us", "UTC")), "timestamp with time zone"),
    (pa.array([1.5]), "numeric"),
])
def test_what_cannot_be_written_exactly_is_left_to_csv(array: pa.Array, pg_type: str) -> None:
    assert encode_field(array, pg_type) is None
    assert copy_binary(pa.table({"c": array}), [pg_type]) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), precision=st.integers(1, 18))
def test_random_decimals_dates_and_times_land_exactly(conn: Any, data: st.DataObject, precision: int) -> None:
    scale = data.draw(st.integers(0, precision))
    bound = 10**precision - 1
    unscaled = data.draw(st.lists(st.one_of(st.none(), st.integers(-bound, bound)), min_size=1, max_size=40))
    values = [None if u is None else Decimal(u).scaleb(-scale) for u in unscaled]
    stamps = data.draw(st.lists(st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1, 1, 1),
                                                                   max_value=dt.datetime(9999, 12, 31))),
                                min_size=len(values), max_size=len(values)))
    table = pa.table({
        "d": pa.array(values, pa.decimal128(precision, scale)),
        "t": pa.array([s.replace(tzinfo=UTC) if s else None for s in stamps], pa.timestamp("us", "UTC")),
        "day": pa.array([s.date() if s else None for s in stamps], pa.date32()),
    })
    binary, csv = _copy_both(conn, table, [f"numeric({precision},{scale})", "timestamptz", "date"])
    assert binary == csv
    assert [r[0] for r in binary] == values
    assert [r[1] for r in binary] == [s.replace(tzinfo=UTC) if s else None for s in stamps]
