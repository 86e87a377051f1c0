"""One schema's side of an ingest request: records -> (messages to produce, rejects).

:meth:`SchemaIngest.check` runs the stream job's own micro-batch step,
:func:`features.pipeline.prepare.prepare_records`, on the records of one request (so a
record is decoded, validated and transformed exactly as the stream job will, with the
same reject rules and messages), and turns the outcome into what the service sends:

- the valid records, their original bytes, each keyed by its entity id (as
  :func:`features.stream.kafka.entity_keys` keys them: every event of an entity on one
  partition) with a ``featureline-source`` header naming the request and the position;
- the rejects, as the rejects table holds them (``_source`` =
  ``http://<request id>#<index>``, ``row_index`` = index) and as dead-letter messages
  (:func:`features.sinks.dead_letter.dead_letter_messages`, the stream's format);
- the field errors, for the response: the first ``max_errors`` of them (by record index)
  and how many there are in all (a body of many bad records answers a bounded list).
- with rate gates in the schema's ``quality:`` section, the request judged by the
  worker's sliding window (:class:`~features.pipeline.gates.GateWindow`): ``Checked.gate``,
  and ``Checked.refused`` when a ``fail`` gate tripped (the service then stores nothing of it).

What one worker holds is bounded: a body is refused past ``max_records`` records
(:class:`~features.serve.body.TooManyRecords`, HTTP 413) before its records are listed,
and the bodies waiting to be checked hold at most ``max_queued_bytes`` (past it
:meth:`SchemaIngest.submit` raises :class:`IngestBusy`, HTTP 503).

``check`` is pure (writes nothing) and blocking: the server calls it in a thread.
:meth:`SchemaIngest.write_rejects` writes the rejects table (one Postgres connection
per schema and worker, used by one thread at a time).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.config import Settings
from features.errors import FeaturesError, SinkError, Transient
from features.kernels import transform_program
from features.lineage import RunContext
from features.pipeline.gates import GateWindow, WindowCheck
from features.pipeline.prepare import prepare_records
from features.serve.body import BadBody, split_body
from features.serve.limits import MAX_ERRORS, MAX_QUEUED_BYTES, MAX_RECORDS
from features.serve.producer import Message
from features.sinks.dead_letter import dead_letter_messages, producer_max_bytes
from features.sinks.postgres import PostgresSink
from features.sources.columnar import ColumnarDecoder
from features.stream.kafka import dead_letter_limit

log = logging.getLogger("features.serve")

#: The Kafka header naming where a produced record came from (``http://<id>#<index>``).
SOURCE_HEADER = "featureline-source"


class IngestBusy(FeaturesError, Transient):
    """The bodies waiting to be checked already hold ``limit`` bytes: the request is not
    queued (HTTP 503 with Retry-After); ``queued`` is what was waiting."""

    def __init__(self, message: str, *, limit: int, queued: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.queued = queued


def record_uri(request_id: str, index: int) -> str:
    """The lineage URI of record ``index`` (0-based) of request ``request_id``."""
    return f"http://{request_id}#{index}"


@dataclass
class Checked:
    """One request's records, checked: what to produce and what to refuse."""

    records: int
    #: (key, value, headers) of each valid record, in request order
    messages: list[Message]
    #: reject rows as the rejects table holds them (one per rejected record)
    rejects: pa.Table
    #: (key, value) of each dead-letter message (one per rejected record)
    dead_letters: list[tuple[bytes, bytes]]
    #: the first ``max_errors`` field errors, by record index: {"index", "field", "rule", "message"}
    errors: list[dict[str, Any]] = field(default_factory=list)
    #: how many field errors there are in all (``errors`` may hold fewer)
    errors_total: int = 0
    #: the quality gates' window judged at this request (:class:`~features.pipeline.gates.WindowCheck`;
    #: None: the schema has no rate gate)
    gate: WindowCheck | None = None

    @property
    def refused(self) -> bool:
        """A ``fail`` gate tripped at this request: nothing of it is stored or produced."""
        return self.gate is not None and self.gate.tripped

    @property
    def errors_truncated(self) -> bool:
        return self.errors_total > len(self.errors)

    @property
    def accepted(self) -> int:
        return len(self.messages)

    @property
    def rejected(self) -> int:
        return int(self.rejects.num_rows)


