"""Benchmark: what the run counts (``featureline_run_counts``) cost one stream write.

Usage::

    .venv/bin/python bench/run_counts.py [--rows 500] [--writes 300]

In a fresh Postgres schema (dropped at the end): ``2 * --writes`` chunks of ``--rows``
applicant rows (``features.ops.examples.applicants``, ~2% rejected; new keys in every
chunk, the usual stream chunk) prepared once, then written one by one with
``PostgresSink.write`` as a stream writes them (no ledger unit), counted (``counted=
"stream"``: one upsert more in the transaction) and not counted in turn. The first four
writes warm up and are not timed. Prints the median, mean and min of each and the
difference of the medians.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time
import uuid
from pathlib import Path

import psycopg

from features.compile import compile_schema
from features.config import resolve_settings
from features.kernels import transform_program
from features.lineage import BatchLineage, RunContext
from features.ops.examples import applicants
from features.pipeline.prepare import Prepared, process_batch
from features.schema import load_schemas
from features.sinks.base import WriteUnit
from features.sinks.postgres import PostgresSink
from features.sources.base import SourceBatch

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=500, help="records per write (default 500)")
    ap.add_argument("--writes", type=int, default=300, help="timed writes of each kind (default 300)")
    args = ap.parse_args()
    settings = resolve_settings()
    compiled = compile_schema(load_schemas(ROOT / "schemas")["credit_applicant"])
    program = transform_program(compiled, settings)
    ns = f"bench_run_counts_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{ns}"')
    try:
        now = dt.datetime.now(dt.UTC)
        ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "bench", now)
        chunks: list[Prepared] = []
        for i in range(2 * args.writes + WARM_UP):
            batch = applicants(args.rows, seed=100 + i, first_id=10**9 + i * 10**6).to_batches(
                max_chunksize=args.rows)[0]
            chunks.append(process_batch(SourceBatch(batch, BatchLineage(f"kafka://bench/{i}", 0, args.rows)),
                                        compiled, program, ctx, now))
        sink = PostgresSink(settings.postgres_dsn, compiled, search_path=ns)
        sink.open()
        times: dict[str, list[float]] = {"not counted": [], "counted": []}
        try:
            for i, p in enumerate(chunks):
                kind = "counted" if i % 2 else "not counted"
                t0 = time.perf_counter()
                sink.write(WriteUnit(p.rows, p.rejects, None, args.rows,
                                     counted="stream" if kind == "counted" else None))
                if i >= WARM_UP:
                    times[kind].append(time.perf_counter() - t0)
        finally:
            sink.close()
        for kind, seconds in times.items():
            print(f"{kind:12s} writes {len(seconds):4d}  median {1000 * statistics.median(seconds):7.3f} ms  "
                  f"mean {1000 * statistics.fmean(seconds):7.3f} ms  min {1000 * min(seconds):7.3f} ms")
        diff = statistics.median(times["counted"]) - statistics.median(times["not counted"])
        print(f"median difference {1000 * diff:+.3f} ms per write of {args.rows:,} records")
    finally:
        with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{ns}" CASCADE')


if __name__ == "__main__":
    main()
