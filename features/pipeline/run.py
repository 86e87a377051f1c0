"""The loop both jobs share: source -> validate -> transform -> sinks, with exact counts.

``run(source, compiled, sinks, ...)`` reads every batch of ``source``, validates it
with the compiled rules, runs the transform program on the valid rows, attaches
lineage, and hands each sink one :class:`~features.sinks.base.WriteUnit`. The batch
loader and the streaming job call this same code (the stream through
:func:`features.pipeline.prepare.process_batch`, one micro-batch at a time).
:func:`load_source` is the whole load of one source (the stores and the windowed
aggregations opened, the run, the aggregations written): the core of the batch loader
(``features.load``) and of ``FeatureStore.write`` (``features.sdk.write``).

Counts are conserved for every run: ``read == stored + rejected + already_present``
where ``already_present`` counts valid rows the cold store already held, rejected rows
whose reject it already held (an earlier run read the same input record: see
:mod:`features.sinks.postgres` for the key), and every row of a unit the ledger says is
committed. So ``rejected`` counts the rejects this run stored, each under its run id,
however the input was cut into units (``--workers``, Flink's parallelism): a second run
over the same input counts each row one way whatever its shard count. Rejected rows are
never dropped: each goes to the rejects table with its raw values, all its errors and
its lineage.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from features.aggregate.backfill import Collector, backfill
from features.aggregate.engine import AggSpec
from features.aggregate.writer import AggregateWriter
from features.compile import CompiledSchema
from features.config import Settings
from features.kernels import transform_program
from features.lineage import RunContext
from features.observe.metrics import RunMetrics
from features.observe.progress import LineProgress, Progress
from features.pipeline.summary import RunSummary
from features.pipeline.write import BatchWriter, Guard
from features.sinks.base import Sink
from features.sinks.postgres import WriterGuard
from features.sinks.stores import aggregate_stores, store_sinks
from features.sources.base import Source, SourceBatch

if TYPE_CHECKING:
    from features.kernels import TransformProgram

log = logging.getLogger("features.load")


def run(source: Source, compiled: CompiledSchema, sinks: Sequence[Sink], *, ctx: RunContext,
        program: TransformProgram | None = None, reference_time: dt.datetime | None = None,
        progress: Progress | None = None,
        batches: Iterable[SourceBatch] | None = None, in_flight: int = 2,
        observer: Callable[[pa.Table], None] | None = None, metrics: RunMetrics | None = None,
        guard: Guard | None = None) -> RunSummary:
    """Load everything ``source`` yields into ``sinks`` (see :class:`BatchWriter`).

    The first sink is the primary (cold) store whose commit decides ``stored``.
    Sinks must be opened by the caller (so an unreachable store fails before any
    work). Units a sink's ledger already holds are skipped for that sink. ``metrics``
    (``features.observe.metrics.RunMetrics``) counts what ``summary`` counts, as it happens;
    ``guard``: see :class:`BatchWriter`.
    """
    summary = RunSummary(run_id=ctx.run_id, schema=compiled.name)
    committed = {s.name: s.committed_units() for s in sinks}
    t0 = time.perf_counter()
    writer = BatchWriter(compiled, sinks, summary=summary, program=program, progress=progress,
                         in_flight=in_flight, committed=committed, observer=observer, metrics=metrics,
                         guard=guard)
    try:
        for sb in (batches if batches is not None else source.batches()):
            writer.submit(sb, ctx=ctx, reference_time=reference_time)
        writer.drain()
    finally:
        writer.close()
    summary.seconds = time.perf_counter() - t0
    if progress:
        progress.close(summary)
    return summary


def load_source(source: Source, compiled: CompiledSchema, settings: Settings, *,
                search_path: str | None = None, key_prefix: str = "", progress: bool = False, run_id: str,
                metrics: RunMetrics | None = None, started: dict[str, Any] | None = None,
                observer: Callable[[pa.Table], None] | None = None, read_own: bool = False) -> RunSummary:
    """Every batch of ``source`` -> validate -> transform -> both stores (Postgres the
    primary, then Redis; each unit's ledger key skips what a store committed), then the
    windowed aggregations of the schema, if it has any, over the valid rows: the core of
    :func:`load_local` and of ``FeatureStore.write`` (``features.sdk.write``). ``started``:
    more fields of the ``load started`` log line; ``observer``: called with each batch's
    valid rows, in order (committed units included), beside the aggregations' collector;
    ``read_own``: the run id stored other rows before (``features.aggregate.backfill``)."""
    program = transform_program(compiled, settings)
    pg, hot = store_sinks(compiled, settings, search_path=search_path, key_prefix=key_prefix)
    # a migration of the schema waits for the unit in flight, then stops this load
    # between units (docs/evolution.md, "Writers during a migration")
    guard = WriterGuard(settings.postgres_dsn, compiled, search_path=search_path,
                        retries=settings.store_retries, backoff_s=settings.store_backoff_s)
    sinks: list[Sink] = [pg, hot]  # the first is the primary: its commit decides "stored"
    spec = AggSpec.of(compiled.schema)
    aggs = None if spec is None else AggregateWriter(compiled, aggregate_stores(
        compiled, settings, search_path=search_path, key_prefix=key_prefix))
    collector = None if spec is None else Collector(spec)
    try:
        # Redis first: its open() writes no data, so a store that is down stops the
        # run before Postgres applies any DDL or row.
        for first in (hot, pg):
            first.open()
        if aggs is not None:
            aggs.open()
        guard.open()
        now = dt.datetime.now(dt.UTC)
        ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, run_id, now)
        log.info("load started", extra={"schema": compiled.name, **(started or {}),
                                        "rows": source.total_rows})
        observe = _both(collector, observer)
        summary = run(source, compiled, sinks, ctx=ctx, program=program,
                      progress=Progress(source.total_rows, enabled=progress), observer=observe,
                      metrics=metrics, guard=guard)
        if spec is not None and aggs is not None and collector is not None:
            guard.enter(lambda: None)  # the aggregations are written under the same version
            inputs = collector.inputs()
            line = LineProgress("aggregations", None, enabled=progress)
            counts = backfill(spec, inputs, aggs, ctx, progress=line, read_own=read_own)
            line.close(counts.accepted, counts.late)
            summary.aggregations = counts.as_dict()
            if metrics is not None:
                metrics.aggregation(accepted=counts.accepted, late=counts.late, duplicates=counts.duplicates)
        d = summary.as_dict()
        log.info("load finished", extra={k: d[k] for k in ("schema", "read", "stored", "rejected",
                                                           "already_present", "restored", "adds_up", "units",
                                                           "skipped_units", "seconds")})
        return summary
    finally:
        guard.close()
        for s in sinks:
            s.close()  # idempotent; also frees a sink whose open() failed half way
        if aggs is not None:
            aggs.close()


def _both(first: Callable[[pa.Table], None] | None,
          second: Callable[[pa.Table], None] | None) -> Callable[[pa.Table], None] | None:
    """One observer calling ``first`` then ``second`` (either may be None)."""
    if first is None or second is None:
        return first if first is not None else second

    def both(rows: pa.Table) -> None:
        first(rows)
        second(rows)

    return both
