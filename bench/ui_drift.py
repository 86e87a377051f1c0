"""Benchmark: the Drift page of ``features ui`` over a large history (issue 35).

Usage::

    /work/bin/wt-run .venv/bin/python bench/ui_drift.py [--rows 1000000] [--days 30] [--rounds 7]
        [--samples 10000,20000,100000] [--no-vacuum] [--keep]

Fills a fresh Postgres schema (``bench_uid_<hex>``, dropped at the end unless ``--keep``)
with the credit_applicant history (the generated DDL, its event-time index included):
``--rows`` rows spread evenly over ``--days`` days of event time (``INSERT ... SELECT
generate_series``, random values within the schema's constraints; the last day's incomes
shifted up, so one field drifts), then ``VACUUM ANALYZE`` until the pages are all-visible (the
state autovacuum reaches; ``--no-vacuum`` times a freshly loaded table, whose index-only
scans still visit the heap). Starts a real ``features ui``
(uvicorn) on a free port and times ``GET /drift/credit_applicant?sample=N`` over HTTP (a
fresh connection a request), the sample sizes taking turns round by round, plus one
request whose windows cover the whole table (``recent`` the last ``days/2`` days,
``reference`` the rest). Prints, per request, the median, min and max and the windows'
rows as the page states them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.compile import compile_schema  # noqa: E402
from features.config import resolve_settings  # noqa: E402
from features.schema import load_schema  # noqa: E402

NEWEST = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
FILL = """
INSERT INTO credit_applicant (application_id, submitted_at, income_monthly, employment_duration_months,
    employment_status, age, existing_debt, credit_score, requested_amount, region, customer_since,
    debt_to_income, score_bucket, customer_tenure_days, _digest, _source, _schema_name, _schema_version,
    _schema_fingerprint, _run_id, _ingested_at)
SELECT 'APP-' || lpad(g::text, 12, '0'), t,
    round((1500 + random() * 6000 + CASE WHEN t > %(shift)s THEN 2500 ELSE 0 END)::numeric, 2),
    (random() * 240)::int,
    (ARRAY['employed', 'self_employed', 'unemployed', 'retired', 'student'])[1 + (random() * 4.999)::int],
    (18 + random() * 60)::int,
    CASE WHEN random() < 0.2 THEN NULL ELSE round((random() * 20000)::numeric, 2) END,
    CASE WHEN random() < 0.1 THEN NULL ELSE (300 + random() * 550)::int END,
    round((1000 + random() * 50000)::numeric, 2),
    (ARRAY['north', 'south', 'east', 'west', 'centre', 'islands'])[1 + (random() * 5.999)::int],
    CASE WHEN random() < 0.3 THEN NULL ELSE date '2015-01-01' + (random() * 3000)::int END,
    random(), (random() * 10)::int, random() * 3000,
    md5(g::text), 'bench://fill#' || g, 'credit_applicant', '3.2.1', %(fp)s, 'bench-fill', now()
FROM generate_series(1, %(rows)s) g,
     LATERAL (SELECT %(newest)s - (g - 1) * %(span)s / %(rows)s AS t) s
"""


def fill(dsn: str, rows: int, days: int, vacuum: bool) -> None:
    compiled = compile_schema(load_schema(ROOT / "schemas" / "credit_applicant.yaml"))
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(compiled.ddl)
        conn.execute(FILL, {"rows": rows, "newest": NEWEST, "span": dt.timedelta(days=days),
                            "shift": NEWEST - dt.timedelta(days=1), "fp": compiled.fingerprint})
        for _ in range(5 if vacuum else 0):  # until every page is all-visible (another session's
            conn.execute("VACUUM ANALYZE credit_applicant")  # old snapshot can hold a pass back)
            if visible(conn) >= 0.99:
                break
            time.sleep(2)
        n = conn.execute("SELECT count(*) FROM credit_applicant").fetchone()
        print(f"filled {n[0] if n else 0:,} rows over {days} days in {time.perf_counter() - started:.1f} s; "
              f"{visible(conn):.0%} of its pages all-visible (index-only scans skip those)", flush=True)


def visible(conn: psycopg.Connection[tuple[object, ...]]) -> float:
    row = conn.execute("SELECT relallvisible::float / greatest(relpages, 1) FROM pg_class "
                       "WHERE oid = 'credit_applicant'::regclass").fetchone()
    return float(row[0]) if row else 0.0


def timed(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        html = r.read().decode()
        status = r.status
    ms = 1000 * (time.perf_counter() - started)
    if status != 200:
        raise SystemExit(f"{url}: {status}")
    return ms, html


def windows(html: str) -> str:
    found = re.findall(r'id="read-(?:recent|reference)">(.*?)</span>', html)
    read = [re.sub(r"<[^>]+>", "", m) for m in found]
    return f"recent: {read[0]}; reference: {read[1]}" if len(read) == 2 else "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--samples", default="10000,20000,100000")
    ap.add_argument("--no-vacuum", action="store_true")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    settings = resolve_settings(root=ROOT)
    ns = f"bench_uid_{uuid.uuid4().hex[:8]}"
    dsn = f"{settings.postgres_dsn}{'&' if '?' in settings.postgres_dsn else '?'}options=-csearch_path%3D{ns}"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    proc = None
    try:
        fill(dsn, args.rows, args.days, not args.no_vacuum)
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_INGEST_TOKENS": "",
                   "FEATURES_POSTGRES_DSN": dsn}
            command = [sys.executable, "-m", "features.cli", "ui", "--port", "0", "--schemas-dir",
                       str(ROOT / "schemas"), "--views-dir", str(Path(tmp) / "none")]
            proc = subprocess.Popen(command, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            assert proc.stdout is not None
            base = proc.stdout.readline().split()[3].rstrip("/")
            half = args.days // 2
            pages = {f"sample={s}": f"/drift/credit_applicant?sample={s}" for s in args.samples.split(",")}
            pages[f"whole table, sample=10000 (recent {half}d, reference {args.days - half}d)"] = (
                f"/drift/credit_applicant?recent={half}d&reference={args.days - half + 1}d")
            for path in pages.values():
                timed(base + path)  # warm: imports, the first connection
            times: dict[str, list[float]] = {name: [] for name in pages}
            shown: dict[str, str] = {}
            for _ in range(args.rounds):
                for name, path in pages.items():
                    ms, html = timed(base + path)
                    times[name].append(ms)
                    shown[name] = windows(html)
            print(f"GET /drift/credit_applicant over HTTP, {args.rounds} rounds, {args.rows:,} history rows:")
            for name, ms in times.items():
                print(f"  {name:60s} median {statistics.median(ms):7.1f} ms  min {min(ms):7.1f}  "
                      f"max {max(ms):7.1f}   [{shown[name]}]")
    finally:
        if proc is not None:
            proc.terminate()
            proc.communicate(timeout=30)
        if not args.keep:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()


if __name__ == "__main__":
    main()
