"""Benchmark: the online read of request-time windows (issue 49 step b) and its state's memory.

Usage::

    .venv/bin/python bench/online_request_time.py [--rates 1,100,10000] [--entities 3] [--days 8]
                                                  [--rounds 5] [--reads 300] [--sketches]

Setup per rate (events per day per entity): a schema ``card_<rate>`` with 4 hot aggregations
over 7 days (count, sum, mean, max of ``amount``; allowed lateness 1h), ``--entities`` cards
each with ``--days`` days of events at that rate (evenly spaced with a random jitter), loaded
with the batch loader (``features load``: the backfill writes the tiles) into a scratch
Postgres schema ``bench_online_rt`` and Redis database 14. ``--sketches`` adds a ``merchant``
field (uniform over 5,000 merchants) and two hot sketches over 7 days to the schema:
``merchants_7d`` (``approx_count_distinct`` of merchant, precision 12) and ``amount_pcts_7d``
(``approx_percentile`` of amount, q [0.5, 0.99], relative accuracy 0.01); the reads then name
all 6 aggregations, and the memory line adds the bytes of the sketches' states in the
tiles' summaries and of their hashes in the tiles' events (issue 49).

Measured:

- **memory per entity**: ``MEMORY USAGE`` of each card's tiles hash
  (``features:card_<rate>__tiles:{card}``) and of its aggregates hash (the 4 values as of
  the newest event), mean over the cards; the number of tiles kept;
- **read latency** of one entity: ``fs.online(schema, [card], AGGS, windows="event")`` (the 4
  stored values, as of the newest event) against ``fs.online(schema, [card], AGGS, windows="request_time")``
  (the windows at the store's clock, 1 hour after the newest event: inside the data, every
  window full), in interleaved rounds (the order alternates each round), ``--reads`` reads
  per contender per round, the p50 of each round printed as measured; then the median of the
  rounds' p50s per contender and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import resolve_settings  # noqa: E402

PG_SCHEMA = "bench_online_rt"
REDIS_DB = 14
PREFIX = "bench:online_rt:"
AGGS = ["n_7d", "amount_sum_7d", "amount_mean_7d", "amount_max_7d"]
DAY_US = 86_400_000_000
START_US = 1_767_225_600_000_000  # 2026-01-01 UTC

SCHEMA = """
name: card_{rate}
version: 1.0.0
entity: card
event_time: ts
fields:
  - {{name: card, type: string, constraints: {{required: true}}}}
  - {{name: ts, type: "timestamp(us, UTC)", constraints: {{required: true}}}}
  - {{name: amount, type: "decimal(12,2)", constraints: {{nullable: true}}}}
aggregations:
  allowed_lateness: 1h
  features:
    - {{name: n_7d, function: count, window: 7d, store: [hot, cold]}}
    - {{name: amount_sum_7d, function: sum, of: amount, window: 7d, store: [hot, cold]}}
    - {{name: amount_mean_7d, function: mean, of: amount, window: 7d, store: [hot, cold]}}
    - {{name: amount_max_7d, function: max, of: amount, window: 7d, store: [hot, cold]}}
"""
SKETCHES = ["merchants_7d", "amount_pcts_7d"]
SKETCH_FIELD = """  - {name: merchant, type: string, constraints: {nullable: true}}
aggregations:"""
SKETCH_AGGS = """
    - {name: merchants_7d, function: approx_count_distinct, of: merchant, precision: 12, window: 7d,
       store: [hot, cold]}
    - {name: amount_pcts_7d, function: approx_percentile, of: amount, q: [0.5, 0.99], window: 7d,
       store: [hot, cold]}
