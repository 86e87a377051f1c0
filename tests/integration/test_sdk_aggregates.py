"""The SDK serves windowed aggregations (``schemas/clicks.yaml``) from the stores the
batch loader wrote: ``online`` reads the aggregates hash with the entity hash (Postgres
fallback: the newest ``clicks__aggregates`` row), ``historical`` joins the aggregation
row of the entity's newest aggregated event at or before each timestamp.

Every expectation is computed here from the ``clicks__aggregates`` rows read straight
from Postgres (and the Redis hashes read with redis-py), never through the SDK."""

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features import FeatureStore
from features.aggregate.engine import AggSpec
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import aggregates_key, entity_key
from features.config import Settings
from features.errors import ConfigError, SinkError
from features.load import load
from features.ops.examples import click_history, clicks_schema
from features.schema.parse import parse_schema

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
NAME = "clicks"
ENTITY, EVENT_TIME = "user_id", "event_time"
META = ("_event_time", "_age_seconds", "_from", "_found", "_stale")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
US = dt.timedelta(microseconds=1)


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return clicks_schema()


def agg_names(c: CompiledSchema, store: str) -> list[str]:
    assert c.schema.aggregations is not None
    return [a.name for a in c.schema.aggregations.features if store in a.store]


@dataclass
class Stored:
    """What the loader wrote, read back directly: per user, the ``clicks__aggregates``
    rows (event times ascending, values by cold aggregation name) and the history's
    event times (ascending)."""

    aggs: dict[str, list[tuple[dt.datetime, dict[str, Any]]]]
    history: dict[str, list[dt.datetime]]
    cold: list[str]

    def newest(self, user: str) -> tuple[dt.datetime, dict[str, Any]]:
        return self.aggs[user][-1]

    def as_of(self, user: str, t: dt.datetime) -> tuple[dt.datetime | None, dict[str, Any]]:
        """The reference: the user's aggregation row with the greatest event time <= t."""
        rows = self.aggs.get(user, [])
        i = bisect.bisect_right([r[0] for r in rows], t)
        return (rows[i - 1][0], rows[i - 1][1]) if i else (None, dict.fromkeys(self.cold))

    def history_as_of(self, user: str, t: dt.datetime) -> dt.datetime | None:
        times = self.history.get(user, [])
        i = bisect.bisect_right(times, t)
        return times[i - 1] if i else None


def load_clicks(tmp_path: Path, settings: Settings, c: CompiledSchema, pg_schema: str, redis_prefix: str,
                events: int, users: int) -> Stored:
    path = tmp_path / "clicks.parquet"
    pq.write_table(click_history(events, users=users), path, row_group_size=5_000)
    summary = load([path], c, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.aggregations is not None and summary.aggregations["adds_up"]
    # a backfill has no late events: every history row gets its aggregation row
    assert summary.aggregations["late"] == 0 and summary.aggregations["duplicates"] > 0
    cold = agg_names(c, "cold")
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        rows = conn.execute(f"SELECT {ENTITY}, {EVENT_TIME}, {', '.join(cold)} FROM clicks__aggregates "
                            "ORDER BY 1, 2").fetchall()
        events_at = conn.execute(f"SELECT {ENTITY}, {EVENT_TIME} FROM clicks ORDER BY 1, 2").fetchall()
    aggs: dict[str, list[tuple[dt.datetime, dict[str, Any]]]] = {}
    for r in rows:
        aggs.setdefault(r[0], []).append((r[1].astimezone(dt.UTC), dict(zip(cold, r[2:], strict=True))))
    history: dict[str, list[dt.datetime]] = {}
    for user, when in events_at:
        history.setdefault(user, []).append(when.astimezone(dt.UTC))
    assert len(aggs) == users and len(rows) > events * 3 // 4
    return Stored(aggs, history, cold)


@pytest.fixture()
def stored(tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
           redis_prefix: str) -> Stored:
    return load_clicks(tmp_path, settings, compiled, pg_schema, redis_prefix, 20_000, 300)


def make_store(settings: Settings, pg_schema: str, redis_prefix: str, **kwargs: Any) -> FeatureStore:
    """A store on the test's stores, without the read-through fill unless ``fill=True``."""
    kwargs.setdefault("fill", False)
    return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                        schemas=kwargs.pop("schemas", ROOT / "schemas"), search_path=pg_schema,
                        key_prefix=redis_prefix, **kwargs)


