"""``features migrate --apply`` while a load and a stream of the old version are writing
(issue 45, item 4): the migration changes a column's type (``trend`` int32 -> int64, which
the old writer's binary COPY cannot write), waits for the unit each writer has in flight,
and the writers stop between units with a message naming the new version, every unit they
wrote in both stores (Postgres and Redis agree); run again with the new file, they finish
with exact counts. The load is a real ``load_source`` (a file source that yields a batch
every 50 ms); the stream is the micro-batch code path (``StreamProcessor.process``, what the
PyFlink job calls per micro-batch) over records that arrive one chunk every 50 ms."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import psycopg
import pyarrow as pa
import pytest
import redis
from conftest import cli_environment

from features.compile import compile_schema
from features.config import Settings
from features.errors import SinkError
from features.lineage import BatchLineage
from features.pipeline.run import load_source
from features.schema.parse import parse_schema
from features.sdk.write import slices
from features.sources.base import SourceBatch
from features.stream.core import StreamProcessor

pytestmark = pytest.mark.services
REDIS_DB = 13  # this file's own database, flushed before and after
ROWS = 6_000
BATCH = 200

V1 = """\
name: busy_readings
version: 1.0.0
entity: patient
event_time: read_at
fields:
  - {name: patient, type: string, store: [hot, cold], constraints: {required: true}}
  - {name: read_at, type: "timestamp(us, UTC)", store: [hot, cold], constraints: {required: true}}
  - {name: trend, type: int32, store: [hot, cold], constraints: {nullable: true}}
