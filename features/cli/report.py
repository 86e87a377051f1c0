"""``features report``: a data-quality report of Parquet files, the cold table or the
rejects table, as ``DIR/report.json`` (every number) and ``DIR/report.html`` (one
self-contained page).

``features report --schema NAME (--parquet PATH... | --table | --rejects [--since TIME]) --out DIR``
``[--reference-parquet PATH... | --reference-table] [--psi-threshold X] [--psi-warn X] [--ks-threshold X]``
``[--drift-exclude FIELD]...``

With a reference, every numeric and categorical field is compared with it (KS, PSI,
total variation distance; see :mod:`features.report.drift`); a field above a fail
threshold and above its sampling noise makes the verdict FAIL. ``--table`` also counts
the rows kept in the rejects table and says so next to a PASS.

Exit codes: 0 the checks pass (no rejected row, every GX expectation met; for
``--rejects``: no reject row in the window), 1 they fail, 2 usage errors (bad
arguments, unknown schema, missing file, store unreachable, table absent).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from pathlib import Path
from typing import Any

from features.cli import COMMANDS
from features.compile import find_schema
from features.config import resolve_settings
from features.report.build import parquet_report, rejects_report, table_report, write_report
from features.report.drift import SAMPLE_SIZE, DriftOptions, Thresholds
from features.report.sources import PG_BATCH_ROWS
from features.sources.parquet import DEFAULT_BATCH_ROWS

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(text: str) -> dt.datetime:
    """``--since``: an ISO 8601 date or time (naive means UTC) or an age such as ``90m``,
    ``12h``, ``7d``, ``2w`` (that long before now)."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if m:
        return dt.datetime.now(dt.UTC) - dt.timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: expected ISO 8601 (2024-05-01, 2024-05-01T12:00:00Z) "
            "or an age like 90m, 12h, 7d") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)


def _nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def add_parser(sub: Any) -> None:
    """Register ``report`` on the ``features`` parser."""
    p: argparse.ArgumentParser = sub.add_parser(
        "report", help=COMMANDS["report"].summary,
        description="Check Parquet files (--parquet) or the schema's cold table (--table) with the "
        "generated Great Expectations suite and the compiled validator, batch by batch, or group the "
        "rejects table by field and rule (--rejects). Writes DIR/report.json and DIR/report.html (one "
        "self-contained page). Exit 0 when the checks pass, 1 when they fail, 2 on usage errors, an "
        "unknown schema, a missing file or an unreachable store.",
    )
    p.add_argument("--schema", required=True, metavar="NAME", help="schema name (its `name:` key)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--parquet", nargs="+", metavar="PATH", help="Parquet files, folders or globs")
    src.add_argument("--table", action="store_true",
                     help="the schema's cold table in Postgres (found through the DSN's search_path)")
    src.add_argument("--rejects", action="store_true", help="the <schema>__rejects table in Postgres")
    p.add_argument("--since", type=parse_since, metavar="TIME",
                   help="with --rejects: only rows ingested at or after TIME (ISO 8601, or an age: 12h, 7d)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for report.json and report.html")
    p.add_argument("--schemas-dir", default=None, metavar="DIR",
                   help="folder of schema YAML files (default: the schemas_dir setting)")
    p.add_argument("--batch-rows", type=int, default=None, metavar="N",
                   help="rows per batch (default: 131072 for Parquet, 50000 for Postgres)")
    p.add_argument("--no-progress", action="store_true", help="no progress line even on a terminal")
    d = p.add_argument_group(
        "drift", "compare the data (--parquet or --table) with a reference. Numeric fields (int, float, "
        "decimal): two-sample KS statistic max|F_ref - F_data| and PSI = sum (q - p) ln(q / p) over 10 bins "
        "at the reference's deciles (right-closed), shares floored at 1e-4. Categorical fields (string, "
        "enum, bool): PSI over categories and total variation distance 0.5 sum |q - p|. The entity key, "
        "dates and timestamps are not compared; nulls and NaN are left out (their shares are reported). "
        "Numeric values are kept as a seeded uniform sample of --drift-sample values per field and side "
        "(exact below that; KS error about 1.36*sqrt(2/N) at 95%); categories are counted exactly (fields "
        "with more than 1,000 distinct values are skipped, and so are string fields with more than half "
        "of a side's values distinct: identifiers such as postal codes). A field fails when PSI > "
        "--psi-threshold or KS > --ks-threshold (FAIL verdict, exit 1) and warns when PSI > --psi-warn, "
        "in both cases only when the statistic is also above its 99%% sampling noise for the sample sizes "
        "(small samples do not flag drift they cannot show).")
    ref = d.add_mutually_exclusive_group()
    ref.add_argument("--reference-parquet", nargs="+", metavar="PATH",
                     help="reference Parquet files, folders or globs")
    ref.add_argument("--reference-table", action="store_true",
                     help="the schema's cold table in Postgres as the reference")
    d.add_argument("--psi-threshold", type=_nonnegative, default=0.25, metavar="X",
                   help="PSI above which a field fails (default 0.25)")
    d.add_argument("--psi-warn", type=_nonnegative, default=0.1, metavar="X",
                   help="PSI above which a field warns (default 0.1)")
    d.add_argument("--ks-threshold", type=_nonnegative, default=0.2, metavar="X",
                   help="KS statistic above which a numeric field fails (default 0.2)")
    d.add_argument("--drift-sample", type=int, default=None, metavar="N",
                   help="values sampled per numeric field and side (default 100000)")
    d.add_argument("--drift-exclude", action="append", default=[], metavar="FIELD",
                   help="leave FIELD out of the drift comparison (repeat for several fields)")
    p.set_defaults(func=run, report_parser=p)


