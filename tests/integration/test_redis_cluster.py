"""featureline against a real Redis Cluster (3 primaries + 3 replicas from the Debian
``redis-server``): slots as the server computes them, batch loads identical to a single
server's, SDK reads, a primary killed mid-load, a slot migrated mid-load."""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from features.compile import CompiledSchema
from features.compile.layout import key_slot, key_slots
from features.config import Settings
from features.errors import SinkUnavailable
from features.load import load
from features.ops.dev.services import RedisCluster as LocalCluster
from features.ops.examples import applicant_schema, applicants
from features.sdk.store import FeatureStore

#: serial: it kills and migrates under the local Redis Cluster that other tests' redis-cluster runs use.
pytestmark = [pytest.mark.services, pytest.mark.serial]
ROOT = Path(__file__).resolve().parents[2]
VOLATILE = (b"_run_id", b"_ingested_at")  # differ between runs by design


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


def client_of(cluster: LocalCluster) -> RedisCluster:
    return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in cluster.ports[:3]],
                        socket_timeout=5)


def cluster_snapshot(client: RedisCluster, prefix: str) -> dict[bytes, dict[bytes, bytes]]:
    out = {}
    for node in client.get_primaries():
        conn = client.get_redis_connection(node)
        for key in conn.scan_iter(match=prefix + "features:credit_applicant:{*", count=5_000):
            h = conn.hgetall(key)
            out[key.removeprefix(prefix.encode())] = {k: v for k, v in h.items() if k not in VOLATILE}
    return out


def single_snapshot(client: redis.Redis, prefix: str) -> dict[bytes, dict[bytes, bytes]]:
    out = {}
    for key in client.scan_iter(match=prefix + "features:credit_applicant:{*", count=5_000):
        h = client.hgetall(key)
        out[key.removeprefix(prefix.encode())] = {k: v for k, v in h.items() if k not in VOLATILE}
    return out


def write_files(tmp: Path, rows: int, files: int = 3, seed: int = 11) -> list[Path]:
    """Files whose ids repeat across files with shuffled event times: newest-wins decides."""
    paths = []
    for i in range(files):
        table = applicants(rows, seed=seed + i, first_id=10**9)  # the same ids in every file
        order = list(range(rows))
        random.Random(seed + i).shuffle(order)
        path = tmp / f"part-{i}.parquet"
        pq.write_table(table.take(pa.array(order)), path, row_group_size=700)
        paths.append(path)
    return paths


def reference(tmp: Path, paths: list[Path], settings: Settings, compiled: CompiledSchema, schema: str,
              prefix: str) -> dict[bytes, dict[bytes, bytes]]:
    """The same files loaded into the single Redis server: what the cluster must hold."""
    s = load(paths, compiled, settings, batch_rows=1_000, search_path=schema, key_prefix=prefix)
    assert s.adds_up
    client = redis.Redis.from_url(settings.redis_url)
    try:
        return single_snapshot(client, prefix)
    finally:
        client.close()


def test_slots_agree_with_the_servers_keyslot(redis_cluster: LocalCluster) -> None:
    rng = random.Random(5)
    alphabet = "ab{}:é-_0\x00"
    keys = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14))) for _ in range(300)]
    keys += [f"features:credit_applicant:{{APP-{i:012d}}}" for i in range(200)]
    # hash-tag edge cases, and long keys beside short ones (the ragged path and its scalar tail)
    keys += ["", "{}", "{", "}", "}{", "{}{a}", "a{b}{c}", "{{a}}", "é{ü}", "x" * 20_000,
             "y" * 5_000 + "{tag}" + "z" * 5_000, "{" + "w" * 9_000, "q" * 300 + "{}" + "r" * 300]
    node = redis.Redis(host="127.0.0.1", port=redis_cluster.ports[0])
    try:
        server = [node.cluster("keyslot", k) for k in keys]
    finally:
        node.close()
    assert key_slots(pa.array(keys, pa.string())).tolist() == server


