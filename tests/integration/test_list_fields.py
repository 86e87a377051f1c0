"""List-valued fields (``list(float32, 4)`` embeddings, ``list(int64, max=3)`` tags) end to
end with the real stores: a Parquet file with list columns loaded by the batch loader, read
back online (Redis, and the Postgres fallback) and historical (Postgres), equal to what was
loaded; bad rows (wrong length, NaN, null element, not a list, a value float32 cannot hold)
rejected with field-level errors and kept in the rejects table, which Postgres' own CHECKs
agree with."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features import FeatureStore
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import entity_key
from features.config import Settings
from features.load import load
from features.schema.parse import parse_schema
from features.validation import validate

pytestmark = pytest.mark.services
SCHEMA = """\
name: items
version: 1.0.0
entity: item_id
event_time: at
hot:
  ttl: 1d
fields:
  - name: item_id
    type: string
    store: [hot, cold]
    constraints: {required: true}
  - name: at
    type: timestamp(us, UTC)
    store: [hot, cold]
    constraints: {required: true}
  - name: embedding
    type: list(float32, 4)
    store: [hot, cold]
    constraints: {nullable: false}
  - name: tags
    type: list(int64, max=3)
    store: [hot, cold]
  - name: scores
    type: list(float64, 2, nullable=true)
    store: [hot, cold]
"""
T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return compile_schema(parse_schema(SCHEMA, "items.yaml"))


def good_rows(n: int, seed: int = 3) -> pa.Table:
    """``n`` valid rows: 2 events per item (the second one newer), random float32
    embeddings (subnormal, huge and negative zero included), tags of 0..3 ints."""
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, 4)).astype(np.float32) * np.float32(1e3)
    emb[0] = [np.float32(1e-45), np.float32(3.4e38), np.float32(-0.0), np.float32(0.1)]
    lengths = rng.integers(0, 4, n)
    tags = [rng.integers(-(2**62), 2**62, k).tolist() for k in lengths]
    tags[1] = None
    scores: list[Any] = [[float(rng.random()), None if i % 5 == 0 else 1 / 3] for i in range(n)]
    scores[2] = None
    return pa.table({
        "item_id": [f"i{i // 2}" for i in range(n)],
        "at": pa.array([T0 + dt.timedelta(minutes=i % 2, seconds=i) for i in range(n)],
                       pa.timestamp("us", "UTC")),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel(), pa.float32()), 4),
        "tags": pa.array(tags, pa.list_(pa.int64())),
        "scores": pa.array(scores, pa.list_(pa.float64())),
    })


BAD = [  # (embedding, tags, the rule id and the words its message holds)
    ([1.0, 2.0, 3.0], [1], "embedding.type", "got [1.0, 2.0, 3.0] (length 3), expected list(float32, 4)"),
    ([1.0, float("nan"), 3.0, 4.0], [1], "embedding.nan", "(a NaN element), expected numbers"),
    ([1.0, None, 3.0, 4.0], [1], "embedding.type", "(a null element), expected list(float32, 4)"),
    ([0.1, 2.0, 3.0, 4.0], [1], "embedding.type", "(element 0: 0.1), expected list(float32, 4)"),
    (None, [1], "embedding.not_null", "got null, expected a value"),
    ([1.0, 2.0, 3.0, 4.0], [1, 2, 3, 4], "tags.type",
     "got [1, 2, 3, 4] (length 4), expected list(int64, max=3)"),
    ([1.0, 2.0, 3.0, float("inf")], [1], "embedding.type", "(element 3: inf)"),
]


def bad_rows() -> pa.Table:
    return pa.table({
        "item_id": [f"bad{i}" for i in range(len(BAD))],
        "at": pa.array([T0] * len(BAD), pa.timestamp("us", "UTC")),
        "embedding": pa.array([b[0] for b in BAD], pa.list_(pa.float64())),
        "tags": pa.array([b[1] for b in BAD], pa.list_(pa.int64())),
        "scores": pa.array([None] * len(BAD), pa.list_(pa.float64())),
    })


def same(a: Any, b: Any) -> bool:
    """Equal lists, NaN-free, bit for bit (negative zero kept)."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and x == y
                                      and math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(a, b, strict=True))


@pytest.fixture()
def loaded(tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
           redis_prefix: str) -> pa.Table:
    good = good_rows(400)
    path, bad = tmp_path / "items.parquet", tmp_path / "bad.parquet"
    pq.write_table(good, path, row_group_size=150)
    pq.write_table(bad_rows(), bad)  # embeddings as list<double>: converted exactly, or refused
    summary = load([path, bad], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.stored == 400 and summary.rejected == len(BAD)
    return good


def store(settings: Settings, pg_schema: str, redis_prefix: str, tmp_path: Path) -> FeatureStore:
    folder = tmp_path / "schemas"
    folder.mkdir(exist_ok=True)
    (folder / "items.yaml").write_text(SCHEMA)
    return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=folder,
                        search_path=pg_schema, key_prefix=redis_prefix, fill=False)


