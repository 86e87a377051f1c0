"""Windowed aggregations: the stream job and the batch backfill agree (docs/aggregations.md).

One random event history for ``schemas/clicks.yaml`` with two sketches added (100k events, 4,000 users;
out-of-order arrivals within the allowed lateness, duplicates, late events, quiet
gaps, events exactly on window edges, invalid rows) goes

- through the batch loader from a Parquet file, into one Postgres schema and Redis
  key prefix, and
- through Kafka (a 2-partition topic keyed by user) and the PyFlink job into another;
  the job is SIGKILLed mid-stream and restarted from its last checkpoint.

The stream calls late exactly the events more than the allowed lateness behind their
user's newest earlier event (arrival order, computed here independently); for every
user without such an event its aggregation rows equal the backfill's exactly, and so do
its request-time window tiles in Redis (issue 49: byte for byte, so the kill and the
restore lost and counted twice nothing), read at request times around its newest event
as ``historical(..., windows="request_time")`` computes them; both hold the same
history. Then a backfill of the same file into the stream's stores repairs the rest:
afterwards every aggregation row, every hot value and every tile in Redis equals the
batch backfill's.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aggregate_reference import T, stream_late

from features.aggregate.engine import AggSpec
from features.aggregate.tiles import TileSpec
from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.ops.examples import click_history, click_records
from features.schema import load_schema
from features.stream.kafka import produce
from features.validation import validate

pytestmark = [pytest.mark.services, pytest.mark.flink]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "stream_job.py"
EVENTS = 100_000  # ~196 late events of ~160 users, ~1,000 duplicates (seed 5)
USERS = 4_000
#: the first run is killed once the stream has written this many aggregation rows (a fifth)
KILL_AFTER = EVENTS // 5
AGGS = ("clicks_24h", "views_24h", "click_ratio_24h", "dwell_mean_1h", "items_7d", "spend_today",
        "max_price_24h", "last_dwell_1h", "items_approx_7d", "price_pcts_24h")
#: the two sketches (issue 50) added to the shipped clicks schema for these tests: precision
#: 4 keeps the exact distinct hashes only while <= 2 of them, so most users' windows take the
#: register path; a list of quantiles of a decimal field
SKETCHES = """    - {name: items_approx_7d, function: approx_count_distinct, of: item_id, precision: 4,
       window: 7d, store: cold}
    - {name: price_pcts_24h, function: approx_percentile, of: price, q: [0.1, 0.5, 0.9],
       relative_accuracy: 0.02, window: 24h, store: cold}
"""
HOT = ("clicks_24h", "click_ratio_24h", "dwell_mean_1h", "spend_today")


def _sketched(tmp: Path) -> CompiledSchema:
    """``schemas/clicks.yaml`` with the two sketches appended to its aggregations, written to
    ``tmp/schemas`` (the folder the stream job reads) and compiled (what the backfill uses)."""
    text = (ROOT / "schemas" / "clicks.yaml").read_text()
    anchor = "evolution_rules:"
    assert text.count(anchor) == 1
    folder = tmp / "schemas"
    folder.mkdir(exist_ok=True)
    path = folder / "clicks.yaml"
    path.write_text(text.replace(anchor, SKETCHES + anchor))
    return compile_schema(load_schema(path))


def _job(args: list[str], tmp: Path, prefix: str) -> list[str]:
    return [sys.executable, str(JOB), "--schema", "clicks", "--schemas-dir", str(tmp / "schemas"),
            "--state-dir", str(tmp / "state"), "--json",
            "--key-prefix", f"{prefix}stream:",
            "--checkpoint-interval-ms", "2000", "--batch-size", "2000", "--restart-attempts", "0", *args]


def _pg_rows(conn: Any, schema: str, query: str) -> list[tuple[Any, ...]]:
    conn.execute(f'SET search_path = "{schema}"')
    return list(conn.execute(query).fetchall())


def _count(conn: Any, schema: str, table: str) -> int:
    conn.execute(f'SET search_path = "{schema}"')
    if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
        return 0
    return int(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])


def _hot(url: str, prefix: str) -> dict[str, dict[bytes, bytes]]:
    import redis

    client = redis.Redis.from_url(url)
    out = {}
    for key in client.scan_iter(match=f"{prefix}features:clicks__aggregates:*", count=10_000):
        h = client.hgetall(key)
        out[key.decode()[len(prefix):]] = {k: v for k, v in h.items()
                                           if k.decode() in (*HOT, "_event_time")}
    return out


def _tiles(url: str, prefix: str) -> dict[str, dict[bytes, bytes]]:
    """Every user's request-time window tiles hash (features.aggregate.tiles), whole."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return {key.decode()[len(prefix):]: dict(client.hgetall(key))  # type: ignore[arg-type]
                for key in client.scan_iter(match=f"{prefix}features:clicks__tiles:*", count=10_000)}
    finally:
        client.close()


