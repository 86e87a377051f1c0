"""Assemble ``report.json`` (every number) and ``report.html`` for one run.

The verdict is PASS when the validator rejected no row, every GX expectation
succeeded and (with a reference) no field drifted above a fail threshold
(``--parquet``, ``--table``), or when the rejects table holds no row in the
window (``--rejects``); FAIL otherwise.

A table report also counts the schema's rejects table (``rejects_kept``): the cold
table holds only the rows that passed, so a PASS over it says nothing of the rows the
loads refused. When that table holds rows the PASS carries a ``verdict_notes`` line
naming the count, the table and the command that reports them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features import __version__
from features.compile import CompiledSchema, compile_schema, gates_text
from features.compile.postgres import aggregates_table_name, aggregation_pg_type, rejects_table_name
from features.errors import ConfigError
from features.pipeline.gates import GateCounts, evaluate
from features.report.core import DataTally, Progress, RejectsTally, iso_now, iterate
from features.report.drift import DriftOptions, Side, compare, verdict_reason
from features.report.html import render_html
from features.report.sources import (
    PG_BATCH_ROWS,
    Postgres,
    aggregates_input,
    parquet_input,
    rejects_input,
    table_input,
)
from features.report.stats import ColumnStats, jsonable

REPORT_VERSION = 1


def _schema_json(compiled: CompiledSchema, checked: CompiledSchema | None = None) -> dict[str, Any]:
    s = compiled.schema
    checked_names = (checked or compiled).schema.field_names
    return {
        "name": s.name,
        "version": s.version_str,
        "fingerprint": compiled.fingerprint,
        "path": s.path,
        "entity": s.entity,
        "event_time": s.event_time,
        "aggregations": [a.name for a in s.aggregations.features] if s.aggregations is not None else [],
        "quality": gates_text(s),
        "gates_fingerprint": compiled.gates_fingerprint,
        "checked_fields": list(checked_names),
        "unchecked_fields": [n for n in s.field_names if n not in checked_names],
    }


def finish(value: Any) -> Any:
    """Lineage trackers (objects with ``as_json``) and Python values as JSON."""
    if hasattr(value, "as_json"):
        return value.as_json()
    if isinstance(value, dict):
        return {str(k): finish(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finish(v) for v in value]
    return jsonable(value)


def _base(mode: str, compiled: CompiledSchema, lineage: dict[str, Any]) -> dict[str, Any]:
    return {
        "report_version": REPORT_VERSION,
        "generated_at": iso_now(),
        "generated_by": f"featureline {__version__} (features report)",
        "mode": mode,
        "schema": _schema_json(compiled),
        "lineage": lineage,
    }


def _data_report(mode: str, compiled: CompiledSchema, tally: DataTally, lineage: dict[str, Any],
                 drift: dict[str, Any] | None = None, aggregations: list[dict[str, Any]] | None = None,
                 rejects_kept: dict[str, Any] | None = None) -> dict[str, Any]:
    report = _base(mode, compiled, lineage)
    report["schema"] = _schema_json(compiled, tally.compiled)
    event_time = compiled.schema.event_time
    if event_time is not None and event_time in tally.fields:
        stats = tally.fields[event_time]
        lineage["event_time"] = {"field": event_time, "min": stats.min, "max": stats.max}
    expectations = tally.expectations_json()
    gx = tally.gx_json()
    reasons = []
    if tally.rejected_rows:
        reasons.append(f"{tally.rejected_rows:,} of {tally.input_rows:,} rows rejected by the validator")
    if gx["failed"]:
        reasons.append(f"{gx['failed']} of {gx['expectations']} GX expectations failed")
    notes = []
    gates = _gates(mode, compiled, tally)
    if gates is not None:
        if not gates["passed"]:
            reasons.append(f"quality gates breached ({', '.join(gates['failed'])}): `features load` would "
                           "refuse this input")
        if gates["warned"]:
            notes.append(f"quality gates breached with on_breach: warn ({', '.join(gates['warned'])}): "
                         "`features load` would store this input and report them")
    drift_reason = verdict_reason(drift) if drift is not None else None
    if drift_reason:
        reasons.append(drift_reason)
    groups = tally.groups()
    if rejects_kept and rejects_kept["rows"]:
        notes.append(f"{rejects_kept['rows']:,} rows rejected at load are kept in {rejects_kept['table']} "
                     f"(not in this table): `{rejects_kept['command']}` reports them")
    report.update({
        "verdict": "FAIL" if reasons else "PASS",
        "verdict_reasons": reasons,
        "verdict_notes": notes,
        "rejects_kept": rejects_kept,
        "counts": tally.counts_json(),
        "gx": gx,
        "expectations": expectations,
        "disagreements": [e["rule"] for e in expectations if e["agrees"] is False],
        "fields": tally.fields_json(),
        "features": tally.features_json(),
        "aggregations": aggregations,
        "rejects": {"source": "validator", "rows": tally.rejected_rows,
                    "errors": sum(g.count for g in groups), "groups": [g.as_json() for g in groups]},
        "drift": drift,
        "quality_gates": gates,
    })
    report["lineage"] = finish(lineage)
    return report


def _gates(mode: str, compiled: CompiledSchema, tally: DataTally) -> dict[str, Any] | None:
    """The schema's load gates judged on a Parquet report's validator counts (what
    ``features load`` would decide, but for transform rejects, which the report does not
    count): ``GateVerdict.as_dict`` plus the names of the breached ``failed`` and ``warned``
    gates. None in the other modes (stored rows passed their gates) or without gates."""
    if mode != "parquet" or not compiled.gates:
        return None
    verdict = evaluate(compiled, GateCounts(read=tally.input_rows, rejected=tally.rejected_rows,
                                            by_rule=Counter(tally.by_rule)))
    return {**verdict.as_dict(), "failed": [r.gate.name for r in verdict.failed],
            "warned": [r.gate.name for r in verdict.warned]}


def _reference(options: DriftOptions, compiled: CompiledSchema, progress: bool
               ) -> tuple[Side, dict[str, Any]]:
    """The reference side of a drift comparison, read in full (values only: no checks)."""
    side = Side(compiled, sample_size=options.sample_size, exclude=options.exclude)
    if options.table:
        if options.dsn is None:
            raise ConfigError("--reference-table needs a Postgres DSN", key="postgres_dsn")
        if not compiled.schema.loadable:
            raise ConfigError(f"schema {compiled.name!r} is validation-only (no entity/event_time): "
                              "it has no cold table to use as the reference", key="schema")
        with Postgres(options.dsn) as pg:
            lineage, total, absent, chunks = table_input(pg, _cold_fields(compiled), PG_BATCH_ROWS)
            bar = Progress(f"{compiled.name} reference", total, enabled=progress)
            for chunk in chunks:
                side.add(chunk)
                bar.update(side.rows, 0)
            bar.close(side.rows, 0)
        lineage["fields_not_in_table"] = absent
    else:
        lineage, total, chunks = parquet_input(options.paths, compiled, options.batch_rows)
        bar = Progress(f"{compiled.name} reference", total, enabled=progress)
        for chunk in chunks:
            side.add(chunk)
            bar.update(side.rows, 0)
        bar.close(side.rows, 0)
    return side, finish(lineage)


def _drift(options: DriftOptions | None, reference: tuple[Side, dict[str, Any]] | None,
           data: Side | None) -> dict[str, Any] | None:
    if options is None or reference is None or data is None:
        return None
    return compare(reference[0], data, options.thresholds, reference[1], sample_size=options.sample_size)


def parquet_report(paths: Sequence[str | Path], compiled: CompiledSchema, *, batch_rows: int,
                   progress: bool = False, drift: DriftOptions | None = None) -> dict[str, Any]:
    """The report of Parquet ``paths`` (SourceError for missing or unfit files), compared
    with ``drift``'s reference when given (see :mod:`features.report.drift`)."""
    lineage, total, chunks = parquet_input(paths, compiled, batch_rows)
    reference = _reference(drift, compiled, progress) if drift is not None else None
    data = Side(compiled, sample_size=drift.sample_size, exclude=drift.exclude) if drift is not None else None
    tally = DataTally(compiled, drift=data)
    iterate(chunks, tally, Progress(f"{compiled.name} report", total, enabled=progress))
    return _data_report("parquet", compiled, tally, lineage, _drift(drift, reference, data))


