"""Benchmark: the PyFlink stream job against a plain consumer loop and the batch loader.

Usage::

    .venv/bin/python bench/stream.py [--events 200000] [--latency-events 20000] [--rate 1000]
                                     [--parallelism 1 2] [--repeat 1]

Events are ``features.ops.examples.applicant_events`` (JSON, ~2% invalid, some duplicates
and undecodable payloads; ``schemas/credit_applicant.yaml``), keyed by entity
(``features.stream.kafka.entity_keys``) into fresh 2-partition topics. The stream
contenders run ``features.stream.core.StreamProcessor.process`` on micro-batches of up
to ``--batch-size`` records or ``--max-wait-ms`` (default: the job's defaults). Every
run writes Redis (database 13, flushed before each run)
and Postgres (a fresh, empty ``bench_stream_*`` schema for each run); everything is
dropped at the end.

The **baseline** is one Python process: a confluent-kafka ``Consumer`` loop that
``consume(num_messages=<batch size>, timeout=<max wait>)``, calls ``process`` and commits the offsets
(synchronously) after each batch; it assigns itself the partitions, as Flink's source does
(no consumer-group rebalance). **Flink** is ``jobs/stream_job.py`` as a subprocess
(a JVM mini-cluster plus Python workers), at each ``--parallelism`` (default 1 and 2).
The **batch loader** is ``features load --schema credit_applicant --json FILE`` as a
subprocess, on the same records as one Parquet file (written once, in the scratch
folder): the records ``features.sources.records.decode`` turns into rows (JSON objects;
the undecodable payloads are left out, so it reads fewer records than the others), the
values as they are in the JSON (decimals stay decimal text, which the schema's
``accept_strings`` takes), except the ISO 8601 timestamps and dates, which Arrow parses
into ``timestamp(us, UTC)`` and ``date32`` since the loader takes no text for those.

1. **Throughput** (``--events`` records produced once, before anyone starts), in
   ``--repeat`` interleaved rounds; each round runs, in this order, on the same topic
   data: the baseline until it has read them all; the batch loader on the Parquet file;
   ``jobs/stream_job.py --bounded`` (stops at the end offsets seen at start) at each
   parallelism. Rates:

   - baseline: records / wall time from creating the consumer and opening the stores
     until the last batch is written and the consumer closed;
   - batch loader: rows / the loader's own ``seconds`` (its JSON summary: from the first
     batch read to the last written; without interpreter start, schema compile and store
     connections); the subprocess wall time is shown next to it;
   - Flink *end to end*: records / wall time of the subprocess, JVM start included;
     Flink *job only*: records / the slowest subtask's ``seconds`` in the per-subtask
     summary files under ``<state-dir>/credit_applicant/summaries`` (from the Python
     UDF's ``open`` to its ``close``, i.e. without JVM and worker start).

   Each run prints one line as soon as it is measured (contender, round, seconds,
   events/s, and the counts check below), then the CPU seconds it took per process: this
   process (the baseline), subprocesses (the loader; Flink's client, JVM and Python
   workers, JVM start included), and the Postgres, Redis and Kafka servers. The summary
   gives per contender the median, min and max events/s over the rounds, and two
   ratios, per round and their median: *flink p=N job only / baseline* (> 1: the Flink
   job processes faster than the plain loop) and *baseline / batch loader* (< 1: the
   stream core is slower than the loader). The produce -> stored latency of a backlog is
   meaningless and not shown.

2. **Latency** (``--latency-events`` records, each contender on a fresh topic, produced
   *while it runs*), once, after the throughput rounds. A bounded job cannot do this (it
   stops at the end offsets seen at start), so Flink runs unbounded and its latency comes
   from the per-subtask summary files, which each subtask rewrites after every
   micro-batch with its counts and the produce -> stored p50/p99 (Kafka timestamp ->
   batch written to both stores) of everything it has read so far. The sequence, the
   same for both:

   - start the contender; produce 2 warm-up records (one to each partition) and wait
     until they are stored, so the JVM, the Python workers and the connections are up;
   - a separate producer process sends the records at ``--rate`` records/s (Kafka
     CreateTime timestamps, ``linger.ms`` 5), keyed by entity;
   - wait until the contender has caught up (Postgres rows + rejects equal what the
     baseline stored from the same records; the baseline knows from its own counts);
     the producer then sends the 2 last records ("flush", one to each partition);
   - Flink: wait until the subtasks' summary files add up to every record; p50/p99 are
     the largest over subtasks (as ``merged_summary`` does). Then the job's process group
     gets SIGTERM (SIGKILL if it lingers). The baseline reads
     ``processor.stats.latency_quantile`` directly.

   (The job's status lines on stderr are not used: a subtask logs one only after a
   micro-batch and at most every ``--log-every-s``, and their text form,
   ``features.stream [<run id>]: stream {...}``, changed when the run id was added.)
   The 2 warm-up records waited for the JVM start (seconds); they are 2 of
   ``--latency-events`` records, far fewer than 1%, so they move p99 by 2 ranks at most.
   ``--rate`` must stay well under the slowest contender's throughput, or the latency
   measures a growing backlog instead.

A failed run (an exception, a timeout, a job that exits non-zero) is printed with its
step and the bench goes on with the next one; results already printed stay. At the end
it prints the summary tables and, for every run, whether read == stored + rejected +
already present, and Postgres' row and reject counts next to the run's own. Exit 1 when
anything failed or a count did not add up.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import Settings, resolve_settings  # noqa: E402
from features.ops.examples import applicant_events, applicant_schema  # noqa: E402
from features.stream.kafka import ensure_topic, entity_keys, produce  # noqa: E402

JOB = ROOT / "jobs" / "stream_job.py"
SCHEMA = "credit_applicant"
REDIS_DB = 13
PARTITIONS = 2
from features.flink.stream import StreamConfig  # noqa: E402

#: the job's default --batch-size and --max-wait-ms (set with the bench's options of the same
#: names, which both the Flink job and the baseline's consume call then use)
BATCH = StreamConfig.batch_size
WAIT_S = StreamConfig.max_wait_ms / 1000
BASELINE = "baseline consumer loop"
LOADER = "batch loader (Parquet)"
T = TypeVar("T")


def _features_cli() -> str:
    """The ``features`` console script next to this interpreter (the venv's)."""
    here = Path(sys.executable).with_name("features")
    return str(here if here.exists() else ROOT / ".venv" / "bin" / "features")


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
    wall: float | None = None      # batch loader: the subprocess's wall time

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")


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
                exists: Any = conn.execute("SELECT to_regclass(%s)", (f'"{table}"',)).fetchone()
                count: Any = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone() if exists[0] else (0,)
                out.append(int(count[0]))
        return out[0], out[1]

    def redis_keys(self) -> int:
        keys: Any = self.redis.dbsize()
        return int(keys)

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
                "--state-dir", str(self.tmp / run_id), "--restart-attempts", "0", "--run-id", run_id,
                "--batch-size", str(BATCH), "--max-wait-ms", str(round(WAIT_S * 1000))]

    def subtask_summaries(self, run_id: str) -> list[dict[str, Any]]:
        """Each subtask's cumulative counts and latency, as its Python UDF last saved them
        (after every micro-batch, replaced atomically; one file per subtask)."""
        out = []
        for path in sorted((self.tmp / run_id / SCHEMA / "summaries").glob(f"{run_id}-*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                pass  # being replaced: read again on the next poll
        return out


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
        self.closed = False
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
                raise TimeoutError(f"baseline: read {self.read:,} of {read:,} records in {timeout_s:.0f} s")
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
        if not self.closed:
            self.closed = True
            try:
                self.consumer.close()
            finally:
                self.proc.close()
        s = self.proc.stats.summary
        return {k: int(getattr(s, k)) for k in ("read", "stored", "rejected", "already_present")}


def cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of the local servers (Postgres, Redis, Kafka: long-lived, read from
    ``/proc``; Postgres' ended backends through the postmaster's reaped-children time), of
    this process (the baseline runs in it) and of its waited-for children
    (a subprocess contender with everything it started and reaped: the loader, the Flink
    client, JVM and Python workers)."""
    import resource

    tick = os.sysconf("SC_CLK_TCK")
    out = {"postgres": 0.0, "redis": 0.0, "kafka": 0.0}
    postgres: dict[str, tuple[str, float, float]] = {}  # pid -> (parent, own, reaped children)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if comm.startswith("postgres"):
            postgres[pid] = (fields[1], seconds, (int(fields[13]) + int(fields[14])) / tick)
        elif comm.startswith("redis"):
            out["redis"] += seconds
        elif comm == "java" and (b"kafka.Kafka" in cmd or b"kafka-libs" in cmd):
            out["kafka"] += seconds
    for parent, seconds, reaped in postgres.values():
        # a backend's CPU outlives it in its postmaster's reaped-children time
        out["postgres"] += seconds + (reaped if parent not in postgres else 0.0)
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["this process"] = own.ru_utime + own.ru_stime
    out["subprocesses"] = kids.ru_utime + kids.ru_stime
    return out


def cpu_text(before: dict[str, float], after: dict[str, float], events: int) -> str:
    """CPU seconds per process between two :func:`cpu_seconds`, and µs per event."""
    parts = []
    for name in ("this process", "subprocesses", "postgres", "redis", "kafka"):
        used = after[name] - before[name]
        if used >= 0.05:
            parts.append(f"{name} {used:.1f} s ({used / max(events, 1) * 1e6:.1f} us/event)")
    return "cpu: " + ", ".join(parts)


def baseline_throughput(bench: Bench, topic: str, n: int, compiled: Any) -> Run:
    bench.fresh_stores()
    t0 = time.perf_counter()
    base = Baseline(bench, topic, compiled)
    try:
        base.until(n, timeout_s=600 + n / 100)
    finally:
        counts = base.close()
    return Run(BASELINE, time.perf_counter() - t0, n, counts)


def summary_json(stdout: str, what: str) -> dict[str, Any]:
    """The JSON summary a ``--json`` subprocess printed on stdout. Anything else there
    (before or after it) is shown, not fatal: a line the JVM or a Python worker wrote to
    the inherited stdout once broke a plain ``json.loads`` with "Extra data"."""
    start = stdout.find("{")
    try:
        obj, end = json.JSONDecoder().raw_decode(stdout, max(start, 0))
    except ValueError as exc:
        raise RuntimeError(f"{what}: no JSON summary on stdout ({exc}):\n{stdout[-2000:]}") from None
    if not isinstance(obj, dict):
        raise RuntimeError(f"{what}: stdout holds no JSON object:\n{stdout[-2000:]}")
    other = (stdout[:max(start, 0)] + stdout[end:]).strip()
    if other:
        print(f"note: {what} printed more than its summary on stdout: {other[:500]!r}", flush=True)
    return obj


# --------------------------------------------------------------------------- the batch loader


def write_parquet(bench: Bench, values: list[bytes | None], compiled: Any) -> tuple[Path, int]:
    """The records that decode into JSON objects, as one Parquet file; returns (path, rows).

    Values stay as the JSON has them (text, integers, nulls; decimal text is what
    ``accept_strings`` is for), except ISO 8601 timestamps and dates: the loader takes no
    text for those, so Arrow parses them into the declared type, as a Parquet writer would."""
    import pyarrow.parquet as pq

    from features.sources.records import decode

    schema = compiled.schema
    known = frozenset(f.name for f in schema.fields)
    decoded = decode(values, max_bytes=schema.payload.max_bytes, known=known)
    batch = decoded.batch  # a column per key some object holds; mixed JSON types as JSON text
    columns: dict[str, pa.Array] = {}
    for field in compiled.arrow_schema:
        if field.name in batch.schema.names:
            col = batch.column(field.name)
        else:
            col = pa.nulls(batch.num_rows)
        temporal = pa.types.is_timestamp(field.type) or pa.types.is_date(field.type)
        if temporal and pa.types.is_string(col.type):
            col = col.cast(field.type)
        columns[field.name] = col
    table = pa.table(columns)
    path = bench.tmp / "applicant_events.parquet"
    pq.write_table(table, path)
    return path, table.num_rows


def loader_throughput(bench: Bench, path: Path, rows: int) -> Run:
    """``features load --json`` on the Parquet file, into fresh stores."""
    bench.fresh_stores()
    log = bench.tmp / f"load-{uuid.uuid4().hex[:8]}.log"
    cmd = [_features_cli(), "load", "--schema", SCHEMA, "--json", "--no-progress", str(path)]
    t0 = time.perf_counter()
    with log.open("w") as err:
        proc = subprocess.run(cmd, env=bench.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                              timeout=600 + rows / 100)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1: counts do not add up (the counts check says so)
        raise RuntimeError(f"features load: exit {proc.returncode}\n{proc.stdout[-2000:]}\n"
                           f"{log.read_text()[-4000:]}")
    summary = summary_json(proc.stdout, "features load")
    counts = {k: int(summary[k]) for k in ("read", "stored", "rejected", "already_present")}
    return Run(LOADER, float(summary["seconds"]), rows, counts, wall=wall)


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
        raise RuntimeError(f"flink p={parallelism}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n"
                           f"{log.read_text()[-4000:]}")
    summary = summary_json(proc.stdout, f"flink p={parallelism}")
    parts = bench.subtask_summaries(run_id)
    if not parts:
        raise RuntimeError(f"flink p={parallelism}: no per-subtask summary files")
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
        self.child: Any = None

    def warm_up(self, topic: str) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bench.base.kafka_bootstrap, "linger.ms": 0})
        for p, value in enumerate(self.warm):
            producer.produce(topic, value=value, partition=p)
        if producer.flush(30):
            raise RuntimeError("warm-up records not acknowledged")

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
            raise RuntimeError(f"{left} flush records not acknowledged")

    def stop(self) -> None:
        """End the producer process if a failed run left it running."""
        if self.child is not None and self.child.is_alive():
            self.child.terminate()
            self.child.join(10)
        self.child = None


def baseline_latency(bench: Bench, live: Live, compiled: Any) -> tuple[Run, tuple[int, int]]:
    """The consumer loop on records produced while it runs; also the (rows, rejects)
    Postgres holds before the flush records, which the Flink runs wait for."""
    bench.fresh_stores()
    topic = bench.topic("lat_base")
    base = Baseline(bench, topic, compiled)
    try:
        live.warm_up(topic)
        base.until(len(live.warm), timeout_s=120)
        live.start(topic)
        base.until(len(live.values) - len(live.flush), timeout_s=900)
        seconds = live.produced_s()
        before_flush = bench.store_counts()
        live.send_flush()
        base.until(len(live.values), timeout_s=120)
        p50, p99 = base.proc.stats.latency_quantile(0.5), base.proc.stats.latency_quantile(0.99)
    finally:
        live.stop()
        counts = base.close()
    run = Run(BASELINE, seconds, len(live.values), counts, p50, p99, rate=live.sent / seconds)
    return run, before_flush


def flink_latency(bench: Bench, live: Live, parallelism: int, before_flush: tuple[int, int]) -> Run:
    bench.fresh_stores()
    topic = bench.topic(f"lat_p{parallelism}")
    run_id = f"lat{parallelism}-{uuid.uuid4().hex[:8]}"
    log = bench.tmp / f"{run_id}.log"
    out = log.open("w")
    job = subprocess.Popen(bench.job_cmd(topic, parallelism, run_id, bounded=False), env=bench.env, cwd=ROOT,
                           stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(what: str, done: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while not done():
            if job.poll() is not None:
                raise RuntimeError(f"flink p={parallelism} exited ({job.returncode}) while waiting for "
                                   f"{what}:\n" + log.read_text()[-4000:])
            if time.time() > deadline:
                raise TimeoutError(f"flink p={parallelism}: no {what} after {timeout_s:.0f} s (stores "
                                   f"{bench.store_counts()}, subtask summaries "
                                   f"{[s.get('read') for s in bench.subtask_summaries(run_id)]}):\n"
                                   + log.read_text()[-4000:])
            time.sleep(0.5)

    try:
        live.warm_up(topic)
        wait_for("warm-up records stored", lambda: sum(bench.store_counts()) >= len(live.warm), 600)
        live.start(topic)
        seconds = live.produced_s()
        wait_for("catch-up", lambda: bench.store_counts() == before_flush, 300)
        live.send_flush()
        # each subtask rewrites its summary file after every micro-batch (cumulative counts
        # and latency histogram): no wait for a status line, no double counting
        wait_for("subtask summaries covering every record",
                 lambda: sum(int(s["read"]) for s in bench.subtask_summaries(run_id)) >= len(live.values),
                 120)
        status = bench.subtask_summaries(run_id)
    finally:
        live.stop()
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
    quantiles = [s["latency_ms"] for s in status]
    p50 = max((float(q["p50"]) for q in quantiles if q["p50"] is not None), default=None)
    p99 = max((float(q["p99"]) for q in quantiles if q["p99"] is not None), default=None)
    return Run(f"flink p={parallelism}", seconds, len(live.values), counts, p50, p99,
               rate=live.sent / seconds)


# --------------------------------------------------------------------------- report


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _counts_text(run: Run, stores: tuple[int, int], redis_keys: int) -> tuple[str, bool]:
    """The counts check of one run, and whether it passed."""
    c = run.counts
    adds = c["read"] == c["stored"] + c["rejected"] + c["already_present"] == run.events
    pg_ok = stores == (c["stored"], c["rejected"])
    return (f"read {c['read']:,} = stored {c['stored']:,} + rejected {c['rejected']:,} + "
            f"already present {c['already_present']:,} [{'adds up' if adds else 'DOES NOT ADD UP'}]; "
            f"Postgres rows {stores[0]:,}, rejects {stores[1]:,} [{'match' if pg_ok else 'MISMATCH'}]; "
            f"Redis keys {redis_keys:,}"), adds and pg_ok


def _ratio_line(label: str, per_round: dict[int, float]) -> str:
    if not per_round:
        return f"  {label:<34} - (no round with both runs)"
    rounds = ", ".join(f"r{r} {v:.2f}x" for r, v in sorted(per_round.items()))
    return f"  {label:<34} median {statistics.median(per_round.values()):.2f}x   ({rounds})"


def main(argv: list[str] | None = None) -> int:
    global BATCH, WAIT_S
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000, help="events for the throughput runs")
    ap.add_argument("--latency-events", type=int, default=20_000, help="events for each latency run")
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s produced during the latency runs")
    ap.add_argument("--parallelism", type=int, nargs="+", default=[1, 2], help="Flink parallelisms")
    ap.add_argument("--repeat", type=int, default=1,
                    help="interleaved throughput rounds (each runs every contender once; default 1)")
    ap.add_argument("--batch-size", type=int, default=BATCH,
                    help=f"records per micro-batch, both stream contenders (default: the job's, {BATCH})")
    ap.add_argument("--max-wait-ms", type=int, default=round(WAIT_S * 1000),
                    help=f"longest wait for a micro-batch (default: the job's, {round(WAIT_S * 1000)})")
    args = ap.parse_args(argv)
    BATCH, WAIT_S = args.batch_size, args.max_wait_ms / 1000
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    bench = Bench(resolve_settings(root=ROOT))
    compiled = applicant_schema()
    checks: list[str] = []
    failures: list[str] = []
    ok = True
    rounds = args.repeat
    #: contender -> round -> run (insertion order: the order of the first round)
    throughput: dict[str, dict[int, Run]] = {}
    latency: list[Run] = []
    n = rows = lat_n = 0

    def attempt(step: str, fn: Callable[..., T], *fn_args: Any) -> T | None:
        """``fn(*fn_args)``; on failure print the failure with its step name and go on."""
        try:
            return fn(*fn_args)
        except (Exception, SystemExit) as exc:  # a failed step must not lose the results before it
            failures.append(step)
            detail = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
            print(f"FAILED {step}: {detail}", flush=True)
            if not isinstance(exc, RuntimeError | TimeoutError | SystemExit):
                traceback.print_exc(limit=-4, file=sys.stdout)
                sys.stdout.flush()
            return None

    def check(label: str, runs: list[Run], prefix: str) -> None:
        """Print one line per run as soon as it is measured, with the counts check."""
        nonlocal ok
        try:
            text, good = _counts_text(runs[0], bench.store_counts(), bench.redis_keys())
        except Exception as exc:
            text, good = f"counts not checked: {exc}", False
        ok = ok and good
        checks.append(f"  {label:<12}{runs[0].step:<30} {text}")
        for run in runs:
            rate, extra = run.events_per_s, ""
            if run.wall is not None:
                extra = f" (loader's own seconds; subprocess wall {run.wall:.2f} s)"
            if run.rate is not None:  # a latency run: seconds producing, the offered rate
                rate, extra = run.rate, f" offered, p50 {_ms(run.p50)} ms, p99 {_ms(run.p99)} ms"
            print(f"{prefix} {run.step:<28}{run.seconds:>9.2f} s{rate:>11,.0f} events/s{extra} | {text}",
                  flush=True)

    try:
        values = applicant_events(args.events, seed=42)
        n = len(values)
        topic = bench.topic("tp")
        t0 = time.perf_counter()
        produce(bench.base.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
        print(f"{n:,} JSON events ({args.events:,} applications + duplicates and undecodable payloads) "
              f"produced to {PARTITIONS} partitions in {time.perf_counter() - t0:.1f} s", flush=True)
        parquet = attempt("write the Parquet file", write_parquet, bench, values, compiled)
        if parquet is not None:
            rows = parquet[1]
            print(f"{rows:,} decodable records (JSON objects) written to {parquet[0].name} for the batch "
                  "loader", flush=True)
        del values

        for r in range(1, rounds + 1):
            prefix = f"round {r}/{rounds}"
            print(f"{prefix}: throughput, {n:,} events", flush=True)
            cpu0 = cpu_seconds()
            got = attempt(f"{prefix} {BASELINE}", baseline_throughput, bench, topic, n, compiled)
            if got is not None:
                throughput.setdefault(got.step, {})[r] = got
                check(f"round {r}", [got], prefix)
                print(f"{prefix} {BASELINE:<28}{cpu_text(cpu0, cpu_seconds(), n)}", flush=True)
            if parquet is not None:
                cpu0 = cpu_seconds()
                got = attempt(f"{prefix} {LOADER}", loader_throughput, bench, parquet[0], rows)
                if got is not None:
                    throughput.setdefault(got.step, {})[r] = got
                    check(f"round {r}", [got], prefix)
                    print(f"{prefix} {LOADER:<28}{cpu_text(cpu0, cpu_seconds(), rows)}", flush=True)
            for p in args.parallelism:
                cpu0 = cpu_seconds()
                pair = attempt(f"{prefix} flink p={p}", flink_throughput, bench, topic, n, p)
                if pair is not None:
                    for run in pair:
                        throughput.setdefault(run.step, {})[r] = run
                    check(f"round {r}", list(pair), prefix)
                    label = f"flink p={p}, whole run"
                    print(f"{prefix} {label:<28}{cpu_text(cpu0, cpu_seconds(), n)}", flush=True)

        print(f"latency: {args.latency_events:,} applications produced at {args.rate:,.0f}/s while each "
              "contender runs", flush=True)
        live = attempt("latency: records", lambda: Live(
            bench, applicant_events(args.latency_events, seed=43), args.rate))
        if live is not None:
            lat_n = len(live.values)
            got_base = attempt(f"latency {BASELINE}", baseline_latency, bench, live, compiled)
            if got_base is not None:
                base_lat, before_flush = got_base
                latency.append(base_lat)
                check("latency", [base_lat], "latency")
                for p in args.parallelism:
                    lat = attempt(f"latency flink p={p}", flink_latency, bench, live, p, before_flush)
                    if lat is not None:
                        latency.append(lat)
                        check("latency", [lat], "latency")
            else:
                print("latency: the Flink runs need the baseline's counts; skipped", flush=True)
    finally:
        try:
            bench.cleanup()
        except Exception as exc:  # the results matter more than the scratch namespaces
            failures.append("cleanup")
            print(f"FAILED cleanup (schema {bench.pg_schema}, topics bench_stream_{bench.tag}_*): {exc}",
                  flush=True)

    print()
    print(f"throughput: {n:,} events already in the topic (batch loader: {rows:,} decodable records as "
          f"Parquet), {rounds} round(s)")
    print(f"  {'contender':<30}{'runs':>5}{'median/s':>11}{'min/s':>11}{'max/s':>11}{'median s':>10}"
          "   median vs baseline")
    base_runs = throughput.get(BASELINE, {})
    base_med = statistics.median(r.events_per_s for r in base_runs.values()) if base_runs else None
    for step, runs in throughput.items():
        rates = [run.events_per_s for run in runs.values()]
        med = statistics.median(rates)
        vs = "" if step == BASELINE or base_med is None else f"{med / base_med:.2f}x events/s"
        print(f"  {step:<30}{len(runs):>5}{med:>11,.0f}{min(rates):>11,.0f}{max(rates):>11,.0f}"
              f"{statistics.median(run.seconds for run in runs.values()):>10.2f}   {vs}")
    print("  (baseline: wall from consumer creation to close; batch loader: the loader's own seconds, "
          "without interpreter start; job only: records / slowest subtask's open..close)")
    print("ratios of events/s, per round and the median of those:")
    for p in args.parallelism:
        job = throughput.get(f"flink p={p}, job only", {})
        per_round = {r: job[r].events_per_s / b.events_per_s for r, b in base_runs.items() if r in job}
        print(_ratio_line(f"flink p={p} job only / baseline", per_round))
    loader = throughput.get(LOADER, {})
    per_round = {r: b.events_per_s / loader[r].events_per_s for r, b in base_runs.items() if r in loader}
    print(_ratio_line("baseline / batch loader", per_round))

    print(f"latency: {lat_n:,} events produced at {args.rate:,.0f}/s while it runs (produce -> stored)")
    print(f"  {'step':<30}{'seconds':>9}{'events/s':>11}{'p50 ms':>9}{'p99 ms':>9}   vs baseline")
    base_lat_run = latency[0] if latency and latency[0].step == BASELINE else None
    for run in latency:
        vs = ""
        if (base_lat_run is not None and run is not base_lat_run
                and run.p50 is not None and run.p99 is not None):
            vs = (f"{run.p50 / max(base_lat_run.p50 or 1.0, 1.0):.2f}x p50, "
                  f"{run.p99 / max(base_lat_run.p99 or 1.0, 1.0):.2f}x p99")
        print(f"  {run.step:<30}{run.seconds:>9.2f}{run.rate or 0:>11,.0f}{_ms(run.p50):>9}"
              f"{_ms(run.p99):>9}   {vs}")
    print("  (latency 'seconds': producing the records; 'events/s': the offered rate)")
    print("counts (each run into an empty Postgres schema and a flushed Redis database):")
    for line in checks:
        print(line)
    if failures:
        print(f"FAILED steps ({len(failures)}): " + "; ".join(failures))
    if not ok:
        print("some counts did not add up or did not match Postgres (see above)")
    return 0 if ok and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
