"""Writing prepared batches to every sink, in parallel, counting exactly.

:class:`BatchWriter` prepares each batch (:func:`features.pipeline.prepare.process_batch`)
and hands each sink one :class:`~features.sinks.base.WriteUnit` on its own thread;
:func:`account` adds each unit's outcome to the run's summary (and metrics).
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.lineage import RunContext
from features.observe.metrics import RunMetrics
from features.observe.progress import Progress
from features.pipeline.prepare import Prepared, process_batch
from features.pipeline.summary import MAX_EXAMPLES, RunSummary, SinkStats
from features.sinks.base import Sink, WriteResult, WriteUnit
from features.sources.base import SourceBatch

if TYPE_CHECKING:
    from features.kernels import TransformProgram


def account(summary: RunSummary, prepared: Prepared, read: int, results: dict[str, Any],
            primary: str, metrics: RunMetrics | None = None, event_time: str | None = None) -> None:
    """Add one unit's outcome to ``summary`` (and to ``metrics``, by the same amounts);
    ``primary`` is the sink whose stored count defines ``stored`` (the cold store);
    ``event_time`` names the rows' event time column (for the freshness metric)."""
    summary.read += read
    summary.units += 1
    res = results.get(primary)
    if res is not None and res.skipped:
        summary.already_present += read
        summary.skipped_units += 1
        if metrics is not None:
            metrics.unit(read=read, stored=0, rejected=0, already_present=read, by_rule={})
        return
    # rejects the primary already held (an earlier run read those records) are already
    # present, as valid rows it held are: ``rejected`` is what this run stored
    held = res.rejects_held if res is not None else None
    rejected = prepared.rejected_rows - (len(held) if held is not None else 0)
    by_rule, examples = prepared.reasons(held)
    summary.rejected += rejected
    summary.by_rule.update(by_rule)
    for rule, ex in examples.items():
        have = summary.examples.setdefault(rule, [])
        have.extend(ex[: MAX_EXAMPLES - len(have)])
    valid = prepared.rows.num_rows
    stored = res.stored if res is not None else valid
    present = valid - stored + prepared.rejected_rows - rejected
    summary.stored += stored
    summary.already_present += present
    if metrics is not None:
        metrics.unit(read=read, stored=stored, rejected=rejected, already_present=present, by_rule=by_rule)
        newest = newest_event_time(prepared.rows, event_time)
        if newest is not None:
            metrics.event_time(newest)