#: A batch of queued requests holds at most this many body bytes (at least one request).
MAX_BATCH_BYTES = 4 * 1024 * 1024


@dataclass
class _Job:
    body: bytes
    content_type: str
    request_id: str
    future: Future[Checked]


#: The rejects of a request without any (the rejects table's columns, no row).
_NO_REJECTS = pa.table({"_source": pa.array([], pa.string()), "row_index": pa.array([], pa.int64()),
                        "errors": pa.array([], pa.string()), "raw": pa.array([], pa.string())})


class SchemaIngest:
    """The compiled schema, its transform program, its columnar decoder and its rejects
    writer, for one worker. ``open`` connects to Postgres (SinkUnavailable naming the
    address; SinkError when the tables belong to another fingerprint). ``max_records``,
    ``max_errors`` and ``max_queued_bytes``: see the module docstring."""

    def __init__(self, compiled: CompiledSchema, settings: Settings, *, topic: str,
                 dead_letter_topic: str | None, run_id: str, max_records: int = MAX_RECORDS,
                 max_errors: int = MAX_ERRORS, max_queued_bytes: int = MAX_QUEUED_BYTES) -> None:
        schema = compiled.schema
        assert schema.entity is not None, "only loadable schemas are served"
        self.compiled = compiled
        self.name = compiled.name
        self.topic = topic
        self.dead_letter_topic = dead_letter_topic
        self.run_id = run_id
        self.max_records = max_records
        self.max_errors = max_errors
        self.max_queued_bytes = max_queued_bytes
        self.entity: str = schema.entity
        self.max_bytes = schema.payload.max_bytes
        self.program = transform_program(compiled, settings)
        self.decoder = ColumnarDecoder(schema, max_bytes=self.max_bytes)
        #: the rate gates over the last N records this worker checked (docs/operations.md)
        self.window = GateWindow(compiled)
        # a request waits for these: a short retry budget, then 503 (the client retries)
        self.pg = PostgresSink(settings.postgres_dsn, compiled, retries=2, backoff_s=0.2)
        self.settings = settings
        #: every dead letter stays under this (the topic's limit, read at open)
        self.dead_letter_max_bytes = 0
        self._breaching: set[str] = set()  # the gates breached at the last request judged
        self._decode_lock = threading.Lock()  # the decoder learns read types: one batch at a time
        self._pg_lock = threading.Lock()      # one connection
        self._queue: list[_Job] = []
        self._queued_bytes = 0
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        """Connect to Postgres, read the dead-letter topic's size limit (a dead letter
        must fit it, or the broker refuses it: :func:`features.stream.kafka.dead_letter_limit`)
        and start the thread that checks the requests' bodies."""
        self.pg.open()
        if self.dead_letter_topic:
            # short: a broker that is down must not hold the service's start for long
            self.dead_letter_max_bytes = dead_letter_limit(self.settings, self.dead_letter_topic,
                                                           producer_max_bytes(self.max_bytes), timeout_s=3.0)
        self._thread = threading.Thread(target=self._run, name=f"check-{self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the checking thread (after the requests queued) and close the connection."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(30)
        with self._pg_lock:
            self.pg.close()

    # --- requests are checked in batches ------------------------------------------------

    def submit(self, body: bytes, content_type: str, request_id: str) -> Future[Checked]:
        """Queue a request body for :meth:`check_many`; the future holds its
        :class:`Checked`, or raises BadBody (the body is refused whole; TooManyRecords past
        ``max_records``). Requests that arrive while a batch is being checked are checked
        together next, so concurrent small requests share ``prepare_records``' fixed cost.
        Raises IngestBusy (nothing queued) when the queue would go past
        ``max_queued_bytes``; a body alone in the queue always fits."""
        job = _Job(body, content_type, request_id, Future())
        with self._wake:
            if self._queue and self._queued_bytes + len(body) > self.max_queued_bytes:
                raise IngestBusy(f"schema {self.name}: {self._queued_bytes:,} bytes of requests are waiting "
                                 f"to be checked, the limit is {self.max_queued_bytes:,} "
                                 "(--max-queued-bytes); retry shortly", limit=self.max_queued_bytes,
                                 queued=self._queued_bytes)
            self._queue.append(job)
            self._queued_bytes += len(body)
            self._wake.notify()
        return job.future

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return
                take, size = 0, 0
                while take < len(self._queue) and (take == 0 or size + len(self._queue[take].body)
                                                   <= MAX_BATCH_BYTES):
                    size += len(self._queue[take].body)
                    take += 1
                batch, self._queue = self._queue[:take], self._queue[take:]
                self._queued_bytes -= size
            parsed: list[tuple[_Job, list[bytes]]] = []
            for job in batch:
                try:
                    parsed.append((job, split_body(job.body, job.content_type, self.max_records)))
                except BadBody as exc:
                    job.future.set_exception(exc)
            if not parsed:
                continue
            try:
                results = self.check_many([(records, job.request_id) for job, records in parsed])
            except BaseException as exc:  # a bug: every request of the batch answers 500 (logged there)
                for job, _ in parsed:
                    job.future.set_exception(exc)
                continue
            for (job, _), result in zip(parsed, results, strict=True):
                job.future.set_result(result)

    def check(self, records: list[bytes], request_id: str) -> Checked:
        """Decode, validate and transform the records of one request (see the module docstring)."""
        return self.check_many([(records, request_id)])[0]

    def check_many(self, requests: Sequence[tuple[list[bytes], str]]) -> list[Checked]:
        """:meth:`check` for several requests at once: one ``prepare_records`` call over all
        their records (its fixed cost, a few milliseconds, paid once), the outcome split
        back per request. Each record keeps its own request's URI and index."""
        values: list[bytes] = []
        uris: list[str] = []
        starts: list[int] = []
        for records, request_id in requests:
            starts.append(len(values))
            values.extend(records)
            uris.extend(record_uri(request_id, i) for i in range(len(records)))
        now = dt.datetime.now(dt.UTC)
        c = self.compiled
        ctx = RunContext(c.name, c.schema.version_str, c.fingerprint, self.run_id, now)
        # row_index of a reject = its position here (made the request's own index below)
        positions = np.arange(len(values), dtype=np.int64)
        with self._decode_lock:
            part = prepare_records(values, pa.array(uris, pa.string()), positions, c, self.program, ctx, now,
                                   decoder=self.decoder)
        prepared = part.prepared
        first = np.asarray(starts, dtype=np.int64)
        index = prepared.index if prepared.index is not None else np.zeros(0, dtype=np.int64)
        entities = pc.cast(prepared.rows.column(self.entity), pa.string()).to_pylist() if len(index) else []
        out = [Checked(len(records), [], _NO_REJECTS, []) for records, _ in requests]
        owner = np.searchsorted(first, index, side="right") - 1
        for pos, job, entity in zip(index.tolist(), owner.tolist(), entities, strict=True):
            out[job].messages.append((entity.encode() if entity is not None else None, values[pos],
                                      [(SOURCE_HEADER, uris[pos].encode())]))
        rejects = prepared.rejects
        if self.window.active:
            with self._decode_lock:  # one window per schema and worker
                self._judge(out, first, part.entries)
        if rejects.num_rows:
            at = rejects.column("row_index").to_numpy()
            jobs = np.searchsorted(first, at, side="right") - 1
            local = rejects.set_column(rejects.schema.get_field_index("row_index"), "row_index",
                                       pa.array(at - first[jobs], pa.int64()))
            entries = part.entries
            entry_at = entries.column("row").to_numpy()
            entry_jobs = np.searchsorted(first, entry_at, side="right") - 1
            entries = entries.set_column(entries.schema.get_field_index("row"), "row",
                                         pa.array(entry_at - first[entry_jobs], pa.int64()))
            for job in np.unique(jobs).tolist():
                mine = local.filter(pa.array(jobs == job))
                errors, total = self._errors(entries.filter(pa.array(entry_jobs == job)))
                dead = (dead_letter_messages(mine, c, self.run_id,
                                             max_message_bytes=self.dead_letter_max_bytes)
                        if self.dead_letter_topic else [])
                out[job] = Checked(out[job].records, out[job].messages, mine, dead, errors, total,
                                   out[job].gate)
        return out

    def _judge(self, out: list[Checked], first: npt.NDArray[np.int64], entries: pa.Table) -> None:
        """Each request of ``out`` (in arrival order; ``first``: its first record's position)
        judged by the window as one micro-batch: the gates over the last N records up to each
        of its records (docs/operations.md, "Quality gates"). A request that trips a ``fail``
        gate is not added to the window. The verdict of the last request where a breach
        started or that was refused is recorded in ``featureline_gate_verdicts`` under the
        worker's run (the UI's Runs pages)."""
        at = np.asarray(entries.column("row").to_numpy(), dtype=np.int64)
        jobs = np.searchsorted(first, at, side="right") - 1
        rules = entries.column("rule").combine_chunks().cast(pa.string())
        record = None
        for job, checked in enumerate(out):
            mask = jobs == job
            rows = at[mask] - first[job]
            flags = np.zeros(checked.records, dtype=np.bool_)
            flags[rows] = True
            checked.gate = check = self.window.observe(flags, rows, rules.filter(pa.array(mask)))
            if check.verdict is None:
                continue
            breached = {r.gate.name for r in check.verdict.breaches}
            if check.tripped or breached - self._breaching:
                record = check.verdict
            self._breaching = breached
        if record is not None:  # a breach started or a request was refused: where the UI reads it
            try:
                with self._pg_lock:
                    self.pg.record_gate_verdict(self.run_id, record.as_rows(refused=False))
            except SinkError as exc:  # the requests' answers do not wait on it (the log has it)
                log.warning("ingest: the quality gates' verdict was not recorded: %s", exc,
                            extra={"schema": self.name, "run_id": self.run_id})

    def _errors(self, entries: pa.Table) -> tuple[list[dict[str, Any]], int]:
        """(the first ``max_errors`` field errors of one request's reject entries
        (``PreparedRecords.entries``, ``row`` the record's index in the request), by record
        index, a record's errors in their order; how many there are in all). Only those
        listed become dicts. Texts read as the rejects table's ``errors`` JSON gives them
        back (a NUL character as the text ``\\u0000``)."""
        order = pc.sort_indices(entries.column("row"))  # stable: a record's errors keep their order
        head = entries.take(order.slice(0, self.max_errors))
        listed = {name: _as_stored(head.column(name)).to_pylist() for name in ("field", "rule", "message")}
        errors = [{"index": i, "field": f, "rule": r, "message": m}
                  for i, f, r, m in zip(head.column("row").to_pylist(), listed["field"], listed["rule"],
                                        listed["message"], strict=True)]
        return errors, entries.num_rows

    def write_rejects(self, rejects: pa.Table) -> int:
        """Insert reject rows into the rejects table (a retried request inserts none twice:
        rejects are unique per source URI). SinkUnavailable when Postgres is unreachable."""
        with self._pg_lock:
            return self.pg.insert_rejects(rejects)


def _as_stored(texts: pa.ChunkedArray) -> pa.ChunkedArray:
    """``texts`` as the rejects table's ``errors`` JSON holds them: a NUL character is the
    six characters ``\\u0000`` there (jsonb refuses the escape)."""
    return pc.replace_substring(texts, "\x00", "\\u0000")
