"""The batch loader: Parquet files -> validate -> transform -> Redis (hot) + Postgres (cold)."""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.errors import ConfigError, FeaturesError, WorkerFailed
from features.lineage import RunContext, new_run_id
from features.logs import bind_run_id
from features.metrics import RunMetrics
from features.runner import LineProgress, Progress, RunSummary, run
from features.sinks.base import Sink
from features.sources.parquet import DEFAULT_BATCH_ROWS, ParquetSource

log = logging.getLogger("features.load")


def find_schema(name: str, schemas_dir: str | Path) -> CompiledSchema:
    """Compile the schema called ``name`` from ``schemas_dir`` (ConfigError when absent)."""
    from features.schema import load_schemas

    schemas = load_schemas(Path(schemas_dir))
    if name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        raise ConfigError(f"no schema named {name!r} in {schemas_dir} (known: {known})", key="schema",
                          looked_in=[str(schemas_dir)])
    return compile_schema(schemas[name])


def transform_program(compiled: CompiledSchema, settings: Settings) -> Any:
    """The compiled transform program for the schema's derived features, or None."""
    if not compiled.schema.features:
        return None
    from features.kernels import compile_transforms

    return compile_transforms(compiled.schema, device=settings.device)


def load(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *,
         batch_rows: int = DEFAULT_BATCH_ROWS, search_path: str | None = None, key_prefix: str = "",
         progress: bool = False, run_id: str | None = None, metrics: RunMetrics | None = None,
         workers: int = 1, shard: tuple[int, int] | None = None, engine: str = "local",
         parallelism: int | None = None) -> RunSummary:
    """Load Parquet ``paths`` into both stores; returns the run's summary.

    Raises SourceError before writing anything when a file is unreadable or does not
    fit the schema, SinkUnavailable when a store is unreachable at start (nothing is
    written), SinkError on a fingerprint mismatch. Re-running the same input stores
    nothing twice (commit ledger in both stores). ``metrics`` counts the run as it goes
    (``features.metrics.RunMetrics``: the summary's counts, write seconds, batch sizes,
    freshness, aggregation outcomes). Logs ``load started``/``load finished`` (with the
    counts) on ``features.load``, with the run id.

    ``workers`` > 1: that many processes, each loading one shard of the entities
    (:func:`load_workers`). ``engine="flink"``: a Flink BATCH job of ``parallelism`` shard
    tasks instead (``features.load.flink``; None: the environment's default parallelism,
    e.g. ``flink run -p N``). ``shard=(i, n)``: only the rows of entity shard
    ``i`` of ``n`` (``features.sources.parquet.entity_shards``), with ledger units of
    their own.
    """
    run_id = run_id or new_run_id()
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}", key="workers")
    if engine not in ("local", "flink"):
        raise ConfigError(f"engine {engine!r}: expected local or flink", key="engine")
    with bind_run_id(run_id):
        if engine == "flink":
            from features.load.flink import load_flink

            return load_flink(paths, compiled, settings, parallelism=parallelism, batch_rows=batch_rows,
                              search_path=search_path, key_prefix=key_prefix, run_id=run_id)
        if workers > 1:
            return load_workers(paths, compiled, settings, workers=workers, batch_rows=batch_rows,
                                search_path=search_path, key_prefix=key_prefix, progress=progress,
                                run_id=run_id, metrics=metrics)
        return _load(paths, compiled, settings, batch_rows=batch_rows, search_path=search_path,
                     key_prefix=key_prefix, progress=progress, run_id=run_id, metrics=metrics, shard=shard)


def _load(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *, batch_rows: int,
          search_path: str | None, key_prefix: str, progress: bool, run_id: str,
          metrics: RunMetrics | None, shard: tuple[int, int] | None = None) -> RunSummary:
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
                                                           "already_present", "adds_up", "units",
                                                           "skipped_units", "seconds")})
        return summary
    finally:
        for s in sinks:
            s.close()  # idempotent; also frees a sink whose open() failed half way
        if aggs is not None:
            aggs.close()


def open_stores(compiled: CompiledSchema, settings: Settings, *, search_path: str | None = None,
                key_prefix: str = "") -> None:
    """Open (and close) every store a load writes to: checks they answer and the schema's
    fingerprint, applies the DDL and loads the Redis scripts once, before workers start
    (concurrent ``CREATE TABLE IF NOT EXISTS`` can fail in Postgres)."""
    from features.aggregate.engine import AggSpec
    from features.aggregate.writer import AggregateWriter
    from features.sinks.postgres import PostgresSink
    from features.sinks.redis import RedisSink

    stores: list[Any] = [RedisSink(settings.redis_url, compiled, key_prefix=key_prefix),
                         PostgresSink(settings.postgres_dsn, compiled, search_path=search_path)]
    if AggSpec.of(compiled.schema) is not None:
        stores.append(AggregateWriter(compiled, settings.postgres_dsn, settings.redis_url,
                                      search_path=search_path, key_prefix=key_prefix))
    try:
        for store in stores:
            store.open()
    finally:
        for store in stores:
            store.close()


def _worker(args: tuple[Any, ...]) -> RunSummary:
    """One process of :func:`load_workers`: shard ``i`` of ``n``."""
    paths, compiled, settings, i, n, kw = args
    from features.logs import setup_logging

    setup_logging(None, logger="features")
    return load(paths, compiled, settings, shard=(i, n), **kw)


