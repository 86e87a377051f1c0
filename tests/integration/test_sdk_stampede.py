"""The SDK under load (``features.sdk.fallback``, docs/sdk.md "Under load"), against the real
stores: single-flight (threads, asyncio, processes), the read-through fill and its lock,
the negative cache, logical expiry, ``prewarm`` after a Redis loss.

Postgres queries are counted by the server: the history table's scans in
``pg_stat_user_tables`` (every fallback read is one scan of it; the SDK's other queries
read other tables), read after the SDK's connections closed (a backend flushes its
statistics when it exits)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
import redis
import redis_kinds

from features import FeatureStore
from features.compile import CompiledSchema
from features.compile.layout import entity_key
from features.config import Settings
from features.load import load
from features.ops.examples import applicant_schema, applicants
from features.sinks.redis import NEWEST_WINS, _msgpack_str

pytestmark = pytest.mark.services
#: each test runs against one Redis server and the local Redis Cluster (tests/redis_kinds.py)
hot_kind, settings, hot = redis_kinds.hot_kind, redis_kinds.settings, redis_kinds.hot
ROOT = Path(__file__).resolve().parents[2]
NAME = "credit_applicant"
ENTITY = "application_id"
CALLERS = 200


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()








@pytest.fixture()
def loaded(tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
           redis_prefix: str) -> dict[str, tuple[Any, ...]]:
    """500 example applicants loaded by the batch loader; the cold rows by id:
    (income_monthly, _source)."""
    path = tmp_path / "applicants.parquet"
    pq.write_table(applicants(500, seed=5), path)
    summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.stored > 450
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        rows = conn.execute(f"SELECT {ENTITY}, income_monthly, _source FROM credit_applicant").fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def make_store(settings: Settings, pg_schema: str, redis_prefix: str, **kwargs: Any) -> FeatureStore:
    return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                        schemas=kwargs.pop("schemas", ROOT / "schemas"), search_path=pg_schema,
                        key_prefix=redis_prefix, **kwargs)


def history_scans(settings: Settings, pg_schema: str, *, after: int | None = None) -> int:
    """Scans of the history table so far, as the server counts them. Statistics reach
    the shared counters when a backend goes idle or exits, a moment after: read until
    the count has stood still for a second (and, given ``after``, passed it)."""
    deadline = time.monotonic() + 15
    last, since = -1, time.monotonic()
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        while True:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute("SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
                               "WHERE schemaname = %s AND relname = %s", (pg_schema, NAME)).fetchone()
            n = int(row[0]) if row else 0
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since >= 1.0 and (after is None or n > after):
                return n
            if time.monotonic() > deadline:
                return n
            time.sleep(0.1)


def evict(hot: Any, prefix: str, ids: list[str]) -> None:
    for i in ids:
        hot.delete(prefix + entity_key(NAME, i))


def test_threads_share_one_postgres_read_and_fill_redis_once(
        settings: Settings, pg_schema: str, redis_prefix: str, loaded: dict[str, tuple[Any, ...]],
        hot: Any) -> None:
    target = sorted(loaded)[7]
    original = hot.hgetall(redis_prefix + entity_key(NAME, target))
    evict(hot, redis_prefix, [target])
    before = history_scans(settings, pg_schema)
    fs = make_store(settings, pg_schema, redis_prefix)
    fs.schema(NAME)
    barrier = threading.Barrier(CALLERS)
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        got = fs.online(NAME, [target]).to_pylist()[0]
        with lock:
            rows.append(got)

    threads = [threading.Thread(target=call) for _ in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counts = fs._fallback.counts
    fs.close()
    assert len(rows) == CALLERS
    assert {r["income_monthly"] for r in rows} == {loaded[target][0]}
    assert {r["_found"] for r in rows} == {True}
    assert {r["_from"] for r in rows} <= {"postgres", "redis"}
    assert counts.queries == 1 and counts.fills == 1 and counts.filled == 1, counts
    assert history_scans(settings, pg_schema, after=before) == before + 1

    # The fill: the history row's values and lineage, marked _filled; hot-only features
    # are absent (null), as the fallback serves them.
    filled = hot.hgetall(redis_prefix + entity_key(NAME, target))
    assert filled[b"_filled"] == b"1"
    assert filled[b"_source"].decode() == loaded[target][1]
    assert filled[b"_event_time"] == original[b"_event_time"]
    assert filled[b"income_monthly"] == original[b"income_monthly"]
    assert b"income_log" in original and b"income_log" not in filled
    assert 0 < hot.pttl(redis_prefix + entity_key(NAME, target)) <= 7 * 86400 * 1000

    # Now Redis serves it, and no Postgres read happens.
    with make_store(settings, pg_schema, redis_prefix) as again:
        row = again.online(NAME, [target]).to_pylist()[0]
        assert row["_from"] == "redis" and row["income_monthly"] == loaded[target][0]
        assert row["income_log"] is None
        assert again._fallback.counts.queries == 0

    # The pipeline's own write of the same event replaces the filled hash (the hot-only
    # features come back); a fill never replaces the pipeline's hash of that event.
    key = redis_prefix + entity_key(NAME, target)
    items = [k.decode() for pair in original.items() if pair[0] != b"_event_time" for k in pair]
    payload = (b"\xdd" + (2 + len(items)).to_bytes(4, "big") + _msgpack_str(original[b"_event_time"].decode())
               + b"\xcd" + len(items).to_bytes(2, "big") + b"".join(_msgpack_str(x) for x in items))
    assert hot.eval(NEWEST_WINS, 1, key, 3600, payload) == 1
    assert hot.hgetall(key) == original
    assert hot.eval(NEWEST_WINS, 1, key, 3600, payload) == 0  # and that write is first-wins again


def test_asyncio_callers_share_one_postgres_read(
        settings: Settings, pg_schema: str, redis_prefix: str, loaded: dict[str, tuple[Any, ...]],
        hot: Any) -> None:
    target = sorted(loaded)[11]
    evict(hot, redis_prefix, [target])
    before = history_scans(settings, pg_schema)

    async def main() -> tuple[list[dict[str, Any]], Any]:
        fs = make_store(settings, pg_schema, redis_prefix)
        fs.schema(NAME)
        try:
            tables = await asyncio.gather(*(fs.online_async(NAME, [target], ["income_monthly"])
                                            for _ in range(CALLERS)))
            return [t.to_pylist()[0] for t in tables], fs._fallback.counts
        finally:
            await fs.aclose()

    rows, counts = asyncio.run(main())
    assert {r["income_monthly"] for r in rows} == {loaded[target][0]} and len(rows) == CALLERS
    assert counts.queries == 1 and counts.fills == 1, counts
    assert history_scans(settings, pg_schema, after=before) == before + 1


@pytest.mark.parametrize("fill_wait_s", [0.0, 2.0])
def test_processes_read_postgres_once_each_and_fill_once(
        settings: Settings, pg_schema: str, redis_prefix: str, loaded: dict[str, tuple[Any, ...]],
        hot: Any, hot_kind: str, fill_wait_s: float) -> None:
    """4 processes x 50 threads on one cold entity. Without ``fill_wait``: one Postgres
    read per process shared by its concurrent callers (single-flight; a caller that stalled
    past that read while the fill was not in Redis yet reads again, one whose callers all
    come after the fill reads none) and one fill across them (the lock). With it, the
    processes that lose the lock wait for the winner's fill: one Postgres read in all."""
    if hot_kind == "redis-cluster" and fill_wait_s:
        pytest.skip("the wait is the same code on a cluster; one Redis kind is enough")
    target = sorted(loaded)[3]
    evict(hot, redis_prefix, [target])
    before = history_scans(settings, pg_schema)
    procs = [subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "integration" / "stampede_worker.py"), json.dumps({
            "redis_url": settings.redis_url, "dsn": settings.postgres_dsn, "search_path": pg_schema,
            "prefix": redis_prefix, "schema": NAME, "id": target, "threads": 50,
            "fill_wait_s": fill_wait_s})],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
        for _ in range(4)]
    # All four started and warm before any asks (a fixed start time was missed under a loaded
    # machine: a process still importing found the winner's fill and read no Postgres).
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.communicate(timeout=60)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert all(o["calls"] == 50 and o["values"] == [str(loaded[target][0])] for o in outs), outs
    assert sum(o["fills"] for o in outs) == 1, outs
    assert sum(o["filled"] for o in outs) == 1, outs
    scans = history_scans(settings, pg_schema, after=before) - before
    if fill_wait_s:
        assert sum(o["queries"] for o in outs) == 1 and scans == 1, outs
        assert sum(o["waited"] for o in outs) >= 1, outs
    else:
        # Single-flight: a process's concurrent callers share its read (49 of 50 in a quiet
        # run). A caller whose Redis read began after that read finished may not share it
        # (it could be stale); if the fill (by the process that won the lock) is not in Redis
        # yet, it reads Postgres again, and a process whose callers all come after the fill
        # reads none. Under a loaded machine one process read 4 times in one run and another
        # none in another: timing, not a rule. Without single-flight each caller that missed
        # would read, about 50 per process.
        queries = [o["queries"] for o in outs]
        assert all(q <= 10 for q in queries) and sum(queries) >= 1, outs
        assert max(o["shared"] for o in outs) >= 25, outs  # one read served most of a process's callers
        assert scans == sum(queries)


