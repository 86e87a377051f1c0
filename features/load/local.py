"""The batch loader in one process: Parquet -> validate -> transform -> both stores, then
the aggregations (``features.load.load`` with the local engine, each ``--workers``
process, each task of ``--engine flink``)."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from pathlib import Path

from features.compile import CompiledSchema, transform_program
from features.config import Settings
from features.lineage import RunContext
from features.metrics import RunMetrics
from features.progress import LineProgress, Progress
from features.runner import RunSummary, run
from features.sinks.base import Sink
from features.sources.parquet import DEFAULT_BATCH_ROWS, ParquetSource

log = logging.getLogger("features.load")


def load_local(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *,
               batch_rows: int = DEFAULT_BATCH_ROWS, search_path: str | None = None, key_prefix: str = "",
               progress: bool = False, run_id: str, metrics: RunMetrics | None = None,
               shard: tuple[int, int] | None = None) -> RunSummary:
    """The loader in this process (one shard of the entities with ``shard``): what
    :func:`features.load.load` runs for the local engine, and what each Flink task and
    each worker process runs (see its docstring for the guarantees)."""
    from features.aggregate.backfill import Collector, backfill
    from features.aggregate.engine import AggSpec
    from features.aggregate.writer import AggregateWriter
    from features.sinks.postgres import PostgresSink
    from features.sinks.redis import RedisSink

    source = ParquetSource(paths, compiled, batch_rows=batch_rows, shard=shard)
    program = transform_program(compiled, settings)
    pg = PostgresSink(settings.postgres_dsn, compiled, search_path=search_path)
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
        now = dt.datetime.now(dt.UTC)
        ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, run_id, now)
        log.info("load started", extra={"schema": compiled.name, "files": len(source.files),
                                        "rows": source.total_rows})
        summary = run(source, compiled, sinks, ctx=ctx, program=program,
                      progress=Progress(source.total_rows, enabled=progress), observer=collector,
                      metrics=metrics)
        if spec is not None and aggs is not None and collector is not None:
            inputs = collector.inputs()
            line = LineProgress("aggregations", None, enabled=progress)
            counts = backfill(spec, inputs, aggs, ctx, progress=line)
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
        for s in sinks:
            s.close()  # idempotent; also frees a sink whose open() failed half way
        if aggs is not None:
            aggs.close()
