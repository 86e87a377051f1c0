"""The GX suite of the stored aggregates (``expectations/<schema>__aggregates.json``) on
a real ``<schema>__aggregates`` table: a small history loaded with ``features load``
into Postgres passes it, and a row broken in place (a negative count, a null count, a
percentile list of the wrong length, a dropped column) fails the check that guards it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from features.compile import compile_schema
from features.compile.expectations import run_aggregates_suite
from features.config import Settings
from features.load import load
from features.schema import parse_schema

pytestmark = pytest.mark.services

COMPILED = compile_schema(parse_schema("""
name: gx_aggs
version: 1.0.0
entity: user_id
event_time: ts
fields:
  - {name: user_id, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(ms, UTC)", constraints: {required: true}}
  - {name: item, type: string, constraints: {required: true}}
  - {name: dwell, type: int32, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 1h
  features:
    - {name: n_1h, function: count, window: 1h, store: cold}
    - {name: items_1h, function: count_distinct, of: item, window: 1h, store: cold}
    - {name: approx_items_1h, function: approx_count_distinct, of: item, window: 1h, store: cold}
    - {name: dwell_q_1h, function: approx_percentile, of: dwell, q: [0.5, 0.9], window: 1h, store: cold}
    - {name: dwell_p50_1h, function: approx_percentile, of: dwell, q: 0.5, window: 1h, store: cold}
    - {name: dwell_mean_1h, function: mean, of: dwell, window: 1h, store: cold}
"""))


def _history(path: Path) -> None:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    rows = [(f"u{i % 3}", base + dt.timedelta(minutes=7 * i), f"i{i % 5}", None if i % 4 == 0 else 10 * i)
            for i in range(30)]
    pq.write_table(pa.table({
        "user_id": pa.array([r[0] for r in rows]),
        "ts": pa.array([r[1] for r in rows], pa.timestamp("ms", "UTC")),
        "item": pa.array([r[2] for r in rows]),
        "dwell": pa.array([r[3] for r in rows], pa.int32()),
    }), path)


def _read(conn: Any, ns: str) -> pa.Table:
    cur = conn.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(ns),
                                                            sql.Identifier("gx_aggs__aggregates")))
    names = [d.name for d in cur.description]
    rows = cur.fetchall()
    return pa.table({n: pa.array([r[i] for r in rows]) for i, n in enumerate(names)})


def test_stored_aggregates_pass_their_suite_and_a_broken_row_fails_it(
        settings: Settings, pg_schema: str, redis_prefix: str, tmp_path: Path) -> None:
    import psycopg

    _history(tmp_path / "h.parquet")
    summary = load([tmp_path / "h.parquet"], COMPILED, settings, search_path=pg_schema,
                   key_prefix=redis_prefix)
    assert summary.adds_up and summary.aggregations is not None
    table = sql.SQL("{}.{}").format(sql.Identifier(pg_schema), sql.Identifier("gx_aggs__aggregates"))
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        stored = _read(conn, pg_schema)
        assert stored.num_rows == 30
        counts = run_aggregates_suite(COMPILED, stored)
        assert set(counts) == {e["meta"]["rule"] for e in COMPILED.aggregates_expectations["expectations"]}  # type: ignore[index]
        assert {"n_1h.min", "items_1h.not_null", "approx_items_1h.min", "dwell_q_1h.length"} <= set(counts)
        assert all(v == 0 for v in counts.values()), counts

        first = sql.SQL("(SELECT user_id, ts FROM {} ORDER BY ts LIMIT 1)").format(table)
        conn.execute(sql.SQL("UPDATE {} SET n_1h = -1 WHERE (user_id, ts) IN {}").format(table, first))
        conn.execute(sql.SQL("UPDATE {} SET items_1h = NULL WHERE (user_id, ts) IN {}").format(table, first))
        conn.execute(sql.SQL("UPDATE {} SET dwell_q_1h = ARRAY[1.0]::double precision[] "
                             "WHERE dwell_q_1h IS NOT NULL AND (user_id, ts) IN "
                             "(SELECT user_id, ts FROM {} WHERE dwell_q_1h IS NOT NULL ORDER BY ts LIMIT 2)"
                             ).format(table, table))
        broken = run_aggregates_suite(COMPILED, _read(conn, pg_schema))
        assert broken["n_1h.min"] == 1
        assert broken["items_1h.not_null"] == 1
        assert broken["dwell_q_1h.length"] == 2
        assert {k: v for k, v in broken.items() if v} == {"n_1h.min": 1, "items_1h.not_null": 1,
                                                           "dwell_q_1h.length": 2}

        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN approx_items_1h").format(table))
        dropped = run_aggregates_suite(COMPILED, _read(conn, pg_schema))
        assert dropped["approx_items_1h.missing"] == 30
