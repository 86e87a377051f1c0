"""Benchmark: the batch loader in 1 and 2 processes, into one Redis and into the Redis Cluster.

Usage::

    .venv/bin/python bench/scale.py [--rows 4000000] [--repeat 2] [--workers 1 2]

Needs ``features dev up`` (the local Redis Cluster is started if it is not running).
**It flushes database 12 of the dev Redis and every key of the local cluster.**

``--rows`` applicant rows (~2% invalid, one Parquet file of 131,072-row row groups,
cached under ``.cache/bench``) are loaded from empty by ``features load --json
--workers N`` as a subprocess (``--workers`` values x {single Redis, cluster}; with
``--flink P``, also ``--engine flink --parallelism P`` on the local mini-cluster, JVM
start included in the loader's seconds), rounds interleaved. Every run goes into a fresh
Postgres schema and an empty Redis; its summary must add up and the stores must hold
exactly the stored rows. Each result is printed as soon as it is measured: the loader's
own seconds (from its summary), rows/s, and the CPU seconds of each process kind over
the run (the loader and its workers, Postgres, Redis; ``bench/stream.py``'s
``cpu_seconds``). The summary gives medians with
min/max and, per round, each contender's ratio to ``--workers 1`` into one Redis.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch_load import dataset  # noqa: E402
from stream import cpu_seconds  # noqa: E402

from features.config import resolve_settings  # noqa: E402
from features.ops.dev.services import RedisCluster  # noqa: E402

PG_SCHEMA = "bench_scale"


def pg(dsn: str, *statements: str) -> Any:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        out = None
        for s in statements:
            out = conn.execute(s).fetchone() if s.lstrip().upper().startswith("SELECT") else conn.execute(s)
        return out


def flush(single_url: str, cluster: RedisCluster) -> None:
    import redis

    c = redis.Redis.from_url(single_url)
    c.flushdb()
    c.close()
    for port in cluster.ports:
        node = redis.Redis(host="127.0.0.1", port=port)
        try:
            if node.info("replication")["role"] == "master":
                node.flushall()
        finally:
            node.close()


def redis_keys(url: str, cluster: RedisCluster) -> int:
    import redis

    if url.startswith("redis+cluster"):
        total = 0
        for port in cluster.ports:
            node = redis.Redis(host="127.0.0.1", port=port)
            try:
                if node.info("replication")["role"] == "master":
                    total += int(node.dbsize())
            finally:
                node.close()
        return total
    c = redis.Redis.from_url(url)
    try:
        return int(c.dbsize())
    finally:
        c.close()


def run_load(path: Path, workers: int, redis_url: str, dsn: str, *, flink: bool = False) -> dict[str, Any]:
    env = {"FEATURES_POSTGRES_DSN": dsn + ("&" if "?" in dsn else "?") + "options="
           + quote(f"-c search_path={PG_SCHEMA}"), "FEATURES_REDIS_URL": redis_url}
    import os

    how = ["--engine", "flink", "--parallelism", str(workers)] if flink else ["--workers", str(workers)]
    proc = subprocess.run([sys.executable, "-m", "features.cli", "load", "--schema", "credit_applicant",
                           *how, "--json", "--no-progress", str(path)],
                          env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=7200)
    if proc.returncode != 0:
        raise RuntimeError(f"features load --workers {workers} -> exit {proc.returncode}: "
                           f"{proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout[proc.stdout.index("{"):])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000, help="applicant rows (~2%% invalid)")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="--workers values to compare")
    ap.add_argument("--flink", type=int, nargs="*", default=[], metavar="P",
                    help="also --engine flink --parallelism P (local mini-cluster), for each P")
    ap.add_argument("--no-cluster", action="store_true", help="only the single Redis server")
    args = ap.parse_args(argv)
    settings = resolve_settings(root=ROOT)
    cluster = RedisCluster()
    targets = {"redis": settings.redis_url.rsplit("/", 1)[0] + "/12"}
    if not args.no_cluster:
        cluster.install()
        print(f"local Redis Cluster: {cluster.start()}", flush=True)
        targets["cluster"] = cluster.url
    t0 = time.perf_counter()
    path = dataset(args.rows)
    print(f"{args.rows:,} rows in {path.name} ({time.perf_counter() - t0:.0f} s to make or find)", flush=True)
    contenders = [(w, t, False) for t in targets for w in args.workers]
    contenders += [(p, t, True) for t in targets for p in args.flink]
    rates: dict[tuple[int, str, bool], list[float]] = {c: [] for c in contenders}
    for r in range(1, args.repeat + 1):
        for workers, target, flink in contenders:
            pg(settings.postgres_dsn, f'DROP SCHEMA IF EXISTS "{PG_SCHEMA}" CASCADE',
               f'CREATE SCHEMA "{PG_SCHEMA}"')
            flush(targets["redis"], cluster)
            cpu0 = cpu_seconds()
            label = f"{'flink -p' if flink else '--workers'} {workers} -> {target}"
            try:
                s = run_load(path, workers, targets[target], settings.postgres_dsn, flink=flink)
            except Exception as exc:  # a failed contender must not lose the results before it
                print(f"round {r}/{args.repeat} {label:<28} FAILED: {exc}", flush=True)
                continue
            cpu1 = cpu_seconds()
            rows = pg(settings.postgres_dsn, f'SELECT count(*) FROM "{PG_SCHEMA}".credit_applicant')[0]
            keys = redis_keys(targets[target], cluster)
            exact = s["adds_up"] and rows == s["stored"] and keys == s["stored"] + 1  # + the ledger set
            rate = s["read"] / s["seconds"]
            rates[(workers, target, flink)].append(rate)
            cpu = ", ".join(f"{k} {cpu1[k] - cpu0[k]:.0f} s" for k in ("subprocesses", "postgres", "redis"))
            print(f"round {r}/{args.repeat} {label:<28} {s['seconds']:8.1f} s {rate:>10,.0f} rows/s | "
                  f"read {s['read']:,} = stored {s['stored']:,} + rejected {s['rejected']:,} + already "
                  f"present {s['already_present']:,}; Postgres rows {rows:,}, Redis keys {keys:,} "
                  f"[{'exact' if exact else 'MISMATCH'}] | cpu {cpu}", flush=True)
    base = rates.get((args.workers[0], "redis", False), [])
    print(f"\n{args.rows:,} rows, {args.repeat} round(s): median rows/s [min - max], ratio to "
          f"--workers {args.workers[0]} -> redis per round")
    for (workers, target, flink), got in rates.items():
        if not got:
            continue
        how = "flink -p" if flink else "--workers"
        ratios = [g / b for g, b in zip(got, base, strict=False)]
        ratio = (f"  {statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"
                 if ratios else "")
        print(f"  {how} {workers} -> {target:<8} {statistics.median(got):>10,.0f} "
              f"[{min(got):,.0f} - {max(got):,.0f}]{ratio}")
    pg(settings.postgres_dsn, f'DROP SCHEMA IF EXISTS "{PG_SCHEMA}" CASCADE')
    flush(targets["redis"], cluster)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