"""
V2 = V1.replace("version: 1.0.0", "version: 1.1.0").replace("type: int32", "type: int64")
T0 = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def _table(first: int, n: int) -> pa.Table:
    """``n`` rows, one entity each (so the stores agree when the entity hashes in Redis
    and the rows in Postgres are as many)."""
    return pa.table({"patient": [f"p{i:06d}" for i in range(first, first + n)],
                     "read_at": pa.array([T0 + dt.timedelta(seconds=i) for i in range(first, first + n)],
                                         pa.timestamp("us", "UTC")),
                     "trend": pa.array([i % 1000 - 500 for i in range(first, first + n)], pa.int32())})


class _Gate:
    """Holds a writer's input back, past its first ``free`` slices, until the migration
    says it waits for the writers: the writer is still mid-input when the migration starts,
    however slowly the ``features migrate`` process starts on a busy machine (CI)."""

    def __init__(self, free: int) -> None:
        self.free, self.served = free, 0
        self.waiting = threading.Event()

    def pass_slice(self, pause_s: float) -> None:
        time.sleep(pause_s)
        self.served += 1
        if self.served > self.free and pause_s:
            self.waiting.wait(120)


class _PacedFile:
    """The batches of a table with file lineage and ledger units, one every ``pause_s``
    (held at ``gate`` once past its free batches)."""

    name = "file"

    def __init__(self, table: pa.Table, path: str, pause_s: float, gate: _Gate | None = None) -> None:
        self.table, self.path, self.pause_s = table, path, pause_s
        self.gate = gate or _Gate(1 << 30)

    @property
    def total_rows(self) -> int:
        return int(self.table.num_rows)

    def batches(self) -> Iterator[SourceBatch]:
        for j, batch in enumerate(slices(self.table, BATCH)):
            yield SourceBatch(batch, BatchLineage(f"file://{self.path}", j * BATCH, batch.num_rows,
                                                  f"{self.path}#b{j}"))
            self.gate.pass_slice(self.pause_s)


class _Arriving(Sequence[bytes]):
    """Kafka record values that take ``pause_s`` to arrive per slice (the stream's chunks),
    held at ``gate`` once past its free slices."""

    def __init__(self, values: list[bytes], pause_s: float, gate: _Gate) -> None:
        self.values, self.pause_s, self.gate = values, pause_s, gate

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(i, slice):
            self.gate.pass_slice(self.pause_s)
        return self.values[i]


def _records(table: pa.Table) -> list[bytes]:
    return [json.dumps({"patient": r["patient"], "read_at": r["read_at"].isoformat(), "trend": r["trend"]}
                       ).encode() for r in table.to_pylist()]


def _counts(settings: Settings, pg_schema: str, url: str) -> tuple[int, int, set[str]]:
    """Rows in Postgres, entity hashes in Redis, and the fingerprints those hashes hold."""
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        row = conn.execute("SELECT count(*) FROM busy_readings").fetchone()
    assert row is not None
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match="features:busy_readings:{*}", count=1000))
    fps = {client.hget(k, "_schema_fingerprint") for k in keys}
    client.close()
    return int(row[0]), len(keys), {fp.decode() for fp in fps if fp is not None}


def _when_stored(settings: Settings, pg_schema: str, url: str, rows: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if _counts(settings, pg_schema, url)[0] >= rows:
                return
        except psycopg.errors.UndefinedTable:
            pass
        time.sleep(0.05)
    raise AssertionError(f"fewer than {rows} rows stored after {timeout_s} s")


def _migrate(path: Path, env: dict[str, str], gate: _Gate) -> subprocess.CompletedProcess[str]:
    """``features migrate --apply`` (its stderr in stdout); ``gate`` opens when it says it
    waits for the writers."""
    lines: list[str] = []
    with subprocess.Popen([sys.executable, "-m", "features.cli", "migrate", str(path), "--apply"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if "waiting for the writers" in line:
                    gate.waiting.set()
            gate.waiting.set()  # the process ended: let the writer go on (the asserts tell what happened)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            proc.wait(timeout=300)
        finally:
            reader.join(30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines), "")  # stderr is in stdout


@pytest.fixture()
def env(settings: Settings, pg_schema: str) -> Iterator[dict[str, str]]:
    with cli_environment(settings, pg_schema, REDIS_DB) as e:
        yield e


@pytest.fixture()
def v2_file(tmp_path: Path) -> Path:
    path = tmp_path / "busy_readings.yaml"
    path.write_text(V2)
    return path


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    return t, out


def test_a_load_under_a_migration_stops_between_units_with_the_stores_in_agreement(
        settings: Settings, pg_schema: str, env: dict[str, str], v2_file: Path, tmp_path: Path) -> None:
    url = env["FEATURES_REDIS_URL"]
    cfg = dataclasses.replace(settings, redis_url=url)
    v1, v2 = compile_schema(parse_schema(V1, "v1.yaml")), compile_schema(parse_schema(V2, "v2.yaml"))
    table = _table(0, ROWS)
    path = str(tmp_path / "readings.parquet")
    gate = _Gate(free=10)
    thread, out = _in_thread(lambda: load_source(_PacedFile(table, path, 0.05, gate), v1, cfg,
                                                 search_path=pg_schema, run_id="old-load"))
    _when_stored(settings, pg_schema, url, 3 * BATCH)
    migrated = _migrate(v2_file, env, gate)
    thread.join(120)
    assert migrated.returncode == 0, migrated.stdout[-2000:] + migrated.stderr[-2000:]
    stored, hashes, fps = _counts(settings, pg_schema, url)
    assert hashes == stored, (hashes, stored)  # the stores agree on the units written
    error = out.get("error")
    assert isinstance(error, SinkError), "".join(traceback.format_exception(error)) if error else out
    assert "migrated to busy_readings 1.1.0" in str(error) and "stopped between batches" in str(error)
    assert 3 * BATCH <= stored < ROWS and stored % BATCH == 0
    assert hashes == stored and fps == {v2.fingerprint}  # both stores hold the same units
    assert "waiting for the writers of busy_readings" in migrated.stdout, migrated.stdout
    again = load_source(_PacedFile(table, path, 0), v2, cfg, search_path=pg_schema, run_id="new-load")
    assert again.adds_up and again.already_present == stored and again.stored == ROWS - stored
    assert _counts(settings, pg_schema, url) == (ROWS, ROWS, {v2.fingerprint})


def test_a_stream_under_a_migration_stops_between_chunks_with_the_stores_in_agreement(
        settings: Settings, pg_schema: str, env: dict[str, str], v2_file: Path) -> None:
    url = env["FEATURES_REDIS_URL"]
    cfg = dataclasses.replace(settings, redis_url=url)
    v1, v2 = compile_schema(parse_schema(V1, "v1.yaml")), compile_schema(parse_schema(V2, "v2.yaml"))
    first, second = _table(0, 1_000), _table(1_000, ROWS - 1_000)

    def coords(n: int, at: int) -> tuple[pa.Array, pa.Array, pa.Array]:
        return (pa.array(["busy"] * n, pa.string()), pa.array([0] * n, pa.int32()),
                pa.array(range(at, at + n), pa.int64()))

    proc = StreamProcessor(v1, cfg, run_id="old-stream", dead_letter_topic=None, search_path=pg_schema,
                           chunk_records=BATCH)
    proc.open()
    try:
        assert int(proc.process(_records(first), *coords(1_000, 0)).sum()) == 0  # a micro-batch before
        gate = _Gate(free=10)
        busy = _Arriving(_records(second), 0.05, gate)
        thread, out = _in_thread(lambda: proc.process(busy, *coords(ROWS - 1_000, 1_000)))
        _when_stored(settings, pg_schema, url, 1_000 + 3 * BATCH)
        migrated = _migrate(v2_file, env, gate)
        thread.join(120)
    finally:
        proc.close()
    assert migrated.returncode == 0, migrated.stdout[-2000:] + migrated.stderr[-2000:]
    stored, hashes, fps = _counts(settings, pg_schema, url)
    assert hashes == stored, (hashes, stored)  # the stores agree on the micro-batch's chunks written
    error = out.get("error")
    assert isinstance(error, SinkError), "".join(traceback.format_exception(error)) if error else out
    assert "while this stream wrote" in str(error) and "migrated to busy_readings 1.1.0" in str(error)
    assert 1_000 + 3 * BATCH <= stored < ROWS
    assert hashes == stored and fps == {v2.fingerprint}
    assert "waiting for the writers of busy_readings" in migrated.stdout, migrated.stdout
    # the micro-batch replayed (Kafka's offsets were not committed) by a stream on the new file
    proc = StreamProcessor(v2, cfg, run_id="new-stream", dead_letter_topic=None, search_path=pg_schema)
    proc.open()
    try:
        assert int(proc.process(_records(second), *coords(ROWS - 1_000, 1_000)).sum()) == 0
    finally:
        proc.close()
    assert _counts(settings, pg_schema, url) == (ROWS, ROWS, {v2.fingerprint})
    # and a stream still on the old file is refused at its next micro-batch's start
    proc = StreamProcessor(v1, cfg, run_id="old-again", dead_letter_topic=None, search_path=pg_schema)
    with pytest.raises(SinkError, match="newer version"):
        proc.open()
    proc.close()
