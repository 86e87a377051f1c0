"""Benchmark: rendering ``report.html`` from a report dict (no checks, no I/O).

Usage::

    .venv/bin/python bench/report_html.py [--copies 20] [--rounds 15] [--renders 10]
        [--against OLD_HTML_PY]

Builds one real report (``parquet_report`` over 5,000 example applicants, ~2% invalid,
with drift against another 5,000), then widens it ``--copies`` times: every field,
expectation, rejects group and drift field repeated under a suffixed name (``age~7``),
so the page has many rows, examples and charts. Times ``render_html`` on it: per round
``--renders`` calls, the mean CPU time per call (``time.process_time``: the
render is single-threaded, and CPU time is less disturbed than wall time by other work
on the machine). With ``--against`` (a file defining
``render_html``, e.g. an earlier ``features/report/html.py`` from ``git show``) the two
renderers take turns round by round, so a change of machine load hits both alike.
Prints each renderer's median, min and max per call over the rounds, and
the time to build the report itself (validator, GX, statistics, drift) for scale.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

Render = Callable[[dict[str, Any]], str]


def base_report(folder: Path) -> dict[str, Any]:
    from features.ops.examples import applicant_schema, applicants
    from features.report import parquet_report
    from features.report.drift import DriftOptions

    data, ref = folder / "data.parquet", folder / "reference.parquet"
    pq.write_table(applicants(5_000, seed=11), data)
    pq.write_table(applicants(5_000, seed=12, invalid_share=0.0), ref)
    return parquet_report([data], applicant_schema(), batch_rows=2_000,
                          drift=DriftOptions(paths=(str(ref),)))


def widen(report: dict[str, Any], copies: int) -> dict[str, Any]:
    """``report`` with each per-field and per-rule row repeated ``copies`` times."""
    r = copy.deepcopy(report)

    def repeat(rows: list[dict[str, Any]], *keys: str) -> list[dict[str, Any]]:
        out = []
        for i in range(copies):
            for row in rows:
                row = copy.deepcopy(row)
                for key in keys:
                    row[key] = f"{row[key]}~{i}"
                out.append(row)
        return out

    r["fields"] = repeat(r["fields"], "field")
    r["expectations"] = repeat(r["expectations"], "rule")
    r["rejects"]["groups"] = repeat(r["rejects"]["groups"], "field", "rule")
    r["drift"]["fields"] = repeat(r["drift"]["fields"], "field")
    return r


def load_render(path: str) -> Render:
    spec = importlib.util.spec_from_file_location("report_html_against", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    render: Render = module.render_html
    return render


def main(argv: list[str] | None = None) -> int:
    from features.report.html import render_html

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--renders", type=int, default=10)
    ap.add_argument("--against", metavar="OLD_HTML_PY", help="another html.py to time alongside")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        base = base_report(Path(tmp))
        built = time.perf_counter() - t0
    report = widen(base, args.copies)
    renderers: dict[str, Render] = {"template (features/report/html.py)": render_html}
    if args.against:
        renderers[f"against ({args.against})"] = load_render(args.against)
    pages = {name: render(report) for name, render in renderers.items()}  # warm-up (template compile)
    print(f"{len(report['fields']):,} fields, {len(report['expectations']):,} expectations, "
          f"{len(report['rejects']['groups']):,} rejects groups, {len(report['drift']['fields']):,} "
          f"drift fields; page {', '.join(f'{len(p) / 1e3:,.0f} kB' for p in pages.values())}; "
          f"building the unwidened report took {built:.1f} s")
    seconds: dict[str, list[float]] = {name: [] for name in renderers}
    for i in range(args.rounds):
        order = list(renderers.items())
        for name, render in order if i % 2 == 0 else reversed(order):
            t0 = time.process_time()
            for _ in range(args.renders):
                render(report)
            seconds[name].append((time.process_time() - t0) / args.renders)
    print(f"{'renderer':<48}{'median ms':>11}{'min ms':>9}{'max ms':>9}")
    for name, s in seconds.items():
        print(f"{name:<48}{statistics.median(s) * 1e3:>11.2f}{min(s) * 1e3:>9.2f}{max(s) * 1e3:>9.2f}")
    if args.against:
        a, b = (statistics.median(s) for s in seconds.values())
        print(f"template / against at the median = {a / b:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