def load_workers(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *, workers: int,
                 batch_rows: int = DEFAULT_BATCH_ROWS, search_path: str | None = None, key_prefix: str = "",
                 progress: bool = False, run_id: str | None = None,
                 metrics: RunMetrics | None = None) -> RunSummary:
    """``features load --workers N``: N local processes, each running the whole loader
    (validate, transform, both stores, its own ledger units, the aggregations) over one
    shard of the entities: the rows whose entity hashes to it, read from every file
    (:func:`features.sources.parquet.entity_shards`). Entities never span two workers, so
    workers never write the same key and each computes its entities' aggregations over
    their whole history, exactly as one process would. Lineage (``file://path#row``) and
    counts are those of a single-process run; a re-run with the same ``workers`` skips
    the committed units (another ``workers`` re-offers the rows: already present).
    The stores are opened once first (DDL, fingerprint). A failed worker fails the run
    with its error after the others finish; a re-run completes it exactly."""
    import concurrent.futures as cf
    import multiprocessing
    import time

    from features.runner import merge_summaries

    run_id = run_id or new_run_id()
    source = ParquetSource(paths, compiled, batch_rows=batch_rows)  # checks every file first
    open_stores(compiled, settings, search_path=search_path, key_prefix=key_prefix)
    log.info("load started", extra={"schema": compiled.name, "files": len(source.files),
                                    "rows": source.total_rows, "workers": workers})
    kw = {"batch_rows": batch_rows, "search_path": search_path, "key_prefix": key_prefix, "run_id": run_id}
    t0 = time.perf_counter()
    done: list[RunSummary] = []
    failures: list[BaseException] = []
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_worker, (list(paths), compiled, settings, i, workers, kw)): i
                   for i in range(workers)}
        for fut in cf.as_completed(futures):
            i = futures[fut]
            try:
                part = fut.result()
            except FeaturesError as exc:  # reported after the other workers finish
                failures.append(exc)
                log.error("load worker %d of %d failed: %s", i + 1, workers, exc)
                continue
            except Exception as exc:  # the process died (BrokenProcessPool) or a bug
                failures.append(WorkerFailed(
                    f"load worker {i + 1} of {workers} died ({type(exc).__name__}: {exc}); what the "
                    "workers committed stays; run the same command again (same --workers) to finish "
                    "the load exactly", worker=i, workers=workers))
                log.error("load worker %d of %d died: %s", i + 1, workers, exc)
                continue
            done.append(part)
            if metrics is not None:
                metrics.unit(read=part.read, stored=part.stored, rejected=part.rejected,
                             already_present=part.already_present, by_rule=part.by_rule)
                if part.aggregations:
                    a = part.aggregations
                    metrics.aggregation(accepted=a["accepted"], late=a["late"], duplicates=a["duplicates"])
            if progress:
                print(f"worker {i + 1}/{workers}: read {part.read:,}, stored {part.stored:,}, "
                      f"rejected {part.rejected:,} in {part.seconds:.1f}s", file=sys.stderr, flush=True)
    if failures:
        raise failures[0]
    summary = merge_summaries(run_id, compiled.name, done, seconds=time.perf_counter() - t0)
    d = summary.as_dict()
    log.info("load finished", extra={k: d[k] for k in ("schema", "read", "stored", "rejected",
                                                       "already_present", "adds_up", "units",
                                                       "skipped_units", "seconds")})
    return summary


def render_summary(s: RunSummary, *, rejects_table: str) -> str:
    """The human summary every run prints."""
    lines = [
        f"run {s.run_id}: schema {s.schema}",
        f"  read {s.read:,} = stored {s.stored:,} + rejected {s.rejected:,} + already present "
        f"{s.already_present:,}  [{'adds up' if s.adds_up else 'DOES NOT ADD UP'}]",
        f"  {s.units} batches ({s.skipped_units} already committed, skipped), {s.seconds:.1f}s, "
        f"{(s.read / s.seconds if s.seconds else 0):,.0f} rows/s",
    ]
    for name, st in s.sinks.items():
        lines.append(f"  {name}: wrote {st.written:,}, unchanged {st.unchanged:,}, "
                     f"skipped {st.skipped_units} batches, {st.seconds:.1f}s")
    if (a := s.aggregations) is not None:
        lines.append(
            f"  aggregations: {a['events']:,} events = accepted {a['accepted']:,} + "
            f"duplicates {a['duplicates']:,}  [{'adds up' if a['adds_up'] else 'DOES NOT ADD UP'}]; "
            f"{a.get('from_history', 0):,} earlier events read back from the history for their windows; "
            f"postgres rows written/changed {a['rows_written']:,}, redis entities {a['hot_written']:,}, "
            f"{a['seconds']:.1f}s")
    if s.by_rule:
        lines.append("  top reject reasons:")
        for rule, count, examples in s.top_reasons(5):
            lines.append(f"    {count:>9,}  {rule}" + (f"   e.g. {examples[0]}" if examples else ""))
        lines.append(f"  rejects are in Postgres table {rejects_table!r} "
                     f"(SELECT _source, errors, raw FROM \"{rejects_table}\" WHERE _run_id = '{s.run_id}')")
    return "\n".join(lines)
