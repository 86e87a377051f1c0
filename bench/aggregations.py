"""Benchmark: windowed aggregations, batch backfill and stream, against the same work without them.

Usage::

    .venv/bin/python bench/aggregations.py [--batch-events 1000000] [--stream-events 100000] [--repeat 3]

Data: ``features.ops.examples.click_history`` (``schemas/clicks.yaml``: out-of-order events,
duplicates, late events, ~0.4% invalid), ``--users`` users (default 20,000).

1. **Batch backfill** (``features load`` = ``features.load.load``), one Parquet file:
   - baseline A: ``pyarrow.parquet.read_table`` of the file (plain read);
   - baseline B: the loader with the clicks schema *without* its ``aggregations:``
     section (validate, transform, history to Postgres, hot values to Redis);
   - the loader with all 8 aggregations of ``schemas/clicks.yaml``;
   - the aggregation stage alone (its own ``seconds``: read back earlier events, compute,
     finalize, upsert Postgres, write Redis), as rows/s of the events it aggregated;
   - with ``--batch sketches`` (issue 50) also the 8 aggregations with two of them sketches:
     ``max_price_24h`` becomes ``price_p90_24h`` (``approx_percentile``, q 0.9) and
     ``last_dwell_1h`` becomes ``items_approx_7d`` (``approx_count_distinct``, precision 12
     or ``--precision``), and its aggregation stage. Its windows with more than
     2^p/8 distinct items take the register path: ``--users 20 --precision 12`` puts
     thousands of distinct items in a user's 7 days, ``--precision 4`` sends nearly every
     window with over 2 distinct items there.
2. **Stream** (``jobs/stream_job.py --bounded``, parallelism 1, 2-partition topic keyed
   by user, the records produced before the job starts):
   - baseline: the clicks schema without aggregations;
   - the clicks schema with **three** windowed aggregations (``clicks_24h`` count with a
     ``where``, ``dwell_mean_1h`` mean, ``items_7d`` count_distinct over 7 days).
   Rates are records / wall time of the subprocess (JVM start included) and "job only":
   records / the main UDF's ``seconds`` (open to last micro-batch, aggregations included:
   they run in that micro-batch step; not the JVM start).

Rounds (``--repeat``) run the contenders interleaved (the order alternates each round);
each result is printed as soon as it is measured; the end prints median, min and max
per contender and the ratios per round.

Postgres: a fresh ``bench_agg_*`` schema per contender (the one before it dropped, then a
``CHECKPOINT`` where the role may, so each starts from the same store); Redis database 12 (flushed); topics
and the last schema are dropped at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import resolve_settings  # noqa: E402
from features.ops.examples import click_history, click_records  # noqa: E402

REDIS_DB = 12
THREE = """aggregations:
  allowed_lateness: 1h
  features:
    - {name: clicks_24h, function: count, where: {event_type: click}, window: 24h, store: [hot, cold]}
    - {name: dwell_mean_1h, function: mean, of: dwell_ms, window: 1h, store: [hot, cold]}
    - {name: items_7d, function: count_distinct, of: item_id, window: 7d, store: cold}
"""


SKETCHES = (("""    - name: max_price_24h
      function: max
      of: price
      window: 24h
""", """    - name: price_p90_24h
      function: approx_percentile
      of: price
      q: 0.9
      window: 24h
"""), ("""    - name: last_dwell_1h
      function: last
      of: dwell_ms
      window: 1h
""", """    - name: items_approx_7d
      function: approx_count_distinct
      of: item_id
      window: 7d
