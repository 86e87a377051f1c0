"""Assemble ``report.json`` (every number) and ``report.html`` for one run.

The verdict is PASS when the validator rejected no row and every GX expectation
succeeded (``--parquet``, ``--table``), or when the rejects table holds no row in the
window (``--rejects``); FAIL otherwise.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from features.compile import CompiledSchema, compile_schema
from features.errors import ConfigError
from features.report.core import DataTally, Progress, RejectsTally, iso_now, iterate
from features.report.stats import jsonable

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
    from features import __version__

    return {
        "report_version": REPORT_VERSION,
        "generated_at": iso_now(),
        "generated_by": f"featureline {__version__} (features report)",
        "mode": mode,
        "schema": _schema_json(compiled),
        "lineage": lineage,
    }


def _data_report(mode: str, compiled: CompiledSchema, tally: DataTally, lineage: dict[str, Any]
                 ) -> dict[str, Any]:
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
    groups = tally.groups()
    report.update({
        "verdict": "FAIL" if reasons else "PASS",
        "verdict_reasons": reasons,
        "counts": tally.counts_json(),
        "gx": gx,
        "expectations": expectations,
        "disagreements": [e["rule"] for e in expectations if e["agrees"] is False],
        "fields": tally.fields_json(),
        "rejects": {"source": "validator", "rows": tally.rejected_rows,
                    "errors": sum(g.count for g in groups), "groups": [g.as_json() for g in groups]},
    })
    report["lineage"] = finish(lineage)
    return report


def parquet_report(paths: Sequence[str | Path], compiled: CompiledSchema, *, batch_rows: int,
                   progress: bool = False) -> dict[str, Any]:
    """The report of Parquet ``paths`` (SourceError for missing or unfit files)."""
    from features.report.sources import parquet_input

    lineage, total, chunks = parquet_input(paths, compiled, batch_rows)
    tally = DataTally(compiled)
    iterate(chunks, tally, Progress(f"{compiled.name} report", total, enabled=progress))
    return _data_report("parquet", compiled, tally, lineage)


def _cold_fields(compiled: CompiledSchema) -> CompiledSchema:
    """The schema restricted to the fields its cold table stores (the others are
    validated at load time but never stored, so a table cannot be checked for them)."""
    s = compiled.schema
    keys = {s.entity, s.event_time}
    stored = tuple(f for f in s.fields if "cold" in f.store or f.name in keys)
    if len(stored) == len(s.fields):
        return compiled
    return compile_schema(dataclasses.replace(s, fields=stored, features=(), evolution_rules=()))


def table_report(dsn: str, compiled: CompiledSchema, *, batch_rows: int, progress: bool = False
                 ) -> dict[str, Any]:
    """The report of the schema's cold table (SinkUnavailable when Postgres is down,
    SinkError when the table is absent)."""
    from features.report.sources import Postgres, table_input

    if not compiled.schema.loadable:
        raise ConfigError(f"schema {compiled.name!r} is validation-only (no entity/event_time): "
                          "it has no cold table", key="schema")
    checked = _cold_fields(compiled)
    tally = DataTally(checked)
    with Postgres(dsn) as pg:
        lineage, total, absent, chunks = table_input(pg, checked, batch_rows)
        iterate(chunks, tally, Progress(f"{compiled.name} report", total, enabled=progress))
    lineage["fields_not_in_table"] = absent
    return _data_report("table", compiled, tally, lineage)


def rejects_report(dsn: str, compiled: CompiledSchema, *, since: dt.datetime | None, batch_rows: int,
                   progress: bool = False) -> dict[str, Any]:
    """The rejects table grouped by field and rule, optionally since an ingestion time."""
    from features.report.sources import Postgres, rejects_input

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
        "counts": {"reject_rows": tally.rows, "errors": tally.errors,
                   "by_rule": dict(sorted(((g.rule, g.count) for g in groups), key=lambda kv: kv[0]))},
        "gx": None,
        "expectations": [],
        "disagreements": [],
        "fields": [],
        "rejects": {"source": "rejects table", "rows": tally.rows, "errors": tally.errors,
                    "groups": [g.as_json() for g in groups]},
    })
    return report


def write_report(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write ``out/report.json`` and ``out/report.html``; returns their paths."""
    from features.report.html import render_html

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
