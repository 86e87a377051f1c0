"""Benchmark: every page of ``features ui`` over a large store (issue 35: <= 300 ms a page
with 1M rejects and 1,000 runs), and the write cost of the rejects table's indexes.

Usage::

    /work/bin/wt-run .venv/bin/python bench/ui_render.py [--runs 1000] [--rejects 1000000]
        [--rounds 7] [--explain] [--keep]
    /work/bin/wt-run .venv/bin/python bench/ui_render.py --load-cost [--load-rows 200000]

Render: fills a fresh Postgres schema (``bench_ui_<hex>``, dropped at the end unless
``--keep``) with the credit_applicant tables (the generated DDL, its indexes included),
``--runs`` runs in the ledger (4 units each, an hour apart; 1% of them refused by a gate:
a verdict and rejects, no ledger rows; 1% stream runs: rejects only), every run's gate
verdict, and ``--rejects`` rejects spread over the runs (COPY, realistic ``errors`` JSON:
one to three errors a row from 9 rules over 7 fields, a few common and a few rare, and a
``raw`` payload). Then starts a real ``features ui`` (uvicorn) on a free port and times
each page over HTTP (a fresh connection a request, as a browser's first visit), the pages
taking turns round by round; prints the median, min and max per page against the 300 ms
target. ``--explain``: the plans (EXPLAIN ANALYZE) of the queries behind the pages.

Load cost (``--load-cost``): one ``load()`` of ``--load-rows`` applicants, 30% invalid
(many rejects), into a fresh schema; prints its seconds. Run it with ``PYTHONPATH`` at a
checkout without the rejects indexes and at one with them, in turns, to compare.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.compile import compile_schema  # noqa: E402
from features.config import resolve_settings  # noqa: E402
from features.schema import load_schema  # noqa: E402

TARGET_MS = 300.0
SCHEMA = "credit_applicant"
#: (field, rule, reason, message, a bad value, weight): a few common, a few rare
RULES = [
    ("income_monthly", "income_monthly.max", "max", "income_monthly {v} is above the maximum 1000000",
     "2500000", 40),
    ("income_monthly", "income_monthly.required", "required", "income_monthly is missing", None, 15),
    ("age", "age.min", "min", "age {v} is below the minimum 18", "16", 12),
    ("credit_score", "credit_score.max", "max", "credit_score {v} is above the maximum 850", "912", 10),
    ("employment_status", "employment_status.enum", "enum",
     "employment_status '{v}' is not one of employed, self_employed, unemployed, retired", "student", 9),
    ("application_id", "application_id.pattern", "pattern",
     "application_id '{v}' does not match ^APP-[0-9]{{12}}$", "APP-12x", 6),
    ("region", "region.max_length", "max_length", "region '{v}' is longer than 8 characters", "NORTHWESTERN",
     5),
    ("existing_debt", "existing_debt.min", "min", "existing_debt {v} is below the minimum 0", "-40", 2),
    ("requested_amount", "requested_amount.max", "max", "requested_amount {v} is above the maximum 500000",
     "999999", 1),
]
COMMON_RULE, RARE_RULE = "income_monthly.max", "requested_amount.max"


def _errors(rng: random.Random) -> str:
    picked = rng.choices(RULES, weights=[r[5] for r in RULES], k=rng.choice((1, 1, 1, 1, 2, 3)))
    seen: dict[str, dict[str, Any]] = {}
    for f, rule, reason, message, value, _ in picked:
        seen[rule] = {"field": f, "rule": rule, "reason": reason, "message": message.format(v=value),
                      "value": value}
    return json.dumps(list(seen.values()))


def _copy_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def fill(conn: psycopg.Connection[Any], fingerprint: str, runs: int, rejects: int) -> dict[str, Any]:
    """The ledger, verdicts and rejects of ``runs`` runs; returns what the pages ask for."""
    rng = random.Random(35)
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    run_ids = [f"bench-run-{i:05d}-{uuid.UUID(int=rng.getrandbits(128)).hex[:8]}" for i in range(runs)]
    kinds = ["refused" if i % 100 == 37 else "stream" if i % 100 == 71 else "load" for i in range(runs)]
    # rejects per run: uneven (the weights), summing to `rejects`
    weights = [rng.uniform(0.2, 1.8) for _ in range(runs)]
    scale = rejects / sum(weights)
    per_run = [int(w * scale) for w in weights]
    per_run[-1] += rejects - sum(per_run)
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        with cur.copy('COPY "featureline_ledger" (schema_name, fingerprint, unit, run_id, read, stored, '
                      'already_present, rejected, committed_at) FROM STDIN') as copy:
            for i, (rid, kind, n) in enumerate(zip(run_ids, kinds, per_run, strict=True)):
                if kind != "load":
                    continue
                at = base + dt.timedelta(hours=i)
                for u in range(4):
                    rej = n // 4 + (n % 4 if u == 3 else 0)
                    stored = rej * 19 + u
                    copy.write_row((SCHEMA, fingerprint, f"file:///data/{rid}/part-{u}.parquet", rid,
                                    stored + rej, stored, 0, rej, at + dt.timedelta(minutes=u)))
        with cur.copy('COPY "featureline_gate_verdicts" (schema_name, run_id, gate, kind, rule, measured, '
                      'rows, "limit", on_breach, breached, refused, read, rejected, judged_at) FROM STDIN'
                      ) as copy:
            for i, (rid, kind, n) in enumerate(zip(run_ids, kinds, per_run, strict=True)):
                if kind == "stream":
                    continue
                refused = kind == "refused"
                read = n * 4 if refused else n * 20
                copy.write_row((SCHEMA, rid, "max_reject_rate", "max_reject_rate", None, n / read, n, 0.1,
                                "fail", refused, refused, read, n, base + dt.timedelta(hours=i)))
        cols = ("_source", "row_index", "raw", "errors", "event_time", "_schema_name", "_schema_version",
                "_schema_fingerprint", "_run_id", "_ingested_at")
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(
                sql.Identifier(f"{SCHEMA}__rejects"), sql.SQL(", ").join(map(sql.Identifier, cols)))) as copy:
            for i, (rid, n) in enumerate(zip(run_ids, per_run, strict=True)):
                at = (base + dt.timedelta(hours=i, minutes=3)).isoformat()
                lines = []
                for row in range(n):
                    unit = row % 4
                    raw = json.dumps({"application_id": f"APP-{i:06d}{row:06d}", "income_monthly": 2500000,
                                      "age": 16, "region": "NORTHWESTERN", "employment_status": "student"})
                    ev = (base + dt.timedelta(hours=i, seconds=row)).isoformat()
                    lines.append("\t".join((f"file:///data/{rid}/part-{unit}.parquet#{row}", str(row),
                                            _copy_text(raw), _copy_text(_errors(rng)), ev, SCHEMA, "3.2.1",
                                            fingerprint, rid, at)) + "\n")
                copy.write("".join(lines))
    conn.execute("ANALYZE")
    seconds = time.perf_counter() - t0
    mid = runs // 2
    [(lo, hi)] = conn.execute(sql.SQL("SELECT min(id), max(id) FROM {}").format(
        sql.Identifier(f"{SCHEMA}__rejects"))).fetchall()
    return {"seconds": seconds, "run_ids": run_ids, "kinds": kinds, "mid_run": run_ids[mid],
            "refused_run": run_ids[37], "mid_id": (lo + hi) // 2, "lo": lo, "hi": hi}


def pages(f: dict[str, Any]) -> dict[str, str]:
    s, run, mid = SCHEMA, f["mid_run"], f["mid_id"]
    return {
        "registry": "/registry",
        "schema": f"/registry/{s}",
        "runs (all, page 1)": "/runs",
        "runs (schema: chart + page 1)": f"/runs?schema={s}",
        "runs (schema, page 10)": f"/runs?schema={s}&page=10",
        "run (load)": f"/runs/{s}/{run}",
        "run (refused)": f"/runs/{s}/{f['refused_run']}",
        "rejects (unfiltered)": f"/rejects?schema={s}",
        "rejects (by run)": f"/rejects?schema={s}&run={run}",
        "rejects (by common rule)": f"/rejects?schema={s}&rule={COMMON_RULE}",
        "rejects (by rare rule)": f"/rejects?schema={s}&rule={RARE_RULE}",
        "rejects (by field)": f"/rejects?schema={s}&field=age",
        "rejects (page N by keyset)": f"/rejects?schema={s}&after={mid}",
        "rejects (rare rule, page N)": f"/rejects?schema={s}&rule={RARE_RULE}&after={mid}",
        "one reject": f"/rejects/{s}/{mid}",
    }


def explain(conn: psycopg.Connection[Any], f: dict[str, Any]) -> None:
    t = f'"{SCHEMA}__rejects"'
    run, mid = f["mid_run"], f["mid_id"]
    queries = {
        "runs: the rejects' runs (skip scan)":
            f"WITH RECURSIVE r(run) AS ((SELECT _run_id FROM {t} ORDER BY _run_id LIMIT 1) UNION ALL "
            f"SELECT (SELECT _run_id FROM {t} WHERE _run_id > r.run ORDER BY _run_id LIMIT 1) FROM r "
            f"WHERE r.run IS NOT NULL) SELECT count(*) FROM r",
        "runs: top reasons of a page's runs":
            f"SELECT _run_id, e->>'rule', count(*) FROM {t} r, jsonb_array_elements(r.errors) e "
            f"WHERE _run_id = ANY(ARRAY(SELECT run_id FROM featureline_ledger ORDER BY committed_at DESC "
            f"LIMIT 200)) GROUP BY 1, 2",
        "rejects by run (page)":
            f"SELECT id FROM {t} WHERE _run_id = '{run}' AND id > 0 ORDER BY id LIMIT 51",
        "rejects by run (count)":
            f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE _run_id = '{run}' LIMIT 10001) m",
        "rejects by rare rule (page)":
            f"SELECT id FROM {t} WHERE errors @> '[{{\"rule\": \"{RARE_RULE}\"}}]' AND id > 0 "
            f"ORDER BY id LIMIT 51",
        "rejects by rare rule (count)":
            f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE errors @> '[{{\"rule\": \"{RARE_RULE}\"}}]' "
            f"LIMIT 10001) m",
        "rejects by common rule (page)":
            f"SELECT id FROM {t} WHERE errors @> '[{{\"rule\": \"{COMMON_RULE}\"}}]' AND id > {mid} "
            f"ORDER BY id LIMIT 51",
    }
    for name, q in queries.items():
        plan = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF, SUMMARY ON) " + q)]
        print(f"\n-- {name}\n" + "\n".join(plan))


def serve(dsn: str, schemas: Path, tmp: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_INGEST_TOKENS": "", "FEATURES_POSTGRES_DSN": dsn}
    proc = subprocess.Popen([sys.executable, "-m", "features.cli", "ui", "--port", "0", "--schemas-dir",
                             str(schemas), "--views-dir", str(tmp / "no-views")], env=env, cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("features ui: serving "):
        proc.kill()
        raise SystemExit(f"features ui did not start: {line!r}")
    try:
        yield line.split()[3].rstrip("/"), proc
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def fetch_ms(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
        if r.status != 200 or b"<h1" not in body:
            raise SystemExit(f"{url}: HTTP {r.status}")
    return 1000 * (time.perf_counter() - t0)


def render_bench(args: argparse.Namespace) -> None:
    settings = resolve_settings()
    compiled = compile_schema(load_schema(ROOT / "schemas" / f"{SCHEMA}.yaml"))
    ns = f"bench_ui_{uuid.uuid4().hex[:8]}"
    dsn = settings.postgres_dsn + ("&" if "?" in settings.postgres_dsn else "?") + \
        f"options=-csearch_path%3D{ns}"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    try:
        from features.sinks.postgres import PostgresSink

        sink = PostgresSink(settings.postgres_dsn, compiled, search_path=ns)
        sink.open()  # the DDL (tables and indexes), the ledger and the verdicts tables
        sink.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            f = fill(conn, compiled.fingerprint, args.runs, args.rejects)
            print(f"filled {ns}: {args.runs:,} runs ({f['kinds'].count('refused')} refused, "
                  f"{f['kinds'].count('stream')} stream), {args.rejects:,} rejects in {f['seconds']:.1f} s")
            from features.compile.postgres import rejects_index_names, rejects_indexes

            # what a store made before the indexes pays once: building both on these rejects
            conn.execute(sql.SQL("DROP INDEX {}, {}").format(
                *map(sql.Identifier, rejects_index_names(compiled.schema))))
            t0 = time.perf_counter()
            conn.execute(rejects_indexes(compiled.schema))
            print(f"building the rejects indexes on {args.rejects:,} rejects: "
                  f"{time.perf_counter() - t0:.1f} s (writes to the table wait meanwhile)")
            conn.execute("ANALYZE")
            if args.explain:
                explain(conn, f)
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            (tmp / "schemas").mkdir()
            (tmp / "schemas" / f"{SCHEMA}.yaml").write_text((ROOT / "schemas" / f"{SCHEMA}.yaml").read_text())
            for url, _ in serve(dsn, tmp / "schemas", tmp):
                todo = pages(f)
                for path in todo.values():  # warm: the process's imports, the catalog, the caches
                    fetch_ms(url + path)
                times: dict[str, list[float]] = {name: [] for name in todo}
                for _ in range(args.rounds):
                    for name, path in todo.items():
                        times[name].append(fetch_ms(url + path))
        print(f"\n{'page':<32} {'median':>9} {'min':>9} {'max':>9}  (ms, {args.rounds} rounds; target "
              f"{TARGET_MS:.0f} ms)")
        for name, ms in times.items():
            flag = "" if statistics.median(ms) <= TARGET_MS else "  OVER TARGET"
            print(f"{name:<32} {statistics.median(ms):9.1f} {min(ms):9.1f} {max(ms):9.1f}{flag}")
    finally:
        if not args.keep:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        else:
            print(f"kept schema {ns}")
        admin.close()


def load_cost(args: argparse.Namespace) -> None:
    import pyarrow.parquet as pq

    from features.load import load
    from features.ops.examples import applicants

    settings = resolve_settings()
    compiled = compile_schema(load_schema(ROOT / "schemas" / f"{SCHEMA}.yaml"))
    ns = f"bench_uil_{uuid.uuid4().hex[:8]}"
    prefix = f"{ns}:"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    try:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "a.parquet"
            pq.write_table(applicants(args.load_rows, seed=5, invalid_share=0.3), path)
            t0 = time.perf_counter()
            s = load([path], compiled, settings, search_path=ns, key_prefix=prefix)
            seconds = time.perf_counter() - t0
        [(indexes,)] = admin.execute("SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND "
                                     "tablename = %s", (ns, f"{SCHEMA}__rejects")).fetchall()
        print(f"load: read {s.read:,}, stored {s.stored:,}, rejected {s.rejected:,} in {seconds:.2f} s "
              f"(rejects table indexes: {indexes})")
    finally:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        import redis

        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=10_000))
        for i in range(0, len(keys), 10_000):
            client.delete(*keys[i:i + 10_000])
        client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--rejects", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--explain", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the filled Postgres schema")
    p.add_argument("--load-cost", action="store_true")
    p.add_argument("--load-rows", type=int, default=200_000)
    args = p.parse_args()
    load_cost(args) if args.load_cost else render_bench(args)


if __name__ == "__main__":
    main()