def run(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.report_parser
    if args.since is not None and not args.rejects:
        parser.error("--since applies to --rejects only")
    if args.batch_rows is not None and args.batch_rows < 1:
        parser.error("--batch-rows must be >= 1")
    with_reference = bool(args.reference_parquet) or args.reference_table
    if with_reference and args.rejects:
        parser.error("--reference-parquet/--reference-table apply to --parquet and --table only")
    if args.drift_sample is not None and args.drift_sample < 2:
        parser.error("--drift-sample must be >= 2")
    if args.psi_warn > args.psi_threshold:
        parser.error("--psi-warn must not exceed --psi-threshold")
    if args.drift_exclude and not with_reference:
        parser.error("--drift-exclude needs --reference-parquet or --reference-table")
    settings = resolve_settings(schemas_dir=args.schemas_dir)
    compiled = find_schema(args.schema, settings.schemas_dir)
    unknown = [f for f in args.drift_exclude if f not in compiled.schema.field_names]
    if unknown:
        parser.error(f"--drift-exclude: schema {compiled.name!r} has no field "
                     f"{', '.join(map(repr, unknown))} (fields: {', '.join(compiled.schema.field_names)})")
    progress = not args.no_progress
    drift = None
    if with_reference:
        drift = DriftOptions(
            paths=tuple(args.reference_parquet or ()), table=args.reference_table, dsn=settings.postgres_dsn,
            thresholds=Thresholds(psi_warn=args.psi_warn, psi_fail=args.psi_threshold,
                                  ks_fail=args.ks_threshold),
            sample_size=args.drift_sample or SAMPLE_SIZE, batch_rows=args.batch_rows or DEFAULT_BATCH_ROWS,
            exclude=frozenset(args.drift_exclude))
    if args.parquet:
        report = parquet_report(args.parquet, compiled, batch_rows=args.batch_rows or DEFAULT_BATCH_ROWS,
                                progress=progress, drift=drift)
    elif args.table:
        report = table_report(settings.postgres_dsn, compiled, batch_rows=args.batch_rows or PG_BATCH_ROWS,
                              progress=progress, drift=drift)
    else:
        report = rejects_report(settings.postgres_dsn, compiled, since=args.since,
                                batch_rows=args.batch_rows or PG_BATCH_ROWS, progress=progress)
    json_path, html_path = write_report(report, Path(args.out))
    print(summary_line(report))
    for note in report.get("verdict_notes") or []:
        print(f"  note: {note}")
    print(f"  report: {html_path}\n  numbers: {json_path}")
    return 0 if report["verdict"] == "PASS" else 1


def summary_line(r: dict[str, Any]) -> str:
    """One line: schema, verdict and the main counts."""
    s, c = r["schema"], r["counts"]
    head = f"{s['name']} {s['version']} ({r['mode']}): {r['verdict']}"
    if r["mode"] == "rejects":
        return f"{head}: {c['reject_rows']:,} rejected rows, {c['errors']:,} errors"
    n = c["input_rows"]
    share = f" ({c['rejected_rows'] / n:.2%})" if n else ""
    gx = r["gx"]
    line = (f"{head}: {n:,} rows, {c['rejected_rows']:,} rejected{share}; "
            f"GX {gx['passed']}/{gx['expectations']} expectations passed")
    if "exact_copies" in c:
        line += (f"; {c['exact_copies']:,} exact copies, {c['tied_events']:,} distinct events at "
                 f"{c['tied_instants']:,} shared instants")
    kept = r.get("rejects_kept")
    if kept and kept["rows"]:
        line += f"; {kept['rows']:,} rejected rows kept in {kept['table']}"
    drift = r.get("drift")
    if drift:
        line += f"; drift: {len(drift['failed'])} field(s) failed, {len(drift['warned'])} warned"
        if drift["failed"]:
            line += f" (failed: {', '.join(drift['failed'])})"
    return line
