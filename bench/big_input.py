"""Memory stays bounded: load a large Parquet input and sample the loader's RSS.

Usage::

    .venv/bin/python bench/big_input.py [--gb 5.0] [--every 30]

Writes ``.cache/bench/big_<gb>gb.parquet`` once: applicant rows (``features.ops.examples``,
1M rows per seed), **uncompressed and without dictionary encoding**, so that the file
really has ``--gb`` gigabytes on disk (compressed, 5 GB would be ~116M rows, several
hours here). Application ids cycle over 2M entities, so Redis holds 2M hashes and not
one per row (this machine's memory), while Postgres gets every row. Then runs
``features load`` on it in a child process, into a scratch Postgres schema
``bench_big`` and Redis database 14 (both emptied before and after), sampling the
child's RSS from ``/proc`` every ``--every`` seconds, and prints the samples' trend
and the peak (``VmHWM``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CACHE = ROOT / ".cache" / "bench"


def write_input(gb: float) -> Path:
    import pyarrow.parquet as pq

    from features.ops.examples import applicants

    path = CACHE / f"big_{gb:g}gb.parquet"
    if path.exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    writer = None
    i = 0
    while writer is None or tmp.stat().st_size < gb * 1e9:
        t = applicants(1_000_000, seed=1000 + i, first_id=10**9 + (i % 2) * 10**6)
        if writer is None:
            writer = pq.ParquetWriter(tmp, t.schema, compression="none", use_dictionary=False)
        writer.write_table(t, row_group_size=131_072)
        i += 1
    writer.close()
    tmp.rename(path)
    return path


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    import psycopg
    import redis

    from features.config import resolve_settings

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=5.0)
    ap.add_argument("--every", type=float, default=30.0, help="seconds between RSS samples")
    args = ap.parse_args(argv)
    path = write_input(args.gb)
    print(f"input {path} ({path.stat().st_size / 1e9:.2f} GB)", flush=True)
    base = resolve_settings(root=ROOT)
    redis_url = base.redis_url.rsplit("/", 1)[0] + "/14"
    with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench_big CASCADE")
        conn.execute("CREATE SCHEMA bench_big")
    redis.Redis.from_url(redis_url).flushdb()
    sep = "&" if "?" in base.postgres_dsn else "?"
    dsn = f"{base.postgres_dsn}{sep}options=-csearch_path%3Dbench_big"
    env = {**os.environ, "FEATURES_POSTGRES_DSN": dsn, "FEATURES_REDIS_URL": redis_url}
    t0 = time.time()
    cmd = [str(ROOT / ".venv" / "bin" / "features"), "load", "--schema", "credit_applicant", "--json",
           "--no-progress", str(path)]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    samples: list[tuple[float, int]] = []
    peak = 0
    while child.poll() is None:
        try:
            samples.append((time.time() - t0, _status(child.pid, "VmRSS")))
            peak = max(peak, _status(child.pid, "VmHWM"))
        except FileNotFoundError:
            break
        time.sleep(args.every)
    out, _ = child.communicate()
    seconds = time.time() - t0
    try:
        summary = json.loads(out)
    finally:
        with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA bench_big CASCADE")
        redis.Redis.from_url(redis_url).flushdb()
    rss = [r for _, r in samples[1:]] or [0]
    q = max(len(rss) // 4, 1)
    adds = "adds up" if summary["adds_up"] else "DOES NOT ADD UP"
    print(f"exit {child.returncode}; {seconds:.0f} s; read {summary['read']:,} = "
          f"stored {summary['stored']:,} "
          f"+ rejected {summary['rejected']:,} + already present {summary['already_present']:,} ({adds}); "
          f"{summary['rows_per_second']:,} rows/s")
    print(f"RSS samples (every {args.every:g} s, after the first): min {min(rss) / 2**20:.0f} MB, "
          f"max {max(rss) / 2**20:.0f} MB; mean of the first quarter {sum(rss[:q]) / q / 2**20:.0f} MB, "
          f"of the last quarter {sum(rss[-q:]) / q / 2**20:.0f} MB; peak (VmHWM) {peak / 2**20:.0f} MB")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
