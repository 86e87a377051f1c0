"""Generated migrations (``features schema diff``: ``plan_migration``) applied to real
Postgres: a table created by the old schema's DDL, holding a row, then migrated, equals a
table created fresh by the new schema's DDL, column by column (type, NOT NULL, default),
CHECK by CHECK, the aggregates table included, and ``featureline_schemas`` records the new
version and fingerprint. The row survives the migration.

Each case is one kind of compatible change (``features/compile/migration.py``'s table).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import yaml

from features.compile import compile_schema
from features.compile.migration import plan_migration
from features.config import Settings
from features.schema import parse_schema

pytestmark = pytest.mark.services

BASE: dict[str, Any] = yaml.safe_load("""
name: mig
version: 1.0.0
entity: uid
event_time: ts
fields:
  - {name: uid, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(us, UTC)", constraints: {required: true}}
  - {name: qty, type: int16, constraints: {min: 0, max: 1000, nullable: false}}
  - {name: price, type: "decimal(10,2)", constraints: {nullable: true}}
  - {name: kind, type: enum, values: [a, b], constraints: {nullable: true}}
  - {name: code, type: string, constraints: {pattern: "^[A-Z]{3}$", nullable: true}}
  - {name: note, type: string, store: [hot], constraints: {nullable: true}}
features:
  - {name: qty_log, from: qty, steps: [log1p], dtype: float64, store: hot}
""")


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


def _add_nullable(s: dict[str, Any]) -> None:
    s["fields"].append({"name": "city", "type": "string",
                        "constraints": {"nullable": True, "max_length": 40}})


def _add_with_default(s: dict[str, Any]) -> None:
    s["fields"].append({"name": "tier", "type": "int32",
                        "constraints": {"default": 1, "nullable": False, "min": 0}})


def _widen(s: dict[str, Any]) -> None:
    _field(s, "qty")["type"] = "int32"
    _field(s, "price")["type"] = "decimal(14,2)"


def _relax(s: dict[str, Any]) -> None:
    _field(s, "qty")["constraints"] = {"min": 0, "max": 5000, "nullable": True}
    _field(s, "kind")["values"] = ["a", "b", "c"]


def _new_default(s: dict[str, Any]) -> None:
    _field(s, "price")["constraints"]["default"] = 0.5


def _store_cold(s: dict[str, Any]) -> None:
    _field(s, "note")["store"] = ["hot", "cold"]


def _feature_cold(s: dict[str, Any]) -> None:
    s["features"].append({"name": "price_log", "from": "price", "steps": ["log1p"], "dtype": "float64",
                          "store": "cold"})


def _first_aggregations(s: dict[str, Any]) -> None:
    s["aggregations"] = {"allowed_lateness": "10m", "features": [
        {"name": "n_1h", "function": "count", "window": "1h", "store": ["hot", "cold"]},
        {"name": "qty_sum_1h", "function": "sum", "of": "qty", "window": "1h", "store": "cold"}]}


CASES = {"field_added": _add_nullable, "field_added_default": _add_with_default, "type_widened": _widen,
         "constraints_relaxed": _relax, "default": _new_default, "store_cold": _store_cold,
         "feature_added_cold": _feature_cold, "aggregations_added": _first_aggregations}


def _catalog(conn: psycopg.Connection[Any], namespace: str) -> dict[str, Any]:
    """Every table of ``namespace``: its columns (type, NOT NULL, default) and CHECKs."""
    out: dict[str, Any] = {}
    tables = conn.execute("SELECT c.oid, c.relname FROM pg_class c "
                          "JOIN pg_namespace n ON n.oid = c.relnamespace "
                          "WHERE n.nspname = %s AND c.relkind = 'r'", (namespace,)).fetchall()
    for oid, table in tables:
        columns = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
            "pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a "
            "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped", (oid,)).fetchall()
        checks = conn.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                              "WHERE conrelid = %s", (oid,)).fetchall()
        out[table] = {"columns": {c[0]: c[1:] for c in columns}, "constraints": dict(checks)}
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_migrated_table_equals_a_fresh_one(case: str, settings: Settings, pg_schema: str,
                                             second_pg_schema: str) -> None:
    new_yaml = yaml.safe_load(yaml.safe_dump(BASE))
    CASES[case](new_yaml)
    new_yaml["version"] = "1.1.0"
    old, new = (compile_schema(parse_schema(yaml.safe_dump(s))) for s in (BASE, new_yaml))
    migration = plan_migration(old.schema, new.schema)
    assert migration.diff.allowed and migration.diff.compatible, migration.diff.changes
    assert migration.statements, f"{case}: no DDL generated"
    migrated, fresh = pg_schema, second_pg_schema
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={migrated}") as conn:
        conn.execute(old.ddl)
        conn.execute("INSERT INTO mig (uid, ts, qty, price, kind, code, _digest, _source, _schema_name, "
                     "_schema_version, _schema_fingerprint, _run_id, _ingested_at) "
                     "VALUES ('u1', now(), 7, 1.25, 'a', 'ABC', '00000000000000aa', 'file:///x#0', 'mig', "
                     "'1.0.0', %s, 'run-1', now())", (old.fingerprint,))
        conn.commit()
        with conn.transaction():
            for statement in migration.statements:
                conn.execute(statement)
        row = conn.execute("SELECT uid, qty, price, kind, code FROM mig").fetchall()
        recorded = conn.execute("SELECT version, fingerprint FROM featureline_schemas "
                                "WHERE schema_name = 'mig'").fetchall()
        got = _catalog(conn, migrated)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={fresh}") as conn:
        conn.execute(new.ddl)
        conn.commit()
        want = _catalog(conn, fresh)
        want_recorded = conn.execute("SELECT version, fingerprint FROM featureline_schemas "
                                     "WHERE schema_name = 'mig'").fetchall()
    assert [tuple(map(str, r)) for r in row] == [("u1", "7", "1.25", "a", "ABC")]
    assert recorded == want_recorded == [("1.1.0", new.fingerprint)]
    assert sorted(got) == sorted(want)
    for table in want:
        assert got[table]["columns"] == want[table]["columns"], table
        assert got[table]["constraints"] == want[table]["constraints"], table
