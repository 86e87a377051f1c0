"""Benchmark: the PyFlink stream job against a plain consumer loop calling the same core.

Usage::

    .venv/bin/python bench/stream.py [--events 200000] [--latency-events 20000] [--rate 1000]

Events are ``features.examples.applicant_events`` (JSON, ~2% invalid, some duplicates
and undecodable payloads; ``schemas/credit_applicant.yaml``), keyed by entity
(``features.stream.kafka.entity_keys``) into fresh 2-partition topics. Both contenders
run ``features.stream.core.StreamProcessor.process`` on micro-batches of up to 2000
records or 0.5 s, and write Redis (database 13, flushed before each run) and Postgres
(a fresh, empty ``bench_stream_*`` schema for each run); everything is dropped at the end.

The **baseline** is one Python process: a confluent-kafka ``Consumer`` loop that
``consume(num_messages=2000, timeout=0.5)``, calls ``process`` and commits the offsets
(synchronously) after each batch; it assigns itself the partitions, as Flink's source does
(no consumer-group rebalance). **Flink** is ``jobs/stream_job.py`` as a subprocess
(a JVM mini-cluster plus Python workers), at parallelism 1 and 2.

1. **Throughput** (``--events`` records produced before anyone starts): the baseline
   until it has read them all; then ``jobs/stream_job.py --bounded`` (stops at the end
   offsets seen at start), at each parallelism. For Flink two rates: *end to end*
   (records / wall time of the subprocess, JVM start included) and *job only*
   (records / the slowest subtask's ``seconds`` in the per-subtask summary files under
   ``<state-dir>/credit_applicant/summaries``: from the Python UDF's ``open`` to its
   ``close``, i.e. without JVM and worker start). The produce -> stored latency of a
   backlog is meaningless and not shown.

2. **Latency** (``--latency-events`` records, each contender on a fresh topic, produced
   *while it runs*). A bounded job cannot do this (it stops at the end offsets seen at
   start), so Flink runs unbounded and its latency comes from its own status lines: each
   subtask logs ``features.stream: stream {json}`` to stderr at most every 10 s, after a
   micro-batch, with the produce -> stored p50/p99 (Kafka timestamp -> batch written to
   both stores) of everything it has read so far. The sequence, the same for both:

   - start the contender; produce 2 warm-up records (one to each partition) and wait
     until they are stored, so the JVM, the Python workers and the connections are up;
   - a separate producer process sends the records at ``--rate`` records/s (Kafka
     CreateTime timestamps, ``linger.ms`` 5), keyed by entity;
   - wait until the contender has caught up (Postgres rows + rejects equal what the
     baseline stored from the same records; the baseline knows from its own counts),
     then, for Flink, 11 s more, so that every subtask's next micro-batch logs a status
     line; the producer then sends the 2 last records ("flush", one to each partition);
   - Flink: the status lines logged after the flush, one per subtask, must add up to
     every record; p50/p99 are the largest over subtasks (as ``merged_summary`` does).
     Then the job's process group gets SIGTERM (SIGKILL if it lingers). The baseline
     reads ``processor.stats.latency_quantile`` directly.

   The 2 warm-up records waited for the JVM start (seconds); they are 2 of
   ``--latency-events`` records, far fewer than 1%, so they move p99 by 2 ranks at most.
   ``--rate`` must stay well under the slowest contender's throughput, or the latency
   measures a growing backlog instead.

It prints one table (seconds, events/s, p50/p99 ms, and each Flink run against the
baseline) and, for every run, whether read == stored + rejected + already present, and
Postgres' row and reject counts next to the run's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import Settings, resolve_settings  # noqa: E402
from features.examples import applicant_events, applicant_schema  # noqa: E402
from features.stream.kafka import ensure_topic, entity_keys, produce  # noqa: E402

JOB = ROOT / "jobs" / "stream_job.py"
SCHEMA = "credit_applicant"
REDIS_DB = 13
PARTITIONS = 2
BATCH = 2000          # the job's default --batch-size; the baseline consumes as many
WAIT_S = 0.5          # the job's default --max-wait-ms, as the baseline's consume timeout
STATUS = re.compile(r"features\.stream: stream (\{.*\})\s*$")


@dataclasses.dataclass
class Run:
    """One contender's numbers."""

    step: str
    seconds: float
    events: int
    counts: dict[str, int]
    p50: float | None = None
    p99: float | None = None
    job_seconds: float | None = None
    rate: float | None = None      # latency runs: the offered rate (records sent / seconds sending)