@pytest.fixture()
def fs(settings: Settings, pg_schema: str, redis_prefix: str) -> Iterator[FeatureStore]:
    with make_store(settings, pg_schema, redis_prefix) as store:
        yield store


@pytest.fixture()
def hot(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url)
    yield client
    client.close()


def micros(when: dt.datetime) -> int:
    return (when - EPOCH) // US


def same(a: Any, b: Any) -> bool:
    """Equal values of equal kinds; decimals also with the same digits (scale)."""
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return isinstance(a, Decimal) and isinstance(b, Decimal) and str(a) == str(b)
    return type(a) is type(b) and a == b


def assert_rows(got: list[dict[str, Any]], want: list[dict[str, Any]], what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        bad = {k: (g[k], w[k]) for k in w if not same(g[k], w[k])}
        assert not bad, f"{what}: row {i}: {bad}"


def test_online_serves_hot_aggregations_from_redis_and_postgres(
        fs: FeatureStore, stored: Stored, hot: redis.Redis, redis_prefix: str,
        compiled: CompiledSchema) -> None:
    hot_aggs = agg_names(compiled, "hot")
    assert hot_aggs == ["clicks_24h", "click_ratio_24h", "dwell_mean_1h", "spend_today"]
    spec = AggSpec.of(compiled.schema)
    assert spec is not None
    users = sorted(stored.aggs)
    ids = users[::6][:50]
    assert len(ids) == 50

    # Redis holds the newest aggregated event of each user, as the SDK must read it.
    for user in ids:
        h = hot.hgetall(redis_prefix + aggregates_key(NAME, user))
        assert int(h[b"_event_time"]) == micros(stored.newest(user)[0]), user
        assert int(hot.hget(redis_prefix + entity_key(NAME, user), "_event_time") or b"0") == \
            micros(stored.newest(user)[0]), user

    table = fs.online(NAME, [*ids, "u999999", ids[3]], windows="event")
    hot_features = [n for n in table.column_names if n not in (ENTITY, *hot_aggs, *META)]
    assert table.column_names == [ENTITY, *hot_features, *hot_aggs, *META]
    assert "dwell_log" in hot_features
    for name in hot_aggs:
        agg = next(a for a in spec.aggregations.features if a.name == name)
        assert table.schema.field(name).type == spec.output_type(agg), name
    assert table.schema.field("spend_today").type == pa.decimal128(38, 2)
    assert table.schema.field("clicks_24h").type == pa.int64()

    def expected(users: list[str], source: str | None) -> list[dict[str, Any]]:
        out = []
        for u in users:
            when, values = stored.newest(u) if source else (None, dict.fromkeys(stored.cold))
            out.append({ENTITY: u, **{n: values[n] for n in hot_aggs}, "_event_time": when, "_from": source,
                        "_found": source is not None, "_stale": False})
        return out

    want = expected(ids, "redis") + expected(["u999999"], None) + expected([ids[3]], "redis")
    assert_rows(table.to_pylist(), want, "online from redis")
    assert all(v is None for n in hot_features for v in table.column(n).to_pylist()[50:51])

    # The values really come from the aggregates hash: a changed hash value is served.
    hot.hset(redis_prefix + aggregates_key(NAME, ids[0]), "clicks_24h", "123456")
    changed = fs.online(NAME, [ids[0]], ["clicks_24h"], windows="event")
    assert changed.column("clicks_24h").to_pylist() == [123456]

    # Ids missing from Redis come from Postgres: the newest aggregation row. For some only
    # the entity hash is gone (a stale aggregates hash must not be used), for others both.
    entity_gone, both_gone = ids[:5], ids[5:10]
    assert hot.delete(*[redis_prefix + entity_key(NAME, u) for u in entity_gone + both_gone]) == 10
    assert hot.delete(*[redis_prefix + aggregates_key(NAME, u) for u in both_gone]) == 5
    for u in entity_gone:  # a stale value the fallback must not pick up
        hot.hset(redis_prefix + aggregates_key(NAME, u), "clicks_24h", "999999")
    table = fs.online(NAME, [*ids[:12], "u999999"], windows="event")
    want = expected(ids[:10], "postgres") + expected(ids[10:12], "redis") + expected(["u999999"], None)
    assert_rows(table.to_pylist(), want, "online with fallback")
    nowhere = fs.online(NAME, ids[:10], fallback=False, windows="event")
    assert nowhere.column("_found").to_pylist() == [False] * 10
    assert nowhere.column("clicks_24h").to_pylist() == [None] * 10

    # A subset, in the order asked; the async path reads and decodes the same way.
    subset = fs.online(NAME, ids[8:14], ["spend_today", "dwell_log", "clicks_24h"], windows="event")
    assert subset.column_names == [ENTITY, "spend_today", "dwell_log", "clicks_24h", *META]

    async def both() -> tuple[pa.Table, pa.Table]:
        a = await fs.online_async(NAME, [*ids, "u999999"], windows="event")
        b = await fs.online_async(NAME, ids[8:14], ["spend_today", "dwell_log", "clicks_24h"],
                                  windows="event")
        await fs.aclose()
        return a, b

    got_async, subset_async = asyncio.run(both())
    assert got_async.drop_columns(["_age_seconds"]).equals(
        fs.online(NAME, [*ids, "u999999"], windows="event").drop_columns(["_age_seconds"]))
    assert subset_async.drop_columns(["_age_seconds"]).equals(subset.drop_columns(["_age_seconds"]))

    with pytest.raises(ConfigError, match="views_24h"):  # a cold-only aggregation is not in Redis
        fs.online(NAME, ids[:2], ["views_24h"])


def test_aggregates_hash_of_another_schema_or_encoding_raises(
        settings: Settings, pg_schema: str, redis_prefix: str, stored: Stored, hot: redis.Redis,
        compiled: CompiledSchema) -> None:
    first, second = sorted(stored.aggs)[:2]
    key = redis_prefix + aggregates_key(NAME, first)
    hot.hset(key, "_schema_fingerprint", "f" * 64)
    with make_store(settings, pg_schema, redis_prefix) as store:
        assert store.online(NAME, [second], windows="event").column("_found").to_pylist() == [True]
        # without aggregations requested, the aggregates hash is not read
        assert store.online(NAME, [first], ["dwell_log"], windows="event").column(
            "_found").to_pylist() == [True]
        with pytest.raises(SinkError) as info:
            store.online(NAME, [second, first], windows="event")
    assert info.value.store == "redis" and "aggregates hashes" in str(info.value)
    assert "ffffffffffff" in str(info.value) and compiled.fingerprint[:12] in str(info.value)
    hot.hset(key, mapping={"_schema_fingerprint": compiled.fingerprint, "_enc": "2"})
    with make_store(settings, pg_schema, redis_prefix) as store, \
            pytest.raises(SinkError, match="aggregates hashes with encoding version 2"):
        store.online(NAME, [first], ["clicks_24h"], windows="event")


def test_historical_aggregations_match_a_python_as_of_reference(
        fs: FeatureStore, stored: Stored, compiled: CompiledSchema) -> None:
    rng = np.random.default_rng(3)
    users = sorted(stored.aggs)
    cold = stored.cold
    assert cold == ["clicks_24h", "views_24h", "click_ratio_24h", "dwell_mean_1h", "items_7d", "spend_today",
                    "max_price_24h", "last_dwell_1h"]
    # the backfill gave every instant of the history (every event at it) its aggregation row
    assert all(sorted(set(stored.history[u])) == [r[0] for r in stored.aggs[u]] for u in users)
    pairs: list[tuple[str, dt.datetime]] = []
    for k in range(500):
        u = users[int(rng.integers(len(users)))]
        rows = stored.aggs[u]
        kind = k % 6
        if kind == 0:                                   # exactly on an aggregated event
            t = rows[int(rng.integers(len(rows)))][0]
        elif kind == 1 and len(rows) > 1:               # strictly between two events
            i = int(rng.integers(len(rows) - 1))
            t = rows[i][0] + (rows[i + 1][0] - rows[i][0]) / 2
            t -= dt.timedelta(microseconds=t.microsecond % 1000)
            t = t if t > rows[i][0] else rows[i][0] + US
        elif kind == 2:                                 # before the first event
            t = rows[0][0] - [US, dt.timedelta(days=3)][k % 2]
        elif kind == 3:                                 # far after the last
            t = rows[-1][0] + dt.timedelta(days=400)
        elif kind == 4:                                 # a microsecond after an event
            t = rows[int(rng.integers(len(rows)))][0] + US
        else:                                           # a microsecond before an event
            t = rows[int(rng.integers(len(rows)))][0] - US
        pairs.append((u, t))
    pairs += [("u999999", dt.datetime(2026, 1, 5, tzinfo=dt.UTC))]
    entity_df = pa.table({ENTITY: [p[0] for p in pairs],
                          "timestamp": pa.array([p[1] for p in pairs], pa.timestamp("us", "UTC")),
                          "label": pa.array(np.arange(len(pairs)))})
    got = fs.historical(NAME, entity_df, windows="event")
    spec = AggSpec.of(compiled.schema)
    assert spec is not None
    features = [n for n in got.column_names if n not in (ENTITY, "timestamp", "label", *cold, "_event_time")]
    assert got.column_names == [ENTITY, "timestamp", "label", *features, *cold, "_event_time"]
    assert "event_id" in features and "views_24h" not in features
    for agg in spec.aggregations.features:
        assert got.schema.field(agg.name).type == spec.output_type(agg), agg.name
    want = []
    for u, t in pairs:
        _, values = stored.as_of(u, t)
        want.append({ENTITY: u, **values, "_event_time": stored.history_as_of(u, t)})
    assert_rows(got.to_pylist(), want, "historical")
    nulls = sum(w["clicks_24h"] is None for w in want)
    assert 80 < nulls < 150  # before-first and unknown rows; everything else found a row
    # every history row has its aggregation row: as of any time, both are the same event's
    assert all(stored.as_of(u, t)[0] == stored.history_as_of(u, t) for u, t in pairs)

    # Only aggregations asked for, in the order asked; max_age bounds the aggregation row too.
    some = fs.historical(NAME, entity_df, ["spend_today", "item_id", "views_24h"], windows="event")
    assert some.column_names == [ENTITY, "timestamp", "label", "spend_today", "item_id", "views_24h",
                                 "_event_time"]
    assert_rows(some.to_pylist(), [{k: w[k] for k in ("spend_today", "views_24h")} for w in want],
                "historical subset")
    day = dt.timedelta(days=1)
    bounded = fs.historical(NAME, entity_df, ["clicks_24h"], max_age=day, windows="event")
    want_bounded = [w["clicks_24h"] if (a := stored.as_of(u, t)[0]) is not None and a >= t - day else None
                    for w, (u, t) in zip(want, pairs, strict=True)]
    assert bounded.column("clicks_24h").to_pylist() == want_bounded
    assert want_bounded != [w["clicks_24h"] for w in want]
    with pytest.raises(ConfigError, match="already has column"):
        fs.historical(NAME, entity_df.append_column("clicks_24h", pa.array([0] * len(pairs))))


def test_historical_at_an_event_time_is_that_events_row_and_what_online_served(
        fs: FeatureStore, stored: Stored, compiled: CompiledSchema) -> None:
    """Point in time: T equal to an event's time gives exactly that event's aggregation
    row, a microsecond earlier the previous one (never a later one); at the newest event
    the hot aggregations equal what ``online`` serves."""
    users = sorted(stored.aggs)[::5]
    pairs = [(u, when) for u in users for when, _ in stored.aggs[u]]
    entity_df = pa.table({ENTITY: [u for u, _ in pairs] * 2,
                          "timestamp": pa.array([t for _, t in pairs] + [t - US for _, t in pairs],
                                                pa.timestamp("us", "UTC"))})
    cold = stored.cold
    got = fs.historical(NAME, entity_df, cold, windows="event").to_pylist()
    n = len(pairs)
    assert n > 1_000
    at = [{k: g[k] for k in cold} for g in got[:n]]
    before = [{k: g[k] for k in cold} for g in got[n:]]
    assert_rows(at, [values for u in users for _, values in stored.aggs[u]], "at the event time")
    previous = [values for u in users
                for values in [dict.fromkeys(cold), *(v for _, v in stored.aggs[u][:-1])]]
    assert_rows(before, previous, "a microsecond before")

    newest = pa.table({ENTITY: users, "timestamp": pa.array([stored.newest(u)[0] for u in users],
                                                             pa.timestamp("us", "UTC"))})
    hot_aggs = agg_names(compiled, "hot")
    trained = fs.historical(NAME, newest, hot_aggs, windows="event").select(hot_aggs)
    served = fs.online(NAME, users, hot_aggs, windows="event").select(hot_aggs)
    assert trained.equals(served)


HOT_ONLY = """
    - name: clicks_1h
      function: count
      where: {event_type: click}
      window: 1h
      store: hot
"""


def test_hot_only_aggregation_is_null_in_the_fallback(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str, hot: redis.Redis) -> None:
    """A hot-only aggregation is served from Redis, null for fallback rows (Postgres has
    no column for it), and not available to ``historical``."""
    text = (ROOT / "schemas" / "clicks.yaml").read_text()
    anchor = "    - name: last_dwell_1h"
    assert text.count(anchor) == 1
    text = text.replace(anchor, HOT_ONLY.strip("\n") + "\n" + anchor)
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "clicks.yaml").write_text(text)
    c = compile_schema(parse_schema(text, "clicks.yaml"))
    assert agg_names(c, "hot") == ["clicks_24h", "click_ratio_24h", "dwell_mean_1h", "spend_today",
                                   "clicks_1h"]
    data = load_clicks(tmp_path, settings, c, pg_schema, redis_prefix, 4_000, 40)
    users = sorted(data.aggs)[:6]
    raw = [hot.hget(redis_prefix + aggregates_key(NAME, u), "clicks_1h") for u in users]
    assert all(v is not None for v in raw) and any(int(v or 0) > 0 for v in raw)
    hot.delete(*[redis_prefix + entity_key(NAME, u) for u in users[3:]])
    with make_store(settings, pg_schema, redis_prefix, schemas=folder) as store:
        got = store.online(NAME, users, ["clicks_1h", "clicks_24h"], windows="event")
        assert got.column("_from").to_pylist() == ["redis"] * 3 + ["postgres"] * 3
        assert got.column("clicks_1h").to_pylist() == [int(v or 0) for v in raw[:3]] + [None] * 3
        assert got.column("clicks_24h").to_pylist() == [data.newest(u)[1]["clicks_24h"] for u in users]
        with pytest.raises(ConfigError, match="clicks_1h"):
            store.historical(NAME, pa.table({ENTITY: users, "timestamp": pa.array(
                [dt.datetime(2026, 2, 1, tzinfo=dt.UTC)] * len(users), pa.timestamp("us", "UTC"))}),
                ["clicks_1h"])


