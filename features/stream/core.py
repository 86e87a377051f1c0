"""One micro-batch of Kafka records -> validate -> transform -> Redis + Postgres + dead letters.

:class:`StreamProcessor` is what the PyFlink job runs inside its Python operator, and
what the benchmark's plain confluent-kafka consumer loop calls: its records are prepared
by the pipeline's own step (:func:`features.pipeline.prepare.prepare_records`: decoded by
:mod:`features.sources.records`, then the batch loader's
:func:`~features.pipeline.prepare.process_batch`) and written by the batch loader's
:class:`features.pipeline.write.BatchWriter`.

``process(...)`` returns only after every row of the micro-batch is written to both
stores and every reject is in the rejects table and acknowledged by the dead-letter
topic, so a Flink checkpoint taken after it never covers a row that is not stored.
Writes are idempotent (Postgres: one row per event, keyed by entity, event time and
content digest; Redis: newest event wins; rejects: unique per source record), so a replay after a failure
changes nothing. Each chunk's Postgres transaction also adds its counts to the run's row of
``featureline_run_counts`` (:data:`STREAM_RUN`; a replayed chunk's rows count already
present), the Runs page's figures.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, Producer, TopicPartition

from features.aggregate.engine import AggSpec
from features.aggregate.stream import StreamAggregator
from features.aggregate.writer import AggregateCounts, AggregateWriter
from features.compile import CompiledSchema
from features.config import Settings
from features.errors import GateBreached, SinkError
from features.kernels import transform_program
from features.lineage import RunContext
from features.observe.logs import fields
from features.observe.metrics import RunMetrics
from features.pipeline.gates import GateVerdict, GateWindow, WindowCheck
from features.pipeline.prepare import PreparedRecords, prepare_records
from features.pipeline.summary import RunSummary
from features.pipeline.write import BatchWriter
from features.sinks.dead_letter import (
    BROKER_DEFAULT_MAX_MESSAGE_BYTES,
    RECORD_OVERHEAD_BYTES,
    dead_letter_messages,
    producer_max_bytes,
)
from features.sinks.postgres import WriterGuard
from features.sinks.stores import aggregate_stores, store_sinks
from features.sources.columnar import ColumnarDecoder
from features.sources.records import TopCounter, record_uris
from features.stream.kafka import client_config, dead_letter_limit

log = logging.getLogger("features.stream")

#: The kind of run a stream's micro-batches are counted under (``featureline_run_counts``,
#: the Runs page's ``kind``).
STREAM_RUN = "stream"
#: Records per chunk of a micro-batch (``StreamProcessor.chunk_records``); see bench/RESULTS.md.
DEFAULT_CHUNK_RECORDS = 8000
#: Latency histogram: 1 ms buckets up to 10 minutes (the last bucket holds the rest).
_LATENCY_BUCKETS = 600_000
#: With metrics on, the consumer lag is refreshed at least this often (seconds).
_LAG_EVERY_S = 5.0


@dataclass
class StreamStats:
    """Counts and timings of one processor (one Flink subtask, or the consumer loop)."""

    summary: RunSummary
    batches: int = 0
    dead_letters: int = 0
    #: records that took the per-record decode (not the columnar fast path)
    slow_records: int = 0
    #: per unknown JSON key, the records holding a value: bounded (the top keys + ``other``)
    unknown_fields: TopCounter = field(default_factory=TopCounter)
    offsets: dict[str, int] = field(default_factory=dict)     # "topic/partition" -> next offset
    lag: dict[str, int] = field(default_factory=dict)          # "topic/partition" -> records behind
    newest_event_time: str | None = None
    latency_ms: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(_LATENCY_BUCKETS, dtype=np.int64))
    started: float = field(default_factory=time.time)
    #: the windowed aggregations' counts (the aggregator's, shared), if the schema has any
    aggregations: AggregateCounts | None = None
    #: the breaker's record (:meth:`StreamProcessor.judge`): None when the schema has no rate gate
    gates: dict[str, Any] | None = None

    def latency_quantile(self, q: float) -> float | None:
        """The q-quantile (0..1) of produce -> stored latency in ms (1 ms resolution)."""
        total = int(self.latency_ms.sum())
        if total == 0:
            return None
        cum = np.cumsum(self.latency_ms)
        return float(np.searchsorted(cum, q * total, side="left"))

    def as_dict(self) -> dict[str, Any]:
        s = self.summary
        elapsed = max(time.time() - self.started, 1e-9)
        return {
            **s.as_dict(), "seconds": round(elapsed, 3), "rows_per_second": round(s.read / elapsed),
            "batches": self.batches, "dead_letters": self.dead_letters, "slow_records": self.slow_records,
            **_unknown_summary(self.unknown_fields), "next_offsets": dict(self.offsets),
            "lag": dict(self.lag), "lag_total": sum(self.lag.values()) if self.lag else None,
            "newest_event_time": self.newest_event_time,
            "latency_ms": {"p50": self.latency_quantile(0.5), "p99": self.latency_quantile(0.99)},
            **({"aggregations": self.aggregations.as_dict()} if self.aggregations is not None else {}),
            **({"gates": self.gates} if self.gates is not None else {}),
        }


def _unknown_summary(unknown: TopCounter) -> dict[str, Any]:
    """``unknown_fields`` (the top keys, largest first) and ``unknown_fields_other`` (the
    records counted for every other key) of a summary."""
    top, other = unknown.shown()
    return {"unknown_fields": top, "unknown_fields_other": other}


class StreamProcessor:
    """Validate, transform and write micro-batches of Kafka records (see module docstring)."""

    def __init__(self, compiled: CompiledSchema, settings: Settings, *, run_id: str,
                 dead_letter_topic: str | None, search_path: str | None = None, key_prefix: str = "",
                 log_every_s: float = 10.0, instance: str = "", metrics: RunMetrics | None = None,
                 chunk_records: int = DEFAULT_CHUNK_RECORDS) -> None:
        self.compiled = compiled
        self.settings = settings
        self.run_id = run_id
        self.dead_letter_topic = dead_letter_topic
        self.log_every_s = log_every_s
        self.instance = instance
        self.program = transform_program(compiled, settings)
        schema = compiled.schema
        self.max_bytes = schema.payload.max_bytes
        #: a micro-batch is prepared and written in chunks of this many records, the next
        #: chunk prepared while the stores write the last (see ``process``)
        self.chunk_records = chunk_records
        #: the columnar fast path (None: every record per record, as before it existed)
        self.decoder: ColumnarDecoder | None = ColumnarDecoder(schema, max_bytes=self.max_bytes)
        self.pg, self.hot = store_sinks(compiled, settings, search_path=search_path, key_prefix=key_prefix)
        #: held through each micro-batch: a migration of the schema waits for the one in
        #: flight, then stops the stream before its next (docs/evolution.md)
        self.guard = WriterGuard(settings.postgres_dsn, compiled, search_path=search_path, what="stream",
                                 retries=settings.store_retries, backoff_s=settings.store_backoff_s)
        self.stats = StreamStats(RunSummary(run_id=run_id, schema=compiled.name))
        #: counts what ``stats`` counts, plus lag and latency (``features.observe.metrics``)
        self.metrics = metrics
        self._writer: BatchWriter | None = None
        #: the schema's windowed aggregations, computed in the micro-batch (None: it has none)
        self.aggregator: StreamAggregator | None = None
        spec = AggSpec.of(schema)
        if spec is not None:
            stores = aggregate_stores(compiled, settings, search_path=search_path, key_prefix=key_prefix)
            self.aggregator = StreamAggregator(spec, AggregateWriter(compiled, stores))
            self.stats.aggregations = self.aggregator.counts
        self._producer: Any = None
        #: the largest dead letter the topic takes (bytes; read from the broker in ``open``)
        self.dead_letter_max_bytes = BROKER_DEFAULT_MAX_MESSAGE_BYTES
        self._lag_client: Any = None
        self._last_log = time.time()
        self._last_lag = 0.0
        self._delivery_errors: list[str] = []
        #: the breaker: the schema's rate gates over the last N records (docs/operations.md)
        self.window = GateWindow(compiled)
        self._breaching: set[str] = set()  # the gates breached at the last micro-batch judged
        if self.window.active:
            self.stats.gates = {"window_records": self.window.size,
                                "window_min_records": self.window.least, "breached_batches": {},
                                "worst": {}, "last_breach": None, "tripped": None}
        self.last_rows: pa.Table = pa.table({})
        self.last_uris: pa.Array = pa.array([], pa.string())

    # --- lifecycle ------------------------------------------------------------------

    def open(self) -> None:
        """Connect to both stores (an unreachable one raises SinkUnavailable naming it)
        and to Kafka for the dead-letter topic."""
        for sink in (self.hot, self.pg):
            sink.open()
        if self.aggregator is not None:
            self.aggregator.writer.open()
        self.guard.open()
        self._writer = BatchWriter(self.compiled, [self.pg, self.hot], summary=self.stats.summary,
                                   program=self.program, in_flight=2, metrics=self.metrics, guard=self.guard)
        if self.dead_letter_topic:
            # a dead letter must fit the topic, or the broker refuses it and the micro-batch
            # fails on every replay: each message, and each batch of them, stays under the
            # smaller of the topic's limit and the producer's
            producer_max = producer_max_bytes(self.max_bytes)
            self.dead_letter_max_bytes = dead_letter_limit(self.settings, self.dead_letter_topic,
                                                           producer_max)
            self._producer = Producer(client_config(
                self.settings.kafka_bootstrap, self.settings.kafka_properties, **{
                    "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                    "message.max.bytes": producer_max,
                    # librdkafka's default is 1,000,000: a batch of small dead letters
                    # must not outgrow a topic whose limit is lower
                    "batch.size": min(1_000_000, self.dead_letter_max_bytes - RECORD_OVERHEAD_BYTES)}))

    def close(self) -> None:
        try:
            if self._producer is not None:
                self._producer.flush(30)
            if self._writer is not None:
                self._writer.close()
        finally:
            self.guard.close()
            for sink in (self.pg, self.hot):
                sink.close()
            if self.aggregator is not None:
                self.aggregator.writer.close()
            if self._lag_client is not None:
                self._lag_client.close()
                self._lag_client = None

    # --- one micro-batch -------------------------------------------------------------

    def process(self, values: Sequence[bytes | None], topics: pa.Array, partitions: pa.Array,
                offsets: pa.Array, timestamps_ms: npt.NDArray[np.int64] | None = None,
                via: pa.Array | None = None) -> npt.NDArray[np.int8]:
        """Write one micro-batch; returns per record 0 (a row for the stores) or 1 (rejected).
        ``via``: per record, its ``featureline-source`` header (bytes or null), kept in the
        lineage after the Kafka coordinates when valid (:func:`record_uris`)."""
        assert self._writer is not None, "open() first"
        n = len(values)
        outcome = np.zeros(n, dtype=np.int8)
        if n == 0:
            return outcome
        try:
            return self._process(values, topics, partitions, offsets, timestamps_ms, via, outcome)
        finally:
            self.guard.release()  # nothing in flight between micro-batches: a migration may run

    def _process(self, values: Sequence[bytes | None], topics: pa.Array, partitions: pa.Array,
                 offsets: pa.Array, timestamps_ms: npt.NDArray[np.int64] | None, via: pa.Array | None,
                 outcome: npt.NDArray[np.int8]) -> npt.NDArray[np.int8]:
        assert self._writer is not None
        n = len(values)
        now = dt.datetime.now(dt.UTC)
        ctx = RunContext(self.compiled.name, self.compiled.schema.version_str, self.compiled.fingerprint,
                         self.run_id, now)
        uris = record_uris(topics, partitions, offsets, via)
        offs = np.asarray(pa.array(offsets).cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
        # Chunks of the micro-batch are prepared while the stores write the previous one
        # (BatchWriter, two units in flight); everything is written before this returns.
        # With rate gates the whole micro-batch is prepared before any of it is written: the
        # breaker judges it first, and a tripped micro-batch stores nothing but its rejects.
        step = max(self.chunk_records, 1)
        gated = self.window.active
        rows: list[pa.Table] = []
        rejects: list[pa.Table] = []
        parts: list[tuple[int, PreparedRecords]] = []
        sent = 0
        for start in range(0, n, step):
            stop = min(start + step, n)
            chunk = values[start:stop] if start or stop < n else values
            part = prepare_records(chunk, uris.slice(start, stop - start), offs[start:stop], self.compiled,
                                   self.program, ctx, now, decoder=self.decoder)
            parts.append((start, part))
            if not gated:
                self._learn(part)
                sent += self._write_part(part, stop - start)
            rows.append(part.prepared.rows)
            rejects.append(part.prepared.rejects)
        if gated:
            self.judge(parts, n, topics, partitions, offs)
            for i, (start, part) in enumerate(parts):
                stop = parts[i + 1][0] if i + 1 < len(parts) else n
                self._learn(part)
                sent += self._write_part(part, stop - start)
        merged_rows = rows[0] if len(rows) == 1 else pa.concat_tables(rows)
        # the aggregations are computed while the last chunks' rows are written, and written
        # after them (an aggregation row never exists without its history row)
        plan = self.aggregator.plan(merged_rows, ctx) if self.aggregator is not None else None
        self._writer.drain()
        self._flush_dead_letters(sent)
        merged_rejects = rejects[0] if len(rejects) == 1 else pa.concat_tables(rejects)
        self._account(merged_rows, merged_rejects, uris, topics, partitions, offs, timestamps_ms, outcome)
        if self.aggregator is not None and plan is not None:
            done = self.aggregator.commit(plan)
            if self.metrics is not None:
                self.metrics.aggregation(accepted=done.accepted, late=done.late, duplicates=done.duplicates)
        self.last_rows, self.last_uris = merged_rows, uris
        return outcome

    def _learn(self, part: PreparedRecords) -> None:
        """The aggregations' state of the chunk's entities read back before its rows are
        written (``StreamAggregator.learn``)."""
        if self.aggregator is not None and part.prepared.rows.num_rows:
            self.aggregator.learn(part.prepared.rows)

    def _write_part(self, part: PreparedRecords, records: int) -> int:
        """Hand one prepared chunk (``records`` records) to the writer and its rejects to the
        dead-letter topic; returns the dead letters sent."""
        assert self._writer is not None
        self._writer.write(part.prepared, read=records, counted=STREAM_RUN)
        self.stats.unknown_fields.update(part.unknown_fields)
        self.stats.slow_records += part.slow
        return self._produce_dead_letters(part.prepared.rejects)

    # --- the breaker -------------------------------------------------------------------

    def judge(self, parts: Sequence[tuple[int, PreparedRecords]], n: int, topics: pa.Array,
              partitions: pa.Array, offs: npt.NDArray[np.int64]) -> WindowCheck:
        """The breaker (docs/operations.md, "Quality gates"): the micro-batch's records (``parts``:
        each chunk's first record and its prepared records) judged by the sliding window.
        A breached ``warn`` gate is counted (metrics, summary) and logged when it starts; a
        breached ``fail`` gate stores the micro-batch's rejects alone and raises
        GateBreached, which stops the job before any of its rows is stored. The verdict
        of a micro-batch where a breach starts, and of the one that trips, is recorded in
        ``featureline_gate_verdicts`` under the run (the UI's Runs pages show it)."""
        rejected = np.zeros(n, dtype=np.bool_)
        rows, rules = [], []
        for start, part in parts:
            at = np.asarray(part.entries.column("row").to_numpy(), dtype=np.int64) + start
            rejected[at] = True
            rows.append(at)
            rules.append(part.entries.column("rule").combine_chunks().cast(pa.string()))
        check = self.window.observe(rejected, np.concatenate(rows) if rows else np.zeros(0, np.int64),
                                    pa.concat_arrays(rules) if rules else pa.array([], pa.string()))
        verdict = check.verdict
        record = self.stats.gates
        assert record is not None
        if verdict is None:
            return check
        started = any(r.breached and r.gate.name not in self._breaching for r in verdict.results)
        for r in verdict.results:
            if self.metrics is not None:
                self.metrics.gate(r.gate.name, r.gate.on_breach, float(r.measured), breached=r.breached)
            name = r.gate.name
            if r.breached:
                if name not in self._breaching:  # logged when a breach starts, counted every time
                    log.warning("stream: quality gate breached (%s): %s over the last %s records",
                                r.gate.on_breach, r.describe(verdict.counts.read), f"{verdict.counts.read:,}",
                                extra={"schema": self.compiled.name, "gate": name,
                                       "on_breach": r.gate.on_breach, "measured": r.measured})
                record["breached_batches"][name] = record["breached_batches"].get(name, 0) + 1
                record["worst"][name] = max(record["worst"].get(name, 0.0), float(r.measured))
                self._breaching.add(name)
            else:
                self._breaching.discard(name)
        if verdict.breaches:
            record["last_breach"] = verdict.as_dict()
        if check.tripped:
            assert check.position is not None
            self._trip(check, parts, topics, partitions, offs)
        elif started:  # a breach starts: its verdict where the UI reads a run's gates
            self.pg.record_gate_verdict(self.run_id, verdict.as_rows(refused=False))
        return check

    def _trip(self, check: WindowCheck, parts: Sequence[tuple[int, PreparedRecords]], topics: pa.Array,
              partitions: pa.Array, offs: npt.NDArray[np.int64]) -> None:
        """Stop on a breached ``fail`` gate: the micro-batch's rejects into the rejects table
        (the evidence; unique per record, so the replay after a restart adds none), nothing
        else of it anywhere, and GateBreached naming the gate, the offsets and the owner."""
        verdict = check.verdict
        assert verdict is not None and check.position is not None
        rejects = pa.concat_tables([p.prepared.rejects for _, p in parts])
        stored = self.pg.insert_rejects(rejects) if rejects.num_rows else 0
        self.pg.record_gate_verdict(self.run_id, verdict.as_rows(refused=False))
        keys = pa.table({"t": topics, "p": partitions, "o": pa.array(offs)}).group_by(["t", "p"]).aggregate(
            [("o", "min"), ("o", "max")])
        spans = {f"{t}/{p}": (int(lo), int(hi)) for t, p, lo, hi in zip(
            keys.column("t").to_pylist(), keys.column("p").to_pylist(), keys.column("o_min").to_pylist(),
            keys.column("o_max").to_pylist(), strict=True)}
        pos = check.position
        at = f"{pa.array(topics)[pos].as_py()}/{pa.array(partitions)[pos].as_py()}/{int(offs[pos])}"
        resume = {**self.stats.offsets, **{k: lo for k, (lo, _) in spans.items()}}
        message = breaker_message(verdict, schema=self.compiled.name, run_id=self.run_id, record=at,
                                  window=check.window, spans=spans, resume=resume, rejects_stored=stored)
        assert self.stats.gates is not None
        self.stats.gates["tripped"] = {"message": message, "gates": [r.gate.name for r in verdict.failed],
                                       "record": f"kafka://{at}", "resume_offsets": resume,
                                       "verdict": verdict.as_dict()}
        log.error("stream stopped by its quality gates: %s",
                  "; ".join(r.describe(verdict.counts.read) for r in verdict.failed),
                  extra={"schema": self.compiled.name, "gates": [r.gate.name for r in verdict.failed],
                         "resume_offsets": resume})
        raise GateBreached(message, schema=self.compiled.name, run_id=self.run_id,
                           gates=[r.gate.name for r in verdict.failed], rejects_stored=stored,
                           verdict=verdict)

    def _produce_dead_letters(self, rejects: pa.Table) -> int:
        """Send every reject to the dead-letter topic (key: the record's kafka:// URI);
        :meth:`_flush_dead_letters` waits for the acknowledgements. A loop over rejects
        only: the exception path. Returns how many were sent."""
        if self._producer is None or rejects.num_rows == 0:
            return 0
        errors = self._delivery_errors

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for key, value in dead_letter_messages(rejects, self.compiled, self.run_id,
                                               max_message_bytes=self.dead_letter_max_bytes):
            while True:
                try:
                    self._producer.produce(self.dead_letter_topic, key=key, value=value,
                                           on_delivery=delivered)
                    break
                except BufferError:
                    self._producer.poll(0.1)
        return int(rejects.num_rows)

    def _flush_dead_letters(self, sent: int) -> None:
        """Wait until the broker acknowledged every dead letter sent (before the micro-batch
        counts as written); an unacknowledged or refused one fails the micro-batch."""
        if self._producer is None or sent == 0:
            return
        left = self._producer.flush(60)
        errors, self._delivery_errors = self._delivery_errors, []
        if left or errors:
            raise SinkError(f"dead-letter topic {self.dead_letter_topic!r}: {left} messages not acknowledged"
                            + (f"; {errors[0]}" if errors else ""), store="kafka",
                            address=self.settings.kafka_bootstrap)
        self.stats.dead_letters += sent
        if self.metrics is not None:
            self.metrics.dead_letters(sent)

    def _account(self, rows: pa.Table, rejects: pa.Table, uris: pa.Array, topics: pa.Array,
                 partitions: pa.Array, offs: npt.NDArray[np.int64],
                 timestamps_ms: npt.NDArray[np.int64] | None, outcome: npt.NDArray[np.int8]) -> None:
        stats = self.stats
        stats.batches += 1
        if rejects.num_rows:
            hit = pc.is_in(uris, value_set=rejects.column("_source").combine_chunks())
            outcome[np.asarray(hit.to_numpy(zero_copy_only=False), dtype=np.bool_)] = 1
        done = time.time()
        if timestamps_ms is not None and len(timestamps_ms):
            ms = np.clip((done * 1000 - timestamps_ms).astype(np.int64), 0, _LATENCY_BUCKETS - 1)
            stats.latency_ms += np.bincount(ms, minlength=_LATENCY_BUCKETS)
            if self.metrics is not None:
                self.metrics.latency(np.maximum(done - timestamps_ms / 1000.0, 0.0))
        keys = pa.table({"t": topics, "p": partitions, "o": pa.array(offs)}).group_by(["t", "p"]).aggregate(
            [("o", "max")])
        for t, p, o in zip(keys.column("t").to_pylist(), keys.column("p").to_pylist(),
                           keys.column("o_max").to_pylist(), strict=True):
            stats.offsets[f"{t}/{p}"] = max(stats.offsets.get(f"{t}/{p}", 0), int(o) + 1)
        if rows.num_rows and self.compiled.schema.event_time is not None:  # a static schema has none
            et = rows.column(self.compiled.schema.event_time)
            newest = pc.max(et).as_py()
            if newest is not None:
                text = newest.isoformat() if hasattr(newest, "isoformat") else str(newest)
                if stats.newest_event_time is None or text > stats.newest_event_time:
                    stats.newest_event_time = text
        if done - self._last_log >= self.log_every_s:
            self._last_log = done
            self.update_lag()
            log.info("stream", extra=fields(self.status_line()))
        elif self.metrics is not None and done - self._last_lag >= _LAG_EVERY_S:
            self.update_lag()  # the lag gauge stays fresher than the status lines

    def update_lag(self, timeout: float = 5.0) -> None:
        """Consumer lag per partition seen: the partition's end offset minus our next offset
        (``timeout``: seconds per partition's query)."""
        if not self.stats.offsets:
            return
        self._last_lag = time.time()
        try:
            if self._lag_client is None:
                self._lag_client = Consumer(client_config(
                    self.settings.kafka_bootstrap, self.settings.kafka_properties, **{
                        "group.id": f"featureline-lag-{self.run_id}", "enable.auto.commit": False}))
            for key, nxt in self.stats.offsets.items():
                topic, part = key.rsplit("/", 1)
                _, high = self._lag_client.get_watermark_offsets(TopicPartition(topic, int(part)),
                                                                 timeout=timeout)
                self.stats.lag[key] = max(int(high) - nxt, 0)
                if self.metrics is not None:
                    self.metrics.lag(topic, part, self.stats.lag[key])
        except Exception as exc:  # lag is for display only: never fail the job over it
            log.warning("stream: could not read end offsets for the lag: %s", exc)

    def status_line(self) -> dict[str, Any]:
        """The counts a status line shows."""
        d = {**self.stats.as_dict(), "instance": self.instance}
        return {k: d[k] for k in ("run_id", "instance", "schema", "read", "stored", "rejected",
                                  "already_present",
                                  "rows_per_second", "batches", "lag_total", "newest_event_time",
                                  "latency_ms")}


def breaker_message(verdict: GateVerdict, *, schema: str, run_id: str, record: str, window: int,
                    spans: dict[str, tuple[int, int]], resume: dict[str, int], rejects_stored: int) -> str:
    """What a stream stopped by its breaker says: each breached ``fail`` gate (measured vs
    limit over the window), the record that tripped it, the top reasons, what was stored of
    the micro-batch (its rejects alone), the offsets a restart resumes from, the owner."""
    read = verdict.counts.read
    lines = [f"stream of {schema} stopped: quality gate {r.describe(read)} (on_breach: fail), over the "
             f"last {window:,} records up to kafka://{record}" for r in verdict.failed]
    lines += [f"  also breached (warn): {r.describe(read)}" for r in verdict.warned]
    if verdict.counts.by_rule:
        lines.append("  top reasons: "
                     + ", ".join(f"{rule} ({n:,} records)" for rule, n in verdict.top_reasons()))
    batch = ", ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in sorted(spans.items()))
    lines.append(f"  nothing of the micro-batch that tripped it (offsets {batch}) was stored but its "
                 f"{rejects_stored:,} rejects (run {run_id}, the rejects table)")
    lines.append("  a restart resumes from the last completed checkpoint, at or before offsets "
                 + ", ".join(f"{k} {o}" for k, o in sorted(resume.items()))
                 + ": raise the gate in the schema's quality: section (not a new data version) or fix "
                 "the producer, then start the job again (it resumes from the consumer group's offsets)")
    if verdict.owner:
        lines.append(f"  data owner: {verdict.owner}")
    return "\n".join(lines)