class Bench:
    """The scratch namespaces (Postgres schema, Redis database, topics, state folders)."""

    def __init__(self, base: Settings) -> None:
        import redis

        self.base = base
        self.tag = uuid.uuid4().hex[:8]
        self.pg_schema = f"bench_stream_{self.tag}"
        sep = "&" if "?" in base.postgres_dsn else "?"
        self.dsn = f"{base.postgres_dsn}{sep}options=-csearch_path%3D{self.pg_schema}"
        self.redis_url = base.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
        self.redis = redis.Redis.from_url(self.redis_url)
        self.settings = dataclasses.replace(base, postgres_dsn=self.dsn, redis_url=self.redis_url)
        self.topics: list[str] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="bench_stream_"))
        self.env = {**os.environ, "FEATURES_POSTGRES_DSN": self.dsn, "FEATURES_REDIS_URL": self.redis_url,
                    "FEATURES_KAFKA_BOOTSTRAP": base.kafka_bootstrap}

    def topic(self, name: str) -> str:
        topic = f"bench_stream_{self.tag}_{name}"
        ensure_topic(self.base.kafka_bootstrap, topic, partitions=PARTITIONS)
        ensure_topic(self.base.kafka_bootstrap, topic + ".rejects", partitions=1)
        self.topics += [topic, topic + ".rejects"]
        return topic

    def fresh_stores(self) -> None:
        """An empty Postgres schema and a flushed Redis database for the next run."""
        self._pg(f'DROP SCHEMA IF EXISTS "{self.pg_schema}" CASCADE', f'CREATE SCHEMA "{self.pg_schema}"')
        self.redis.flushdb()

    def store_counts(self) -> tuple[int, int]:
        """(rows in the cold table, rows in the rejects table); 0 before they exist."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            out = []
            for table in (SCHEMA, f"{SCHEMA}__rejects"):
                exists = conn.execute("SELECT to_regclass(%s)", (f'"{table}"',)).fetchone()[0]
                out.append(conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] if exists else 0)
        return out[0], out[1]

    def cleanup(self) -> None:
        from confluent_kafka.admin import AdminClient

        self._pg(f'DROP SCHEMA IF EXISTS "{self.pg_schema}" CASCADE')
        self.redis.flushdb()
        self.redis.close()
        if self.topics:
            admin = AdminClient({"bootstrap.servers": self.base.kafka_bootstrap})
            for f in admin.delete_topics(self.topics).values():
                f.result(30)  # the request must reach the broker before this process ends
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _pg(self, *statements: str) -> None:
        import psycopg

        with psycopg.connect(self.base.postgres_dsn, autocommit=True) as conn:
            for s in statements:
                conn.execute(s)

    def job_cmd(self, topic: str, parallelism: int, run_id: str, *, bounded: bool) -> list[str]:
        return [sys.executable, str(JOB), *(["--bounded"] if bounded else []), "--json", "--schema", SCHEMA,
                "--topic", topic, "--parallelism", str(parallelism), "--group-id", f"bench-{run_id}",
                "--state-dir", str(self.tmp / run_id), "--restart-attempts", "0", "--run-id", run_id]


# --------------------------------------------------------------------------- the baseline


class Baseline:
    """The plain consumer loop: consume a batch, StreamProcessor.process, commit."""

    def __init__(self, bench: Bench, topic: str, compiled: Any) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from features.stream.core import StreamProcessor

        self.proc = StreamProcessor(compiled, bench.settings, run_id=f"bench-base-{uuid.uuid4().hex[:8]}",
                                    dead_letter_topic=topic + ".rejects")
        self.proc.open()
        self.consumer = Consumer({"bootstrap.servers": bench.base.kafka_bootstrap,
                                  "group.id": f"bench-base-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        # assign, as Flink's source does: no group rebalance (seconds) before the first batch
        parts = self.consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(parts)])

    @property
    def read(self) -> int:
        return int(self.proc.stats.summary.read)

    def until(self, read: int, timeout_s: float) -> None:
        """Consume and process batches until ``read`` records have been processed."""
        from confluent_kafka import KafkaError, KafkaException

        deadline = time.time() + timeout_s
        while self.read < read:
            if time.time() > deadline:
                raise SystemExit(f"baseline: read {self.read:,} of {read:,} records in {timeout_s:.0f} s")
            msgs = self.consumer.consume(num_messages=BATCH, timeout=WAIT_S)
            good = []
            for m in msgs:
                err = m.error()
                if err is None:
                    good.append(m)
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
            if not good:
                continue
            self.proc.process([m.value() for m in good], pa.array([m.topic() for m in good], pa.string()),
                              pa.array([m.partition() for m in good], pa.int32()),
                              pa.array([m.offset() for m in good], pa.int64()),
                              np.array([m.timestamp()[1] for m in good], dtype=np.int64))
            self.consumer.commit(asynchronous=False)

    def close(self) -> dict[str, int]:
        self.consumer.close()
        self.proc.close()
        s = self.proc.stats.summary
        return {k: int(getattr(s, k)) for k in ("read", "stored", "rejected", "already_present")}


def baseline_throughput(bench: Bench, topic: str, n: int, compiled: Any) -> Run:
    bench.fresh_stores()
    t0 = time.perf_counter()
    base = Baseline(bench, topic, compiled)
    base.until(n, timeout_s=600 + n / 100)
    counts = base.close()
    return Run("baseline consumer loop", time.perf_counter() - t0, n, counts)


# --------------------------------------------------------------------------- Flink, bounded


def flink_throughput(bench: Bench, topic: str, n: int, parallelism: int) -> tuple[Run, Run]:
    bench.fresh_stores()
    run_id = f"tp{parallelism}-{uuid.uuid4().hex[:8]}"
    log = bench.tmp / f"{run_id}.log"
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.run(bench.job_cmd(topic, parallelism, run_id, bounded=True), env=bench.env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True, timeout=600 + n / 50)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"flink p={parallelism}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n"
                         f"{log.read_text()[-4000:]}")
    summary = json.loads(proc.stdout)
    parts = [json.loads(p.read_text()) for p in
             sorted((bench.tmp / run_id / SCHEMA / "summaries").glob(f"{run_id}-*.json"))]
    job_s = max(float(p["seconds"]) for p in parts)
    counts = {k: int(summary[k]) for k in ("read", "stored", "rejected", "already_present")}
    end_to_end = Run(f"flink p={parallelism}, end to end", wall, n, counts)
    job_only = Run(f"flink p={parallelism}, job only", job_s, n, counts, job_seconds=job_s)
    return end_to_end, job_only


# --------------------------------------------------------------------------- latency


def _steady_producer(bootstrap: str, topic: str, values: list[bytes | None], keys: list[bytes | None],
                     rate: float, flush: list[bytes | None], go_flush: Any, report: Any) -> None:
    """(A child process.) Send ``values`` keyed at ``rate`` records/s, then wait for
    ``go_flush`` and send ``flush`` one to each partition; report the sending seconds."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    t0 = time.perf_counter()
    sent = 0
    while sent < len(values):
        due = min(len(values), int((time.perf_counter() - t0) * rate) + 1)
        while sent < due:
            try:
                producer.produce(topic, value=values[sent], key=keys[sent])
                sent += 1
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(60)
    report.put(time.perf_counter() - t0)
    go_flush.wait(900)
    for p, value in enumerate(flush):
        producer.produce(topic, value=value, partition=p % PARTITIONS)
    left = producer.flush(60)
    report.put(left)


