"""Compile once, enforce everywhere: the validator, the Postgres CHECKs and the GX
suite agree, on Hypothesis-generated rows pushed to the edges of every rule.

1. Row verdicts: a row the validator accepts is accepted by the check table
   (``render_check_table``: every field with its NOT NULL / DEFAULT / CHECKs), and a
   row it rejects is refused; the constraint Postgres names (the first violated one)
   is one of the validator's rule ids for that row.
2. Counts: GX's unexpected count per rule equals the validator's reject count per
   rule on the same batch.

Rows hold values of the exact declared type (conversion is the validator's job, and
Postgres would silently round a decimal with more places). What the loader does
before Postgres sees a row is done here too: an empty string of an ``empty_as_null``
field is sent as NULL, and a NULL of a field with a default is left out of the
INSERT so the column DEFAULT fills it.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from features.compile import CompiledSchema, compile_schema
from features.compile.expectations import run_suite
from features.compile.patterns import python_full_match
from features.compile.postgres import constraint_rule_ids, render_check_table
from features.schema import load_schema
from features.schema.model import (
    FLOAT_KINDS,
    INTEGER_KINDS,
    Constraints,
    Field,
    FieldType,
    Schema,
    TypeKind,
)
from features.validation import validate

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]

_INT_RANGE = {
    TypeKind.INT8: (-(2**7), 2**7 - 1),
    TypeKind.INT16: (-(2**15), 2**15 - 1),
    TypeKind.INT32: (-(2**31), 2**31 - 1),
    TypeKind.INT64: (-(2**63), 2**63 - 1),
}
# Text without NUL (Postgres text cannot hold it) or lone surrogates (not UTF-8).
_CHARS = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
_TRICKY = st.sampled_from(["", " ", "\n", "é", "\v", "٣", "😀", ".", "-", "A", "z", "0"])
# pandas/GX turn timestamps into nanoseconds somewhere; stay within their range.
_TS_MIN, _TS_MAX = dt.datetime(1700, 1, 1), dt.datetime(2250, 1, 1)


def _probe_schema() -> Schema:
    """What the shipped schemas lack: floats (NaN, inf), int8, naive timestamps, a
    ``.`` and ``$`` in a pattern, a non-nullable ``empty_as_null`` field."""
    return Schema(name="probe", version=(1, 0, 0), fields=(
        Field("code", FieldType(TypeKind.STRING),
              Constraints(required=True, nullable=False, pattern="[A-Z].[0-9]$|x")),
        Field("score", FieldType(TypeKind.FLOAT32), Constraints(min=0.3, max=1.5)),
        Field("ratio", FieldType(TypeKind.FLOAT64), Constraints(nullable=False, min=-1.0)),
        Field("tiny", FieldType(TypeKind.INT8), Constraints(min=-5, max=100)),
        Field("label", FieldType(TypeKind.STRING),
              Constraints(nullable=False, empty_as_null=True, min_length=2, max_length=4)),
        Field("kind", FieldType(TypeKind.ENUM), Constraints(default="b", has_default=True),
              values=("a", "b", "c d")),
        Field("wall", FieldType(TypeKind.TIMESTAMP, unit="ms"),
              Constraints(min="2000-01-01T00:00:00", max="2030-06-30T23:59:59.999000")),
        Field("day", FieldType(TypeKind.DATE), Constraints(min="1999-12-31")),
    ))


SCHEMAS: dict[str, CompiledSchema] = {
    **{p.stem: compile_schema(load_schema(p)) for p in sorted((ROOT / "schemas").glob("*.yaml"))},
    "probe": compile_schema(_probe_schema()),
}


# --------------------------------------------------------------------------- strategies


def _near(values: list[Any]) -> st.SearchStrategy[Any]:
    return st.sampled_from(sorted(set(values), key=repr))


def _int_values(f: Field) -> st.SearchStrategy[Any]:
    lo, hi = _INT_RANGE[f.type.kind]
    edges = [lo, hi, 0, -1, 1]
    for b in (f.constraints.min, f.constraints.max):
        if b is not None:
            edges += [int(b) + d for d in (-2, -1, 0, 1, 2)]
    return st.one_of(_near([e for e in edges if lo <= e <= hi]), st.integers(lo, hi))


def _decimal_values(f: Field) -> st.SearchStrategy[Any]:
    p, s = f.type.precision or 18, f.type.scale or 0
    step = Decimal(1).scaleb(-s)
    top = Decimal(10) ** (p - s) - step
    edges = [Decimal(0), step, -step, top, -top]
    for b in (f.constraints.min, f.constraints.max):
        if b is not None:
            edges += [Decimal(str(b)) + k * step for k in (-1, 0, 1)]
    quantum = Decimal(1).scaleb(-s)
    return st.one_of(
        _near([e.quantize(quantum) for e in edges if -top <= e <= top]),
        st.decimals(min_value=-top, max_value=top, places=s, allow_nan=False, allow_infinity=False),
    )


def _float_values(f: Field) -> st.SearchStrategy[Any]:
    width = 32 if f.type.kind is TypeKind.FLOAT32 else 64
    ftype = np.float32 if width == 32 else np.float64
    edges = [math.nan, math.inf, -math.inf, 0.0, -0.0]
    for b in (f.constraints.min, f.constraints.max):
        if b is not None:
            x = ftype(float(b))
            up, down = np.nextafter(x, ftype(math.inf)), np.nextafter(x, ftype(-math.inf))
            edges += [float(x), float(up), float(down)]
    return st.one_of(_near(edges), st.floats(width=width))


def _text_values(f: Field) -> st.SearchStrategy[Any]:
    c = f.constraints
    options: list[st.SearchStrategy[Any]] = [st.text(_CHARS, max_size=8), _TRICKY]
    if c.pattern is not None:
        valid = st.from_regex(python_full_match(c.pattern), fullmatch=True).filter(lambda v: "\x00" not in v)
        options += [valid, valid, st.tuples(valid, _TRICKY, st.booleans()).map(
            lambda t: t[0] + t[1] if t[2] else t[1] + t[0])]
        options.append(valid.map(lambda v: v[:-1]))
    if f.type.kind is TypeKind.ENUM:
        options += [st.sampled_from(f.values), st.sampled_from(f.values).map(str.upper),
                    st.sampled_from(f.values).map(lambda v: v + " ")]
    for n in (c.min_length, c.max_length):
        if n is not None:
            options.append(st.integers(max(0, n - 1), n + 1).flatmap(
                lambda k: st.text(_CHARS, min_size=k, max_size=k)))
    return st.one_of(options)


def _date_values(f: Field) -> st.SearchStrategy[Any]:
    edges = [dt.date(1970, 1, 1)]
    for b in (f.constraints.min, f.constraints.max):
        if b is not None:
            d = dt.date.fromisoformat(str(b))
            edges += [d - dt.timedelta(days=1), d, d + dt.timedelta(days=1)]
    return st.one_of(_near(edges), st.dates(_TS_MIN.date(), _TS_MAX.date()))


def _timestamp_values(f: Field) -> st.SearchStrategy[Any]:
    per = {"s": 1_000_000, "ms": 1_000, "us": 1}[f.type.unit or "us"]
    tz = dt.UTC if f.type.tz else None

    def at_unit(moment: dt.datetime) -> dt.datetime:
        moment = moment.replace(microsecond=moment.microsecond // per * per)
        return moment.replace(tzinfo=tz) if tz else moment

    tick = dt.timedelta(microseconds=per)
    edges = [dt.datetime(2000, 1, 1)]
    for b in (f.constraints.min, f.constraints.max):
        if b is not None:
            moment = dt.datetime.fromisoformat(str(b))
            if moment.tzinfo is not None:
                moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
            edges += [moment - tick, moment, moment + tick]
    return st.one_of(_near(edges), st.datetimes(_TS_MIN, _TS_MAX)).map(at_unit)


def _values(f: Field) -> st.SearchStrategy[Any]:
    k = f.type.kind
    if k in INTEGER_KINDS:
        typed = _int_values(f)
    elif k in FLOAT_KINDS:
        typed = _float_values(f)
    elif k is TypeKind.DECIMAL:
        typed = _decimal_values(f)
    elif k in (TypeKind.STRING, TypeKind.ENUM):
        typed = _text_values(f)
    elif k is TypeKind.DATE:
        typed = _date_values(f)
    elif k is TypeKind.TIMESTAMP:
        typed = _timestamp_values(f)
    else:
        typed = st.booleans()
    return st.one_of(st.none(), typed, typed)


def _float32_inward(b: float, up: bool) -> float:
    """The float32 nearest ``b`` on the inside of a bound (``up`` for a min)."""
    x = np.float32(b)
    if (up and float(x) < b) or (not up and float(x) > b):
        x = np.nextafter(x, np.float32(math.inf if up else -math.inf))
    return float(x)


def _valid_values(f: Field) -> st.SearchStrategy[Any]:
    """Values that pass every rule of ``f`` (edges included), null where allowed."""
    c, k = f.constraints, f.type.kind
    lo, hi = c.min, c.max
    typed: st.SearchStrategy[Any]
    if k in INTEGER_KINDS:
        tlo, thi = _INT_RANGE[k]
        a, b = max(tlo, int(lo) if lo is not None else tlo), min(thi, int(hi) if hi is not None else thi)
        typed = st.one_of(_near([a, b]), st.integers(a, b))
    elif k is TypeKind.DECIMAL:
        scale = f.type.scale or 0
        q = Decimal(1).scaleb(-scale)
        top = Decimal(10) ** ((f.type.precision or 18) - scale) - q
        a = Decimal(str(lo)) if lo is not None else -top
        b = Decimal(str(hi)) if hi is not None else top
        typed = st.one_of(_near([a.quantize(q), b.quantize(q)]),
                          st.decimals(a, b, places=scale, allow_nan=False, allow_infinity=False))
    elif k in FLOAT_KINDS:
        width = 32 if k is TypeKind.FLOAT32 else 64
        a_f = None if lo is None else (_float32_inward(float(lo), True) if width == 32 else float(lo))
        b_f = None if hi is None else (_float32_inward(float(hi), False) if width == 32 else float(hi))
        edges = [v for v in (a_f, b_f) if v is not None] or [0.0]
        finite = st.floats(a_f, b_f, allow_nan=False, allow_infinity=False, width=width)
        typed = st.one_of(_near(edges), finite)
    elif k is TypeKind.ENUM:
        typed = st.sampled_from(f.values)
    elif k is TypeKind.STRING:
        low = max(c.min_length or 0, 1 if c.empty_as_null else 0)
        high = c.max_length
        if c.pattern is not None:
            typed = st.from_regex(python_full_match(c.pattern), fullmatch=True).filter(
                lambda v: "\x00" not in v and low <= len(v) and (high is None or len(v) <= high))
        else:
            typed = st.text(_CHARS, min_size=low, max_size=high if high is not None else 12)
    elif k is TypeKind.DATE:
        a_d = dt.date.fromisoformat(str(lo)) if lo is not None else _TS_MIN.date()
        b_d = dt.date.fromisoformat(str(hi)) if hi is not None else _TS_MAX.date()
        typed = st.one_of(_near([a_d, b_d]), st.dates(a_d, b_d))
    elif k is TypeKind.TIMESTAMP:
        def naive(v: object, default: dt.datetime) -> dt.datetime:
            if v is None:
                return default
            m = dt.datetime.fromisoformat(str(v))
            return m.astimezone(dt.UTC).replace(tzinfo=None) if m.tzinfo else m

        a_t, b_t = naive(lo, _TS_MIN), naive(hi, _TS_MAX)
        per = {"s": 1_000_000, "ms": 1_000, "us": 1}[f.type.unit or "us"]
        tz = dt.UTC if f.type.tz else None

        def inside(m: dt.datetime) -> dt.datetime:
            m = max(m.replace(microsecond=m.microsecond // per * per), a_t)
            return m.replace(tzinfo=tz)

        typed = st.one_of(_near([a_t, b_t]), st.datetimes(a_t, b_t)).map(inside).filter(
            lambda m: m.replace(tzinfo=None) <= b_t and m.microsecond % per == 0)
    else:
        typed = st.booleans()
    nullable = (c.nullable and not c.required) or c.has_default
    return st.one_of(st.none(), typed, typed, typed) if nullable else typed


@st.composite
def _row(draw: st.DrawFn, compiled: CompiledSchema) -> dict[str, Any]:
    """A row that is valid but for at most two fields pushed to their edges."""
    fields = compiled.schema.fields
    row = {f.name: draw(_valid_values(f)) for f in fields}
    for f in draw(st.lists(st.sampled_from(fields), max_size=2, unique_by=lambda f: f.name)):
        row[f.name] = draw(_values(f))
    return row


def _rows(compiled: CompiledSchema, max_size: int) -> st.SearchStrategy[list[dict[str, Any]]]:
    wild = st.fixed_dictionaries({f.name: _values(f) for f in compiled.schema.fields})
    return st.lists(st.one_of(_row(compiled), _row(compiled), wild), min_size=1, max_size=max_size)


def _table(compiled: CompiledSchema, rows: list[dict[str, Any]]) -> pa.Table:
    declared = compiled.arrow_schema
    return pa.table({
        f.name: pa.array([r[f.name] for r in rows], declared.field(f.name).type)
        for f in compiled.schema.fields
    })


def _validator_verdicts(
    compiled: CompiledSchema, table: pa.Table
) -> tuple[dict[int, set[str]], dict[str, int]]:
    result = validate(table, compiled)
    by_row: dict[int, set[str]] = {}
    for row, rule in zip(result.rejects.column("row").to_pylist(), result.rejects.column("rule").to_pylist(),
                         strict=True):
        by_row.setdefault(row, set()).add(rule)
    return by_row, dict(result.counts.by_rule)


# --------------------------------------------------------------------------- Postgres


def _pg_verdict(conn: psycopg.Connection[Any], compiled: CompiledSchema, table: str,
                row: dict[str, Any], rule_ids: dict[str, str]) -> str | None:
    """Insert ``row`` in a savepoint that is always rolled back; the rule id Postgres
    refused it for, or None when it was accepted."""
    names, values = [], []
    for f in compiled.schema.fields:
        value = row[f.name]
        if f.constraints.empty_as_null and value == "":
            value = None
        if value is None and f.constraints.has_default:
            continue  # the column DEFAULT fills it, as the validator's default does
        names.append(f.name)
        values.append(value)
    if names:
        stmt = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
            sql.Identifier(table), sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(sql.Placeholder() * len(names)))
    else:
        stmt = sql.SQL("INSERT INTO {} DEFAULT VALUES").format(sql.Identifier(table))
    try:
        with conn.transaction():
            conn.execute(stmt, values)
            raise psycopg.Rollback()
    except psycopg.errors.CheckViolation as exc:
        name = exc.diag.constraint_name
        assert name in rule_ids, f"unknown constraint {name}"
        return rule_ids[name]
    except psycopg.errors.NotNullViolation as exc:
        return f"{exc.diag.column_name}.not_null"
    return None


@pytest.mark.slow  # ~40 s in all: `make test`, not `make check`
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_validator_and_postgres_agree_row_by_row(name: str, pg_conn: psycopg.Connection[Any]) -> None:
    compiled = SCHEMAS[name]
    table_name = f"{name}__agree"
    pg_conn.execute(render_check_table(compiled, table_name))
    pg_conn.commit()
    rule_ids = constraint_rule_ids(compiled)

    @settings(max_examples=200, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(rows=_rows(compiled, max_size=25))
    def check(rows: list[dict[str, Any]]) -> None:
        by_row, _ = _validator_verdicts(compiled, _table(compiled, rows))
        with pg_conn.transaction():
            for i, row in enumerate(rows):
                refused = _pg_verdict(pg_conn, compiled, table_name, row, rule_ids)
                mine = by_row.get(i, set())
                assert (refused is not None) == bool(mine), (
                    f"row {i} {row!r}: validator {sorted(mine) or 'accepts'}, "
                    f"Postgres {'refuses with ' + refused if refused else 'accepts'}")
                if refused is not None:
                    assert refused in mine, (
                        f"row {i} {row!r}: Postgres says {refused}, validator {sorted(mine)}")

    check()


# --------------------------------------------------------------------------- GX


@pytest.mark.slow  # ~45 s in all (GX)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_gx_counts_equal_validator_counts_per_rule(name: str) -> None:
    compiled = SCHEMAS[name]

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(rows=_rows(compiled, max_size=40))
    def check(rows: list[dict[str, Any]]) -> None:
        table = _table(compiled, rows)
        _, by_rule = _validator_verdicts(compiled, table)
        gx_counts = run_suite(compiled, table)
        assert set(by_rule) <= set(gx_counts), f"rules GX cannot see: {set(by_rule) - set(gx_counts)}"
        assert {rule: n for rule, n in gx_counts.items() if n} == by_rule

    check()
