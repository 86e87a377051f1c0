"""A Parquet load's quality gates, checked before anything is written.

:func:`check_gates` reads the whole input once and validates it (no transform unless a
derived feature rejects, no lineage, no write: :func:`features.pipeline.gates.measure`),
then judges the counts against the schema's gates. Why a pass first rather than writing
and then unpublishing: a refused load must leave both stores exactly as they were (Redis
hashes overwritten by newer events, aggregates and tiles recomputed would all need undoing),
while the validation pass costs one more read and validation of the input, a fraction of a
load (bench/RESULTS.md, "Quality gates").

Unless ``dry_run``, the verdict (every gate: measured, limit, breached, whether the load
was refused) is recorded per run in ``featureline_gate_verdicts`` (the UI shows it).
On a breached ``fail`` gate it stores the rejects of the whole input in the rejects table
(the evidence, under the run's id, the stores' ledger untouched: no unit is committed, so
the same files load once fixed) and raises :class:`~features.errors.GateBreached`. With
``dry_run`` it stores nothing at all and needs no store (``features load --check-gates``).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from features.compile import CompiledSchema
from features.compile.postgres import rejects_table_name
from features.config import Settings
from features.errors import GateBreached
from features.kernels import TransformProgram, transform_program
from features.lineage import RunContext
from features.observe.metrics import RunMetrics
from features.pipeline.gates import GateVerdict, evaluate, measure, rejects_transforms
from features.pipeline.prepare import process_batch
from features.sinks.postgres import PostgresSink
from features.sinks.stores import store_sinks
from features.sources.parquet import DEFAULT_BATCH_ROWS, ParquetSource

log = logging.getLogger("features.load")

__all__ = ["check_gates", "refusal_message"]


def check_gates(paths: Sequence[str | Path], compiled: CompiledSchema, settings: Settings, *, run_id: str,
                batch_rows: int = DEFAULT_BATCH_ROWS, search_path: str | None = None, key_prefix: str = "",
                metrics: RunMetrics | None = None, dry_run: bool = False) -> GateVerdict:
    """Measure the input ``paths`` and judge it against ``compiled``'s gates.

    Returns the verdict when no ``fail`` gate is breached (``warn`` breaches are logged as
    warnings and counted in ``metrics``), and always with ``dry_run``. Otherwise stores
    the input's rejects (Postgres, under ``run_id``; nothing else, no ledger unit) and
    raises GateBreached naming each breached gate, its measured rate and limit and the top
    reasons. Raises SourceError for unreadable input, like the load, before any store is
    touched."""
    source = ParquetSource(paths, compiled, batch_rows=batch_rows)
    program = transform_program(compiled, settings) if rejects_transforms(compiled) else None
    now = dt.datetime.now(dt.UTC)
    t0 = time.perf_counter()
    verdict = evaluate(compiled, measure(source.batches(), compiled, program, now))
    seconds = time.perf_counter() - t0
    log.info("quality gates checked", extra={
        "schema": compiled.name, "read": verdict.counts.read, "rejected": verdict.counts.rejected,
        "breached": [r.gate.name for r in verdict.breaches], "passed": not verdict.failed,
        "seconds": round(seconds, 3), "dry_run": dry_run})
    if metrics is not None:
        for r in verdict.results:
            metrics.gate(r.gate.name, r.gate.on_breach, float(r.measured), breached=r.breached)
    for r in verdict.warned:
        log.warning("quality gate breached (warn: the load is stored): %s", r.describe(verdict.counts.read),
                    extra={"schema": compiled.name, "gate": r.gate.name})
    if dry_run:
        return verdict
    if not verdict.failed:
        _record_verdict(compiled, settings, run_id, verdict, search_path=search_path)
        return verdict
    stored = _store_rejects(source, compiled, settings, program, run_id, now, verdict,
                            search_path=search_path, key_prefix=key_prefix)
    message = refusal_message(verdict, run_id=run_id, rejects_stored=stored,
                              rejects_table=rejects_table_name(compiled.schema))
    log.error("load refused: %s", "; ".join(r.describe(verdict.counts.read) for r in verdict.failed),
              extra={"schema": compiled.name, "gates": [r.gate.name for r in verdict.failed]})
    raise GateBreached(message, schema=compiled.name, run_id=run_id,
                       gates=[r.gate.name for r in verdict.failed], rejects_stored=stored, verdict=verdict)


def _record_verdict(compiled: CompiledSchema, settings: Settings, run_id: str, verdict: GateVerdict, *,
                    search_path: str | None) -> None:
    """A passed load's verdict, recorded before its first unit (``featureline_gate_verdicts``)."""
    cold = PostgresSink(settings.postgres_dsn, compiled, search_path=search_path,
                        retries=settings.store_retries, backoff_s=settings.store_backoff_s)
    cold.open()
    try:
        cold.record_gate_verdict(run_id, verdict.as_rows())
    finally:
        cold.close()


def _store_rejects(source: ParquetSource, compiled: CompiledSchema, settings: Settings,
                   program: TransformProgram | None, run_id: str, now: dt.datetime, verdict: GateVerdict, *,
                   search_path: str | None, key_prefix: str) -> int:
    """The rejects of every batch of ``source``, as the load would store them (same rows,
    errors, raw values and lineage), inserted into the rejects table alone, then the
    verdict (refused) in ``featureline_gate_verdicts``: the refused path, so it prepares
    the batches again rather than keeping them from the measure."""
    cold, _ = store_sinks(compiled, settings, search_path=search_path, key_prefix=key_prefix)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, run_id, now)
    stored = 0
    cold.open()  # checks the fingerprint and creates the tables, as a load would
    try:
        for sb in source.batches():
            prepared = process_batch(sb, compiled, program, ctx, now)
            stored += cold.insert_rejects(prepared.rejects)
        cold.record_gate_verdict(run_id, verdict.as_rows())
    finally:
        cold.close()
    return stored


def refusal_message(verdict: GateVerdict, *, run_id: str, rejects_stored: int, rejects_table: str) -> str:
    """What a refused load says: each breached ``fail`` gate (measured vs limit), the top
    reasons, that nothing was stored, where the evidence is, and what to do."""
    read = verdict.counts.read
    lines = [f"load of {verdict.schema} refused: quality gate {r.describe(read)} (on_breach: fail)"
             for r in verdict.failed]
    lines += [f"  also breached (warn): {r.describe(read)}" for r in verdict.warned]
    if verdict.counts.by_rule:
        lines.append("  top reasons: "
                     + ", ".join(f"{rule} ({n:,} rows)" for rule, n in verdict.top_reasons()))
    lines.append(f"  nothing was stored in Redis or Postgres; the {rejects_stored:,} rejects of run "
                 f"{run_id} are kept as the evidence: SELECT _source, errors, raw FROM "
                 f"\"{rejects_table}\" WHERE _run_id = '{run_id}'")
    owner = f"; data owner: {verdict.owner}" if verdict.owner else ""
    lines.append("  fix the data (or the gate, in the schema's quality: section) and run the same "
                 f"command again: no batch was committed{owner}")
    return "\n".join(lines)