"""


def history(rate: int, entities: int, days: int, rng: np.random.Generator, sketches: bool) -> pa.Table:
    n = rate * days
    step = DAY_US // rate
    cards, ts = [], []
    for e in range(entities):
        t = START_US + np.arange(n, dtype=np.int64) * step + rng.integers(0, step, n)
        cards += [f"card-{e}"] * n
        ts.append(t)
    times = np.concatenate(ts)
    amount = pa.array(rng.integers(1, 100_000, len(times)), pa.int64()).cast(pa.decimal128(19, 0)).cast(
        pa.decimal128(12, 2))
    table = pa.table({"card": pa.array(cards), "ts": pa.array(times, pa.timestamp("us", "UTC")),
                      "amount": amount})
    if not sketches:
        return table
    merchant = np.char.add("m-", rng.integers(0, 5000, len(times)).astype(str))
    return table.append_column("merchant", pa.array(merchant))


def sketch_bytes(client: Any, key: str, tspec: Any) -> tuple[int, int]:
    """The bytes of the sketches' states in a tiles hash's summaries, and of their 8-byte
    hashes in its events."""
    from features.aggregate.tilepack import SUMMARIES_FIELD, sketch_parts, summary_blobs, unpack_events

    layout = tspec.layout
    states = hashes = 0
    for field, value in client.hgetall(key).items():
        f = field.decode()
        if f == SUMMARIES_FIELD:  # every kept tile's summary (layout 4)
            for blob in summary_blobs(value)[1]:
                states += sum(4 + len(v) for v in sketch_parts(layout, blob[layout.fixed_bytes:])[0].values())
        elif f.startswith("e:"):
            hashes += 8 * len(layout.hashed) * len(unpack_events(layout, 0, value).time_us)
    return states, hashes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1,100,10000")
    ap.add_argument("--entities", type=int, default=3)
    ap.add_argument("--days", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--sketches", action="store_true", help="add the two sketch aggregations (issue 49)")
    ap.add_argument("--profile", action="store_true",
                    help="print a cProfile of --reads request-time reads per rate instead of timing rounds")
    args = ap.parse_args(argv)

    import psycopg
    import redis

    from features import FeatureStore
    from features.aggregate.engine import AggSpec
    from features.aggregate.tiles import TileSpec
    from features.compile import compile_schema
    from features.load import load
    from features.schema import parse_schema

    base = resolve_settings(root=ROOT)
    url = base.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    import dataclasses

    settings = dataclasses.replace(base, redis_url=url)
    client = redis.Redis.from_url(url)
    client.flushdb()
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {PG_SCHEMA}")
    rng = np.random.default_rng(49)
    tmp = Path("/tmp/bench_online_rt")
    (tmp / "schemas").mkdir(parents=True, exist_ok=True)
    rates = [int(x) for x in args.rates.split(",")]
    summary = []
    aggs = [*AGGS, *SKETCHES] if args.sketches else AGGS
    try:
        for rate in rates:
            text = SCHEMA.format(rate=rate)
            if args.sketches:
                text = text.replace("aggregations:", SKETCH_FIELD).rstrip("\n") + SKETCH_AGGS
            (tmp / "schemas" / f"card_{rate}.yaml").write_text(text)
            c = compile_schema(parse_schema(text))
            path = tmp / f"h_{rate}.parquet"
            table = history(rate, args.entities, args.days, rng, args.sketches)
            pq.write_table(table, path)
            t0 = time.perf_counter()
            s = load([path], c, settings, search_path=PG_SCHEMA, key_prefix=PREFIX)
            took = time.perf_counter() - t0
            newest = int(np.asarray(table.column("ts").cast(pa.int64())).max())
            tiles_mem, agg_mem, nfields, states, hashes = [], [], [], [], []
            tspec = TileSpec.of(AggSpec.of(c.schema))
            for e in range(args.entities):
                key = f"{PREFIX}features:card_{rate}__tiles:{{card-{e}}}"
                tiles_mem.append(client.memory_usage(key, samples=0) or 0)
                got = sketch_bytes(client, key, tspec)
                states.append(got[0])
                hashes.append(got[1])
                nfields.append(client.hlen(key))
                agg_mem.append(client.memory_usage(f"{PREFIX}features:card_{rate}__aggregates:{{card-{e}}}",
                                                   samples=0) or 0)
            print(f"rate {rate}/day: loaded {s.stored:,} events in {took:.1f}s "
                  f"(aggregation stage {s.aggregations.get('seconds', 0)}s, "
                  f"{s.aggregations.get('tiles_written', 0):,} tiles written); per entity: tiles hash "
                  f"{statistics.mean(tiles_mem) / 1024:,.1f} KiB ({statistics.mean(nfields):.0f} fields), "
                  f"aggregates hash {statistics.mean(agg_mem) / 1024:.2f} KiB"
                  + (f"; sketch states {statistics.mean(states) / 1024:,.1f} KiB, sketch hashes in events "
                     f"{statistics.mean(hashes) / 1024:,.1f} KiB" if args.sketches else ""), flush=True)
            clock_s = (newest + 3_600_000_000) / 1e6
            with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=tmp / "schemas",
                              search_path=PG_SCHEMA, key_prefix=PREFIX, clock=lambda s=clock_s: s) as fs:
                name = f"card_{rate}"
                a = fs.online(name, ["card-0"], aggs, windows="request_time").to_pylist()[0]
                b = fs.online(name, ["card-0"], aggs, windows="event").to_pylist()[0]
                print(f"  values at the clock: {[a[x] for x in aggs]}; as of the newest event: "
                      f"{[b[x] for x in aggs]}", flush=True)
                if args.profile:
                    import cProfile
                    import pstats

                    prof = cProfile.Profile()
                    prof.enable()
                    for i in range(args.reads):
                        fs.online(name, [f"card-{i % args.entities}"], aggs, windows="request_time")
                    prof.disable()
                    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
                    continue
                p50s: dict[str, list[float]] = {"stored": [], "request_time": []}
                for r in range(args.rounds):
                    order = ["stored", "request_time"] if r % 2 == 0 else ["request_time", "stored"]
                    for what in order:
                        kw = {"windows": "request_time" if what == "request_time" else "event"}
                        for _ in range(20):
                            fs.online(name, ["card-1"], aggs, **kw)
                        lat = []
                        for i in range(args.reads):
                            card = f"card-{i % args.entities}"
                            t1 = time.perf_counter()
                            fs.online(name, [card], aggs, **kw)
                            lat.append(time.perf_counter() - t1)
                        p50s[what].append(statistics.median(lat) * 1e6)
                        print(f"  round {r + 1} {what}: p50 {p50s[what][-1]:.0f} us", flush=True)
                med = {k: statistics.median(v) for k, v in p50s.items()}
                ratio = med["request_time"] / med["stored"]
                print(f"  rate {rate}/day: p50 stored {med['stored']:.0f} us, request_time "
                      f"{med['request_time']:.0f} us: {ratio:.2f}x", flush=True)
                summary.append((rate, statistics.mean(tiles_mem), statistics.mean(nfields),
                                statistics.mean(agg_mem), med["stored"], med["request_time"], ratio))
    finally:
        client.flushdb()
        client.close()
        with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
    print("\n| events/day | tiles hash per entity | fields | aggregates hash | p50 stored | p50 request_time "
          "| ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rate, tm, nf, am, ps, pr, ratio in summary:
        print(f"| {rate:,} | {tm / 1024:,.1f} KiB | {nf:.0f} | {am / 1024:.2f} KiB | {ps:.0f} us "
              f"| {pr:.0f} us | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