def test_small_calls_read_aggregations_as_the_arrow_path(fs: FeatureStore, stored: Stored) -> None:
    """At most SMALL_CALL ids, all in Redis: decoded in Python (features and the
    aggregates hash), the same rows as the Arrow path of a larger call."""
    from features.sdk.online import SMALL_CALL

    users = sorted(stored.aggs)[:30]
    assert len(users) > SMALL_CALL

    def rows(table_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "_age_seconds"} for r in table_rows]

    for features in (None, ["spend_today", "dwell_log", "clicks_24h"]):
        ref = fs.online(NAME, users, features, windows="event")
        assert set(ref.column("_from").to_pylist()) == {"redis"}
        for start in (0, 9, 18):
            small = fs.online(NAME, users[start:start + 9], features, windows="event")
            assert small.schema == ref.schema
            assert rows(small.to_pylist()) == rows(ref.slice(start, 9).to_pylist())
            dicts = fs.online_dicts(NAME, users[start:start + 9], features, windows="event")
            assert rows(dicts) == rows(small.to_pylist())


def test_fill_writes_the_entity_and_aggregates_hashes_from_postgres(
        settings: Settings, pg_schema: str, redis_prefix: str, stored: Stored, hot: redis.Redis) -> None:
    """The read-through fill of a schema with aggregations: both hashes come back from
    Postgres (the history row and the newest aggregation row, each with its own event
    time and lineage, marked ``_filled``); then Redis serves the same values."""
    users = sorted(stored.aggs)[40:46]
    keys = [redis_prefix + k(NAME, u) for u in users for k in (entity_key, aggregates_key)]
    originals = {key: hot.hgetall(key) for key in keys}
    hot.delete(*keys)
    with make_store(settings, pg_schema, redis_prefix, fill=False) as plain:
        want = plain.online(NAME, users, windows="event").drop_columns(["_age_seconds", "_from"]).to_pylist()
    with make_store(settings, pg_schema, redis_prefix, fill=True) as fs:
        first = fs.online(NAME, users, windows="event")
        assert first.column("_from").to_pylist() == ["postgres"] * len(users)
        assert fs._fallback.counts.filled == 2 * len(users)
        second = fs.online(NAME, users, windows="event")
        assert second.column("_from").to_pylist() == ["redis"] * len(users)
        assert second.drop_columns(["_age_seconds", "_from"]).to_pylist() == want
    for key in keys:
        h = hot.hgetall(key)
        assert h[b"_filled"] == b"1" and h[b"_event_time"] == originals[key][b"_event_time"], key
        assert h[b"_source"] == originals[key][b"_source"] and h[b"_run_id"] == originals[key][b"_run_id"]