class Live:
    """The latency run's records and producer process, identical for every contender."""

    def __init__(self, bench: Bench, values: list[bytes | None], rate: float) -> None:
        self.bench = bench
        self.values = values
        self.rate = rate
        self.keys = entity_keys(values, "application_id")
        self.warm = values[:PARTITIONS]
        self.flush = values[-PARTITIONS:]
        self.steady = slice(PARTITIONS, len(values) - PARTITIONS)
        self.sent = len(values) - 2 * PARTITIONS
        self.ctx = mp.get_context("spawn")  # a clean process: this one has librdkafka threads

    def warm_up(self, topic: str) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bench.base.kafka_bootstrap, "linger.ms": 0})
        for p, value in enumerate(self.warm):
            producer.produce(topic, value=value, partition=p)
        if producer.flush(30):
            raise SystemExit("warm-up records not acknowledged")

    def start(self, topic: str) -> None:
        self.go_flush = self.ctx.Event()
        self.report = self.ctx.Queue()
        self.child = self.ctx.Process(target=_steady_producer, daemon=True, args=(
            self.bench.base.kafka_bootstrap, topic, self.values[self.steady], self.keys[self.steady],
            self.rate, self.flush, self.go_flush, self.report))
        self.child.start()

    def produced_s(self) -> float:
        return float(self.report.get(timeout=900))

    def send_flush(self) -> None:
        self.go_flush.set()
        left = self.report.get(timeout=120)
        self.child.join(30)
        if left:
            raise SystemExit(f"{left} flush records not acknowledged")


