"""``last_k`` through the stores and the SDK: the shared aggregation schema
(``tests/aggregate_reference.py``: ``score_last3``, a float64 field's 3 newest values in 1h,
hot and cold; ``qty_last2_day``, an int32 field's 2 newest of the UTC day where kind is a
or b, cold) loaded by the batch loader; Postgres holds ``double precision[]`` /
``integer[]`` arrays, Redis the JSON array, and the SDK's ``online`` (Redis, and the
Postgres fallback) and ``historical`` give Arrow lists equal to the brute-force
reference's values, newest first."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from aggregate_reference import SCHEMA, history_table, random_history, reference

from features import FeatureStore
from features.compile import compile_schema
from features.compile.layout import aggregates_key, entity_key
from features.config import Settings
from features.load import load
from features.schema import parse_schema

pytestmark = pytest.mark.services
COMPILED = compile_schema(parse_schema(SCHEMA))
NAMES = [a.name for a in COMPILED.schema.aggregations.features] if COMPILED.schema.aggregations else []


def test_last_k_round_trips_through_postgres_redis_and_the_sdk(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    events = random_history(random.Random(7), 1_500, users=40, minutes=600)
    path = tmp_path / "events.parquet"
    pq.write_table(history_table(events), path)
    summary = load([path], COMPILED, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.rejected == 0
    want = reference(COMPILED.schema, events)
    at = {n: i for i, n in enumerate(NAMES)}
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        types = dict(conn.execute(
            "SELECT attname, atttypid::regtype::text FROM pg_attribute WHERE attrelid = "
            "'agg_props__aggregates'::regclass AND attnum > 0").fetchall())
        assert (types["score_last3"], types["qty_last2_day"]) == ("double precision[]", "integer[]")
    newest: dict[str, int] = {}
    for uid, t in want:
        newest[uid] = max(newest.get(uid, t), t)
    users = sorted(newest)
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "agg_props.yaml").write_text(SCHEMA)
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=folder,
                      search_path=pg_schema, key_prefix=redis_prefix, fill=False) as fs:
        online = fs.online("agg_props", users, ["score_last3"], windows="event")
        assert online.schema.field("score_last3").type == pa.list_(pa.float64())
        assert online.column("_from").to_pylist() == ["redis"] * len(users)
        expected = [want[(u, newest[u])][at["score_last3"]] for u in users]
        assert online.column("score_last3").to_pylist() == expected
        assert any(len(v) == 3 for v in expected) and any(len(v) < 3 for v in expected)
        # the Postgres fallback: the newest aggregation row
        hot = redis.Redis.from_url(settings.redis_url)
        gone = users[:10]
        hot.delete(*[redis_prefix + k(u) for u in gone for k in (lambda u: entity_key("agg_props", u),
                                                                   lambda u: aggregates_key("agg_props", u))])
        fallback = fs.online("agg_props", gone, ["score_last3"], windows="event")
        assert fallback.column("_from").to_pylist() == ["postgres"] * len(gone)
        assert fallback.column("score_last3").to_pylist() == expected[:10]
        # historical: as of each event's own time, its values
        keys = sorted(want)
        frame = pa.table({"uid": [u for u, _ in keys],
                          "timestamp": pa.array([t for _, t in keys], pa.int64()).cast(
                              pa.timestamp("us", "UTC"))})
        hist = fs.historical("agg_props", frame, ["score_last3", "qty_last2_day"], windows="event")
        assert hist.schema.field("qty_last2_day").type == pa.list_(pa.int32())
        got: list[Any] = list(zip(hist.column("score_last3").to_pylist(),
                                  hist.column("qty_last2_day").to_pylist(), strict=True))
        assert got == [(want[key][at["score_last3"]], want[key][at["qty_last2_day"]]) for key in keys]
