"""Benchmark: the Redis sink on a single server vs the local 3-primary Redis Cluster.

Usage::

    .venv/bin/python bench/redis_cluster.py [--rows 500000] [--repeat 3]

Needs ``features dev up --redis-cluster`` (it is started if it is not running).
**It flushes database 13 of the dev Redis and every key of the local cluster.**

On ``--rows`` prepared applicant rows (exactly what the sinks receive), each round
(``--repeat``, interleaved) writes the same rows, from empty, with:

- ``raw single``: pre-built ``HSET`` + ``EXPIRE`` protocol bytes over one socket to the
  single server (the fastest way to put these hashes in Redis; ``batch_load.raw_redis``);
- ``sink single``: ``RedisSink.write`` (newest-wins script, MessagePack) to the single server;
- ``redis-py cluster``: redis-py's ``RedisCluster`` with hiredis, a non-transactional
  pipeline of ``HSET`` + ``EXPIRE`` per row (mappings built before the clock starts),
  10,000 rows per ``execute``: the ordinary cluster client;
- ``sink cluster``: ``RedisSink.write`` to the cluster (slot-routed, every primary's share
  sent before replies are read).

Each result is printed as soon as it is measured, with the Redis servers' CPU seconds
(``INFO cpu``, all nodes for the cluster); the summary gives medians with min/max and
the ratios per round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import pyarrow as pa  # noqa: E402
from batch_load import dataset, prepared_rows, raw_redis  # noqa: E402

from features.compile.layout import encode_column  # noqa: E402
from features.config import resolve_settings  # noqa: E402
from features.ops.dev.services import RedisCluster  # noqa: E402
from features.ops.examples import applicant_schema  # noqa: E402
from features.sinks.base import REJECTED_ROWS_SCHEMA, WriteUnit  # noqa: E402
from features.sinks.redis import RedisSink  # noqa: E402

UNIT = 100_000  # rows per sink write (a loader unit is one row group or batch)


def single_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/13"


def cluster_clients(cluster: RedisCluster) -> list[Any]:
    import redis

    return [redis.Redis(host="127.0.0.1", port=p) for p in cluster.ports]


def flush_cluster(cluster: RedisCluster) -> None:
    for c in cluster_clients(cluster):
        try:
            if c.info("replication")["role"] == "master":
                c.flushall()
        finally:
            c.close()


def redis_cpu(ports: list[int]) -> float:
    import redis

    total = 0.0
    for p in ports:
        c = redis.Redis(host="127.0.0.1", port=p)
        info = c.info("cpu")
        total += float(info["used_cpu_user"] + info["used_cpu_sys"])
        c.close()
    return total


def sink_write(url: str, rows: pa.Table, compiled: Any) -> float:
    sink = RedisSink(url, compiled)
    sink.open()
    empty = REJECTED_ROWS_SCHEMA.empty_table()
    try:
        t0 = time.perf_counter()
        stored = 0
        for start in range(0, rows.num_rows, UNIT):
            part = rows.slice(start, UNIT)
            stored += sink.write(WriteUnit(part, empty, None, part.num_rows)).stored
        seconds = time.perf_counter() - t0
    finally:
        sink.close()
    assert stored == rows.num_rows, (stored, rows.num_rows)
    return seconds


def redis_py_cluster(rows: pa.Table, compiled: Any, cluster: RedisCluster) -> float:
    from redis.cluster import ClusterNode
    from redis.cluster import RedisCluster as PyCluster

    sink = RedisSink(cluster.url, compiled)
    names = [*sink.hot_columns, "_source", "_schema_version", "_schema_fingerprint", "_run_id",
             "_ingested_at"]
    cols = {n: encode_column(rows.column(n).combine_chunks()).to_pylist() for n in names}
    ids = encode_column(rows.column(sink.entity).combine_chunks()).to_pylist()
    mappings = [{n: cols[n][i] for n in names if cols[n][i] is not None} for i in range(rows.num_rows)]
    keys = [f"features:{compiled.name}:{{{e}}}" for e in ids]
    client = PyCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in cluster.ports[:3]])
    try:
        t0 = time.perf_counter()
        for start in range(0, len(keys), 10_000):
            pipe = client.pipeline(transaction=False)
            for k, m in zip(keys[start:start + 10_000], mappings[start:start + 10_000], strict=True):
                pipe.hset(k, mapping=m)
                pipe.expire(k, sink.ttl)
            pipe.execute()
        return time.perf_counter() - t0
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=500_000, help="applicant rows generated (~2%% are rejects)")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    args = ap.parse_args(argv)
    settings = resolve_settings(root=ROOT)
    compiled = applicant_schema()
    cluster = RedisCluster()
    cluster.install()
    print(f"local Redis Cluster: {cluster.start()} ({cluster.url})", flush=True)
    rows = prepared_rows(dataset(args.rows), compiled, settings)
    n = rows.num_rows
    print(f"{n:,} prepared rows ({args.rows:,} generated); rows/s and Redis server CPU per contender",
          flush=True)
    single = single_url(settings.redis_url)
    single_port = int(single.split(":")[-1].split("/")[0])

    import redis

    def flush_single() -> None:
        c = redis.Redis.from_url(single)
        c.flushdb()
        c.close()

    contenders: dict[str, tuple[Callable[[], float], list[int], Callable[[], None]]] = {
        "raw single": (lambda: raw_redis(rows, compiled, single, ttl=True), [single_port], flush_single),
        "sink single": (lambda: sink_write(single, rows, compiled), [single_port], flush_single),
        "redis-py cluster": (lambda: redis_py_cluster(rows, compiled, cluster), cluster.ports,
                             lambda: flush_cluster(cluster)),
        "sink cluster": (lambda: sink_write(cluster.url, rows, compiled), cluster.ports,
                         lambda: flush_cluster(cluster)),
    }
    results: dict[str, list[float]] = {k: [] for k in contenders}
    for r in range(1, args.repeat + 1):
        for name, (fn, ports, flush) in contenders.items():
            flush()
            cpu0 = redis_cpu(ports)
            try:
                seconds = fn()
            except Exception as exc:  # a failed contender must not lose the results before it
                print(f"round {r}/{args.repeat} {name:<18} FAILED: {exc!r}", flush=True)
                continue
            cpu = redis_cpu(ports) - cpu0
            flush()
            results[name].append(n / seconds)
            print(f"round {r}/{args.repeat} {name:<18} {seconds:7.2f} s {n / seconds:>10,.0f} rows/s  "
                  f"redis cpu {cpu:5.1f} s ({cpu / n * 1e6:.1f} us/row)", flush=True)

    print(f"\n{n:,} rows, {args.repeat} round(s): median rows/s [min - max]")
    for name, rates in results.items():
        if rates:
            print(f"  {name:<18} {statistics.median(rates):>10,.0f} [{min(rates):,.0f} - {max(rates):,.0f}]")
    for a, b in (("sink cluster", "sink single"), ("sink single", "raw single"),
                 ("sink cluster", "redis-py cluster")):
        pairs = [x / y for x, y in zip(results[a], results[b], strict=False)]
        if pairs:
            print(f"  {a} / {b}: median {statistics.median(pairs):.2f}x "
                  f"({', '.join(f'{p:.2f}' for p in pairs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
