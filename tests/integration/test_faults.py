"""Fault tests: the stores and the broker restarted under a running load or stream job.

Every server restarted here is a **private** one that the test starts on free loopback
ports and stops again (never the shared ``features dev up`` services, which other
tests use at the same time): a ``redis-server``, a PostgreSQL cluster (``initdb`` +
``pg_ctl`` through :class:`features.ops.dev.services.Postgres`) and a single-node KRaft
Kafka broker (the cached jars, through :class:`features.ops.dev.services.Kafka`).

After each fault, with the job resumed or re-run, the stores are checked against a
reference computed here from the input: counts conserved, Postgres holds exactly the
valid distinct events (no duplicates, none lost), the rejects table exactly the
invalid records, Redis the newest valid event per entity, and for the stream the
dead-letter topic exactly the invalid records. ``docs/faults.md`` says what each test
does and what the system guarantees under each fault.

The stream job killed with SIGKILL is
``test_stream.py::test_sigkill_mid_stream_then_restart_from_checkpoint_is_exact``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis
from aggregate_reference import T, stream_late
from aggregate_reference import reference as aggregation_reference
from test_stream import check_stores, expected  # the stream tests' reference and store checks

from features.compile import CompiledSchema
from features.config import Settings
from features.flink.stream import merged_summary
from features.home import state_home
from features.load import load
from features.ops.dev.services import Kafka, Postgres
from features.ops.examples import applicant_events, applicant_schema, applicants
from features.sinks.postgres import PostgresSink
from features.sinks.redis import RedisSink
from features.stream.kafka import ensure_topic, entity_keys, produce, read_topic

#: serial: its fault timings (restarts, retry budgets) are tuned for a machine that runs nothing else.
pytestmark = [pytest.mark.services, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "stream_job.py"
SCHEMA = "credit_applicant"


# --------------------------------------------------------------------------- private servers


def free_port(*, pair: bool = False) -> int:
    """A free loopback port (with ``pair``: the next one is free too, for Kafka's controller)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not pair:
            return port
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


class PrivateRedis:
    """A redis-server of the test's own. ``persistent``: append-only file, fsync always
    (a restart keeps the data); otherwise none, as ``features dev up`` runs it (a
    restart empties it)."""

    def __init__(self, folder: Path, *, persistent: bool) -> None:
        self.folder = folder
        self.port = free_port()
        self.persistent = persistent
        self.proc: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10)

    def start(self) -> None:
        aof = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else [
            "--appendonly", "no"]
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", *aof,
             "--dir", str(self.folder), "--logfile", str(self.folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"private redis on port {self.port} did not start: {self.folder / 'redis.log'}")

    def stop(self) -> None:
        """SIGTERM: Redis shuts down cleanly (with persistence, the AOF is complete)."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (``features dev up``'s code, another folder
    and port). ``stop`` is ``pg_ctl stop -m fast``: open sessions are terminated and their
    transactions rolled back, as in a restart of a production server."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.dsn = f"postgresql://featureline:featureline@127.0.0.1:{self.port}/featureline"
        self.state = state_home() / f"test-faults-pg-{uuid.uuid4().hex[:8]}"
        self.server = Postgres(dataclasses.replace(settings, postgres_dsn=self.dsn), state=self.state)

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def ensure_started(self) -> None:
        """Start the server unless it answers (after a test that failed while it was down)."""
        if not self.server.healthy():
            self.server.start()

    def new_schema(self) -> str:
        name = f"t_faults_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return name

    def dsn_for(self, schema: str) -> str:
        """The DSN whose sessions use ``schema`` (what a job's FEATURES_POSTGRES_DSN holds)."""
        return f"{self.dsn}?options=-csearch_path%3D{schema}"

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.state, ignore_errors=True)


