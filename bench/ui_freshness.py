"""Benchmark: the UI's Freshness and lag page over a large history, and the write cost of
the history table's two indexes (by event time, by ``_ingested_at``).

Usage::

    /work/bin/wt-run .venv/bin/python bench/ui_freshness.py [--rows 1000000] [--rounds 15]
        [--index-cost] [--keep]

Fills a fresh Postgres schema (``bench_uif_<hex>``, dropped at the end unless ``--keep``)
and a Redis key prefix: a real ``load()`` of 20,000 credit applicants (hot and cold,
the newest events), then the history widened in SQL to ``--rows`` rows with older copies
of those rows under other entity ids (cold only: entities whose hot hash expired).
Creates a 2-partition topic with 1,000 records and a consumer group that committed half
of them. Starts a real ``features ui --stream credit_applicant:TOPIC:GROUP`` on a free
port and times ``/freshness`` and ``/freshness/credit_applicant`` over HTTP (a fresh
connection a request), taking turns round by round; prints the median, min and max per
page against the 300 ms target, and the plans of the two ``max()`` queries.

``--load-cost ROWS``: one real ``load()`` of ROWS valid applicants into a fresh schema and
key prefix, its seconds; with ``BENCH_FEATURES=/path/to/checkout`` that checkout's
``features`` is timed (e.g. main, without the indexes): run both in turns to compare.

``--index-cost``: copies the history (``--rows`` rows, ``INSERT ... SELECT``) into a table
keyed like it, without and then with the two indexes, in turns, twice each; prints the
seconds of each and the difference (what the indexes add to a load's Postgres write).
"""

from __future__ import annotations

import argparse
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
from typing import Any

import psycopg
import pyarrow.parquet as pq
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
if os.environ.get("BENCH_FEATURES"):  # --load-cost at another checkout (one without the indexes)
    sys.path.insert(0, os.environ["BENCH_FEATURES"])
else:
    sys.path.insert(0, str(ROOT))

from features.compile import compile_schema  # noqa: E402
from features.config import resolve_settings  # noqa: E402
from features.load import load  # noqa: E402
from features.ops.examples import applicant_events, applicants  # noqa: E402
from features.schema import load_schema  # noqa: E402
from features.stream.kafka import create_topic, entity_keys, produce  # noqa: E402

TARGET_MS = 300.0
REAL_ROWS = 20_000


def dsn_with(dsn: str, ns: str) -> str:
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options=-csearch_path%3D{ns}"


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
    assert row is not None
    return int(row[0])