def _cold_fields(compiled: CompiledSchema) -> CompiledSchema:
    """The schema restricted to the fields its cold table stores (the others are
    validated at load time but never stored, so a table cannot be checked for them)."""
    s = compiled.schema
    keys = {s.entity, s.event_time}
    stored = tuple(f for f in s.fields if "cold" in f.store or f.name in keys)
    if len(stored) == len(s.fields):
        return compiled
    return compile_schema(dataclasses.replace(s, fields=stored, features=(), evolution_rules=()))


def table_report(dsn: str, compiled: CompiledSchema, *, batch_rows: int, progress: bool = False,
                 drift: DriftOptions | None = None) -> dict[str, Any]:
    """The report of the schema's cold table (SinkUnavailable when Postgres is down,
    SinkError when the table is absent)."""
    if not compiled.schema.loadable:
        raise ConfigError(f"schema {compiled.name!r} is validation-only (no entity/event_time): "
                          "it has no cold table", key="schema")
    checked = _cold_fields(compiled)
    reference = _reference(drift, checked, progress) if drift is not None else None
    data = Side(checked, sample_size=drift.sample_size, exclude=drift.exclude) if drift is not None else None
    s = compiled.schema
    stored = {c: str(f.dtype) for f in s.features if "cold" in f.store for c in s.feature_columns(f)}
    tally = DataTally(checked, drift=data, derived="stored", feature_columns=stored)
    with Postgres(dsn) as pg:
        lineage, total, absent, chunks = table_input(pg, checked, batch_rows, list(stored))
        iterate(chunks, tally, Progress(f"{compiled.name} report", total, enabled=progress))
        aggregations = _aggregations(pg, compiled, batch_rows)
        found = pg.find(rejects_table_name(s))
        kept = None
        if found is not None:
            kept = {"table": f"{found[0]}.{found[1]}", "rows": pg.count(found[0], found[1]),
                    "command": f"features report --schema {s.name} --rejects --out DIR"}
    lineage["fields_not_in_table"] = absent
    return _data_report("table", compiled, tally, lineage, _drift(drift, reference, data), aggregations, kept)