def newest_event_time(rows: pa.Table, column: str | None) -> float | None:
    """The newest value of ``column`` in ``rows`` as Unix seconds (a naive timestamp is
    UTC, a date its midnight UTC); None without rows, column or non-null value."""
    if column is None or rows.num_rows == 0 or column not in rows.column_names:
        return None
    newest = pc.max(rows.column(column)).as_py()
    if isinstance(newest, dt.datetime):
        return (newest if newest.tzinfo is not None else newest.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(newest, dt.date):
        return dt.datetime.combine(newest, dt.time(), dt.UTC).timestamp()
    return None


def _finish_unit(summary: RunSummary, pending: _Pending, primary: str, progress: Progress | None,
                 metrics: RunMetrics | None = None, event_time: str | None = None) -> None:
    """Wait for one unit's writes (in submission order) and account for them."""
    results: dict[str, Any] = {}
    for name, fut in pending.futures.items():
        res = fut.result()  # a sink's final error (after its retries) propagates here
        results[name] = res
        stats = summary.sinks[name]
        stats.seconds += res.seconds
        if res.skipped:
            stats.skipped_units += 1
        else:
            stats.written += res.stored
            stats.unchanged += res.already_present
            if metrics is not None:
                metrics.write(name, res.seconds)
    for name in pending.skipped:
        summary.sinks[name].skipped_units += 1
    held = results.get(primary)
    if primary and (held is None or held.skipped or held.stored == 0):
        # the primary already held every row of the unit: what another store wrote of it,
        # that store had lost (or never got)
        for name, res in results.items():
            if name != primary and not res.skipped:
                summary.sinks[name].restored += res.stored
    if primary and primary not in results:
        # the primary committed this unit in an earlier run; only other sinks caught up
        results[primary] = WriteResult(skipped=True)
    account(summary, pending.prepared, pending.read, results, primary, metrics, event_time)
    if progress:
        progress.update(summary)


class Guard(Protocol):
    """What keeps a writer and a migration of its schema apart
    (:class:`features.sinks.postgres.WriterGuard`)."""

    def enter(self, drain: Callable[[], None]) -> None: ...

    def release(self) -> None: ...


@dataclass
class _Pending:
    prepared: Prepared
    read: int
    futures: dict[str, Future[WriteResult]]
    skipped: list[str]


class BatchWriter:
    """Prepares batches and writes them to every sink, counting exactly.

    The batch loader (:func:`run`) and the streaming job share it. Each sink writes on
    its own thread, units in submission order, while the caller prepares the next
    batch: the stores work in parallel with each other and with us. At most
    ``in_flight`` units are prepared but not yet written, which bounds memory.
    :meth:`drain` waits for everything submitted (the stream calls it at the end of each
    micro-batch, so a checkpoint never covers rows that are not written). A sink's
    error (after its own bounded retries) propagates from :meth:`submit` or
    :meth:`drain` once the writes already started have finished. With ``metrics``, every
    unit accounted in ``summary`` is counted there too (same amounts), with each store's
    write seconds and the newest event time written. With ``guard``, each unit is written
    only once ``guard.enter`` lets it (a migration of the schema waiting first drains the
    units in flight, then stops the writer with SinkError); the caller releases it.
    """

    def __init__(self, compiled: CompiledSchema, sinks: Sequence[Sink], *, summary: RunSummary,
                 program: TransformProgram | None = None, progress: Progress | None = None,
                 in_flight: int = 2,
                 committed: dict[str, set[str]] | None = None,
                 observer: Callable[[pa.Table], None] | None = None,
                 metrics: RunMetrics | None = None, guard: Guard | None = None) -> None:
        self.compiled = compiled
        self.metrics = metrics
        self.guard = guard
        self._event_time = compiled.schema.event_time
        #: called with every batch's valid rows, in order, committed units included (the
        #: aggregations' backfill reads them)
        self.observer = observer
        self.sinks = list(sinks)
        self.summary = summary
        self.program = program
        self.progress = progress
        self.in_flight = in_flight
        self.primary = self.sinks[0].name if self.sinks else ""
        self.committed = committed if committed is not None else {s.name: set() for s in self.sinks}
        for s in self.sinks:
            summary.sinks.setdefault(s.name, SinkStats())
        self._pools = {s.name: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sink-{s.name}")
                       for s in self.sinks}
        self._queue: deque[_Pending] = deque()

    def submit(self, sb: SourceBatch, *, ctx: RunContext, reference_time: dt.datetime | None = None) -> None:
        """Prepare ``sb`` (:func:`~features.pipeline.prepare.process_batch`) and start its
        writes to every sink whose ledger does not hold its unit yet."""
        unit = sb.lineage.unit
        todo = [s for s in self.sinks if unit is None or unit not in self.committed[s.name]]
        prepared = (process_batch(sb, self.compiled, self.program, ctx, reference_time or ctx.ingested_at)
                    if todo or self.observer is not None else None)
        self._start(prepared, sb.batch.num_rows if isinstance(sb.batch, pa.RecordBatch) else len(sb.batch),
                    todo, unit, sb.lineage.content)

    def write(self, prepared: Prepared, *, read: int, counted: str | None = None) -> None:
        """Start the writes of rows prepared by the caller, outside any ledger unit (a
        stream's micro-batch: ``read`` counts its records, those that never decoded into a
        row too, whose rejects ``prepared`` carries). ``counted``: the kind of run
        (``stream``) whose per-run counts the stores add this write's to, in its own
        transaction (``WriteUnit.counted``); None: not counted."""
        self._start(prepared, read, list(self.sinks), None, None, counted)

    def _start(self, prepared: Prepared | None, n: int, todo: list[Sink], unit: str | None,
               content: str | None, counted: str | None = None) -> None:
        """Hand one unit to the sinks in ``todo`` (``prepared`` is None only when none
        is left and nothing observes the rows: the unit is counted already present)."""
        summary = self.summary
        if self.observer is not None:
            assert prepared is not None
            self.observer(prepared.rows)
        if not todo:
            summary.read += n
            summary.units += 1
            summary.already_present += n
            summary.skipped_units += 1
            for s in self.sinks:
                summary.sinks[s.name].skipped_units += 1
            if self.metrics is not None:
                self.metrics.unit(read=n, stored=0, rejected=0, already_present=n, by_rule={})
            if self.progress:
                self.progress.update(summary)
            return
        assert prepared is not None
        while len(self._queue) >= self.in_flight:
            _finish_unit(summary, self._queue.popleft(), self.primary, self.progress, self.metrics,
                         self._event_time)
        if self.guard is not None:
            self.guard.enter(self.drain)
        write = WriteUnit(prepared.rows, prepared.rejects, unit, n, content, counted)
        futures = {}
        for s in todo:
            futures[s.name] = self._pools[s.name].submit(s.write, write)
        self._queue.append(_Pending(prepared, n, futures, [s.name for s in self.sinks if s not in todo]))

    def drain(self) -> None:
        """Wait for every submitted write and account for it."""
        while self._queue:
            _finish_unit(self.summary, self._queue.popleft(), self.primary, self.progress, self.metrics,
                         self._event_time)

    def close(self) -> None:
        """Let the writes already submitted finish (they commit or fail on their own)."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