def widen(conn: psycopg.Connection[Any], rows: int) -> None:
    """The history widened to ``rows`` rows: copies of the loaded rows, each copy ``g``
    under other entity ids (``+ g * 20,000,000``) and 30 days older per copy."""
    have = count(conn, "credit_applicant")
    copies = max(-(-rows // have) - 1, 0)
    cols = [r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'credit_applicant' ORDER BY ordinal_position")]
    exprs: list[sql.Composable] = []
    for c in cols:
        if c == "application_id":
            exprs.append(sql.SQL("'APP-' || lpad((substr(application_id, 5)::bigint + g * 20000000)::text, "
                                 "12, '0')"))
        elif c == "submitted_at":
            exprs.append(sql.SQL("submitted_at - g * interval '30 days'"))
        else:
            exprs.append(sql.Identifier(c))
    conn.execute(sql.SQL('INSERT INTO "credit_applicant" ({}) SELECT {} FROM "credit_applicant", '
                         "generate_series(1, %s) g ORDER BY g LIMIT %s").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in cols), sql.SQL(", ").join(exprs)),
        [copies, rows - have])
    conn.execute('ANALYZE "credit_applicant"')


def index_cost(conn: psycopg.Connection[Any], schema: Any) -> None:
    """Seconds to copy the history into a table keyed like it, with none, each and both of
    the two indexes, in turns, twice each (the best of two printed)."""
    from features.compile.postgres import history_indexes  # not at a checkout without them (--load-cost)

    rows = count(conn, "credit_applicant")
    ddl = history_indexes(schema).replace('"credit_applicant__by', '"credit_applicant_copy__by')
    ddl = ddl.replace('ON "credit_applicant"', 'ON "credit_applicant_copy"')
    statements = [s for s in ddl.splitlines() if s]
    variants = {"none": [], "event time": statements[:1], "ingested_at": statements[1:], "both": statements}
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(2):
        for variant, create in variants.items():
            conn.execute('DROP TABLE IF EXISTS "credit_applicant_copy"')
            conn.execute('CREATE TABLE "credit_applicant_copy" (LIKE "credit_applicant" INCLUDING DEFAULTS '
                         "INCLUDING CONSTRAINTS EXCLUDING INDEXES)")
            conn.execute('ALTER TABLE "credit_applicant_copy" ADD PRIMARY KEY (application_id, submitted_at, '
                         "_digest)")
            for statement in create:
                conn.execute(statement)
            t0 = time.perf_counter()
            conn.execute('INSERT INTO "credit_applicant_copy" SELECT * FROM "credit_applicant"')
            times[variant].append(time.perf_counter() - t0)
    conn.execute('DROP TABLE "credit_applicant_copy"')
    base = min(times["none"])
    for variant, ts in times.items():
        best = min(ts)
        print(f"index cost: INSERT ... SELECT of {rows:,} rows, primary key and {variant:11s}: "
              f"{', '.join(f'{t:.2f}' for t in ts)} s "
              f"(best {best:.2f} s, +{100 * (best - base) / base:.0f}%)")


def load_cost(rows: int) -> None:
    """One ``load()`` of ``rows`` valid applicants into a fresh schema and key prefix: its
    seconds (run it at a checkout with the indexes and at one without, in turns)."""
    settings = resolve_settings()
    compiled = compile_schema(load_schema(ROOT / "schemas" / "credit_applicant.yaml"))
    ns, prefix = f"bench_uif_{uuid.uuid4().hex[:8]}", f"bench_uif_{uuid.uuid4().hex[:8]}:"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    import redis

    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "a.parquet"
            pq.write_table(applicants(rows, seed=23, invalid_share=0.0), data)
            t0 = time.perf_counter()
            summary = load([data], compiled, settings, search_path=ns, key_prefix=prefix)
            print(f"load cost: {summary.stored:,} rows stored in {time.perf_counter() - t0:.2f} s "
                  f"(features from {Path(sys.modules['features'].__file__ or '').parent.parent})")
    finally:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=10_000))
        for at in range(0, len(keys), 10_000):
            client.delete(*keys[at:at + 10_000])
        client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--index-cost", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--load-cost", type=int, default=0, metavar="ROWS",
                    help="only time one load() of ROWS rows (see load_cost)")
    args = ap.parse_args()
    if args.load_cost:
        load_cost(args.load_cost)
        return
    settings = resolve_settings()
    schema = load_schema(ROOT / "schemas" / "credit_applicant.yaml")
    compiled = compile_schema(schema)
    ns, prefix = f"bench_uif_{uuid.uuid4().hex[:8]}", f"bench_uif_{uuid.uuid4().hex[:8]}:"
    topic, group = f"bench_uif_{uuid.uuid4().hex[:8]}", f"bench_uif_group_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    proc = None
    import redis
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    kafka = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "a.parquet"
            pq.write_table(applicants(REAL_ROWS, seed=21, invalid_share=0.0), data)
            t0 = time.perf_counter()
            load([data], compiled, settings, search_path=ns, key_prefix=prefix)
            print(f"loaded {REAL_ROWS:,} rows in {time.perf_counter() - t0:.1f} s")
        conn = psycopg.connect(dsn_with(settings.postgres_dsn, ns), autocommit=True)
        t0 = time.perf_counter()
        widen(conn, args.rows)
        total = count(conn, "credit_applicant")
        print(f"history widened to {total:,} rows in {time.perf_counter() - t0:.1f} s")
        for column in ("submitted_at", "_ingested_at"):
            plan = conn.execute(f'EXPLAIN ANALYZE SELECT max("{column}") FROM "credit_applicant"').fetchall()
            shown = [r[0].strip() for r in plan if "Scan" in r[0] or "Execution" in r[0]]
            print(f"max({column}):", "; ".join(shown))
        create_topic(settings.kafka_bootstrap, topic, partitions=2)
        values = applicant_events(1000, seed=2, undecodable_every=0)
        positions = produce(settings.kafka_bootstrap, topic, values,
                            keys=entity_keys(values, "application_id"))
        ends: dict[int, int] = {}
        for part, off, _ in positions:
            ends[part] = max(ends.get(part, 0), off + 1)
        c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group})
        c.commit(offsets=[TopicPartition(topic, p, e // 2) for p, e in ends.items()], asynchronous=False)
        c.close()

        env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_INGEST_TOKENS": "",
               "FEATURES_POSTGRES_DSN": dsn_with(settings.postgres_dsn, ns)}
        proc = subprocess.Popen([sys.executable, "-m", "features.cli", "ui", "--port", "0", "--schemas-dir",
                                 str(ROOT / "schemas"), "--key-prefix", prefix, "--stream",
                                 f"credit_applicant:{topic}:{group}"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[3].rstrip("/")
        pages = ["/freshness", "/freshness/credit_applicant"]
        timings: dict[str, list[float]] = {p: [] for p in pages}
        for round_ in range(args.rounds + 1):
            for p in pages:
                t0 = time.perf_counter()
                with urllib.request.urlopen(url + p, timeout=30) as r:
                    body = r.read()
                    assert r.status == 200
                if round_:  # the first round warms the server's caches (templates, imports)
                    timings[p].append(1000 * (time.perf_counter() - t0))
                assert b"coverage-hot" in body
        text = body.decode()
        hot, sampled, lag = (re.search(rf'class="{c}">([^<]*)<', text) for c in (
            "n coverage-hot", "n coverage-entities", "num lag-total"))
        print(f"the page shows: {hot and hot[1]} of {sampled and sampled[1]} sampled entities hot, a lag of "
              f"{lag and lag[1]} records")
        for p, ts in timings.items():
            med = statistics.median(ts)
            print(f"{p:32s} median {med:6.1f} ms  min {min(ts):6.1f}  max {max(ts):6.1f}  "
                  f"({'within' if med <= TARGET_MS else 'OVER'} {TARGET_MS:.0f} ms; {len(ts)} rounds)")
        if args.index_cost:
            index_cost(conn, schema)
        conn.close()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
        if not args.keep:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
            client = redis.Redis.from_url(settings.redis_url)
            keys = list(client.scan_iter(match=prefix + "*", count=10_000))
            for at in range(0, len(keys), 10_000):
                client.delete(*keys[at:at + 10_000])
            client.close()
            kafka.delete_consumer_groups([group])
            kafka.delete_topics([topic])
        admin.close()


if __name__ == "__main__":
    main()