def test_unknown_ids_are_remembered_absent_for_negative_ttl(
        settings: Settings, pg_schema: str, redis_prefix: str, loaded: dict[str, tuple[Any, ...]],
        hot_kind: str) -> None:
    if hot_kind == "redis-cluster":
        pytest.skip("the negative cache is per process, whatever the Redis")
    unknown = ["APP-999999999991", "APP-999999999992"]
    with make_store(settings, pg_schema, redis_prefix, negative_ttl=dt.timedelta(seconds=1.5)) as fs:
        barrier = threading.Barrier(50)

        def call() -> None:
            barrier.wait()
            assert fs.online(NAME, unknown).column("_found").to_pylist() == [False, False]

        threads = [threading.Thread(target=call) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert fs._fallback.counts.queries == 1
        fs.online(NAME, unknown)
        assert fs._fallback.counts.queries == 1 and fs._fallback.counts.negative >= 2
        time.sleep(1.6)  # the negative entries expired: Postgres is asked again
        fs.online(NAME, unknown)
        assert fs._fallback.counts.queries == 2
    with make_store(settings, pg_schema, redis_prefix, negative_ttl=dt.timedelta(0)) as off:
        off.online(NAME, unknown)
        off.online(NAME, unknown)
        assert off._fallback.counts.queries == 2


def test_logical_expiry_serves_stale_while_one_caller_refreshes(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str,
        loaded: dict[str, tuple[Any, ...]], hot: Any) -> None:
    """``hot.refresh_after``: past that age since its last write, a hash is served
    flagged stale while the one caller that wins the lock re-reads Postgres; the fill
    renews the TTL of the same event (Postgres confirms it is the newest)."""
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    text = (ROOT / "schemas" / f"{NAME}.yaml").read_text()
    assert "  ttl: 7d\n" in text
    (schemas / f"{NAME}.yaml").write_text(text.replace("  ttl: 7d\n", "  ttl: 7d\n  refresh_after: 1h\n"))
    target = sorted(loaded)[20]
    key = redis_prefix + entity_key(NAME, target)
    ttl_ms = 7 * 86400 * 1000
    with make_store(settings, pg_schema, redis_prefix, schemas=schemas) as fs:
        assert fs.schema(NAME).fingerprint == applicant_schema().fingerprint  # a reader setting
        fresh = fs.online(NAME, [target]).to_pylist()[0]
        assert fresh["_stale"] is False and fresh["_from"] == "redis"
        hot.pexpire(key, ttl_ms - 2 * 3600 * 1000)  # as if written two hours ago
        barrier = threading.Barrier(40)
        rows: list[dict[str, Any]] = []

        def call() -> None:
            barrier.wait()
            rows.append(fs.online(NAME, [target]).to_pylist()[0])

        threads = [threading.Thread(target=call) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {r["income_monthly"] for r in rows} == {loaded[target][0]}
        assert {r["_from"] for r in rows} == {"redis"}
        assert any(r["_stale"] for r in rows)
        assert fs._fallback.counts.refreshes == 1 and fs._fallback.counts.queries == 1
        assert hot.pttl(key) > ttl_ms - 60_000  # renewed
        assert b"_filled" not in hot.hgetall(key)  # the same event: the pipeline's hash stays
        assert fs.online(NAME, [target]).to_pylist()[0]["_stale"] is False


def test_prewarm_after_a_redis_loss_serves_from_redis_again(
        settings: Settings, pg_schema: str, redis_prefix: str, loaded: dict[str, tuple[Any, ...]],
        hot: Any) -> None:
    ids = sorted(loaded)
    keys = [redis_prefix + entity_key(NAME, i) for i in ids]
    originals = {k: hot.hgetall(k) for k in keys[:20]}
    for k in keys:  # the schema's hashes are lost
        hot.delete(k)
    with make_store(settings, pg_schema, redis_prefix, fill=False) as fs:
        assert set(fs.online(NAME, ids[:50]).column("_from").to_pylist()) == {"postgres"}
        done: list[tuple[int, int]] = []
        result = fs.prewarm(NAME, chunk_rows=200, progress=lambda r, w: done.append((r, w)))
        assert result == {"rows": len(ids), "written": len(ids)}
        assert done[-1] == (len(ids), len(ids)) and len(done) == -(-len(ids) // 200)
        before = fs._fallback.counts.queries
        table = fs.online(NAME, ids)
        assert set(table.column("_from").to_pylist()) == {"redis"}
        assert fs._fallback.counts.queries == before
        assert table.column("income_monthly").to_pylist() == [loaded[i][0] for i in ids]
        for k, original in originals.items():
            assert hot.hget(k, "_event_time") == original[b"_event_time"]
        # a second prewarm writes nothing (the same events), --ids and --since narrow it
        assert fs.prewarm(NAME) == {"rows": len(ids), "written": 0}
        assert fs.prewarm(NAME, ids=[*ids[:5], "APP-999999999999"]) == {"rows": 5, "written": 0}
        assert fs.prewarm(NAME, since=dt.timedelta(days=1)) == {"rows": 0, "written": 0}  # events of 2023


@pytest.mark.scratch_redis_db(14)
def test_prewarm_command_after_flushdb(tmp_path: Path, settings: Settings, pg_schema: str,
                                       compiled: CompiledSchema, hot_kind: str) -> None:
    """``features prewarm`` as an operator runs it: a whole Redis database flushed, then
    prewarmed from the history, and ``online`` serves every id from Redis."""
    if hot_kind == "redis-cluster":
        pytest.skip("one run of the command is enough (the library path runs on both)")
    url = settings.redis_url.rsplit("/", 1)[0] + "/14"
    client = redis.Redis.from_url(url)
    client.flushdb()
    path = tmp_path / "a.parquet"
    pq.write_table(applicants(300, seed=9), path)
    scratch = dataclasses.replace(settings, redis_url=url)
    summary = load([path], compiled, scratch, search_path=pg_schema)
    try:
        client.flushdb()
        dsn = psycopg.conninfo.make_conninfo(settings.postgres_dsn, options=f"-c search_path={pg_schema}")
        env = {**os.environ, "FEATURES_REDIS_URL": url, "FEATURES_POSTGRES_DSN": dsn}
        ids_file = tmp_path / "ids.txt"
        with psycopg.connect(dsn) as conn:
            ids = [r[0] for r in conn.execute(f"SELECT DISTINCT {ENTITY} FROM {NAME} ORDER BY 1")]
        ids_file.write_text("\n".join(ids[:10]) + "\n")
        cmd = [str(ROOT / ".venv" / "bin" / "features"), "prewarm", "--schema", NAME]
        one = subprocess.run([*cmd, "--ids", str(ids_file), "--json"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert one.returncode == 0, one.stderr
        assert json.loads(one.stdout)["written"] == 10
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"{len(ids) - 10:,} Redis hashes written" in out.stdout
        assert len(ids) == summary.stored
        with FeatureStore(redis_url=url, postgres_dsn=dsn, schemas=ROOT / "schemas") as fs:
            assert set(fs.online(NAME, ids).column("_from").to_pylist()) == {"redis"}
        bad = subprocess.run([*cmd, "--since", "soon"], env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "invalid duration 'soon'" in bad.stderr
    finally:
        client.flushdb()
        client.close()
