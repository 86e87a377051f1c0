"""The generated DDL against a real PostgreSQL (`features dev up`): every shipped
``sql/*.sql`` applies (twice), hostile names survive quoting, patterns and float
constraints mean in Postgres what they mean in the validator."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from psycopg import sql

from features.compile import compile_schema
from features.compile.patterns import postgres_full_match
from features.compile.postgres import constraint_rule_ids, render_check_table
from features.schema import load_schema
from features.schema.model import Constraints, Field, FieldType, Schema, TypeKind

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
STEMS = sorted(p.stem for p in (ROOT / "schemas").glob("*.yaml"))


def _tables(conn: psycopg.Connection[Any], schema: str) -> set[str]:
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    ).fetchall()
    return {r[0] for r in rows}


@pytest.mark.parametrize("stem", STEMS)
def test_shipped_sql_file_applies_twice(stem: str, pg_conn: psycopg.Connection[Any], pg_schema: str) -> None:
    compiled = compile_schema(load_schema(ROOT / "schemas" / f"{stem}.yaml"))
    path = ROOT / "sql" / f"{stem}.sql"
    ddl = path.read_text(encoding="utf-8")
    assert ddl == compiled.ddl, f"{path} is stale: run `features compile`"
    pg_conn.execute(ddl)
    pg_conn.execute(ddl)  # IF NOT EXISTS / ON CONFLICT DO NOTHING: a second run changes nothing
    pg_conn.commit()
    name = compiled.name
    if compiled.schema.loadable:
        tables = {name, f"{name}__rejects", "featureline_schemas", "featureline_schema_versions"}
        if compiled.schema.aggregations is not None:
            tables.add(f"{name}__aggregates")
        assert _tables(pg_conn, pg_schema) == tables
        rows = pg_conn.execute("SELECT schema_name, version, fingerprint FROM featureline_schemas").fetchall()
        assert rows == [(name, compiled.schema.version_str, compiled.fingerprint)]
    else:
        assert _tables(pg_conn, pg_schema) == {f"{name}__check"}


def test_cold_and_rejects_tables_accept_rows_and_keep_keys(pg_conn: psycopg.Connection[Any]) -> None:
    compiled = compile_schema(load_schema(ROOT / "schemas" / "credit_applicant.yaml"))
    pg_conn.execute(compiled.ddl)
    lineage = {
        "_source": "file://a.parquet#0", "_schema_name": "credit_applicant", "_schema_version": "3.2.1",
        "_schema_fingerprint": compiled.fingerprint, "_run_id": "r1",
        "_ingested_at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    }
    # the key is (entity, event time, content digest): the same digest twice is refused
    row = {"application_id": "APP-000000000001", "submitted_at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
           "income_monthly": Decimal("0.01"), "_digest": "00000000000000ff", **lineage}
    insert = sql.SQL("INSERT INTO credit_applicant ({}) VALUES ({})").format(
        sql.SQL(", ").join(map(sql.Identifier, row)), sql.SQL(", ").join(sql.Placeholder() * len(row))
    )
    pg_conn.execute(insert, list(row.values()))
    assert pg_conn.execute("SELECT employment_duration_months FROM credit_applicant").fetchone() == (0,)
    with pytest.raises(psycopg.errors.UniqueViolation):
        pg_conn.execute(insert, list(row.values()))
    pg_conn.rollback()

    pg_conn.execute(compiled.ddl)
    reject = (
        "INSERT INTO credit_applicant__rejects (_source, row_index, raw, errors, event_time, _schema_name, "
        "_schema_version, _schema_fingerprint, _run_id, _ingested_at) VALUES "
        "(%s, 0, '{\"income_monthly\": \"0.00\"}', %s, NULL, 'credit_applicant', '3.2.1', %s, 'r1', now()) "
        "ON CONFLICT DO NOTHING"
    )
    errors = ('[{"field": "income_monthly", "rule": "income_monthly.min", "reason": "min", '
              '"message": "...", "value": "0.00"}]')
    for _ in range(2):
        pg_conn.execute(reject, ("file://a.parquet#7", errors, compiled.fingerprint))
    assert pg_conn.execute("SELECT count(*) FROM credit_applicant__rejects").fetchone() == (1,)
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        pg_conn.execute(reject, ("file://a.parquet#8", '{"not": "a list"}', compiled.fingerprint))
    assert info.value.diag.constraint_name == "credit_applicant__rejects__errors"


def test_hostile_names_survive_quoting(pg_conn: psycopg.Connection[Any], pg_schema: str) -> None:
    hostile = 'a"b; drop table x'
    evil = "x'); drop table y; --"
    fields = (
        Field(hostile, FieldType(TypeKind.STRING), Constraints(pattern="[a-z]+\\.[a-z]'")),
        Field("e", FieldType(TypeKind.ENUM), values=("ok", evil)),
    )
    compiled = compile_schema(Schema(name='s"; drop schema public; --', version=(1, 0, 0), fields=fields))
    pg_conn.execute(compiled.ddl)
    table = 's"; drop schema public; --__check'
    cols = pg_conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
        "ORDER BY ordinal_position", (pg_schema, table),
    ).fetchall()
    assert [c[0] for c in cols] == [hostile, "e"]
    insert = sql.SQL("INSERT INTO {} ({}, {}) VALUES (%s, %s)").format(
        sql.Identifier(table), sql.Identifier(hostile), sql.Identifier("e"))
    pg_conn.execute(insert, ("ab.c'", evil))
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        pg_conn.execute(insert, ("ab\\.c'", "ok"))
    assert constraint_rule_ids(compiled)[info.value.diag.constraint_name] == f"{hostile}.pattern"


PATTERNS = ["a.b", "ab", "[^x]b?", "a]?b", "[]a]+", "(a|ab)(c|bcd)?", "(?:ab)*", "a\\.b", "^ab$", ".*",
            "[0-9]{2,3}", "^APP-[0-9]{12}$", "a\\{b", "\\d", "[\\w-]+", "\\s"]
STRINGS = ["ab", "a\nb", "ab\n", "\nab", "a.b", "a]b", "é1", "1", "12", "123", "٣", "_", "\v", "\t", "a{b",
           "", "abab", "abc", "abbcd", "APP-000000000001", "APP-000000000001\n", "a-b"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_postgres_regex_matches_exactly_what_re2_matches(
    pattern: str, pg_conn: psycopg.Connection[Any]
) -> None:
    expected = pc.match_substring_regex(pa.array(STRINGS), f"^(?:{pattern})$").to_pylist()
    rows = pg_conn.execute(
        "SELECT s ~ %s FROM unnest(%s::text[]) WITH ORDINALITY AS u(s, i) ORDER BY i",
        (postgres_full_match(pattern), STRINGS),
    ).fetchall()
    assert [r[0] for r in rows] == expected


def _violation(conn: psycopg.Connection[Any], table: str, column: str, value: object) -> str | None:
    """The constraint (or ``<column>.not_null``) a one-column insert violates, else None."""
    stmt = sql.SQL("INSERT INTO {} ({}) VALUES (%s)").format(sql.Identifier(table), sql.Identifier(column))
    try:
        with conn.transaction():
            conn.execute(stmt, (value,))
    except psycopg.errors.CheckViolation as exc:
        return exc.diag.constraint_name
    except psycopg.errors.NotNullViolation as exc:
        return f"{exc.diag.column_name}.not_null"
    return None


def test_each_value_violates_the_constraint_of_its_own_rule(pg_conn: psycopg.Connection[Any]) -> None:
    fields = (
        Field("score", FieldType(TypeKind.FLOAT32), Constraints(min=0.3, max=1.5)),
        Field("tiny", FieldType(TypeKind.INT8), Constraints(min=-5)),
        Field("at", FieldType(TypeKind.TIMESTAMP, unit="us", tz="UTC"),
              Constraints(min="2000-01-01T00:00:00+00:00")),
        Field("code", FieldType(TypeKind.STRING), Constraints(empty_as_null=True, nullable=False)),
    )
    compiled = compile_schema(Schema(name="probe", version=(1, 0, 0), fields=fields))
    pg_conn.execute("SET TIME ZONE 'Pacific/Kiritimati'")  # bounds must not depend on it
    pg_conn.execute(render_check_table(compiled, "t"))
    pg_conn.execute("ALTER TABLE t ALTER COLUMN code DROP NOT NULL")  # probe one column at a time
    utc = dt.UTC
    cases: list[tuple[str, object, str | None]] = [
        ("score", float("nan"), "score__nan"),
        ("score", float("inf"), "score__type"),
        ("score", float("-inf"), "score__type"),
        ("score", 2.0, "score__max"),
        ("score", 0.25, "score__min"),
        ("score", 0.30000001192092896, None),  # float32(0.3) >= 0.3 in double precision
        ("score", 1.5, None),
        ("tiny", 200, "tiny__type"),
        ("tiny", -6, "tiny__min"),
        ("tiny", -5, None),
        ("at", dt.datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=utc), "at__min"),
        ("at", dt.datetime(2000, 1, 1, tzinfo=utc), None),
        ("at", dt.datetime(2000, 1, 1, 5, tzinfo=dt.timezone(dt.timedelta(hours=5))), None),
        ("code", "", "code__not_null"),
        ("code", "x", None),
    ]
    got = [(col, value, _violation(pg_conn, "t", col, value)) for col, value, _ in cases]
    assert got == cases
    rule_ids = constraint_rule_ids(compiled)
    assert rule_ids["score__type"] == "score.type" and rule_ids["code__not_null"] == "code.not_null"
