"""Benchmark: ``historical`` with windows at request time (issue 49 step a).

Usage::

    .venv/bin/python bench/request_time.py [--events 300000] [--users 30000] [--frames 100000,1000000]
                                           [--rounds 3] [--reuse]

Setup: ``--events`` click events (``schemas/clicks.yaml``, ``features.ops.examples.click_history``:
out of order, duplicates, late and invalid rows as the tests' data) loaded with the batch loader
into a scratch Postgres schema ``bench_request_time`` (Redis database 13). Frames: random stored
(user, event time) pairs, each moved by a random offset from -1 day to +2 days (inside bursts,
between events, after the last).

Methods, in interleaved rounds (the order alternates each round), each printed as measured,
then median and min/max per method and frame size, and the ratio of the medians:

- ``event``: ``fs.historical("clicks", frame, AGGS, windows="event")``, the aggregations as of
  the newest event (the ``clicks__aggregates`` rows: the call without request-time windows);
- ``request_time``: the same call with ``windows="request_time"``: the windows evaluated at each
  row's time from the history table (``features.aggregate.request_time``).

``AGGS``: 4 aggregations: ``clicks_24h``, ``views_24h``, ``click_ratio_24h`` (a ratio of the
two) and ``dwell_mean_1h``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import resolve_settings  # noqa: E402
from features.ops.examples import click_history, clicks_schema  # noqa: E402

PG_SCHEMA = "bench_request_time"
REDIS_DB = 13
AGGS = ["clicks_24h", "views_24h", "click_ratio_24h", "dwell_mean_1h"]
DAY_US = 86_400_000_000


def setup(settings: object, events: int, users: int, reuse: bool) -> None:
    import psycopg

    from features.load import load

    dsn = settings.postgres_dsn  # type: ignore[attr-defined]
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = %s",
                              (PG_SCHEMA,)).fetchone()
        if reuse and exists is not None and exists[0]:
            return
        conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {PG_SCHEMA}")
    path = Path("/tmp") / f"bench_request_time_{events}_{users}.parquet"
    pq.write_table(click_history(events, users=users), path)
    t0 = time.perf_counter()
    s = load([path], clicks_schema(), settings, search_path=PG_SCHEMA,  # type: ignore[arg-type]
             key_prefix="bench:request_time:")
    took = time.perf_counter() - t0
    print(f"setup: loaded {s.stored:,} events of {users:,} users in {took:.1f}s", flush=True)


def frame(settings: object, n: int, rng: np.random.Generator) -> pa.Table:
    import psycopg

    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:  # type: ignore[attr-defined]
        rows = conn.execute(f"SELECT user_id, (extract(epoch FROM event_time) * 1000000)::int8 "
                            f"FROM {PG_SCHEMA}.clicks").fetchall()
    ids = np.array([r[0] for r in rows], dtype=object)
    times = np.array([r[1] for r in rows], dtype=np.int64)
    pick = rng.integers(0, len(ids), n)
    t = times[pick] + rng.integers(-DAY_US, 2 * DAY_US, n)
    return pa.table({"user_id": pa.array(ids[pick], pa.string()),
                     "timestamp": pa.array(t, pa.int64()).cast(pa.timestamp("us", "UTC"))})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--users", type=int, default=30_000)
    ap.add_argument("--frames", default="100000,1000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reuse", action="store_true", help="keep the loaded schema of an earlier run")
    args = ap.parse_args()
    from features import FeatureStore

    settings = resolve_settings(root=ROOT)
    setup(settings, args.events, args.users, args.reuse)
    rng = np.random.default_rng(49)
    sizes = [int(x) for x in args.frames.split(",")]
    frames = {n: frame(settings, n, rng) for n in sizes}
    times: dict[tuple[str, int], list[float]] = {}
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=ROOT / "schemas", search_path=PG_SCHEMA) as fs:
        for r in range(args.rounds):
            for n in sizes:
                methods = ["event", "request_time"]
                for m in methods if r % 2 == 0 else methods[::-1]:
                    t0 = time.perf_counter()
                    out = fs.historical("clicks", frames[n], AGGS, windows=m)
                    dt = time.perf_counter() - t0
                    times.setdefault((m, n), []).append(dt)
                    zero = pa.compute.sum(pa.compute.equal(out.column("clicks_24h"), 0)).as_py()
                    print(f"round {r + 1} {m:<13} {n:>9,} rows: {dt:.3f}s ({n / dt:,.0f} rows/s; "
                          f"clicks_24h == 0 in {zero:,} rows)", flush=True)
    print(f"\n{'method':<14}{'frame':>10}{'median s':>10}{'min-max s':>14}{'rows/s (median)':>17}"
          f"{'ratio':>8}")
    for n in sizes:
        base = statistics.median(times[("event", n)])
        for m in ("event", "request_time"):
            v = times[(m, n)]
            med = statistics.median(v)
            print(f"{m:<14}{n:>10,}{med:>10.3f}{f'{min(v):.3f}-{max(v):.3f}':>14}{n / med:>17,.0f}"
                  f"{base / med:>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