def test_parquet_lists_round_trip_online_and_historical(
        loaded: pa.Table, settings: Settings, pg_schema: str, redis_prefix: str, tmp_path: Path) -> None:
    newest = loaded.filter(pa.array([i % 2 == 1 for i in range(loaded.num_rows)]))
    ids = newest.column("item_id").to_pylist()
    with store(settings, pg_schema, redis_prefix, tmp_path) as fs:
        online = fs.online("items", [*ids, "nope"], ["embedding", "tags", "scores"])
        assert online.schema.field("embedding").type == pa.list_(pa.float32(), 4)
        assert online.schema.field("tags").type == pa.list_(pa.int64())
        assert online.column("_from").to_pylist() == ["redis"] * len(ids) + [None]
        for name in ("embedding", "tags", "scores"):
            got, want = online.column(name).to_pylist(), newest.column(name).to_pylist()
            assert all(same(g, w) for g, w in zip(got, [*want, None], strict=True)), name
        # the Postgres fallback serves the same lists
        gone = ids[:50]
        hot = redis.Redis.from_url(settings.redis_url)
        hot.delete(*[redis_prefix + entity_key("items", i) for i in gone])
        fallback = fs.online("items", gone, ["embedding", "tags", "scores"])
        assert fallback.column("_from").to_pylist() == ["postgres"] * len(gone)
        for name in ("embedding", "tags", "scores"):
            got, want = fallback.column(name).to_pylist(), newest.column(name).to_pylist()[:50]
            assert all(same(g, w) for g, w in zip(got, want, strict=True)), name
        dicts = fs.online_dicts("items", ids[50:52], ["embedding", "tags", "scores"])
        assert [[d[n] for n in ("embedding", "tags", "scores")] for d in dicts] == [
            [r[n] for n in ("embedding", "tags", "scores")] for r in online.slice(50, 2).to_pylist()]
        hist = fs.historical("items", pa.table({
            "item_id": loaded.column("item_id"),
            "timestamp": pa.array([T0 + dt.timedelta(days=1)] * loaded.num_rows, pa.timestamp("us", "UTC"))}),
            ["embedding", "tags", "scores"])
        assert hist.schema.field("embedding").type == pa.list_(pa.float32(), 4)
        for name in ("embedding", "tags", "scores"):
            want = [v for v in newest.column(name).to_pylist() for _ in (0, 1)]
            assert all(same(g, w) for g, w in zip(hist.column(name).to_pylist(), want, strict=True)), name
        # as of the first event of each item: its first embedding
        first = fs.historical("items", pa.table({
            "item_id": loaded.column("item_id"),
            "timestamp": loaded.column("at")}), ["embedding"])
        want = loaded.column("embedding").to_pylist()
        got = first.column("embedding").to_pylist()
        assert all(same(g, w) for g, w in zip(got, want, strict=True))


def test_postgres_arrays_and_rejects(loaded: pa.Table, settings: Settings, pg_schema: str) -> None:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        types = dict(conn.execute(
            "SELECT attname, atttypid::regtype::text FROM pg_attribute WHERE attrelid = 'items'::regclass "
            "AND attnum > 0 AND NOT attisdropped").fetchall())
        assert (types["embedding"], types["tags"], types["scores"]) == (
            "real[]", "bigint[]", "double precision[]")
        rows = conn.execute("SELECT item_id, at, tags FROM items ORDER BY at, item_id").fetchall()
        assert len(rows) == 400
        by_id = {(r[0], r[1]): r[2] for r in rows}
        columns = (loaded.column(c).to_pylist() for c in ("item_id", "at", "tags"))
        for item, at, tags in zip(*columns, strict=True):
            assert by_id[(item, at)] == tags
        rejects = conn.execute("SELECT _source, errors FROM items__rejects ORDER BY _source").fetchall()
        # Postgres refuses what the validator refuses (CHECKs on the array columns)
        for emb, tags, _, words in BAD:
            if emb is None or "(element 0: 0.1)" in words:
                continue  # NOT NULL; and a float64 0.1 is an input float32 cannot hold, not a stored value
            texts = ("NULL" if v is None else repr(v).replace("nan", "NaN").replace("inf", "Infinity")
                     for v in emb)
            lit = "{" + ",".join(texts) + "}"
            with pytest.raises(psycopg.errors.CheckViolation), conn.transaction():
                conn.execute("UPDATE items SET embedding = %s::real[], tags = %s "
                             "WHERE ctid = (SELECT min(ctid) FROM items)", (lit, tags))
        # and takes what it accepts, e.g. the good rows' values again
        with conn.transaction():
            conn.execute("UPDATE items SET embedding = '{1e-45,3.4e+38,-0,0.1}', tags = '{}' "
                         "WHERE ctid = (SELECT min(ctid) FROM items)")
    assert len(rejects) == len(BAD)
    errors = [e for _, errs in rejects for e in errs]
    for _, _, rule, words in BAD:
        assert any(e["rule"] == rule and words in e["message"] for e in errors), (rule, words, errors)


def test_validator_is_vectorised_and_field_level(compiled: CompiledSchema) -> None:
    result = validate(bad_rows(), compiled)
    assert result.valid.num_rows == 0
    got = sorted(zip(result.rejects.column("rule").to_pylist(), result.rejects.column("message").to_pylist(),
                     strict=True))
    for _, _, rule, words in BAD:
        assert any(r == rule and words in m for r, m in got), (rule, words)
    # decoded JSON (the stream's per-record path): the same verdicts, and a non-list
    records = [{"item_id": "j1", "at": "2024-03-01T00:00:00Z", "embedding": [1, 2, 3, 4.5], "tags": [1]},
               {"item_id": "j2", "at": "2024-03-01T00:00:00Z", "embedding": "1,2,3,4"},
               {"item_id": "j3", "at": "2024-03-01T00:00:00Z", "embedding": [1, 2, 3]}]
    result = validate(records, compiled)
    assert result.valid.column("embedding").to_pylist() == [[1.0, 2.0, 3.0, 4.5]]
    messages = result.rejects.column("message").to_pylist()
    assert messages == ["field embedding violates constraint type: got '1,2,3,4' (not a list), "
                        "expected list(float32, 4)",
                        "field embedding violates constraint type: got [1, 2, 3] (length 3), "
                        "expected list(float32, 4)"]