#: Postgres types of aggregation columns whose statistics the report shows (numbers).
_NUMERIC_PG = ("bigint", "integer", "smallint", "double precision", "real", "numeric")


def _aggregations(pg: Any, compiled: CompiledSchema, batch_rows: int) -> list[dict[str, Any]] | None:
    """Statistics of the stored numeric aggregations (``<schema>__aggregates``); None when
    the schema has none stored or the table is absent."""
    s = compiled.schema
    if s.aggregations is None:
        return None
    types = {a.name: aggregation_pg_type(s, a) for a in s.aggregations.features if "cold" in a.store}
    numeric = {n: t for n, t in types.items() if t.startswith(_NUMERIC_PG) and not t.endswith("[]")}
    found = aggregates_input(pg, aggregates_table_name(s), list(numeric), batch_rows) if numeric else None
    if found is None:
        return None
    _, columns, batches = found
    stats = {c: ColumnStats(c, numeric[c], "aggregation", i) for i, c in enumerate(columns)}
    for batch in batches:
        for c, st in stats.items():
            st.add(batch.column(c))
    return [st.as_json() for st in stats.values()]


def rejects_report(dsn: str, compiled: CompiledSchema, *, since: dt.datetime | None, batch_rows: int,
                   progress: bool = False) -> dict[str, Any]:
    """The rejects table grouped by field and rule, optionally since an ingestion time."""
    if not compiled.schema.loadable:
        raise ConfigError(f"schema {compiled.name!r} is validation-only (no entity/event_time): "
                          "it has no rejects table", key="schema")
    tally = RejectsTally()
    with Postgres(dsn) as pg:
        lineage, total, pages = rejects_input(pg, compiled, since, batch_rows)
        bar = Progress(f"{compiled.name} rejects", total, enabled=progress)
        for page in pages:
            tally.add(page)
            bar.update(tally.rows, tally.rows)
        bar.close(tally.rows, tally.rows)
    lineage.update({"event_time": tally.event_time, "ingested_at": tally.ingested_at,
                    "origins": tally.origins, "run_ids": tally.run_ids,
                    "schema_fingerprints": tally.fingerprints})
    report = _base("rejects", compiled, finish(lineage))
    groups = tally.sorted_groups()
    reasons = [f"{tally.rows:,} rejected rows ({tally.errors:,} errors)"
               + (f" ingested since {since.isoformat()}" if since else "")] if tally.rows else []
    report.update({
        "verdict": "FAIL" if tally.rows else "PASS",
        "verdict_reasons": reasons,
        "verdict_notes": [],
        "rejects_kept": None,
        "counts": {"reject_rows": tally.rows, "errors": tally.errors,
                   "by_rule": dict(sorted(((g.rule, g.count) for g in groups), key=lambda kv: kv[0]))},
        "gx": None,
        "expectations": [],
        "disagreements": [],
        "fields": [],
        "features": [],
        "aggregations": None,
        "rejects": {"source": "rejects table", "rows": tally.rows, "errors": tally.errors,
                    "groups": [g.as_json() for g in groups]},
        "drift": None,
    })
    return report


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``out/report.json`` and ``out/report.html``; returns their paths."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        json_path, html_path = out / "report.json", out / "report.html"
        json_path.write_text(json.dumps(report, indent=2, allow_nan=False, ensure_ascii=False) + "\n",
                             encoding="utf-8")
        html_path.write_text(render_html(report), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the report to {out}: {exc}", key="out") from exc
    return json_path, html_path


__all__ = ["REPORT_VERSION", "finish", "parquet_report", "rejects_report", "table_report", "write_report"]
