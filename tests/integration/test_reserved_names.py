"""Field and feature names that are SQL reserved words (``user``, ``when``, ``group``,
``order``, ``from``, ``select``, ``limit``), as real data has them, round-trip through
every artefact and store: the Postgres DDL and its CHECKs, the GX suite, the batch
loader (history, rejects, Redis fields), the stream's decode, the SDK's online reads,
Postgres fallback and fill, and historical."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from psycopg import sql

from features import FeatureStore, compile_schema, parse_schema, validate
from features.compile.expectations import run_suite
from features.compile.layout import entity_key
from features.config import Settings
from features.kernels import transform_program
from features.lineage import RunContext
from features.load import load
from features.pipeline.prepare import prepare_records
from features.sources.columnar import ColumnarDecoder
from features.sources.records import record_uris

pytestmark = pytest.mark.services
NAME = "sqlwords"
SCHEMA = f"""
name: {NAME}
version: 1.0.0
entity: user
event_time: when
hot:
  ttl: 1d
fields:
  - name: user
    type: string
    store: [hot, cold]
    constraints: {{required: true, pattern: "^u[0-9]+$"}}
  - name: when
    type: timestamp(us, UTC)
    store: [hot, cold]
    constraints: {{required: true}}
  - name: group
    type: enum
    values: [a, b]
    store: [hot, cold]
  - name: order
    type: int64
    store: [hot, cold]
    constraints: {{min: 0, max: 1000000}}
  - name: from
    type: string
    store: cold
    constraints: {{nullable: true, max_length: 8}}
  - name: select
    type: decimal(10,2)
    store: [hot, cold]
    constraints: {{min: 0}}
features:
  - name: limit
    from: order
    steps: [log1p]
    dtype: float64
    store: [hot, cold]