def test_batch_load_into_the_cluster_equals_a_single_server_load(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, second_pg_schema: str,
        redis_prefix: str, redis_cluster: LocalCluster, redis_cluster_prefix: str) -> None:
    paths = write_files(tmp_path, 3_000)
    expected = reference(tmp_path, paths, settings, compiled, second_pg_schema, redis_prefix)
    on_cluster = dataclasses.replace(settings, redis_url=redis_cluster.url)
    first = load(paths, compiled, on_cluster, batch_rows=1_000, search_path=pg_schema,
                 key_prefix=redis_cluster_prefix)
    assert first.adds_up and first.stored > 2_000
    client = client_of(redis_cluster)
    try:
        got = cluster_snapshot(client, redis_cluster_prefix)
        assert got == expected
        # the hashes are spread over every primary, each with its TTL
        per_primary = [sum(1 for _ in client.get_redis_connection(n).scan_iter(
            match=redis_cluster_prefix + "features:credit_applicant:{*", count=5_000))
            for n in client.get_primaries()]
        assert len(per_primary) == 3 and min(per_primary) > len(got) / 6, per_primary
        some = next(iter(got))
        assert 0 < client.ttl(redis_cluster_prefix.encode() + some) <= 7 * 86_400
        # a re-run writes nothing (ledger on the cluster), and nothing changes
        again = load(paths, compiled, on_cluster, batch_rows=1_000, search_path=pg_schema,
                     key_prefix=redis_cluster_prefix)
        assert again.stored == 0 and again.skipped_units == again.units
        assert cluster_snapshot(client, redis_cluster_prefix) == expected
    finally:
        client.close()


def test_sdk_reads_the_cluster_as_it_reads_a_single_server(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, second_pg_schema: str,
        redis_prefix: str, redis_cluster: LocalCluster, redis_cluster_prefix: str) -> None:
    import asyncio

    paths = write_files(tmp_path, 800, files=2)
    reference(tmp_path, paths, settings, compiled, second_pg_schema, redis_prefix)
    on_cluster = dataclasses.replace(settings, redis_url=redis_cluster.url)
    load(paths, compiled, on_cluster, batch_rows=500, search_path=pg_schema, key_prefix=redis_cluster_prefix)
    ids = [f"APP-{10**9 + i:012d}" for i in range(0, 800, 7)] + ["APP-nope"]
    volatile = {"_age_seconds"}
    single = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                          schemas=ROOT / "schemas", search_path=second_pg_schema, key_prefix=redis_prefix)
    stores = [FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=ROOT / "schemas",
                           search_path=pg_schema, key_prefix=redis_cluster_prefix)
              for url in (redis_cluster.url, f"redis://127.0.0.1:{redis_cluster.ports[1]}/0")]
    try:
        want = single.online("credit_applicant", ids, fallback=False)
        want = want.drop_columns([c for c in want.column_names if c in volatile])
        for fs in stores:  # a redis+cluster:// URL, and a plain URL naming one node
            got = fs.online("credit_applicant", ids, fallback=False)
            assert got.drop_columns([c for c in got.column_names if c in volatile]) == want
            assert got.column("_found").to_pylist()[-1] is False
            assert got.column("_from").to_pylist()[:-1] == ["redis"] * (len(ids) - 1)

        async def read() -> pa.Table:
            try:
                return await stores[0].online_async("credit_applicant", ids, fallback=False)
            finally:
                await stores[0].aclose()

        got = asyncio.run(read())
        assert got.drop_columns([c for c in got.column_names if c in volatile]) == want
    finally:
        single.close()
        for fs in stores:
            fs.close()


# --------------------------------------------------------------------------- faults


@pytest.fixture()
def fault_cluster() -> Iterator[LocalCluster]:
    """A cluster of its own (ports 7111-7116) that a test may break; stopped afterwards."""
    cluster = LocalCluster(7111, name="redis-cluster-faults")
    cluster.install()
    cluster.stop()
    cluster.start()
    yield cluster
    cluster.stop()


def _primary_pid(cluster: LocalCluster, slot: int) -> tuple[int, int]:
    node = redis.Redis(host="127.0.0.1", port=cluster.ports[0], socket_timeout=5)
    try:
        for lo, hi, primary, *_ in node.execute_command("CLUSTER SLOTS"):
            if lo <= slot <= hi:
                port = int(primary[1])
                return port, int(cluster.pidfile(port).read_text())
    finally:
        node.close()
    raise AssertionError(f"no primary for slot {slot}")