def baseline_latency(bench: Bench, live: Live, compiled: Any) -> tuple[Run, tuple[int, int]]:
    """The consumer loop on records produced while it runs; also the (rows, rejects)
    Postgres holds before the flush records, which the Flink runs wait for."""
    bench.fresh_stores()
    topic = bench.topic("lat_base")
    base = Baseline(bench, topic, compiled)
    live.warm_up(topic)
    base.until(len(live.warm), timeout_s=120)
    live.start(topic)
    base.until(len(live.values) - len(live.flush), timeout_s=900)
    seconds = live.produced_s()
    before_flush = bench.store_counts()
    live.send_flush()
    base.until(len(live.values), timeout_s=120)
    p50, p99 = base.proc.stats.latency_quantile(0.5), base.proc.stats.latency_quantile(0.99)
    counts = base.close()
    run = Run("baseline consumer loop", seconds, len(live.values), counts, p50, p99,
              rate=live.sent / seconds)
    return run, before_flush


def flink_latency(bench: Bench, live: Live, parallelism: int, before_flush: tuple[int, int]) -> Run:
    bench.fresh_stores()
    topic = bench.topic(f"lat_p{parallelism}")
    run_id = f"lat{parallelism}-{uuid.uuid4().hex[:8]}"
    log = bench.tmp / f"{run_id}.log"
    out = log.open("w")
    job = subprocess.Popen(bench.job_cmd(topic, parallelism, run_id, bounded=False), env=bench.env, cwd=ROOT,
                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(what: str, done: Any, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while not done():
            if job.poll() is not None:
                raise SystemExit(f"flink p={parallelism} exited ({job.returncode}) while waiting for "
                                 f"{what}:\n" + log.read_text()[-4000:])
            if time.time() > deadline:
                raise SystemExit(f"flink p={parallelism}: no {what} after {timeout_s:.0f} s (stores "
                                 f"{bench.store_counts()}):\n" + log.read_text()[-4000:])
            time.sleep(0.5)

    try:
        live.warm_up(topic)
        wait_for("warm-up records stored", lambda: sum(bench.store_counts()) >= len(live.warm), 600)
        live.start(topic)
        seconds = live.produced_s()
        wait_for("catch-up", lambda: bench.store_counts() == before_flush, 300)
        time.sleep(11)  # > the 10 s between status lines: each subtask's next batch logs one
        mark = log.stat().st_size
        live.send_flush()

        def lines() -> list[dict[str, Any]]:
            with log.open() as f:
                f.seek(mark)
                return [json.loads(m.group(1)) for m in map(STATUS.search, f.read().splitlines()) if m]

        wait_for("status lines covering every record",
                 lambda: sum(int(s["read"]) for s in lines()) >= len(live.values), 120)
        status = lines()
    finally:
        try:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
        except ProcessLookupError:
            pass
        out.close()
    counts = {k: sum(int(s[k]) for s in status) for k in ("read", "stored", "rejected", "already_present")}
    p50 = max(float(s["latency_ms"]["p50"]) for s in status)
    p99 = max(float(s["latency_ms"]["p99"]) for s in status)
    return Run(f"flink p={parallelism}", seconds, len(live.values), counts, p50, p99,
               rate=live.sent / seconds)


# --------------------------------------------------------------------------- report


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _counts_line(run: Run, stores: tuple[int, int], redis_keys: int) -> str:
    c = run.counts
    adds = c["read"] == c["stored"] + c["rejected"] + c["already_present"] == run.events
    pg_ok = stores == (c["stored"], c["rejected"])
    return (f"  {run.step:<30} read {c['read']:,} = stored {c['stored']:,} + rejected {c['rejected']:,} + "
            f"already present {c['already_present']:,} [{'adds up' if adds else 'DOES NOT ADD UP'}]; "
            f"Postgres rows {stores[0]:,}, rejects {stores[1]:,} [{'match' if pg_ok else 'MISMATCH'}]; "
            f"Redis hashes {redis_keys:,}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="events for the throughput runs")
    ap.add_argument("--latency-events", type=int, default=20_000, help="events for each latency run")
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s produced during the latency runs")
    ap.add_argument("--parallelism", type=int, nargs="+", default=[1, 2], help="Flink parallelisms")
    args = ap.parse_args(argv)

    bench = Bench(resolve_settings(root=ROOT))
    compiled = applicant_schema()
    checks: list[str] = []
    ok = True

    def check(run: Run) -> None:
        nonlocal ok
        stores = bench.store_counts()
        line = _counts_line(run, stores, int(bench.redis.dbsize()))
        ok = ok and "DOES NOT" not in line and "MISMATCH" not in line
        checks.append(line)

    try:
        values = applicant_events(args.events, seed=42)
        n = len(values)
        topic = bench.topic("tp")
        t0 = time.perf_counter()
        produce(bench.base.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
        print(f"{n:,} JSON events ({args.events:,} applications + duplicates and undecodable payloads) "
              f"produced to {PARTITIONS} partitions in {time.perf_counter() - t0:.1f} s")
        del values

        throughput: list[Run] = []
        base_tp = baseline_throughput(bench, topic, n, compiled)
        check(base_tp)
        throughput.append(base_tp)
        for p in args.parallelism:
            e2e, job_only = flink_throughput(bench, topic, n, p)
            check(e2e)
            throughput += [e2e, job_only]

        live = Live(bench, applicant_events(args.latency_events, seed=43), args.rate)
        latency: list[Run] = []
        base_lat, before_flush = baseline_latency(bench, live, compiled)
        check(base_lat)
        latency.append(base_lat)
        for p in args.parallelism:
            run = flink_latency(bench, live, p, before_flush)
            check(run)
            latency.append(run)
    finally:
        bench.cleanup()

    head = f"{'step':<32}{'seconds':>9}{'events/s':>11}{'p50 ms':>9}{'p99 ms':>9}   vs baseline"
    print(head)
    print(f"throughput: {n:,} events already in the topic")
    for run in throughput:
        rate = run.events / run.seconds
        vs = "" if run is base_tp else f"{rate / (base_tp.events / base_tp.seconds):.2f}x events/s"
        print(f"  {run.step:<30}{run.seconds:>9.2f}{rate:>11,.0f}{'-':>9}{'-':>9}   {vs}")
    lat_n = len(live.values)
    print(f"latency: {lat_n:,} events produced at {args.rate:,.0f}/s while it runs (produce -> stored)")
    for run in latency:
        vs = ""
        if run is not base_lat and run.p50 is not None and run.p99 is not None:
            vs = (f"{run.p50 / max(base_lat.p50 or 1.0, 1.0):.2f}x p50, "
                  f"{run.p99 / max(base_lat.p99 or 1.0, 1.0):.2f}x p99")
        print(f"  {run.step:<30}{run.seconds:>9.2f}{run.rate or 0:>11,.0f}{_ms(run.p50):>9}"
              f"{_ms(run.p99):>9}   {vs}")
    print("(latency 'seconds': producing the records; 'events/s': the offered rate; job only: records / "
          "slowest subtask's open..close)")
    print("counts (each run into an empty Postgres schema and a flushed Redis database):")
    for line in checks:
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
