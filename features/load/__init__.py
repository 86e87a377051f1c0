"""The batch loader: Parquet files -> validate -> transform -> Redis (hot) + Postgres (cold)."""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features.compile import CompiledSchema
from features.config import Settings
from features.errors import ConfigError, FeaturesError, WorkerFailed
from features.lineage import new_run_id
from features.load.gates import check_gates
from features.load.local import load_local
from features.load.stores import open_stores
from features.observe.logs import bind_run_id, setup_logging
from features.observe.metrics import RunMetrics
from features.pipeline.summary import RunSummary, merge_summaries
from features.sources.parquet import DEFAULT_BATCH_ROWS, ParquetSource

log = logging.getLogger("features.load")


def load(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *,
         batch_rows: int = DEFAULT_BATCH_ROWS, search_path: str | None = None, key_prefix: str = "",
         progress: bool = False, run_id: str | None = None, metrics: RunMetrics | None = None,
         workers: int = 1, shard: tuple[int, int] | None = None, gates: bool = True) -> RunSummary:
    """Load Parquet ``paths`` into both stores; returns the run's summary.

    Raises SourceError before writing anything when a file is unreadable or does not
    fit the schema, SinkUnavailable when a store is unreachable at start (nothing is
    written), SinkError on a fingerprint mismatch. Re-running the same input stores
    nothing twice (commit ledger in both stores). ``metrics`` counts the run as it goes
    (``features.observe.metrics.RunMetrics``: the summary's counts, write seconds, batch sizes,
    freshness, aggregation outcomes). Logs ``load started``/``load finished`` (with the
    counts) on ``features.load``, with the run id.

    ``workers`` > 1: that many processes, each loading one shard of the entities
    (:func:`load_workers`); a Flink BATCH job of shard tasks is
    :func:`features.flink.batch.load_flink` (``features load --engine flink``).
    ``shard=(i, n)``: only the rows of entity shard ``i`` of ``n``
    (``features.sources.parquet.entity_shards``), with ledger units of their own.

    ``gates`` (default True) and the schema has a ``quality:`` section with load gates: the
    whole input is validated first (:func:`features.load.gates.check_gates`; not per
    shard: the gates judge the whole load) and a breached ``fail`` gate raises GateBreached
    with nothing stored but the rejects; the summary's ``gates`` holds the verdict (its
    ``warn`` breaches too).
    """
    run_id = run_id or new_run_id()
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}", key="workers")
    with bind_run_id(run_id):
        verdict = None
        if gates and compiled.gates and shard is None:
            verdict = check_gates(paths, compiled, settings, run_id=run_id, batch_rows=batch_rows,
                                  search_path=search_path, key_prefix=key_prefix, metrics=metrics)
        if workers > 1:
            summary = load_workers(paths, compiled, settings, workers=workers, batch_rows=batch_rows,
                                   search_path=search_path, key_prefix=key_prefix, progress=progress,
                                   run_id=run_id, metrics=metrics)
        else:
            summary = load_local(paths, compiled, settings, batch_rows=batch_rows, search_path=search_path,
                                 key_prefix=key_prefix, progress=progress, run_id=run_id, metrics=metrics,
                                 shard=shard)
        if verdict is not None:
            summary.gates = verdict.as_dict()
        return summary


def _worker(args: tuple[Any, ...]) -> RunSummary:
    """One process of :func:`load_workers`: shard ``i`` of ``n``."""
    paths, compiled, settings, i, n, kw = args

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
                                                       "already_present", "restored", "adds_up", "units",
                                                       "skipped_units", "seconds")})
    return summary


def render_summary(s: RunSummary, *, rejects_table: str) -> str:
    """The human summary every run prints."""
    primary = next(iter(s.sinks), "the cold store")
    lines = [
        f"run {s.run_id}: schema {s.schema}",
        f"  read {s.read:,} = stored {s.stored:,} + rejected {s.rejected:,} + already present "
        f"{s.already_present:,}  [{'adds up' if s.adds_up else 'DOES NOT ADD UP'}]",
    ]
    for name, st in s.sinks.items():
        if st.restored:  # what the headline's "already present" does not say
            lines.append(f"  restored {st.restored:,} rows into {name} that {primary} already held "
                         f"({name} had lost them, e.g. a FLUSHDB)")
    lines.append(f"  {s.units} batches ({s.skipped_units} already committed, skipped), {s.seconds:.1f}s, "
                 f"{(s.read / s.seconds if s.seconds else 0):,.0f} rows/s")
    for name, st in s.sinks.items():
        restored = f" ({st.restored:,} restored)" if st.restored else ""
        lines.append(f"  {name}: wrote {st.written:,}{restored}, unchanged {st.unchanged:,}, "
                     f"skipped {st.skipped_units} batches, {st.seconds:.1f}s")
    if (a := s.aggregations) is not None:
        hot_restored = f" ({a['hot_restored']:,} restored)" if a.get("hot_restored") else ""
        lines.append(
            f"  aggregations: {a['events']:,} events = accepted {a['accepted']:,} + "
            f"duplicates {a['duplicates']:,}  [{'adds up' if a['adds_up'] else 'DOES NOT ADD UP'}]; "
            f"{a.get('from_history', 0):,} earlier events read back from the history for their windows; "
            f"postgres rows written/changed {a['rows_written']:,}, redis entities {a['hot_written']:,}"
            f"{hot_restored}, {a['seconds']:.1f}s")
    if (g := s.gates) is not None:
        breached = [r for r in g["gates"] if r["breached"]]
        shown = ", ".join(f"{r['gate']} BREACHED ({r['on_breach']}: {_measured(r)})" for r in breached)
        lines.append(f"  quality gates: {len(g['gates'])} checked, {shown or 'none breached'}")
    if s.by_rule:
        lines.append("  top reject reasons:")
        for rule, count, examples in s.top_reasons(5):
            lines.append(f"    {count:>9,}  {rule}" + (f"   e.g. {examples[0]}" if examples else ""))
        lines.append(f"  rejects are in Postgres table {rejects_table!r} "
                     f"(SELECT _source, errors, raw FROM \"{rejects_table}\" WHERE _run_id = '{s.run_id}')")
    return "\n".join(lines)


def _measured(gate: dict[str, Any]) -> str:
    """A gate's measured value against its limit, from ``GateResult.as_dict``."""
    if gate["kind"] == "min_rows":
        return f"{gate['measured']:,} rows < {gate['limit']:,}"
    return f"{gate['measured'] * 100:.4g}% > {gate['limit'] * 100:.4g}%"
