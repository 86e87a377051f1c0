"""Benchmark: what each store's server spends per row on our write path vs the raw one.

Usage::

    .venv/bin/python bench/write_paths.py [--rows 200000] [--repeat 4]

On ``--rows`` prepared applicant rows (the rows the sinks receive), alone on the machine
(no concurrent load), it measures the **server's CPU time** (not wall time, which the
other processes on a 2-core machine blur), interleaving the variants ``--repeat`` times
and printing medians:

- Redis (``INFO cpu`` of the server, database 13): raw ``HSET`` protocol bytes of the
  same hashes; raw ``HSET`` + ``EXPIRE``; our sink's ``write`` (newest-wins script,
  MessagePack arguments, ``PEXPIREAT``);
- Postgres (CPU of the server processes from ``/proc``, reaped backends included): the
  sink's binary ``COPY`` vs Arrow's CSV ``COPY`` of the same rows into a table with the
  same DDL, and the client time to encode each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch_load import dataset, prepared_rows, raw_redis  # noqa: E402

from features.config import resolve_settings  # noqa: E402
from features.ops.examples import applicant_schema  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def postgres_cpu() -> float:
    """CPU seconds of every ``postgres`` process, with its reaped children."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if not f.read().startswith("postgres"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"] + info["used_cpu_sys"])


def main(argv: list[str] | None = None) -> int:
    import psycopg
    import redis

    from features.sinks.base import WriteUnit
    from features.sinks.pgbinary import copy_binary
    from features.sinks.postgres import PostgresSink, copy_csv
    from features.sinks.redis import RedisSink

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args(argv)
    base = resolve_settings(root=ROOT)
    compiled = applicant_schema()
    rows = prepared_rows(dataset(args.rows), compiled, base)
    n = rows.num_rows
    url = base.redis_url.rsplit("/", 1)[0] + "/13"
    client = redis.Redis.from_url(url)
    sink = RedisSink(url, compiled)
    sink.open()
    columns = PostgresSink(base.postgres_dsn, compiled).columns
    data = rows.select(list(columns))
    results: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        results.setdefault(name, []).append(seconds)

    with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench_paths CASCADE")
        conn.execute("CREATE SCHEMA bench_paths")
        conn.execute("SET search_path = bench_paths")
        conn.execute(compiled.ddl)
        types = dict(conn.execute(
            "SELECT attname, atttypid::regtype::text FROM pg_attribute WHERE attrelid = %s::regclass "
            "AND attnum > 0", (f'"{compiled.name}"',)).fetchall())
    pg_types = [types[c] for c in columns]
    cols = ", ".join(f'"{c}"' for c in columns)
    for _ in range(args.repeat):
        for ttl in (False, True):
            before = redis_cpu(client)
            raw_redis(rows, compiled, url, ttl=ttl)
            record("redis: raw HSET" + (" + EXPIRE" if ttl else ""), redis_cpu(client) - before)
        client.flushdb()
        before = redis_cpu(client)
        sink.write(WriteUnit(rows, rows.slice(0, 0), None, n))
        record("redis: our newest-wins script", redis_cpu(client) - before)
        client.flushdb()
        for fmt in ("csv", "binary"):
            t0 = time.perf_counter()
            if fmt == "csv":
                payload: list[Any] = [copy_csv(data)]
                order = list(range(len(columns)))
            else:
                encoded = copy_binary(data, pg_types)
                assert encoded is not None
                payload, order = encoded
            record(f"postgres: encode {fmt} (client)", time.perf_counter() - t0)
            before = postgres_cpu()
            options = "-c TimeZone=UTC -c search_path=bench_paths"
            with psycopg.connect(base.postgres_dsn, options=options) as conn:
                conn.execute(f'TRUNCATE "{compiled.name}"')
                names = ", ".join(f'"{columns[i]}"' for i in order) if fmt == "binary" else cols
                with conn.cursor() as cur, cur.copy(
                        f'COPY "{compiled.name}" ({names}) FROM STDIN (FORMAT {fmt})') as cp:
                    for part in payload:
                        cp.write(part)
                conn.commit()
            time.sleep(0.2)  # let the backend exit and be reaped
            record(f"postgres: COPY {fmt} (server)", postgres_cpu() - before)
    sink.close()
    with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA bench_paths CASCADE")
    print(f"{n:,} rows, {args.repeat} rounds; CPU seconds (median, min-max) and µs per row")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:<38}{med:>8.2f}s  ({min(values):.2f}-{max(values):.2f})  {1e6 * med / n:6.1f} µs/row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