"""))


def variants(tmp: Path, precision: int = 12) -> dict[str, Path]:
    """Schema folders: clicks as shipped (8 aggregations), without, with three, and with
    8 of which two are sketches (``items_approx_7d`` with ``precision``)."""
    text = (ROOT / "schemas" / "clicks.yaml").read_text()
    start, end = text.index("aggregations:"), text.index("evolution_rules:")
    sketched = text
    for old, new in SKETCHES:
        assert old in sketched
        sketched = sketched.replace(old, new)
    acd = "      function: approx_count_distinct\n      of: item_id\n"
    assert sketched.count(acd) == 1
    sketched = sketched.replace(acd, f"{acd}      precision: {precision}\n")
    out = {}
    for name, body in (("all", text), ("none", text[:start] + text[end:]),
                       ("three", text[:start] + THREE + text[end:]), ("sketches", sketched)):
        d = tmp / f"schemas_{name}"
        d.mkdir()
        (d / "clicks.yaml").write_text(body)
        out[name] = d
    return out


def _stats(xs: list[float]) -> str:
    return f"median {statistics.median(xs):,.0f}  min {min(xs):,.0f}  max {max(xs):,.0f}"


def main(argv: list[str] | None = None) -> int:
    import psycopg
    import pyarrow.parquet as pq
    import redis
    from confluent_kafka.admin import AdminClient

    from features.compile import compile_schema
    from features.flink.stream import merged_summary
    from features.load import load
    from features.schema import load_schema
    from features.stream.kafka import ensure_topic, produce

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-events", type=int, default=1_000_000)
    ap.add_argument("--stream-events", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--batch", default="none,all",
                    help="batch contenders, comma-separated: none, all, sketches (default none,all)")
    ap.add_argument("--precision", type=int, default=12,
                    help="items_approx_7d's precision in the sketches contender (default 12); "
                         "its windows with more than 2^p/8 distinct items take the register path")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds; the contenders run interleaved within each round (default 1)")
    args = ap.parse_args(argv)
    base = resolve_settings(root=ROOT)
    tag = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix="bench_agg_"))
    dirs = variants(tmp, args.precision)
    url = base.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    settings = dataclasses.replace(base, redis_url=url)
    r = redis.Redis.from_url(url)
    admin = psycopg.connect(base.postgres_dsn, autocommit=True)
    schemas: list[str] = []
    serial = itertools.count()
    can_checkpoint = admin.execute(
        "SELECT rolsuper OR pg_has_role(current_user, 'pg_checkpoint', 'MEMBER') FROM pg_roles "
        "WHERE rolname = current_user").fetchone()[0]
    topics: list[str] = []
    #: label -> events/s per round
    rates: dict[str, list[float]] = {}

    def fresh() -> str:
        """A new, empty Postgres schema for one contender, the earlier contenders' data
        dropped and (where the role may) a CHECKPOINT taken first: every contender starts
        from the same store (kept schemas made round 3 up to 30% slower than rounds 1-2)."""
        while schemas:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schemas.pop()}" CASCADE')
        if can_checkpoint:
            admin.execute("CHECKPOINT")
        name = f"bench_agg_{tag}_{next(serial)}"
        admin.execute(f'CREATE SCHEMA "{name}"')
        schemas.append(name)
        r.flushdb()
        return name

    def report(rnd: int, label: str, secs: float, n: int, extra: str = "") -> None:
        rates.setdefault(label, []).append(n / secs)
        print(f"round {rnd + 1}  {label:58} {secs:9.2f} s {n:10,} events {n / secs:10,.0f}/s  {extra}",
              flush=True)

    def batch_round(rnd: int, path: Path, n: int) -> None:
        t0 = time.perf_counter()
        pq.read_table(path)
        report(rnd, "batch: plain Parquet read (baseline A)", time.perf_counter() - t0, n)
        labels = {"none": "batch: load, no aggregations (baseline B)", "all": "batch: load + 8 aggregations",
                  "sketches": "batch: load + 8 aggregations, 2 of them sketches"}
        order = [(labels[k], k) for k in args.batch.split(",")]
        for label, key in (order if rnd % 2 == 0 else order[::-1]):
            compiled = compile_schema(load_schema(dirs[key] / "clicks.yaml"))
            t0 = time.perf_counter()
            s = load([path], compiled, settings, search_path=fresh())
            secs = time.perf_counter() - t0
            assert s.adds_up, s.as_dict()
            report(rnd, label, secs, n)
            if s.aggregations is not None:
                a = s.aggregations
                stage = "batch: the aggregation stage alone" + (", 2 sketches" if key == "sketches" else "")
                report(rnd, stage, a["seconds"], a["events"],
                       f"accepted {a['accepted']:,}, dup {a['duplicates']:,}")

    def stream_round(rnd: int, records: list[tuple[bytes, bytes]]) -> None:
        order = [("stream: no aggregations (baseline)", "none"), ("stream: 3 windowed aggregations", "three")]
        for label, key in (order if rnd % 2 == 0 else order[::-1]):
            topic = f"bench_agg_{tag}_{key}_{rnd}"
            ensure_topic(base.kafka_bootstrap, topic, partitions=2)
            topics.append(topic)
            produce(base.kafka_bootstrap, topic, [v for _, v in records], keys=[k for k, _ in records])
            pg = fresh()
            sep = "&" if "?" in base.postgres_dsn else "?"
            dsn = f"{base.postgres_dsn}{sep}options=-csearch_path%3D{pg}"
            env = {**os.environ, "FEATURES_POSTGRES_DSN": dsn, "FEATURES_REDIS_URL": url,
                   "FEATURES_KAFKA_BOOTSTRAP": base.kafka_bootstrap}
            run_id = f"bench-{key}-{tag}-{rnd}"
            state = tmp / f"state_{key}_{rnd}"
            cmd = [sys.executable, str(ROOT / "jobs" / "stream_job.py"), "--bounded", "--json",
                   "--schema", "clicks", "--schemas-dir", str(dirs[key]), "--topic", topic,
                   "--dead-letter-topic", "",
                   "--state-dir", str(state), "--run-id", run_id, "--restart-attempts", "0",
                   "--startup", "earliest-offset", "--group-id", run_id]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                print(f"round {rnd + 1} {label}: the job failed", proc.stdout[-2000:], proc.stderr[-4000:],
                      file=sys.stderr, flush=True)
                continue
            sums = state / "clicks" / "summaries"
            summary = merged_summary(sums, run_id)
            parts = [json.loads(p.read_text()) for p in sums.glob(f"{run_id}-*.json")]
            job_s = max(float(p["seconds"]) for p in parts)
            extra = f"{summary['batches']} micro-batches; "
            if (a := summary.get("aggregations")) is not None:
                extra += (f"events {a['events']:,} = accepted {a['accepted']:,} + late {a['late']:,} + "
                         f"dup {a['duplicates']:,} [{'adds up' if a['adds_up'] else 'DOES NOT ADD UP'}]")
            report(rnd, label + " (end to end)", wall, summary["read"])
            report(rnd, label + " (job only)", job_s, summary["read"], extra)

    try:
        path = tmp / "clicks.parquet"
        n = 0
        if args.batch_events:
            history = click_history(args.batch_events, users=args.users)
            pq.write_table(history, path)
            n = history.num_rows
        records = click_records(click_history(args.stream_events, users=max(args.users // 5, 100), seed=3)) \
            if args.stream_events else []
        for rnd in range(args.repeat):
            if args.batch_events:
                batch_round(rnd, path, n)
            if records:
                stream_round(rnd, records)
    finally:
        for s in schemas:
            admin.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')
        admin.close()
        r.flushdb()
        if topics:
            kafka_admin = AdminClient({"bootstrap.servers": base.kafka_bootstrap})  # alive until done
            for f in kafka_admin.delete_topics(topics).values():
                try:
                    f.result(30)
                except Exception as exc:  # cleanup only: report, keep the results
                    print(f"warning: could not delete a bench topic: {exc}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nover {args.repeat} round(s), events/s:")
    for label, xs in rates.items():
        print(f"  {label:58} {_stats(xs)}")
    ratios = [(label_a, label_b, what) for label_a, label_b, what in (
        ("batch: load + 8 aggregations", "batch: load, no aggregations (baseline B)",
         "batch load with 8 aggregations / without"),
        ("stream: 3 windowed aggregations (job only)", "stream: no aggregations (baseline) (job only)",
         "stream job only, 3 aggregations / without (target >= 0.5)"))
        if label_a in rates and label_b in rates and len(rates[label_a]) == len(rates[label_b])]
    for a, b, what in ratios:
        per_round = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        print(f"  {what}: median {statistics.median(per_round):.2f}x  min {min(per_round):.2f}x  "
              f"max {max(per_round):.2f}x")
    for stage in ("batch: the aggregation stage alone", "batch: the aggregation stage alone, 2 sketches"):
        if stage in rates:
            xs = rates[stage]
            print(f"  {stage[7:]} (target >= 150,000 events/s): median {statistics.median(xs):,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