def _user(key: str) -> str:
    return key.rsplit("{", 1)[1].rstrip("}")


def _request_time_reads(settings: Settings, tmp: Path, pg_schema: str, prefix: str, schema: CompiledSchema,
                        newest: dict[str, int]) -> int:
    """``online(..., windows="request_time", at=T)`` from the tiles under ``prefix`` equals
    ``historical(..., windows="request_time")`` over ``pg_schema``'s history for ~300 of the
    users of ``newest`` (user -> newest event, us) at times within the allowed lateness
    before it, on it, 1 µs after, on the next tile boundaries and hours later. Returns how
    many reads had a click in their 24-hour window (the check is not vacuous)."""
    from features import FeatureStore

    tspec = TileSpec.of(AggSpec.of(schema.schema))
    assert tspec is not None
    h, minute = tspec.size_us, 60_000_000
    users = sorted(newest)[::max(1, len(newest) // 300)]
    reqs = [(u, t) for u in users for t in (newest[u] - 50 * minute, newest[u] - 1, newest[u], newest[u] + 1,
                                            newest[u] // h * h + h, newest[u] // h * h + h - 1,
                                            newest[u] + 20 * h + 7, newest[u] + 30 * 60 * minute)]
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    names = list(HOT)
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp / "schemas", search_path=pg_schema, key_prefix=prefix) as fs:
        online = [fs.online("clicks", [u], names, windows="request_time",
                            at=epoch + dt.timedelta(microseconds=t)).select(names).to_pylist()[0]
                  for u, t in reqs]
        stamps = pa.array([t for _, t in reqs], pa.int64()).cast(pa.timestamp("us", "UTC"))
        frame = pa.table({"user_id": [u for u, _ in reqs], "timestamp": stamps})
        historical = fs.historical("clicks", frame, names, windows="request_time").select(names).to_pylist()
    diff = [(r, o, w) for r, o, w in zip(reqs, online, historical, strict=True) if o != w]
    assert not diff, f"{len(diff)} of {len(reqs)} request-time reads differ, e.g. {diff[:3]}"
    return sum(1 for o in online if o["clicks_24h"])


AGG_QUERY = f"SELECT user_id, event_time, {', '.join(AGGS)} FROM clicks__aggregates ORDER BY 1, 2"
LATE_QUERY = ("SELECT raw FROM clicks__rejects WHERE errors->0->>'rule' = 'aggregation.lateness' "
              "ORDER BY raw::text")
# events at one instant in digest order (both stores hold both)
HISTORY_QUERY = ("SELECT user_id, event_time, event_id, item_id, event_type, dwell_ms, price FROM clicks "
                 "ORDER BY 1, 2, _digest")


@pytest.mark.timeout(2400)
def test_stream_with_sigkill_and_batch_backfill_compute_identical_aggregations(
        settings: Settings, pg_schema: str, redis_prefix: str, stream_topic: str, tmp_path: Path) -> None:
    import psycopg
    import pyarrow.parquet as pq

    from features.flink.stream import latest_checkpoint, merged_summary
    from features.load import load

    schema = _sketched(tmp_path)
    history = click_history(EVENTS, seed=5, users=USERS)
    assert history.num_rows >= EVENTS
    path = tmp_path / "clicks.parquet"
    pq.write_table(history, path)
    records = click_records(history)
    produce(settings.kafka_bootstrap, stream_topic, [v for _, v in records], keys=[k for k, _ in records])

    url = settings.redis_url  # the test's own key prefixes: no database of its own to flush
    batch_schema = f"{pg_schema}_batch"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{batch_schema}"')
    try:
        # ---- the batch backfill
        summary = load([path], schema, settings, search_path=batch_schema,
                       key_prefix=f"{redis_prefix}batch:")
        assert summary.adds_up and summary.aggregations is not None
        agg = summary.aggregations
        assert agg["accepted"] > 0.95 * EVENTS and agg["late"] == 0 and agg["duplicates"] > 500, agg
        # what the stream must call late: the valid events (duplicates included), in arrival
        # order (the topic is keyed by user, so each user's order is the file's)
        valid = validate(history, schema).valid
        times = valid.column("event_time").cast(pa.int64()).to_pylist()  # ms
        arrival = [{"user_id": u, T: t * 1000} for u, t in zip(valid.column("user_id").to_pylist(), times,
                                                                strict=True)]
        late_idx = stream_late(schema.schema, arrival)
        want_late = len(late_idx)
        late_users = {arrival[i]["user_id"] for i in late_idx}
        assert want_late > 50 and len(late_users) < 0.5 * USERS

        # ---- the stream, killed mid-way, then restored from its last checkpoint
        sep = "&" if "?" in settings.postgres_dsn else "?"
        env = {**os.environ,
               "FEATURES_POSTGRES_DSN": f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}",
               "FEATURES_REDIS_URL": url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
        checkpoints = tmp_path / "state" / "clicks" / "checkpoints"
        log1 = (tmp_path / "first.log").open("w")
        first = subprocess.Popen(_job(["--topic", stream_topic, "--startup", "earliest-offset"], tmp_path,
                                      redis_prefix),
                                 env=env, stdout=log1, stderr=subprocess.STDOUT, start_new_session=True)
        done = 0
        try:
            deadline = time.time() + 600
            while time.time() < deadline:
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
                with psycopg.connect(settings.postgres_dsn) as conn:
                    done = _count(conn, pg_schema, "clicks__aggregates")
                if done > KILL_AFTER and latest_checkpoint(checkpoints):
                    break
                time.sleep(0.5)
            assert done > KILL_AFTER, "the job never got going"
            assert done < agg["accepted"], "killed too late: the job had already finished"
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # the client and its Flink JVM
            first.wait(30)
            log1.close()

        log2 = (tmp_path / "second.log").open("w")
        second = subprocess.Popen(_job(["--topic", stream_topic, "--from-checkpoint", "latest",
                                        "--run-id", "second"], tmp_path, redis_prefix),
                                  env=env, stdout=log2, stderr=subprocess.STDOUT, start_new_session=True)
        with psycopg.connect(settings.postgres_dsn) as conn:
            batch_rows = _pg_rows(conn, batch_schema, AGG_QUERY)
        # one aggregation row per instant: two different events of a user at one time are
        # both accepted and share it (docs/aggregations.md, "Semantics")
        instants = len(set(zip(valid.column("user_id").to_pylist(), times, strict=True)))
        assert len(batch_rows) == instants < agg["accepted"]
        on_time_batch = [r for r in batch_rows if r[0] not in late_users]
        # the sketches hold values, most distinct counts from the registers (> 2 distinct)
        sketch = AGGS.index("items_approx_7d") + 2
        assert sum(r[sketch] > 2 for r in batch_rows) > 0.5 * len(batch_rows)
        pcts = [r[sketch + 1] for r in batch_rows if r[sketch + 1] is not None]
        assert len(pcts) > 0.5 * len(batch_rows) and all(len(p) == 3 and p[0] <= p[1] <= p[2] for p in pcts)
        stream_rows: list[tuple[Any, ...]] = []
        try:
            deadline = time.time() + 900
            while time.time() < deadline:
                assert second.poll() is None, (tmp_path / "second.log").read_text()[-4000:]
                with psycopg.connect(settings.postgres_dsn) as conn:
                    late = len(_pg_rows(conn, pg_schema, LATE_QUERY))
                    if late >= want_late:
                        # the last micro-batches may still be updating older events
                        stream_rows = _pg_rows(conn, pg_schema, AGG_QUERY)
                        if [r for r in stream_rows if r[0] not in late_users] == on_time_batch:
                            break
                time.sleep(0.5)
        finally:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(30)
            log2.close()
        resumed = merged_summary(tmp_path / "state" / "clicks" / "summaries", "second")
        assert 0 < resumed["read"] < len(records), f"must resume from the checkpoint: {resumed}"

        # ---- where no event was late: identical values; the same history; the late rejects
        on_time_stream = [r for r in stream_rows if r[0] not in late_users]
        diff = [(s, b) for s, b in zip(on_time_stream, on_time_batch, strict=True) if s != b]
        assert len(on_time_stream) == len(on_time_batch) and not diff, f"{len(diff)} rows differ: {diff[:3]}"
        with psycopg.connect(settings.postgres_dsn) as conn:
            assert len(_pg_rows(conn, pg_schema, LATE_QUERY)) == want_late
            assert _pg_rows(conn, batch_schema, LATE_QUERY) == []
            assert _pg_rows(conn, pg_schema, HISTORY_QUERY) == _pg_rows(conn, batch_schema, HISTORY_QUERY)
        assert len(stream_rows) < len(batch_rows)  # the late events' rows are missing

        # ---- request-time windows: the tiles the stream wrote through the kill and the restore
        stream_tiles = _tiles(url, f"{redis_prefix}stream:")
        batch_tiles = _tiles(url, f"{redis_prefix}batch:")
        on_time_keys = {k for k in batch_tiles if _user(k) not in late_users}
        assert len(batch_tiles) > 0.9 * USERS and len(on_time_keys) > 0.5 * USERS
        assert {k: stream_tiles.get(k) for k in on_time_keys} == {k: batch_tiles[k] for k in on_time_keys}
        newest: dict[str, int] = {}
        for e in arrival:
            if e["user_id"] not in late_users:
                newest[e["user_id"]] = max(newest.get(e["user_id"], e[T]), e[T])
        clicked = _request_time_reads(settings, tmp_path, pg_schema, f"{redis_prefix}stream:", schema, newest)
        assert clicked > 300

        # ---- a backfill of the same history into the stream's stores repairs the rest
        repair = load([path], schema, settings, search_path=pg_schema,
                      key_prefix=f"{redis_prefix}stream:")
        assert repair.stored == 0 and repair.aggregations is not None and repair.aggregations["adds_up"]
        with psycopg.connect(settings.postgres_dsn) as conn:
            repaired = _pg_rows(conn, pg_schema, AGG_QUERY)
        diff = [(s, b) for s, b in zip(repaired, batch_rows, strict=True) if s != b]
        assert len(repaired) == len(batch_rows) and not diff, f"{len(diff)} rows differ, e.g. {diff[:3]}"
        stream_hot = _hot(url, f"{redis_prefix}stream:")
        batch_hot = _hot(url, f"{redis_prefix}batch:")
        assert len(batch_hot) > 0.9 * USERS
        assert stream_hot == batch_hot
        assert all(b"_event_time" in v for v in batch_hot.values())
        assert _tiles(url, f"{redis_prefix}stream:") == _tiles(url, f"{redis_prefix}batch:")
    finally:
        admin.execute(f'DROP SCHEMA "{batch_schema}" CASCADE')
        admin.close()


@pytest.mark.timeout(1200)
def test_a_stream_continuing_a_backfill_gives_the_values_of_a_backfill_of_everything(
        settings: Settings, pg_schema: str, redis_prefix: str, stream_topic: str, tmp_path: Path) -> None:
    """The first half of a history is backfilled; the PyFlink job (bounded) then streams the
    second half into the same stores. For every user without an event the stream calls
    late (judged against the backfilled events as well), the aggregation rows equal those
    of one backfill of the whole history, and so does the hot value in Redis."""
    import psycopg
    import pyarrow.parquet as pq

    from features.load import load

    schema = _sketched(tmp_path)
    history = click_history(20_000, seed=11, users=400)
    half = history.num_rows // 2
    pq.write_table(history.slice(0, half), tmp_path / "first.parquet")
    pq.write_table(history, tmp_path / "all.parquet")
    everything = f"{pg_schema}_all"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{everything}"')
    try:
        whole = load([tmp_path / "all.parquet"], schema, settings, search_path=everything,
                     key_prefix=f"{redis_prefix}all:")
        first = load([tmp_path / "first.parquet"], schema, settings, search_path=pg_schema,
                     key_prefix=f"{redis_prefix}stream:")
        assert whole.adds_up and first.adds_up
        records = click_records(history.slice(half))
        produce(settings.kafka_bootstrap, stream_topic, [v for _, v in records], keys=[k for k, _ in records])
        sep = "&" if "?" in settings.postgres_dsn else "?"
        env = {**os.environ,
               "FEATURES_POSTGRES_DSN": f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}",
               "FEATURES_REDIS_URL": settings.redis_url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
        cmd = _job(["--topic", stream_topic, "--startup", "earliest-offset", "--bounded"], tmp_path,
                   redis_prefix)
        job = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
        summary = json.loads(job.stdout)
        agg = summary["aggregations"]
        assert summary["adds_up"] and agg["adds_up"] and agg["from_history"] > 0, summary

        # the stream's lateness: the backfilled events count as accepted first
        result = validate(history, schema)
        rows = result.valid_row_index.to_numpy()
        valid = result.valid
        times = valid.column("event_time").cast(pa.int64()).to_numpy()
        users = valid.column("user_id").to_pylist()
        events = [({"user_id": u, T: int(t) * 1000}, r) for u, t, r in zip(users, times, rows, strict=True)]
        backfilled = sorted((e for e, r in events if r < half), key=lambda e: e[T])
        streamed = [e for e, r in events if r >= half]
        late = stream_late(schema.schema, backfilled + streamed)
        late_users = {(backfilled + streamed)[i]["user_id"] for i in late}
        assert agg["late"] == len(late) and len(late_users) < 0.5 * len(set(users))
        with psycopg.connect(settings.postgres_dsn) as conn:
            got = [r for r in _pg_rows(conn, pg_schema, AGG_QUERY) if r[0] not in late_users]
            want = [r for r in _pg_rows(conn, everything, AGG_QUERY) if r[0] not in late_users]
        diff = [(g, w) for g, w in zip(got, want, strict=False) if g != w]
        assert len(got) == len(want) > 10_000 and not diff, f"{len(diff)} rows differ, e.g. {diff[:3]}"
        hot_stream = _hot(settings.redis_url, f"{redis_prefix}stream:")
        hot_all = _hot(settings.redis_url, f"{redis_prefix}all:")
        on_time = {k for k in hot_all if k.rsplit("{", 1)[1].rstrip("}") not in late_users}
        assert len(on_time) > 100
        assert {k: hot_stream.get(k) for k in on_time} == {k: hot_all[k] for k in on_time}
    finally:
        admin.execute(f'DROP SCHEMA "{everything}" CASCADE')
        admin.close()
