"""``FeatureStore.online(..., windows="request_time", at=T)``: the window values at ``T``
read from the per-entity tiles the batch backfill writes to real Redis
(``features.aggregate.tiles``), equal to ``historical(..., windows="request_time")`` at
``T`` (real Postgres) and to the brute-force reference (``reference_at`` in
``tests/aggregate_reference.py``):

- random histories of the shared schema with every aggregation stored hot (every
  function, both window kinds, ``where``), ties at one instant with different contents
  included, cut into loads run in any order, each load's rows shuffled, and request
  times inside bursts, exactly on an event, 1 µs either side, on tile boundaries, between
  events, long after the last, before the first, and an entity with no history;
- a quiet entity decays to the empty window (count 0, sum 0, mean/min/max null, last_k
  empty); the tiles hash is trimmed to the retention and carries the schema's TTL; a
  request time before the retained range is refused.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
import yaml
from aggregate_reference import BASE_US, EVENT, MINUTE_US, SCHEMA, USERS, T, history_table, reference_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from features import FeatureStore
from features.aggregate.engine import AggSpec
from features.aggregate.tilepack import SUMMARIES_FIELD, pack_summary_set, summary_blobs
from features.aggregate.tiles import TileSpec
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import aggregates_key, entity_key, tiles_key
from features.config import Settings
from features.errors import ConfigError
from features.load import load
from features.ops.migrate import apply_postgres, plan
from features.schema import parse_schema

pytestmark = pytest.mark.services

def _hot_schema() -> str:
    """The shared schema with every aggregation served online (the sketches included:
    ``items_approx_2h`` at precision 4 counts at most 2 distinct hashes exactly, so its
    windows and tiles switch to registers), a ratio of a sketch, and a lateness that keeps
    the whole test history in the tiles."""
    doc = yaml.safe_load(SCHEMA)
    doc["aggregations"]["allowed_lateness"] = "2d"
    aggs = doc["aggregations"]["features"]
    doc["aggregations"]["features"] = [{**a, "store": ["hot", "cold"]} for a in aggs] + [
        {"name": "items_per_event", "function": "ratio", "numerator": "items_approx_2h",
         "denominator": "n_1h", "on_zero": 0.0, "store": ["hot", "cold"]}]
    return str(yaml.safe_dump(doc, sort_keys=False))


HOT_SCHEMA = _hot_schema()
COMPILED = compile_schema(parse_schema(HOT_SCHEMA))
AGGS = [a.name for a in COMPILED.schema.aggregations.features]  # type: ignore[union-attr]
TSPEC = TileSpec.of(AggSpec.of(COMPILED.schema))
assert TSPEC is not None
TILE = TSPEC.size_us
HOUR = 60 * MINUTE_US
DAY = 24 * HOUR
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: the functions a one-entity read computes from the tiles without the general merge
ONE_ROW = ("count", "sum", "mean", "min", "max", "first", "last")


def at(us: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=us)


#: one event of a dense history for the sketches: 2 users, 3 hours, 8 items and few
#: scores (windows and tiles of more than items_approx_2h's 2 exactly counted hashes, so
#: their states switch to registers in every way; ties of equal values for the percentiles)
DENSE_EVENT = st.tuples(EVENT, st.sampled_from(USERS[:2]), st.integers(0, 180),
                        st.sampled_from([None, *(f"i{k}" for k in range(8))]),
                        st.sampled_from([None, 0.0, -1.5, 2.5, 1e-300, 7.0, 7.000001])).map(
    lambda x: {**x[0], "uid": x[1], T: BASE_US + x[2] * MINUTE_US, "item": x[3], "score": x[4]})


@st.composite
def cases(draw: st.DrawFn, event: st.SearchStrategy[dict[str, Any]] = EVENT, sizes: tuple[int, int] = (1, 40),
          requests: tuple[int, int] = (1, 6)
          ) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[int]]:
    """A history of ``sizes`` events (ties with different contents included), the loads
    it is cut into (any split, any order, rows shuffled) and ``requests`` request times
    around it."""
    events = draw(st.lists(event, min_size=sizes[0], max_size=sizes[1]))
    k = draw(st.integers(1, 3))
    which = draw(st.lists(st.integers(0, k - 1), min_size=len(events), max_size=len(events)))
    parts = [[e for e, w in zip(events, which, strict=True) if w == i] for i in range(k)]
    loads = [draw(st.permutations(p)) for p in draw(st.permutations(parts)) if p]
    near = [e[T] + d for e in events for d in (0, -1, 1, HOUR, HOUR + 1, 2 * HOUR, 90 * MINUTE_US)]
    edges = [BASE_US + i * TILE + d for i in range(-1, 20) for d in (-1, 0, 1)]
    fixed = [BASE_US - DAY, BASE_US - 1, BASE_US + 2 * HOUR, BASE_US + 7 * DAY, BASE_US + DAY + 1]
    t = st.one_of(st.sampled_from(near + fixed), st.sampled_from(edges),
                  st.integers(BASE_US - HOUR, BASE_US + 12 * HOUR))
    return events, loads, draw(st.lists(t, min_size=requests[0], max_size=requests[1], unique=True))


def rows_of(table: pa.Table, aggs: list[str] = AGGS) -> list[tuple[Any, ...]]:
    cols = [table.column(a).to_pylist() for a in aggs]
    return [tuple(c[i] for c in cols) for i in range(table.num_rows)]


def drop_keys(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@contextmanager
def hot_stores(settings: Settings, tmp: Path, tag: str, text: str = HOT_SCHEMA
               ) -> Iterator[tuple[str, str, FeatureStore]]:
    """A Postgres schema and a Redis key prefix of their own for :data:`HOT_SCHEMA` (or
    ``text``), and a FeatureStore on them: ``(search path, key prefix, store)``; all
    dropped afterwards."""
    (tmp / "schemas").mkdir()
    (tmp / "schemas" / "agg_props.yaml").write_text(text)
    ns = f"t_{tag}_{uuid.uuid4().hex[:12]}"
    prefix = f"test:{ns}:"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    client = redis.Redis.from_url(settings.redis_url)
    fs = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp / "schemas", search_path=ns, key_prefix=prefix)
    try:
        yield ns, prefix, fs
    finally:
        fs.close()
        drop_keys(client, prefix)
        client.close()
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()


def check_request_times(fs: FeatureStore, events: list[dict[str, Any]], times: list[int],
                        compiled: Any = COMPILED, aggs: list[str] = AGGS) -> None:
    """At each of ``times``, for every user and one unknown: ``online(T) == historical(T) ==
    reference_at(T)`` over the history ``events``."""
    ids = [*USERS, "nobody"]
    for t in times:
        want = reference_at(compiled.schema, events, [(u, t) for u in ids])
        got = fs.online("agg_props", ids, aggs, windows="request_time", at=at(t))
        assert got.column("uid").to_pylist() == ids
        assert rows_of(got, aggs) == want, t
        # the counts, sums, means, min/max, first/last among them (the one-entity fast read,
        # taken beside the sketches the tiles hold), in reverse order
        kinds = {a.name: a.function for a in compiled.schema.aggregations.features}
        simple = [a for a in aggs if kinds[a] in ONE_ROW][::-1]
        for i, u in enumerate(ids):  # one entity per call (the one-entity read, or its fallback)
            one = fs.online("agg_props", [u], aggs, windows="request_time", at=at(t))
            assert rows_of(one, aggs) == want[i:i + 1], (t, u)
            if simple:
                fast = fs.online("agg_props", [u], simple, windows="request_time", at=at(t))
                assert rows_of(fast, simple) == [tuple(want[i][aggs.index(a)] for a in simple)], (t, u)
        frame = pa.table({"uid": pa.array(ids), "timestamp": pa.array([t] * len(ids), pa.int64()).cast(
            pa.timestamp("us", "UTC"))})
        assert rows_of(fs.historical("agg_props", frame, aggs, windows="request_time"), aggs) == want, t


def load_all(loads: list[list[dict[str, Any]]], compiled: Any, settings: Settings, tmp: Path, ns: str,
             prefix: str) -> None:
    """Each of ``loads`` as a Parquet file, loaded in turn."""
    for i, rows in enumerate(loads):
        path = tmp / f"load{i}.parquet"
        pq.write_table(history_table(rows), path)
        summary = load([path], compiled, settings, search_path=ns, key_prefix=prefix)
        assert summary.adds_up and summary.rejected == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=cases())
def test_online_at_request_time_equals_historical_and_the_reference(
        case: tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[int]],
        settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    load_and_check(case, settings, tmp_path_factory.mktemp("ort"), "online_rt")


def load_and_check(case: tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[int]],
                   settings: Settings, tmp: Path, tag: str) -> None:
    """Load the case's history in its loads (each a Parquet file, in their order), then
    :func:`check_request_times` at its request times."""
    events, loads, times = case
    with hot_stores(settings, tmp, tag) as (ns, prefix, fs):
        load_all(loads, COMPILED, settings, tmp, ns, prefix)
        check_request_times(fs, events, times)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(case=cases())
def test_an_entity_without_tiles_reads_the_history(
        case: tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[int]],
        settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    """u1's tiles hash deleted: its windows (the sketches and the ratio of one included)
    are computed from the history at ``T`` in the same call, never refused. Every
    function equals historical and the reference."""
    events, loads, times = case
    tmp = tmp_path_factory.mktemp("ors")
    with hot_stores(settings, tmp, "online_nt") as (ns, prefix, fs):
        load_all(loads, COMPILED, settings, tmp, ns, prefix)
        client = redis.Redis.from_url(settings.redis_url)
        client.delete(prefix + tiles_key("agg_props", "u1"))
        client.close()
        check_request_times(fs, events, times)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(case=cases(DENSE_EVENT, (30, 80), (6, 12)))
def test_sketches_online_equal_historical_and_the_reference_on_dense_histories(
        case: tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[int]],
        settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    """approx_count_distinct (exact list, sparse and dense registers in the tiles),
    approx_percentile and a ratio of a sketch: online(T) == historical(T) ==
    reference_at(T) over dense histories cut into loads in any order."""
    load_and_check(case, settings, tmp_path_factory.mktemp("ort_dense"), "online_rt_dense")


QUIET = """
name: quiet
version: 1.0.0
entity: card
event_time: ts
hot: {ttl: 30d}
fields:
  - {name: card, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(us, UTC)", constraints: {required: true}}
  - {name: amount, type: float64, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 1h
  features:
    - {name: txn_24h, function: count, window: 24h, store: [hot, cold]}
    - {name: amount_sum_24h, function: sum, of: amount, scale: 2, window: 24h, store: [hot, cold]}
    - {name: amount_mean_24h, function: mean, of: amount, window: 24h, store: [hot, cold]}
    - {name: amount_max_24h, function: max, of: amount, window: 24h, store: [hot, cold]}
    - {name: last3, function: last_k, of: amount, k: 3, window: 24h, store: [hot, cold]}
"""


def test_a_quiet_entity_decays_and_the_tiles_stay_bounded(settings: Settings, tmp_path: Path, pg_schema: str,
                                                          redis_prefix: str) -> None:
    c = compile_schema(parse_schema(QUIET))
    tspec = TileSpec.of(AggSpec.of(c.schema))
    assert tspec is not None
    day0 = int(dt.datetime(2026, 3, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000
    # 10 days of one event every 20 minutes, then nothing
    ts = [day0 + i * 20 * MINUTE_US for i in range(10 * 72)]
    table = pa.table({"card": pa.array(["c1"] * len(ts)), "ts": pa.array(ts, pa.timestamp("us", "UTC")),
                      "amount": pa.array([float(i % 7) for i in range(len(ts))])})
    pq.write_table(table, tmp_path / "h.parquet")
    assert load([tmp_path / "h.parquet"], c, settings, search_path=pg_schema, key_prefix=redis_prefix).adds_up
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "quiet.yaml").write_text(QUIET)
    last = ts[-1]
    client = redis.Redis.from_url(settings.redis_url)
    key = redis_prefix + tiles_key("quiet", "c1")
    fields = [f.decode() for f in client.hkeys(key)]
    # only the tiles of the last window + lateness (a summary and the events of each): the
    # summaries in the one packed field the write script splices, ascending, in the
    # format of features.aggregate.tilepack.pack_summary_set (its Python twin)
    packed = client.hget(key, SUMMARIES_FIELD)
    assert isinstance(packed, bytes)
    starts, blobs = summary_blobs(packed)
    assert pack_summary_set(starts, blobs) == packed
    assert starts == sorted({int(f[2:]) for f in fields if f[:2] == "e:"})
    assert set(fields) == {"n", "v", SUMMARIES_FIELD, *(f"e:{s}" for s in starts)}  # no "c": whole
    assert starts[0] >= (last - tspec.retention_us) // tspec.size_us * tspec.size_us
    assert len(starts) <= tspec.retention_us // tspec.size_us + 1
    assert all(len(b) >= tspec.layout.fixed_bytes for b in blobs)
    assert 29 * 86400 < client.ttl(key) <= 30 * 86400
    client.close()
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix,
                      clock=lambda: (last + 2 * DAY) / 1e6) as fs:
        names = ["txn_24h", "amount_sum_24h", "amount_mean_24h", "amount_max_24h", "last3"]
        busy = fs.online("quiet", ["c1"], names, windows="request_time", at=at(last))
        assert busy.to_pylist()[0] | {} == busy.to_pylist()[0]
        assert busy.column("txn_24h").to_pylist() == [72]
        assert busy.column("last3").to_pylist() == [[float((len(ts) - 1 - j) % 7) for j in range(3)]]
        stale = fs.online("quiet", ["c1"], names, windows="event")  # as of the newest event: frozen
        assert stale.column("txn_24h").to_pylist() == [72]
        now = fs.online("quiet", ["c1", "nobody"], names, windows="request_time")  # the clock: 2 days later
        assert now.column("txn_24h").to_pylist() == [0, 0]
        assert now.column("amount_sum_24h").to_pylist() == [0.0, 0.0]
        assert now.column("amount_mean_24h").to_pylist() == [None, None]
        assert now.column("amount_max_24h").to_pylist() == [None, None]
        assert now.column("last3").to_pylist() == [[], []]
        half = fs.online("quiet", ["c1"], names, windows="request_time", at=at(last + 12 * HOUR))
        assert half.column("txn_24h").to_pylist() == [36]
        with pytest.raises(ConfigError, match="allowed lateness"):
            fs.online("quiet", ["c1"], names, windows="request_time", at=at(last - 2 * HOUR))
        with pytest.raises(ConfigError, match="windows must be one of"):
            fs.online("quiet", ["c1"], names, windows="request-time")
        with pytest.raises(ConfigError, match="at= is the request time"):
            fs.online("quiet", ["c1"], names, windows="event", at=at(last))
        # the default: the windows at the clock, two days after the last event
        assert fs.online("quiet", ["c1"], names).to_pylist()[0]["txn_24h"] == 0
    # a clock 2 hours behind the newest event (more than the lateness): the default call
    # does not refuse; the entity's windows come from the history, as historical gives them
    behind = last - 2 * HOUR
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix,
                      clock=lambda: behind / 1e6) as fs:
        got = fs.online("quiet", ["c1"], names)
        frame = pa.table({"card": ["c1"], "timestamp": pa.array([behind], pa.int64()).cast(
            pa.timestamp("us", "UTC"))})
        assert got.select(names).to_pylist() == fs.historical("quiet", frame, names).select(names).to_pylist()
        assert got.column("txn_24h").to_pylist() == [72]


def _three_cards(settings: Settings, tmp_path: Path, pg_schema: str, redis_prefix: str
                 ) -> tuple[CompiledSchema, list[str], list[int]]:
    """The quiet schema, cards c1..c3 with an event every 20 minutes in turn for two days
    loaded from ``tmp_path/h.parquet``, the schema in ``tmp_path/schemas``: (schema, cards,
    the event times)."""
    c = compile_schema(parse_schema(QUIET))
    day0 = int(dt.datetime(2026, 3, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000
    cards = ["c1", "c2", "c3"]
    ts = [day0 + i * 20 * MINUTE_US for i in range(2 * 72)]
    table = pa.table({"card": pa.array([cards[i % 3] for i in range(len(ts))]),
                      "ts": pa.array(ts, pa.timestamp("us", "UTC")),
                      "amount": pa.array([float(i % 5) + 0.25 for i in range(len(ts))])})
    pq.write_table(table, tmp_path / "h.parquet")
    assert load([tmp_path / "h.parquet"], c, settings, search_path=pg_schema, key_prefix=redis_prefix).adds_up
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "quiet.yaml").write_text(QUIET)
    return c, cards, ts


def test_an_entity_without_tiles_reads_its_windows_from_the_history(
        settings: Settings, tmp_path: Path, pg_schema: str, redis_prefix: str) -> None:
    """A tiles hash lost (Redis restarted without persistence, or an entity loaded before
    tiles existed) reads the windows ``historical(..., windows="request_time")`` gives at
    ``T``, never the empty window; so does an entity Redis lost whole (the Postgres
    fallback finds it); an entity never seen reads the empty window without a history
    read; ``online_async`` gives the rows ``online`` gives. The tiles are not written back."""
    _, cards, ts = _three_cards(settings, tmp_path, pg_schema, redis_prefix)
    client = redis.Redis.from_url(settings.redis_url)
    assert client.delete(redis_prefix + tiles_key("quiet", "c1")) == 1  # its tiles only
    lost = [redis_prefix + key("quiet", "c2") for key in (entity_key, aggregates_key, tiles_key)]
    assert client.delete(*lost) == 3  # all of it
    names = ["txn_24h", "amount_sum_24h", "amount_mean_24h", "amount_max_24h", "last3"]
    ids = [*cards, "nobody"]
    t = ts[-1] + 6 * HOUR  # a quarter of the 24 h window has decayed
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix) as fs:
        got = fs.online("quiet", ids, names, windows="request_time", at=at(t))
        frame = pa.table({"card": pa.array(ids), "timestamp": pa.array([t] * len(ids), pa.int64()).cast(
            pa.timestamp("us", "UTC"))})
        want = fs.historical("quiet", frame, names, windows="request_time")
        assert got.select(names).to_pylist() == want.select(names).to_pylist()
        assert got.column("txn_24h").to_pylist() == [18, 18, 18, 0]  # 54 events in (t - 24 h, t]
        assert got.column("_from").to_pylist() == ["redis", "postgres", "redis", None]
        assert got.column("last3").to_pylist()[3] == []
        async def read_async() -> pa.Table:
            try:
                return await fs.online_async("quiet", ids, names, windows="request_time", at=at(t))
            finally:
                await fs.connections.aclose()

        same = got.drop_columns(["_age_seconds"]).to_pylist()
        assert asyncio.run(read_async()).drop_columns(["_age_seconds"]).to_pylist() == same
        dicts = fs.online_dicts("quiet", ids, names, windows="request_time", at=at(t))
        assert [{k: v for k, v in d.items() if k != "_age_seconds"} for d in dicts] == same
        # c1 and c2 (not "nobody"), three calls
        counted = [line for line in fs.metrics().splitlines()
                   if line.startswith("featureline_sdk_windows_from_history_total{")]
        assert counted == ['featureline_sdk_windows_from_history_total{schema="quiet"} 6.0'], counted
    assert client.exists(redis_prefix + tiles_key("quiet", "c1")) == 0  # a read writes no tiles
    client.close()


def test_a_tiles_hash_redis_lost_and_a_writer_made_again_reads_the_history_until_whole(
        settings: Settings, tmp_path: Path, pg_schema: str, redis_prefix: str) -> None:
    """Redis loses two entities' tiles hashes; a batch load of a new event of one and a
    stream micro-batch of a new event of the other make them again holding only the tiles
    they write, with ``c``: the end of the last tile holding an event they read back and
    did not write. A read whose windows reach before ``c`` computes them from the history
    (online == historical, one entity or several), one that does not reads the tiles; a
    write that leaves no event out (a reload) drops ``c``. An entity whose hash Redis kept
    gets no ``c``."""
    from features.stream.core import StreamProcessor

    c, cards, ts = _three_cards(settings, tmp_path, pg_schema, redis_prefix)
    of = {k: [t for i, t in enumerate(ts) if cards[i % 3] == k] for k in cards}
    client = redis.Redis.from_url(settings.redis_url)
    keys = {k: redis_prefix + tiles_key("quiet", k) for k in cards}
    assert client.delete(keys["c1"], keys["c2"]) == 2
    new_t = ts[-1] + 30 * MINUTE_US
    pq.write_table(pa.table({"card": ["c1"], "ts": pa.array([new_t], pa.timestamp("us", "UTC")),
                             "amount": [9.5]}), tmp_path / "new.parquet")
    assert load([tmp_path / "new.parquet"], c, settings, search_path=pg_schema,
                key_prefix=redis_prefix).adds_up
    proc = StreamProcessor(c, settings, run_id="lost-tiles", dead_letter_topic=None, search_path=pg_schema,
                           key_prefix=redis_prefix)
    proc.open()
    try:
        iso = dt.datetime.fromtimestamp(new_t / 1e6, dt.UTC).isoformat().replace("+00:00", "Z")
        proc.process([f'{{"card": "c2", "ts": "{iso}", "amount": 9.5}}'.encode()], pa.array(["t"]),
                     pa.array([0], pa.int32()), pa.array([0], pa.int64()))
    finally:
        proc.close()
    tspec = TileSpec.of(AggSpec.of(c.schema))
    assert tspec is not None
    h = tspec.size_us
    cover = {k: client.hget(keys[k], "c") for k in cards}
    for k in ("c1", "c2"):  # after the tile of its last event before the new one, not after the new one's
        assert cover[k] is not None and int(cover[k]) == (of[k][-1] // h + 1) * h <= new_t, (k, cover)
    assert cover["c3"] is None
    names = ["txn_24h", "amount_sum_24h", "amount_mean_24h", "amount_max_24h", "last3"]

    def history_reads(fs: FeatureStore) -> float:
        line = [x for x in fs.metrics().splitlines()
                if x.startswith('featureline_sdk_windows_from_history_total{schema="quiet"}')]
        return float(line[0].split()[-1]) if line else 0.0

    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix) as fs:
        t = new_t + HOUR  # the 24 h window reaches back over the lost tiles
        frame = pa.table({"card": pa.array(cards), "timestamp": pa.array([t] * 3, pa.int64()).cast(
            pa.timestamp("us", "UTC"))})
        want = fs.historical("quiet", frame, names, windows="request_time").select(names).to_pylist()
        assert [w["txn_24h"] for w in want] == [
            sum(t - DAY < x <= t for x in of[k] + ([new_t] if k != "c3" else [])) for k in cards]

        def online(ids: list[str], when: int) -> list[dict[str, Any]]:
            got = fs.online("quiet", ids, names, windows="request_time", at=at(when))
            return got.select(names).to_pylist()

        assert online(cards, t) == want
        for i, k in enumerate(cards):  # the one-entity read too
            assert online([k], t) == [want[i]]
        assert history_reads(fs) == 4  # c1 and c2, then each once alone
        # once no window reaches before c, the tiles serve
        late = max(int(cover["c1"] or 0), int(cover["c2"] or 0)) + DAY - 1
        frame = pa.table({"card": pa.array(cards), "timestamp": pa.array([late] * 3, pa.int64()).cast(
            pa.timestamp("us", "UTC"))})
        want = fs.historical("quiet", frame, names, windows="request_time").select(names).to_pylist()
        got = online(cards, late)
        assert got == want and [w["txn_24h"] for w in want] == [
            sum(late - DAY < x <= late for x in of[k] + ([new_t] if k != "c3" else [])) for k in cards]
        assert history_reads(fs) == 4
    # a write that leaves no event of the entity out (c1: a reload of both its files) drops
    # "c"; one that leaves one out (c2: its streamed event's tile, read back, not rewritten)
    # never raises it
    assert load([tmp_path / "h.parquet", tmp_path / "new.parquet"], c, settings, search_path=pg_schema,
                key_prefix=redis_prefix).adds_up
    assert client.hget(keys["c1"], "c") is None and client.hget(keys["c3"], "c") is None
    left = client.hget(keys["c2"], "c")
    assert (left is None) == (new_t // h == of["c2"][-1] // h) and (left is None or left == cover["c2"])
    client.close()


#: the quiet schema with a hot field beside its windows
AGED_V1 = QUIET.replace("name: quiet", "name: aged").replace(
    "aggregations:",
    "  - {name: device, type: string, store: hot, constraints: {nullable: true}}\naggregations:")
#: a compatible v2: a hot field with a default added (the hashes v1 wrote are rewritten on read)
AGED_V2 = AGED_V1.replace("version: 1.0.0", "version: 1.1.0").replace(
    "  - {name: device,", "  - {name: unit, type: string, store: [hot, cold], "
    "constraints: {nullable: true, default: mg/dL}}\n  - {name: device,")


def test_online_async_at_request_time_rewrites_hashes_an_earlier_version_wrote(
        settings: Settings, tmp_path: Path, pg_schema: str, redis_prefix: str) -> None:
    """``online_async`` with request-time windows over hashes v1 wrote, after the stores
    were migrated to v2 (Postgres only: no hash rewritten): each read rewrites the hashes
    it finds (the Outdated loop, through redis.asyncio) and returns v2's row (the new
    field's default) with the windows at ``T`` equal to ``historical``'s; one entity (the
    one-entity read declines old hashes) and several; the tiles, whose layout a compatible
    change keeps, are read as they are."""
    v1, v2 = compile_schema(parse_schema(AGED_V1)), compile_schema(parse_schema(AGED_V2))
    day0 = int(dt.datetime(2026, 3, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000
    cards = ["c1", "c2", "c3"]
    ts = [day0 + i * 20 * MINUTE_US for i in range(2 * 72)]
    table = pa.table({"card": pa.array([cards[i % 3] for i in range(len(ts))]),
                      "ts": pa.array(ts, pa.timestamp("us", "UTC")),
                      "amount": pa.array([float(i % 5) + 0.25 for i in range(len(ts))]),
                      "device": pa.array([f"g{i % 2}" for i in range(len(ts))])})
    pq.write_table(table, tmp_path / "h.parquet")
    loaded = load([tmp_path / "h.parquet"], v1, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert loaded.adds_up
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "aged.yaml").write_text(AGED_V2)
    client = redis.Redis.from_url(settings.redis_url)

    def fingerprints() -> list[bytes | None]:
        return [client.hget(redis_prefix + entity_key("aged", c), "_schema_fingerprint")  # type: ignore[misc]
                for c in cards]

    assert fingerprints() == [v1.fingerprint.encode()] * 3
    names = ["device", "unit", "txn_24h", "amount_sum_24h", "amount_max_24h"]
    windows = ["txn_24h", "amount_sum_24h", "amount_max_24h"]
    t = ts[-1] + 6 * HOUR
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix,
                      fallback=False) as fs:
        p = plan(fs, v2, None)
        assert p.refusal is None and p.migration is not None
        apply_postgres(fs, p)
        frame = pa.table({"card": pa.array(cards), "timestamp": pa.array([t] * 3, pa.int64()).cast(
            pa.timestamp("us", "UTC"))})
        want = fs.historical("aged", frame, windows, windows="request_time").select(windows).to_pylist()
        assert [w["txn_24h"] for w in want] == [18, 18, 18]

        async def read(ids: list[str]) -> pa.Table:
            return await fs.online_async("aged", ids, names, windows="request_time", at=at(t))

        async def both() -> tuple[pa.Table, pa.Table]:
            try:
                return await read(["c1"]), await read(["c2", "c3"])
            finally:
                await fs.connections.aclose()

        one, two = asyncio.run(both())
        assert fingerprints() == [v2.fingerprint.encode()] * 3  # every hash read was rewritten
        for got, ids in ((one, ["c1"]), (two, ["c2", "c3"])):
            assert got.column("card").to_pylist() == ids
            assert got.select(windows).to_pylist() == [want[cards.index(c)] for c in ids]
            assert got.column("unit").to_pylist() == ["mg/dL"] * len(ids)
            assert got.column("_from").to_pylist() == ["redis"] * len(ids)
        assert one.column("device").to_pylist() == [table.column("device")[len(ts) - 3].as_py()]
        # the sync read of the rewritten hashes gives the same rows
        again = fs.online("aged", cards, names, windows="request_time", at=at(t))
        rows = [*one.select(names).to_pylist(), *two.select(names).to_pylist()]
        assert again.select(names).to_pylist() == rows
    client.close()