def _load_until(cluster: LocalCluster, units: int, paths: list[Path], compiled: CompiledSchema,
                settings: Settings, prefix: str, **kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Start a load into ``cluster`` in a thread; return once ``units`` of its units are in
    the ledger (the load still running). ``out`` gets its summary or its exception."""
    out: dict[str, Any] = {}
    on_cluster = dataclasses.replace(settings, redis_url=cluster.url)

    def run() -> None:
        try:
            out["summary"] = load(paths, compiled, on_cluster, key_prefix=prefix, **kw)
        except Exception as exc:  # judged by the test: a clear failure is allowed, a silent loss is not
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 120
    while _ledger_size(cluster, prefix) < units and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert thread.is_alive(), "the load ended before the fault could be injected: make it longer"
    return thread, out


def _ledger_size(cluster: LocalCluster, prefix: str) -> int:
    client = client_of(cluster)
    try:
        return int(client.scard(prefix + "features:credit_applicant:__ledger__"))
    except redis.RedisError:
        return 0
    finally:
        client.close()


def _redirects(cluster: LocalCluster) -> int:
    """-MOVED and -ASK replies the nodes have sent (``INFO errorstats``)."""
    total = 0
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        try:
            stats = node.info("errorstats")
        except redis.RedisError:
            continue
        finally:
            node.close()
        total += sum(int(v["count"]) for k, v in stats.items() if k in ("errorstat_MOVED", "errorstat_ASK"))
    return total


def test_primary_killed_mid_load_fails_over_and_a_rerun_ends_exact(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, second_pg_schema: str,
        redis_prefix: str, fault_cluster: LocalCluster) -> None:
    prefix = f"t_failover_{os.urandom(3).hex()}:"
    paths = write_files(tmp_path, 6_000, files=2)
    expected = reference(tmp_path, paths, settings, compiled, second_pg_schema, redis_prefix)
    on_cluster = dataclasses.replace(settings, redis_url=fault_cluster.url)
    thread, out = _load_until(fault_cluster, 5, paths, compiled, settings, prefix, batch_rows=300,
                              search_path=pg_schema)
    # the primary holding the ledger: rows and ledger entries both meet the failover
    _, pid = _primary_pid(fault_cluster, key_slot(f"{prefix}features:credit_applicant:__ledger__"))
    os.kill(pid, signal.SIGKILL)  # its replica is promoted after the 2 s node timeout
    thread.join(timeout=300)
    assert not thread.is_alive()
    if "error" in out:  # allowed: unavailable after the retries, naming the store; never a silent loss
        assert isinstance(out["error"], SinkUnavailable) and "Redis" in str(out["error"]), out["error"]
    else:
        assert out["summary"].adds_up
    # the cluster serves every slot again (a replica took over)
    client = client_of(fault_cluster)
    try:
        deadline = time.monotonic() + 60
        while client.cluster_info().get("cluster_state") != "ok" and time.monotonic() < deadline:
            time.sleep(0.5)
        rerun = load(paths, compiled, on_cluster, batch_rows=300, search_path=pg_schema, key_prefix=prefix)
        assert rerun.adds_up
        assert cluster_snapshot(client, prefix) == expected
    finally:
        client.close()


def test_slots_migrated_mid_load_lose_nothing(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, second_pg_schema: str,
        redis_prefix: str, fault_cluster: LocalCluster) -> None:
    prefix = f"t_reshard_{os.urandom(3).hex()}:"
    paths = write_files(tmp_path, 8_000, files=2)
    expected = reference(tmp_path, paths, settings, compiled, second_pg_schema, redis_prefix)
    node = redis.Redis(host="127.0.0.1", port=fault_cluster.ports[0], socket_timeout=5)
    primaries = [(int(p[1]), p[2].decode()) for _, _, p, *_ in node.execute_command("CLUSTER SLOTS")]
    node.close()
    (_, source), (_, target) = sorted(set(primaries))[:2]
    redirects_before = _redirects(fault_cluster)
    thread, out = _load_until(fault_cluster, 3, paths, compiled, settings, prefix, batch_rows=300,
                              search_path=pg_schema)
    subprocess.run(["redis-cli", "--cluster", "reshard", f"127.0.0.1:{fault_cluster.ports[0]}",
                    "--cluster-from", source, "--cluster-to", target, "--cluster-slots", "1000",
                    "--cluster-yes", "--cluster-pipeline", "50"],
                   check=True, capture_output=True, timeout=300)
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert "error" not in out, out.get("error")
    assert out["summary"].adds_up
    assert _redirects(fault_cluster) > redirects_before  # the load did meet slots on the move
    client = client_of(fault_cluster)
    try:
        assert cluster_snapshot(client, prefix) == expected
    finally:
        client.close()


def test_aggregation_backfill_split_in_two_loads_writes_the_reference_hot_values(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_cluster: LocalCluster,
        redis_cluster_prefix: str) -> None:
    """The aggregates hashes (their own sink, an equal event time replaces) on the cluster:
    two loads (later time range first) give each entity its newest event's hot values."""

    from aggregate_reference import (
        BASE_US,
        MINUTE_US,
        SCHEMA,
        T,
        check_hot,
        history_table,
        random_history,
        reference,
    )

    from features.compile import compile_schema
    from features.schema import parse_schema

    agg = compile_schema(parse_schema(SCHEMA))
    rng = random.Random(3)
    events = random_history(rng, 1_500, users=60, minutes=600)
    cut = BASE_US + 300 * MINUTE_US
    parts = [[e for e in events if e[T] >= cut], [e for e in events if e[T] < cut]]
    on_cluster = dataclasses.replace(settings, redis_url=redis_cluster.url)
    for i, rows in enumerate(parts):
        rng.shuffle(rows)
        path = tmp_path / f"load{i}.parquet"
        pq.write_table(history_table(rows), path)
        summary = load([path], agg, on_cluster, search_path=pg_schema, key_prefix=redis_cluster_prefix)
        assert summary.adds_up and summary.aggregations is not None and summary.aggregations["adds_up"]
    client = client_of(redis_cluster)
    try:
        check_hot(client, redis_cluster_prefix, agg.schema, reference(agg.schema, events))
    finally:
        client.close()


def test_health_check_names_every_primary_of_the_cluster(settings: Settings,
                                                         redis_cluster: LocalCluster) -> None:
    from features.ops.health import check_all

    checks = check_all(dataclasses.replace(settings, redis_url=redis_cluster.url))
    (check,) = [c for c in checks if c.name == "redis"]
    assert check.ok, check
    assert "3 primaries answer PING" in check.detail


def test_request_time_windows_read_from_the_cluster_equal_the_reference(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_cluster: LocalCluster,
        redis_cluster_prefix: str) -> None:
    """The tiles hashes on the cluster (``{<entity>}``: one slot per entity, the entities
    spread over the primaries): a history shuffled into two loads, then ``online`` and
    ``online_async`` with ``windows="request_time"`` at times in and after it, equal to
    the brute-force reference for every entity at once."""
    import asyncio
    import datetime as dt

    from aggregate_reference import BASE_US, MINUTE_US, T, history_table, random_history, reference_at
    from test_online_request_time import AGGS, COMPILED, HOT_SCHEMA, rows_of

    from features.compile.layout import tiles_key

    rng = random.Random(5)
    events = random_history(rng, 600, users=40, minutes=600)
    cut = BASE_US + 300 * MINUTE_US
    on_cluster = dataclasses.replace(settings, redis_url=redis_cluster.url)
    for i, rows in enumerate([[e for e in events if e[T] >= cut], [e for e in events if e[T] < cut]]):
        rng.shuffle(rows)
        pq.write_table(history_table(rows), tmp_path / f"load{i}.parquet")
        summary = load([tmp_path / f"load{i}.parquet"], COMPILED, on_cluster, search_path=pg_schema,
                       key_prefix=redis_cluster_prefix)
        assert summary.adds_up and summary.rejected == 0
    ids = [*sorted({str(e["uid"]) for e in events}), "nobody"]
    slots = {key_slot(redis_cluster_prefix + tiles_key(COMPILED.name, i)) for i in ids}
    assert len(slots) > 3
    client = client_of(redis_cluster)
    try:  # every entity's tiles hash is there, each on the primary of its slot
        assert all(client.exists(redis_cluster_prefix + tiles_key(COMPILED.name, i)) for i in ids[:-1])
    finally:
        client.close()
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "agg_props.yaml").write_text(HOT_SCHEMA)
    newest = max(e[T] for e in events)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    fs = FeatureStore(redis_url=redis_cluster.url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_cluster_prefix)
    try:
        for t in (newest, newest + 1, newest + 45 * MINUTE_US, newest + 30 * 60 * MINUTE_US, cut):
            at = epoch + dt.timedelta(microseconds=t)
            want = reference_at(COMPILED.schema, events, [(u, t) for u in ids])
            got = fs.online(COMPILED.name, ids, AGGS, windows="request_time", at=at)
            assert got.column("uid").to_pylist() == ids
            assert rows_of(got) == want, t

        async def read(at: dt.datetime) -> pa.Table:
            try:
                return await fs.online_async(COMPILED.name, ids, AGGS, windows="request_time", at=at)
            finally:
                await fs.aclose()

        t = newest + 20 * MINUTE_US
        got = asyncio.run(read(epoch + dt.timedelta(microseconds=t)))
        assert rows_of(got) == reference_at(COMPILED.schema, events, [(u, t) for u in ids])
    finally:
        fs.close()