"""
WORDS = ("user", "when", "group", "order", "from", "select", "limit")


def rows(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    users = [f"u{i % 40}" for i in range(n)]
    order = [int(x) for x in rng.integers(0, 1000, n)]
    order[5] = -1                      # order.min
    select = [Decimal(int(x)) / 100 for x in rng.integers(0, 100_000, n)]
    select[7] = Decimal("-1.00")       # select.min
    frm = ["web" if i % 3 else None for i in range(n)]
    frm[9] = "too long by far"          # from.max_length
    return pa.table({
        "user": users,
        "when": pa.array([base + dt.timedelta(minutes=i) for i in range(n)], pa.timestamp("us", "UTC")),
        "group": ["a" if i % 2 else "b" for i in range(n)],
        "order": pa.array(order, pa.int64()),
        "from": frm,
        "select": pa.array(select, pa.decimal128(10, 2)),
    })


def test_reserved_words_round_trip_through_every_store(tmp_path: Path, settings: Settings, pg_schema: str,
                                                       redis_prefix: str) -> None:
    compiled = compile_schema(parse_schema(SCHEMA, "sqlwords.yaml"))
    assert [f.name for f in compiled.schema.fields] == [w for w in WORDS if w != "limit"]
    data = rows(200)

    # the validator, and the GX suite on the same rows: the same counts per rule
    result = validate(data, compiled)
    by_rule = dict(result.counts.by_rule)
    assert by_rule == {"order.min": 1, "select.min": 1, "from.max_length": 1}
    suite = run_suite(compiled, data)
    assert {rule: n for rule, n in suite.items() if n} == by_rule
    assert "field order violates constraint min: got -1, expected >= 0" in \
        result.rejects.column("message").to_pylist()

    # the batch loader: DDL (CHECKs, quoted), history, rejects, Redis
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / f"{NAME}.yaml").write_text(SCHEMA)
    path = tmp_path / "words.parquet"
    pq.write_table(data, path)
    summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.rejected == 3 and summary.stored == 197
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        cols = sql.SQL(", ").join(sql.Identifier(w) for w in WORDS)
        got = conn.execute(sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
            cols, sql.Identifier(NAME), sql.Identifier("when"))).fetchall()
        assert len(got) == 197 and got[0][0] == "u0"
        rejects = conn.execute(sql.SQL("SELECT errors FROM {}").format(
            sql.Identifier(f"{NAME}__rejects"))).fetchall()
        assert sorted(e["rule"] for (errs,) in rejects for e in errs) == sorted(by_rule)
        with pytest.raises(psycopg.errors.CheckViolation):  # the CHECK on a reserved-word column
            update = sql.SQL("UPDATE {} SET {} = -5").format(sql.Identifier(NAME), sql.Identifier("order"))
            conn.execute(update)
    hot = redis.Redis.from_url(settings.redis_url)
    try:
        h = hot.hgetall(redis_prefix + entity_key(NAME, "u1"))
        assert {b"group", b"order", b"select", b"limit"} <= set(h) and b"from" not in h  # from: cold only

        # the SDK: Redis, then the Postgres fallback and its fill, and historical
        with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=schemas,
                          search_path=pg_schema, key_prefix=redis_prefix) as fs:
            online = fs.online(NAME, ["u1", "u2", "nobody"])
            assert online.column_names[:6] == ["user", "group", "order", "select", "limit", "_event_time"]
            assert online.column("_from").to_pylist() == ["redis", "redis", None]
            assert fs.online_dicts(NAME, ["u1"])[0]["order"] == online.column("order")[0].as_py()
            newest_u1 = max((r for r in got if r[0] == "u1"), key=lambda r: r[1])
            assert online.column("order")[0].as_py() == newest_u1[3]
            assert online.column("select")[0].as_py() == newest_u1[5]
            hot.delete(redis_prefix + entity_key(NAME, "u1"))
            fallback = fs.online(NAME, ["u1"]).to_pylist()[0]
            assert (fallback["_from"], fallback["order"], fallback["limit"]) == \
                ("postgres", newest_u1[3], newest_u1[6])
            assert hot.hget(redis_prefix + entity_key(NAME, "u1"), "_filled") == b"1"
            assert fs.online(NAME, ["u1"]).column("_from").to_pylist() == ["redis"]
            entity_df = pa.table({"user": ["u1", "u2"], "timestamp": pa.array(
                [dt.datetime(2027, 1, 1, tzinfo=dt.UTC)] * 2, pa.timestamp("us", "UTC"))})
            hist = fs.historical(NAME, entity_df, ["from", "order"])
            assert hist.column("order").to_pylist()[0] == newest_u1[3]
            assert hist.column("from").to_pylist()[0] == newest_u1[4]
    finally:
        hot.close()

    # the stream's decode of the same rows as JSON: the same rejects
    def as_json(r: dict[str, Any]) -> bytes:
        # decimals as JSON numbers (2 places: the float's shortest text is the decimal's)
        return json.dumps({k: (v.isoformat() if isinstance(v, dt.datetime) else
                               float(v) if isinstance(v, Decimal) else v) for k, v in r.items()}).encode()

    values = [as_json(r) for r in data.to_pylist()]
    n = len(values)
    offsets = np.arange(n, dtype=np.int64)
    uris = record_uris(pa.array(["t"] * n), pa.array([0] * n, pa.int32()), pa.array(offsets))
    now = dt.datetime.now(dt.UTC)
    ctx = RunContext(NAME, "1.0.0", compiled.fingerprint, "run", now)
    program = transform_program(compiled, settings)
    for columnar_min in (1, 10_000):  # the columnar path and the per-record path
        decoder = ColumnarDecoder(compiled.schema, max_bytes=compiled.schema.payload.max_bytes)
        part = prepare_records(values, uris, offsets, compiled, program, ctx, now, decoder=decoder,
                               columnar_min=columnar_min)
        assert part.prepared.rows.num_rows == 197
        stream_rules = sorted(e["rule"] for errs in part.prepared.rejects.column("errors").to_pylist()
                              for e in json.loads(errs))
        assert stream_rules == sorted(by_rule)