class PrivateKafka:
    """A single-node KRaft broker of the test's own (``features dev up``'s code and cached
    jars, another folder and ports). ``stop`` is SIGTERM (a controlled shutdown); the
    log folder survives a restart."""

    def __init__(self, settings: Settings, folder: Path) -> None:
        self.port = free_port(pair=True)
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.server = Kafka(dataclasses.replace(settings, kafka_bootstrap=self.bootstrap))
        self.server.dir = folder
        self.server.data = folder / "data"
        self.server.log = folder / "kafka.log"
        self.server.pidfile = folder / "kafka.pid"
        self.pid = 0

    def start(self) -> None:
        with warnings.catch_warnings():
            # start() leaves the broker running on purpose (a daemon for `features dev up`):
            # its Popen object's "still running" ResourceWarning is expected here.
            warnings.simplefilter("ignore", ResourceWarning)
            self.server.start()
        self.pid = int(self.server.pidfile.read_text())

    def stop(self) -> None:
        self.server.stop()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)  # our child: reap it


def restart_later(stop: Callable[[], None], start: Callable[[], None], down_s: float) -> threading.Thread:
    """Stop a server now; start it again ``down_s`` seconds later on another thread."""
    stop()

    def back() -> None:
        time.sleep(down_s)
        start()

    thread = threading.Thread(target=back, name="restart", daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def private_pg(settings: Settings) -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(settings)
    pg.start()
    yield pg
    pg.close()


@pytest.fixture()
def volatile_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private Redis without persistence: a restart empties it."""
    server = PrivateRedis(tmp_path / "redis", persistent=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def durable_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A private Redis with an fsync-always append-only file: a restart keeps the data."""
    server = PrivateRedis(tmp_path / "redis", persistent=True)
    server.start()
    yield server
    server.stop()


# --------------------------------------------------------------------------- reference and checks


def applicant_history(rows: int, seed: int) -> pa.Table:
    """Applicant rows (``features.ops.examples.applicants``, ~2% invalid) whose valid ids are
    drawn from a pool of ``rows // 4`` entities: most entities get several events, in
    random event-time order, spread over many batches."""
    import numpy as np

    table = applicants(rows, seed)
    ids = table.column("application_id").combine_chunks()
    pool = np.random.default_rng(seed).integers(0, rows // 4, rows)
    drawn = pc.binary_join_element_wise(
        "APP-", pc.utf8_lpad(pc.cast(pa.array(pool + 7 * 10**11), pa.string()), 12, "0"), "")
    good = pc.fill_null(pc.match_substring_regex(ids, r"^APP-[0-9]{12}$"), False)
    return table.set_column(0, "application_id", pc.if_else(good, drawn, ids))


def write_history(folder: Path, files: int, rows: int, *, row_group: int) -> tuple[list[Path], pa.Table]:
    """``files`` Parquet files of :func:`applicant_history`; returns them and all rows in
    load order with a ``_source`` column (the loader's lineage URI of each row)."""
    paths, parts = [], []
    for i in range(files):
        table = applicant_history(rows, seed=100 + i)
        path = folder / f"part-{i}.parquet"
        pq.write_table(table, path, row_group_size=row_group)
        uri = path.resolve().as_uri()
        paths.append(path)
        parts.append(table.append_column("_source", pa.array([f"{uri}#{r}" for r in range(rows)])))
    return paths, pa.concat_tables(parts)


def reference(compiled: CompiledSchema, rows: pa.Table) -> dict[str, Any]:
    """What the stores must hold after loading ``rows`` (in order): the valid distinct
    (entity, event time) keys, the rejected sources, the newest event time per entity."""
    from features.validation import validate

    result = validate(rows.drop_columns(["_source"]), compiled)
    sources = rows.column("_source").to_pylist()
    bad = set(result.rejects.column("row").to_pylist())
    valid: set[tuple[str, Any]] = set()
    newest: dict[str, Any] = {}
    for row in result.valid.select(["application_id", "submitted_at"]).to_pylist():
        e, t = row["application_id"], row["submitted_at"]
        valid.add((e, t))
        if e not in newest or t > newest[e]:
            newest[e] = t
    return {"valid": valid, "rejected": {sources[i] for i in bad}, "newest": newest}


def micros(t: Any) -> int:
    return int(t.timestamp()) * 1_000_000 + t.microsecond


def hot_event_times(client: redis.Redis) -> dict[str, int]:
    """Every entity hash of the schema in ``client``'s database -> its ``_event_time``."""
    keys = list(client.scan_iter(match=f"features:{SCHEMA}:{{*", count=10_000))
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.hget(k, "_event_time")
    return {k.decode().split("{", 1)[1].rstrip("}"): int(v)
            for k, v in zip(keys, pipe.execute(), strict=True)}


def check_load(dsn: str, schema: str, client: redis.Redis, want: dict[str, Any]) -> None:
    """Postgres holds exactly the valid distinct events and the rejects; Redis the newest."""
    with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        cold = conn.execute(f"SELECT application_id, submitted_at FROM {SCHEMA}").fetchall()
        rejects = conn.execute(f"SELECT _source FROM {SCHEMA}__rejects").fetchall()
    assert len(cold) == len(set(cold)), "duplicate (entity, event time) rows in Postgres"
    assert set(cold) == want["valid"], "Postgres must hold exactly the valid events"
    assert len(rejects) == len(want["rejected"]) and {r[0] for r in rejects} == want["rejected"]
    hot = hot_event_times(client)
    assert hot == {e: micros(t) for e, t in want["newest"].items()}, "Redis must hold the newest per entity"


# --------------------------------------------------------------------------- batch load


def test_batch_load_with_redis_restarted_between_rows_and_ledger_then_rerun_is_exact(
        tmp_path: Path, settings: Settings, private_pg: PrivatePostgres, volatile_redis: PrivateRedis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis (no persistence) restarts in the middle of a load, at the worst moment: after a
    unit's rows reached the server and before its ledger entry. The sink retries (the server
    is back after 2 s) and the load completes; the restart emptied Redis, so the re-run
    rewrites every unit the new server's ledger lacks. Postgres was untouched: exact after
    the first run, skipped entirely by the second."""
    compiled = applicant_schema()
    paths, rows = write_history(tmp_path, files=2, rows=3_000, row_group=500)
    want = reference(compiled, rows)
    schema = private_pg.new_schema()
    hot_settings = dataclasses.replace(settings, postgres_dsn=private_pg.dsn, redis_url=volatile_redis.url)

    real_send = RedisSink._send
    sent = {"units": 0}
    restarts: list[threading.Thread] = []

    def send_then_restart(self: RedisSink, calls: Iterable[list[bytes]]) -> int:
        written = real_send(self, calls)
        sent["units"] += 1
        if sent["units"] == 4:  # the 4th unit's rows are in Redis; its ledger entry is not
            restarts.append(restart_later(volatile_redis.stop, volatile_redis.start, 2.0))
        return written

    monkeypatch.setattr(RedisSink, "_send", send_then_restart)
    try:
        first = load(paths, compiled, hot_settings, batch_rows=500, search_path=schema)
    finally:
        for thread in restarts:
            thread.join(60)
        monkeypatch.undo()
    assert first.adds_up and first.read == rows.num_rows and first.units == 12
    assert first.stored == len(want["valid"]) and first.rejected == len(want["rejected"])
    # The restart emptied Redis: its ledger lists only the units written after it, and
    # entities whose newest event came before it now hold an older one.
    ledger = volatile_redis.client().smembers(f"features:{SCHEMA}:__ledger__")
    assert len(ledger) == 12 - 3
    assert hot_event_times(volatile_redis.client()) != {e: micros(t) for e, t in want["newest"].items()}

    second = load(paths, compiled, hot_settings, batch_rows=500, search_path=schema)
    assert second.adds_up and second.read == rows.num_rows
    assert (second.stored, second.rejected, second.already_present) == (0, 0, rows.num_rows)
    assert second.sinks["postgres"].skipped_units == 12
    # Redis's new ledger holds only the units written after the restart (the 4th among them,
    # sent again with its rows); the re-run writes the other ones.
    assert second.sinks["redis"].skipped_units == 12 - 3
    check_load(private_pg.dsn, schema, volatile_redis.client(), want)


def test_redis_still_loading_its_data_after_a_restart_is_waited_for_not_an_error(
        tmp_path: Path, settings: Settings) -> None:
    """A restarted Redis answers ``-LOADING`` until its dataset is back in memory. The sink
    treats that as "not ready yet" (retried with backoff), not as a refused write: the
    load completes once the server is ready, and the rows land exactly."""
    filler = 3_000_000  # keys: a second or two to load again on this machine
    folder = tmp_path / "loading"
    folder.mkdir()
    port = free_port()
    args = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(folder), "--dbfilename", "big.rdb", "--enable-debug-command", "yes",
            "--logfile", str(folder / "redis.log")]
    client = redis.Redis(port=port, socket_timeout=30)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, f"private redis did not start: {folder / 'redis.log'}"
                time.sleep(0.05)
        client.execute_command("DEBUG", "POPULATE", filler, "filler", 64)  # seconds to load again
        client.save()
        proc.terminate()
        proc.wait(30)
        client.close()
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        loading_seen = False
        deadline = time.monotonic() + 30
        while not loading_seen:  # the server accepts connections while it loads
            try:
                client.ping()
                break
            except redis.BusyLoadingError:
                loading_seen = True
            except redis.ConnectionError:
                assert time.monotonic() < deadline, f"private redis did not restart: {folder / 'redis.log'}"
                time.sleep(0.01)
        assert loading_seen, "the server finished loading before the write: the test tested nothing"
        compiled = applicant_schema()
        rows = applicants(500, seed=3)
        sink = RedisSink(f"redis://127.0.0.1:{port}/0", compiled, key_prefix="loading:", retries=12,
                         backoff_s=0.2)
        import datetime as dt

        from features.lineage import RunContext
        from features.pipeline.prepare import process_batch
        from features.sinks.base import WriteUnit
        from features.sources.parquet import ParquetSource

        path = tmp_path / "rows.parquet"
        pq.write_table(rows, path)
        ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run-loading",
                         dt.datetime.now(dt.UTC))
        batch = next(iter(ParquetSource([path], compiled).batches()))
        from features.kernels import transform_program

        prepared = process_batch(batch, compiled, transform_program(compiled, settings), ctx, ctx.ingested_at)
        sink.open()  # SCRIPT LOAD meets -LOADING too
        try:
            result = sink.write(WriteUnit(prepared.rows, prepared.rejects, "rows.parquet#0",
                                          batch.batch.num_rows))
        finally:
            sink.close()
        assert result.stored == prepared.rows.num_rows > 0 and result.already_present == 0
        keys = list(client.scan_iter(match="loading:features:*{*", count=10_000))
        assert len(keys) == prepared.rows.num_rows
        assert client.sismember(f"loading:features:{compiled.name}:__ledger__",
                                f"{compiled.fingerprint[:16]} rows.parquet#0")
        assert client.dbsize() == filler + prepared.rows.num_rows + 1, "the restart kept the dataset"
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)


def test_batch_load_with_postgres_restarted_mid_transaction_completes_exactly(
        tmp_path: Path, settings: Settings, private_pg: PrivatePostgres, volatile_redis: PrivateRedis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Postgres stops (``pg_ctl stop -m fast``) in the middle of a load, inside a unit's
    transaction (rows copied, ledger row and commit not yet sent), and is back 2 s later.
    The transaction was rolled back; the sink reconnects with backoff and writes the unit
    again: the load completes exactly, and a re-run stores nothing."""
    compiled = applicant_schema()
    paths, rows = write_history(tmp_path, files=2, rows=3_000, row_group=500)
    want = reference(compiled, rows)
    schema = private_pg.new_schema()
    cold_settings = dataclasses.replace(settings, postgres_dsn=private_pg.dsn, redis_url=volatile_redis.url)

    real_copy = PostgresSink._copy
    copied = {"units": 0}
    restarts: list[threading.Thread] = []

    def copy_then_restart(self: PostgresSink, conn: Any, table: str, columns: Any, data: pa.Table) -> None:
        real_copy(self, conn, table, columns, data)
        if table != self.table:
            return  # a COPY of rejects into their staging table
        copied["units"] += 1
        if copied["units"] == 4:  # the 4th unit's rows are copied, its transaction still open
            restarts.append(restart_later(private_pg.stop, private_pg.start, 2.0))

    monkeypatch.setattr(PostgresSink, "_copy", copy_then_restart)
    try:
        first = load(paths, compiled, cold_settings, batch_rows=500, search_path=schema)
    finally:
        for thread in restarts:
            thread.join(60)
        monkeypatch.undo()
    assert copied["units"] == 13, "the interrupted unit must have been copied again"
    assert first.adds_up and first.read == rows.num_rows and first.units == 12
    assert first.stored == len(want["valid"]) and first.rejected == len(want["rejected"])
    assert first.already_present == rows.num_rows - first.stored - first.rejected
    check_load(private_pg.dsn, schema, volatile_redis.client(), want)
    with psycopg.connect(private_pg.dsn) as conn:
        ledger = conn.execute(f'SELECT count(*), sum(read) FROM "{schema}".featureline_ledger').fetchone()
    assert ledger == (12, rows.num_rows)

    second = load(paths, compiled, cold_settings, batch_rows=500, search_path=schema)
    assert (second.stored, second.rejected, second.already_present) == (0, 0, rows.num_rows)
    assert second.sinks["postgres"].skipped_units == second.sinks["redis"].skipped_units == 12
    check_load(private_pg.dsn, schema, volatile_redis.client(), want)


# --------------------------------------------------------------------------- stream job

Positions = list[tuple[int, int, int]]

#: windowed aggregations for the stream fault tests (credit_applicant + this section): the
#: entity's events arrive out of order, some beyond the lateness
AGGREGATIONS = """
aggregations:
  allowed_lateness: 2d
  features:
    - {name: events_30d, function: count, window: 30d, store: [hot, cold]}
    - {name: amount_sum_30d, function: sum, of: requested_amount, window: 30d, store: [hot, cold]}
    - {name: regions_90d, function: count_distinct, of: region, window: 90d, store: cold}
"""
AGG_NAMES = ("events_30d", "amount_sum_30d", "regions_90d")


def schemas_with_aggregations(tmp: Path) -> Path:
    """A schemas folder holding credit_applicant with :data:`AGGREGATIONS` added."""
    out = tmp / "schemas"
    out.mkdir(exist_ok=True)
    text = (ROOT / "schemas" / f"{SCHEMA}.yaml").read_text()
    (out / f"{SCHEMA}.yaml").write_text(text.rstrip("\n") + "\n" + AGGREGATIONS)
    return out


@dataclasses.dataclass
class StreamRun:
    """One unbounded stream job (its own process group) and what it was fed."""

    tmp: Path
    env: dict[str, str]
    bootstrap: str
    topic: str
    run_id: str = dataclasses.field(default_factory=lambda: f"faults-{uuid.uuid4().hex[:8]}")
    values: list[bytes | None] = dataclasses.field(default_factory=list)
    positions: Positions = dataclasses.field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    #: a schemas folder whose credit_applicant has windowed aggregations (None: the shipped one)
    schemas_dir: Path | None = None

    @property
    def state(self) -> Path:
        return self.tmp / "state" / SCHEMA

    @property
    def log(self) -> Path:
        return self.tmp / "job.log"

    def produce(self, values: list[bytes | None]) -> Positions:
        positions = produce(self.bootstrap, self.topic, values, keys=entity_keys(values, "application_id"))
        self.values += values
        self.positions += positions
        return positions

    def start(self, *args: str) -> None:
        # Small micro-batches and a checkpoint every second: a fault lands between many of
        # them, and a restarted task resumes from a recent checkpoint.
        cmd = [sys.executable, str(JOB), "--schema", SCHEMA, "--topic", self.topic, "--state-dir",
               str(self.tmp / "state"), "--run-id", self.run_id, "--batch-size", "100",
               "--max-wait-ms", "200", "--checkpoint-interval-ms", "1000", "--log-every-s", "2", *args,
               *(["--schemas-dir", str(self.schemas_dir)] if self.schemas_dir else [])]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def next_offsets(self) -> dict[str, int]:
        """Per partition, the next offset after the last micro-batch written (by any subtask
        instance of this run: a restarted task writes its own summary file)."""
        out: dict[str, int] = {}
        for f in (self.state / "summaries").glob(f"{self.run_id}-*.json"):
            try:
                done = json.loads(f.read_text()).get("next_offsets", {})
            except ValueError:
                continue  # replaced atomically, but be safe against a partial read
            for k, v in done.items():
                out[k] = max(out.get(k, 0), int(v))
        return out

    def instances(self) -> int:
        return len(list((self.state / "summaries").glob(f"{self.run_id}-*.json")))

    def wait_processed(self, positions: Positions, *, timeout_s: float = 300) -> None:
        """Wait until every record of ``positions`` is written (the job must stay alive)."""
        ends: dict[str, int] = {}
        for part, off, _ in positions:
            key = f"{self.topic}/{part}"
            ends[key] = max(ends.get(key, 0), off + 1)
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            done = self.next_offsets()
            if all(done.get(k, 0) >= v for k, v in ends.items()):
                return
            assert time.monotonic() < deadline, f"not processed in {timeout_s:.0f}s: {done} < {ends}"
            time.sleep(0.2)

    def check_alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, \
            f"the stream job died:\n{self.log.read_text(errors='replace')[-6000:]}"

    def wait_started(self, *, timeout_s: float = 300) -> None:
        """Wait until the job has written its first micro-batch."""
        deadline = time.monotonic() + timeout_s
        while not self.next_offsets():
            self.check_alive()
            assert time.monotonic() < deadline, "the stream job never started"
            time.sleep(0.1)

    def wait_logged(self, text: str, *, timeout_s: float = 120) -> None:
        """Wait until the job's output (client, JVM and Python workers) contains ``text``."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log.read_text(errors="replace"):
            self.check_alive()
            assert time.monotonic() < deadline, f"the job never logged {text!r}"
            time.sleep(0.2)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the client and its Flink JVM
            self.proc.wait(60)

    def summary(self) -> dict[str, Any]:
        return merged_summary(self.state / "summaries", self.run_id)


def stream_env(pg: PrivatePostgres, schema: str, redis_url: str, bootstrap: str) -> dict[str, str]:
    return {**os.environ, "FEATURES_POSTGRES_DSN": pg.dsn_for(schema), "FEATURES_REDIS_URL": redis_url,
            "FEATURES_KAFKA_BOOTSTRAP": bootstrap}


def check_stream(run: StreamRun, pg: PrivatePostgres, schema: str, redis_url: str) -> dict[str, Any]:
    """The stores against the reference (``test_stream.expected``/``check_stores``), and the
    run's counts: every record read at least once, and they add up."""
    want = expected(applicant_schema(), run.topic, run.values, run.positions)
    summary = run.summary()
    assert summary["adds_up"], summary
    assert summary["read"] >= len(run.values)
    check_stores(Settings(postgres_dsn=pg.dsn, redis_url=redis_url, kafka_bootstrap=run.bootstrap), schema,
                 run.topic, want, redis_db=0)
    dead = read_topic(run.bootstrap, run.topic + ".rejects")
    for m in dead:  # each dead letter names its own record
        assert json.loads(m.value())["source"] == m.key().decode()
    if run.schemas_dir is not None:
        check_aggregations(run, pg, schema)
        assert summary["aggregations"]["adds_up"], summary
    return {"summary": summary, "dead_letters": len(dead), "rejected": len(want["rejected"])}


def check_aggregations(run: StreamRun, pg: PrivatePostgres, schema: str) -> None:
    """The aggregation rows against the reference: the valid events in production order
    (each entity's records are on one partition, so that is their arrival order), those
    more than the lateness behind their entity's newest earlier one left out."""
    from features.compile import compile_schema
    from features.schema import load_schema
    from features.validation import validate

    compiled = compile_schema(load_schema(run.schemas_dir / f"{SCHEMA}.yaml"))  # type: ignore[operator]
    objs = []
    for value in run.values:
        try:
            obj = json.loads(value) if value is not None and len(value) <= 65536 else None
        except (ValueError, RecursionError, UnicodeDecodeError):
            obj = None
        if isinstance(obj, dict):
            objs.append(obj)
    events = []
    for row in validate(objs, compiled).valid.to_pylist():
        t = row["submitted_at"]
        events.append({**row, T: int(t.timestamp()) * 1_000_000 + t.microsecond})
    late = stream_late(compiled.schema, events)
    assert late, "the history must hold events beyond the lateness"
    want = aggregation_reference(compiled.schema, [e for i, e in enumerate(events) if i not in late])
    with psycopg.connect(pg.dsn_for(schema)) as conn:
        rows = conn.execute(f"SELECT application_id, (extract(epoch FROM submitted_at) * 1000000)::bigint, "
                            f"{', '.join(AGG_NAMES)} FROM credit_applicant__aggregates").fetchall()
        rejects = conn.execute("SELECT count(*) FROM credit_applicant__rejects "
                               "WHERE errors->0->>'rule' = 'aggregation.lateness'").fetchone()
    got = {(r[0], int(r[1])): tuple(r[2:]) for r in rows}
    assert len(got) == len(rows) == len(want)
    diff = [k for k in want if got.get(k) != want[k]]
    assert not diff, f"{len(diff)} aggregation rows differ: {[(k, got.get(k), want[k]) for k in diff[:3]]}"
    assert rejects is not None and rejects[0] == len(late)


@pytest.mark.flink
def test_stream_with_postgres_down_longer_than_the_retries_restarts_from_checkpoint_exactly(
        tmp_path: Path, settings: Settings, private_pg: PrivatePostgres, volatile_redis: PrivateRedis,
        stream_topic: str) -> None:
    """Postgres goes down under a running stream job for longer than the sink's retries
    (5 attempts, ~7.5 s): the micro-batch fails, Flink restarts the task from its last
    checkpoint (``--restart-attempts``, 2 s apart; the task's open() fails too while the
    server is down) until Postgres is back, and the replay is idempotent: the stores end
    exact."""
    schema = private_pg.new_schema()
    run = StreamRun(tmp_path, stream_env(private_pg, schema, volatile_redis.url, settings.kafka_bootstrap),
                    settings.kafka_bootstrap, stream_topic,
                    schemas_dir=schemas_with_aggregations(tmp_path))
    values = applicant_events(2_000, seed=21, undecodable_every=100)
    first = run.produce(values[:1_000])
    run.start("--restart-attempts", "5")
    try:
        run.wait_processed(first)
        private_pg.stop()
        run.produce(values[1_000:])   # arrives while Postgres is down
        # a store operation gave up (the rows' write, or with aggregations possibly the read of
        # their state, which runs beside it): the task fails
        run.wait_logged("failed after 5 attempts")
        private_pg.start()
        run.wait_processed(run.positions)
    finally:
        run.kill()
        private_pg.ensure_started()  # the module's other tests use it
    assert run.instances() >= 2, "the task must have been restarted (a second subtask instance)"
    check_stream(run, private_pg, schema, volatile_redis.url)


@pytest.mark.flink
def test_stream_with_redis_restarted_mid_stream_survives_on_retries_exactly(
        tmp_path: Path, settings: Settings, private_pg: PrivatePostgres, durable_redis: PrivateRedis,
        stream_topic: str) -> None:
    """A persistent Redis (append-only file) restarts under a running stream job, down for
    2 s: the sink's retries (~7.5 s) bridge it, the job keeps running, the stores end exact."""
    schema = private_pg.new_schema()
    run = StreamRun(tmp_path, stream_env(private_pg, schema, durable_redis.url, settings.kafka_bootstrap),
                    settings.kafka_bootstrap, stream_topic,
                    schemas_dir=schemas_with_aggregations(tmp_path))
    values = applicant_events(2_000, seed=22, undecodable_every=100)
    first = run.produce(values[:1_000])
    run.start("--restart-attempts", "0")  # no Flink restart: the sink's retries alone must do
    try:
        run.wait_processed(first)
        restart = restart_later(durable_redis.stop, durable_redis.start, 2.0)
        run.produce(values[1_000:])   # arrives while Redis is down
        restart.join(30)
        run.wait_processed(run.positions)
    finally:
        run.kill()
    assert run.instances() == 1, "the job must have ridden out the restart without a task restart"
    out = check_stream(run, private_pg, schema, durable_redis.url)
    assert out["summary"]["read"] == len(run.values)  # nothing replayed
    assert out["dead_letters"] == out["rejected"]      # so no dead letter twice


@pytest.mark.flink
def test_stream_with_volatile_redis_restarted_loses_hot_values_until_replayed(
        tmp_path: Path, settings: Settings, private_pg: PrivatePostgres, volatile_redis: PrivateRedis,
        stream_topic: str) -> None:
    """A Redis without persistence (as ``features dev up`` runs it) restarts under a running
    stream job: the job rides it out as above, but the restart emptied Redis, and a stream
    keeps no ledger that could notice. Replaying the topic (a bounded job, a new consumer
    group, from the earliest offset) restores it: the writes are idempotent."""
    schema = private_pg.new_schema()
    env = stream_env(private_pg, schema, volatile_redis.url, settings.kafka_bootstrap)
    run = StreamRun(tmp_path, env, settings.kafka_bootstrap, stream_topic)
    values = applicant_events(2_000, seed=24, undecodable_every=100)
    first = run.produce(values[:1_000])
    run.start("--restart-attempts", "0")
    try:
        run.wait_processed(first)
        restart = restart_later(volatile_redis.stop, volatile_redis.start, 2.0)
        run.produce(values[1_000:])
        restart.join(30)
        run.wait_processed(run.positions)
    finally:
        run.kill()
    assert run.instances() == 1
    want = expected(applicant_schema(), run.topic, run.values, run.positions)
    hot = hot_event_times(volatile_redis.client())
    assert 0 < len(hot) < len(want["newest"]), "entities written only before the restart are gone"

    replay = subprocess.run(
        [sys.executable, str(JOB), "--schema", SCHEMA, "--topic", run.topic, "--state-dir",
         str(tmp_path / "replay"), "--group-id", f"replay-{uuid.uuid4().hex[:8]}", "--startup",
         "earliest-offset", "--bounded", "--restart-attempts", "0", "--json"],
        env=env, capture_output=True, text=True, timeout=400)
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-4000:]
    summary = json.loads(replay.stdout)
    assert summary["read"] == len(run.values) and summary["stored"] == 0 and summary["adds_up"]
    check_stream(run, private_pg, schema, volatile_redis.url)


@pytest.fixture()
def private_kafka(settings: Settings, tmp_path: Path) -> Iterator[PrivateKafka]:
    kafka = PrivateKafka(settings, tmp_path / "kafka")
    kafka.start()
    yield kafka
    kafka.stop()


@pytest.mark.flink
def test_stream_with_kafka_broker_restarted_mid_stream_survives_exactly(
        tmp_path: Path, settings: Settings, private_pg: PrivatePostgres, volatile_redis: PrivateRedis,
        private_kafka: PrivateKafka) -> None:
    """The broker restarts (controlled shutdown, ~15-20 s down) under a running stream job,
    while it works through a backlog: the Kafka source reconnects, the dead-letter producer
    waits for the broker (up to 60 s per micro-batch), offsets commit again with the next
    checkpoint, the stores end exact and each dead letter names its record."""
    schema = private_pg.new_schema()
    bootstrap = private_kafka.bootstrap
    topic = f"t_faults_{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, partitions=2)
    ensure_topic(bootstrap, topic + ".rejects", partitions=1)
    run = StreamRun(tmp_path, stream_env(private_pg, schema, volatile_redis.url, bootstrap), bootstrap, topic,
                    schemas_dir=schemas_with_aggregations(tmp_path))
    values = applicant_events(3_000, seed=23, undecodable_every=100)
    run.produce(values[:2_000])
    run.start("--restart-attempts", "3")
    try:
        run.wait_started()
        private_kafka.stop()  # under the job, with most of the backlog still to do
        private_kafka.start()
        run.produce(values[2_000:])
        run.wait_processed(run.positions)
    finally:
        run.kill()
    out = check_stream(run, private_pg, schema, volatile_redis.url)
    # Dead letters are at-least-once: only a task restart (a replay) may send one again,
    # under the same key; the idempotent producer's own retries across the broker restart
    # never do.
    if run.instances() == 1:
        assert out["dead_letters"] == out["rejected"]