def test_moments_first_and_float_sums_are_stored_and_read_in_their_types(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    """variance/stddev (double precision), a float field's fixed-point sum (double
    precision) and first (the field's type): Postgres and Redis hold the reference's
    values, and the SDK reads them so (online from Redis, online from Postgres once the
    hashes are gone, historical), typed as ``AggSpec.output_type`` says."""
    import random

    from aggregate_reference import SCHEMA, history_table, random_history, reference

    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "agg_props.yaml").write_text(SCHEMA)
    c = compile_schema(parse_schema(SCHEMA))
    events = random_history(random.Random(7), 400, users=6, minutes=600)
    pq.write_table(history_table(events), tmp_path / "h.parquet")
    assert load([tmp_path / "h.parquet"], c, settings, search_path=pg_schema, key_prefix=redis_prefix).adds_up
    want = reference(c.schema, events)
    spec = AggSpec.of(c.schema)
    assert spec is not None
    names = [a.name for a in spec.aggregations.features]
    new = ["qty_var", "qty_std_hour", "amount_std", "amount_var_s", "temp_sum", "temp_mean", "temp_std_s",
           "temp_var_day", "qty_first", "score_first", "amount_first_day"]
    types = {n: spec.output_type(next(a for a in spec.aggregations.features if a.name == n)) for n in new}
    assert types["temp_sum"] == types["qty_var"] == types["temp_std_s"] == pa.float64()
    assert types["qty_first"] == pa.int32() and types["amount_first_day"] == pa.decimal128(10, 2)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        pg_types = dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns "
                                     "WHERE table_name = 'agg_props__aggregates'").fetchall())
    assert pg_types["temp_sum"] == pg_types["qty_var"] == "double precision"
    assert (pg_types["qty_first"], pg_types["amount_first_day"]) == ("integer", "numeric")
    newest = {u: max(t for (e, t) in want if e == u) for u in {k[0] for k in want}}
    users = sorted(newest)

    def expect(u: str, t: int, cols: list[str]) -> dict[str, Any]:
        values = dict(zip(names, want[(u, t)], strict=True))
        return {n: values[n] for n in cols}

    hot = [n for n in new if "hot" in next(a for a in spec.aggregations.features if a.name == n).store]
    assert hot == ["qty_std_hour", "amount_std", "temp_sum", "temp_std_s", "qty_first"]
    with make_store(settings, pg_schema, redis_prefix, schemas=schemas) as fs:
        for source in ("redis", "postgres"):
            table = fs.online("agg_props", users, hot, windows="event")
            for n in hot:
                assert table.schema.field(n).type == types[n], n
            assert table.column("_from").to_pylist() == [source] * len(users)
            got = table.select(hot).to_pylist()
            assert got == [expect(u, newest[u], hot) for u in users], source
            r = redis.Redis.from_url(settings.redis_url)
            r.delete(*[redis_prefix + entity_key("agg_props", u) for u in users],
                     *[redis_prefix + aggregates_key("agg_props", u) for u in users])
            r.close()
        keys = sorted(want)[::7]
        entity_df = pa.table({"uid": [k[0] for k in keys],
                              "timestamp": pa.array([k[1] for k in keys], pa.timestamp("us", "UTC"))})
        hist = fs.historical("agg_props", entity_df, new, windows="event")
        for n in new:
            assert hist.schema.field(n).type == types[n], n
        assert hist.select(new).to_pylist() == [expect(u, t, new) for u, t in keys]
    assert any(v is not None and v > 0 for v in hist.column("temp_std_s").to_pylist())
