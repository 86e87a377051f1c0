"""Benchmark: how long ``features ui``'s registry pages take with a long version history
(issue 35: each page in <= 300 ms).

Usage::

    .venv/bin/python bench/ui_registry.py [--versions 1000] [--other-rows 200000] [--repeat 20]

In a fresh Postgres schema: the tables ``features compile`` generates for
``schemas/credit_applicant.yaml``, then ``featureline_schema_versions`` filled with
``--versions`` recorded versions of it (2.0.0, 2.0.1, ...: each with its YAML text and
real fingerprint, each migrated from the one before; the stores hold the last) and
``--other-rows`` rows of other schemas (the table is large, the pages read one schema's
range of its primary key). The schemas folder holds 3.2.1, so the schema page also
computes the diff of the held version against it. Each page is asked ``--repeat`` times
through the ASGI application in process (the route, the queries in a worker thread, the
rendering), the pages taking turns round by round; it prints each round's times as
measured, then the median, min and max per page. The rejects and ledger tables
are not read by these pages (the runs benchmark covers those).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

from features.compile import compile_schema  # noqa: E402
from features.compile.postgres import VERSIONS_TABLE, record_version  # noqa: E402
from features.config import resolve_settings  # noqa: E402
from features.ops.catalog import read_catalog  # noqa: E402
from features.schema.parse import parse_schema  # noqa: E402
from features.ui.app import UIApp  # noqa: E402
from features.ui.data import UIData  # noqa: E402


def dsn_in(dsn: str, ns: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{ns}"


def fill(conn: psycopg.Connection[Any], versions: int, other_rows: int) -> list[str]:
    """The tables, the recorded versions (their version strings, oldest first)."""
    text = (ROOT / "schemas" / "credit_applicant.yaml").read_text()
    conn.execute(compile_schema(parse_schema(text, "credit_applicant.yaml")).ddl)
    names, prev = [], None
    for i in range(versions):
        v = f"2.{i // 100}.{i % 100}"
        s = parse_schema(text.replace("version: 3.2.1", f"version: {v}", 1), f"<{v}>")
        c = compile_schema(s)
        conn.execute(record_version(s, c.fingerprint, prev))
        names.append(v)
        prev = c.fingerprint
    conn.execute("UPDATE featureline_schemas SET version = %s, fingerprint = %s WHERE schema_name = %s",
                 [names[-1], prev, "credit_applicant"])
    conn.execute(sql.SQL("INSERT INTO {} (schema_name, fingerprint, version, definition) SELECT "
                         "'other_' || (g %% 500), md5(g::text), '1.0.' || g, repeat('x', 2000) "
                         "FROM generate_series(1, %s) g").format(sql.Identifier(VERSIONS_TABLE)),
                 [other_rows])
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(VERSIONS_TABLE)))
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", type=int, default=1000)
    ap.add_argument("--other-rows", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    settings = resolve_settings(root=ROOT)
    ns = f"bench_uireg_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    try:
        with psycopg.connect(dsn_in(settings.postgres_dsn, ns), autocommit=True) as conn:
            t = time.perf_counter()
            names = fill(conn, args.versions, args.other_rows)
            print(f"filled: {args.versions} versions of credit_applicant + {args.other_rows:,} other rows "
                  f"in {time.perf_counter() - t:.1f} s")
            plan = conn.execute(sql.SQL("EXPLAIN SELECT fingerprint, version, definition IS NOT NULL, "
                                        "migrated_from, recorded_at FROM {} WHERE schema_name = %s ORDER BY "
                                        "recorded_at DESC, fingerprint DESC LIMIT 100").format(
                sql.Identifier(VERSIONS_TABLE)), ["credit_applicant"]).fetchall()
            print("history query plan:", " / ".join(r[0].strip() for r in plan))
        catalog = read_catalog(ROOT / "schemas", ROOT / "views")
        data = UIData({n: compile_schema(s) for n, s in catalog.schemas.items()},
                      dsn_in(settings.postgres_dsn, ns))
        app = UIApp(catalog, data, tokens=None)
        pages = {"registry": "/registry", "schema (1,000 versions + diff against the file)":
                 "/registry/credit_applicant",
                 "diff first -> last": f"/registry/credit_applicant/diff?from={names[0]}&to={names[-1]}",
                 "diff held -> file": f"/registry/credit_applicant/diff?from={names[-1]}&to=file",
                 "view": "/views/application_scoring"}
        scopes: dict[str, dict[str, Any]] = {}
        for label, path in pages.items():
            target, _, q = path.partition("?")
            scopes[label] = {"type": "http", "method": "GET", "path": target, "headers": [],
                             "query_string": q.encode()}
            got = asyncio.run(app.answer(scopes[label]))  # warms the caches (templates, compiled schemas)
            assert got.status == 200, (path, got.html[-500:])
        times: dict[str, list[float]] = {label: [] for label in pages}
        for r in range(args.repeat):  # interleaved: every page once a round
            for label, scope in scopes.items():
                t = time.perf_counter()
                got = asyncio.run(app.answer(scope))
                times[label].append(time.perf_counter() - t)
                assert got.status == 200, (pages[label], got.html[-500:])
            print(f"round {r + 1}: " + "  ".join(f"{1000 * ts[-1]:.1f}" for ts in times.values()) + " ms",
                  flush=True)
        for label, ts in times.items():
            print(f"{label:<50} median {1000 * statistics.median(ts):7.1f} ms   "
                  f"min {1000 * min(ts):7.1f}   max {1000 * max(ts):7.1f} ms")
    finally:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
