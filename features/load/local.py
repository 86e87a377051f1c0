"""The batch loader in one process: Parquet -> validate -> transform -> both stores, then
the aggregations (``features.load.load`` with the local engine, each ``--workers``
process, each task of ``--engine flink``). :func:`load_source` is that core for any
source (``FeatureStore.write``'s in-memory tables too)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from features.compile import CompiledSchema
from features.config import Settings
from features.kernels import transform_program
from features.lineage import RunContext
from features.observe.metrics import RunMetrics
from features.observe.progress import LineProgress, Progress
from features.pipeline.run import RunSummary, run
from features.sinks.base import Sink
from features.sources.base import Source
from features.sources.parquet import DEFAULT_BATCH_ROWS, ParquetSource

log = logging.getLogger("features.load")


def load_local(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *,
               batch_rows: int = DEFAULT_BATCH_ROWS, search_path: str | None = None, key_prefix: str = "",
               progress: bool = False, run_id: str, metrics: RunMetrics | None = None,
               shard: tuple[int, int] | None = None) -> RunSummary:
    """The loader in this process (one shard of the entities with ``shard``): what
    :func:`features.load.load` runs for the local engine, and what each Flink task and
    each worker process runs (see its docstring for the guarantees)."""
    source = ParquetSource(paths, compiled, batch_rows=batch_rows, shard=shard)
    return load_source(source, compiled, settings, search_path=search_path, key_prefix=key_prefix,
                       progress=progress, run_id=run_id, metrics=metrics,
                       started={"files": len(source.files)})


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
    from features.aggregate.backfill import Collector, backfill
    from features.aggregate.engine import AggSpec
    from features.aggregate.writer import AggregateWriter
    from features.sinks.postgres import PostgresSink, WriterGuard
    from features.sinks.redis import RedisSink

    program = transform_program(compiled, settings)
    pg = PostgresSink(settings.postgres_dsn, compiled, search_path=search_path)
    # a migration of the schema waits for the unit in flight, then stops this load
    # between units (docs/evolution.md, "Writers during a migration")
    guard = WriterGuard(settings.postgres_dsn, compiled, search_path=search_path)
    hot = RedisSink(settings.redis_url, compiled, key_prefix=key_prefix)
    sinks: list[Sink] = [pg, hot]  # the first is the primary: its commit decides "stored"
    spec = AggSpec.of(compiled.schema)
    aggs = None if spec is None else AggregateWriter(compiled, settings.postgres_dsn, settings.redis_url,
                                                     search_path=search_path, key_prefix=key_prefix)
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
