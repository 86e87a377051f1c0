"""Benchmark: what one stream micro-batch costs, by size, and where the time goes.

Usage::

    .venv/bin/python bench/stream_fixed.py [--sizes 1 100 1000 2000 8000 16000] [--repeat 5] [--chunk 2000]

Calls ``features.stream.core.StreamProcessor.process`` directly (no Kafka consumer, no
Flink) on micro-batches of ``features.ops.examples.applicant_events`` of each size, writing
to the real stores (a scratch Postgres schema, Redis database 13, a scratch dead-letter
topic), ``--repeat`` rounds with the sizes interleaved, fresh records every call. For each
size it prints, as soon as it is measured: median milliseconds per micro-batch, µs per
record, records/s, and the median milliseconds of each part of ``process``: preparing
(decode, validate, transform: ``prepare_records``), waiting for the stores (the
writer's ``drain``; the writes of a chunk overlap the preparing of the next), the
dead-letter flush, and the accounting. The cost of a 1-record micro-batch is the fixed
cost every micro-batch pays.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import resolve_settings  # noqa: E402
from features.ops.examples import applicant_events, applicant_schema  # noqa: E402
from features.pipeline import write as runner  # noqa: E402
from features.stream import core  # noqa: E402
from features.stream.kafka import ensure_topic  # noqa: E402

REDIS_DB = 13


def _timed(obj: Any, name: str, label: str, spent: dict[str, float]) -> None:
    """Wrap ``obj.name`` so that its wall time is added to ``spent[label]``."""
    original = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t0

    setattr(obj, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 100, 1000, 2000, 8000, 16000])
    ap.add_argument("--repeat", type=int, default=5, help="rounds (each calls every size once)")
    ap.add_argument("--chunk", type=int, default=core.DEFAULT_CHUNK_RECORDS,
                    help=f"records per chunk of a micro-batch (default {core.DEFAULT_CHUNK_RECORDS})")
    args = ap.parse_args(argv)

    import psycopg
    import redis
    from confluent_kafka.admin import AdminClient

    base = resolve_settings(root=ROOT)
    tag = uuid.uuid4().hex[:8]
    schema = f"bench_fixed_{tag}"
    sep = "&" if "?" in base.postgres_dsn else "?"
    dsn = f"{base.postgres_dsn}{sep}options=-csearch_path%3D{schema}"
    redis_url = base.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    settings = dataclasses.replace(base, postgres_dsn=dsn, redis_url=redis_url)
    dlq = f"bench_fixed_{tag}.rejects"
    ensure_topic(base.kafka_bootstrap, dlq, partitions=1)
    with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    spent: dict[str, float] = defaultdict(float)
    _timed(core, "prepare_records", "prepare", spent)
    _timed(runner.BatchWriter, "drain", "stores (drain)", spent)
    _timed(core.StreamProcessor, "_flush_dead_letters", "dead-letter flush", spent)
    _timed(core.StreamProcessor, "_account", "accounting", spent)
    compiled = applicant_schema()
    total = sum(args.sizes) * (args.repeat + 1)
    values = applicant_events(total, seed=11)
    proc = core.StreamProcessor(compiled, settings, run_id=f"bench-fixed-{tag}", dead_letter_topic=dlq,
                                chunk_records=args.chunk)
    proc.open()
    results: dict[int, list[dict[str, float]]] = defaultdict(list)
    offset = 0
    try:
        for round_ in range(args.repeat + 1):  # round 0 warms up (connections, caches)
            for size in args.sizes:
                batch = values[offset:offset + size]
                n = len(batch)
                offs = pa.array(np.arange(offset, offset + n, dtype=np.int64))
                offset += n
                spent.clear()
                t0 = time.perf_counter()
                proc.process(batch, pa.array(["bench"] * n, pa.string()), pa.array([0] * n, pa.int32()), offs,
                             np.full(n, int(time.time() * 1000), dtype=np.int64))
                seconds = time.perf_counter() - t0
                if round_ == 0:
                    continue
                results[size].append({"total": seconds, **spent})
                parts = "  ".join(f"{k} {v * 1000:.1f}" for k, v in spent.items())
                print(f"round {round_} size {n:>6,}: {seconds * 1000:8.1f} ms  ({parts})", flush=True)
    finally:
        proc.close()
        with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        redis.Redis.from_url(redis_url).flushdb()
        admin = AdminClient({"bootstrap.servers": base.kafka_bootstrap})
        for f in admin.delete_topics([dlq]).values():
            f.result(30)  # the admin client must live until the broker answered
    labels = ["prepare", "stores (drain)", "dead-letter flush", "accounting"]
    print(f"\n{'size':>7} {'ms/batch':>9} {'min':>7} {'max':>7} {'us/rec':>7} {'rec/s':>8}  "
          + "  ".join(f"{label:>17}" for label in labels) + "   (medians, ms)")
    for size in args.sizes:
        runs = results[size]
        totals = [r["total"] for r in runs]
        med = statistics.median(totals)
        parts = "  ".join(f"{statistics.median(r.get(label, 0.0) for r in runs) * 1000:>17.1f}"
                          for label in labels)
        print(f"{size:>7,} {med * 1000:>9.1f} {min(totals) * 1000:>7.1f} {max(totals) * 1000:>7.1f} "
              f"{med / size * 1e6:>7.1f} {size / med:>8,.0f}  {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
