"""Benchmark: the feature SDK's reads (``FeatureStore.online`` and ``.historical``) against raw clients.

Usage::

    .venv/bin/python bench/online.py [--rows 1000000] [--reps 2000] [--hist-rows 100000]
                                     [--profile] [--keep] [--reuse]

Setup: ``--rows`` applicant rows (deterministic, ~2% invalid; ``schemas/credit_applicant.yaml``,
the batch-load benchmark's cached file) are loaded with the batch loader (``features.load.load``)
into a scratch Postgres schema ``bench_online`` and Redis database 11. Then, in one run:

1. **online**: p50/p99 latency of ``fs.online("credit_applicant", ids)`` and of
   ``fs.online_dicts`` (the same rows as dicts) for 1, 10 and 100 ids (random stored
   ids, ``--reps`` repetitions after a warm-up) and, on the same ids in a rotating
   order, the raw baseline: redis-py with hiredis (the fastest ordinary client), one
   ``client.hmget`` for 1 id and a pipeline (``transaction=False``) of one ``HMGET`` per
   key for more (``features.compile.layout.entity_key``), of the same fields the SDK asks for
   (the hot features, ``_enc``, ``_schema_fingerprint``, ``_event_time``), nothing
   decoded. It prints microseconds and ours / raw at p50; the targets are 1 id p50 <=
   250 us and <= 2.5x raw, 100 ids <= 1.5x raw.
2. **historical**: ``fs.historical`` for ``--hist-rows`` entity rows (random stored ids,
   random zoned timestamps across the data's event-time range) against the stored rows;
   for comparison the same COPY + as-of query in psycopg alone, once counted in Postgres
   (the server's share) and once fetched as Python rows (no Arrow).

``--profile`` adds a cProfile of ``fs.online`` for 100 ids. The scratch schema and the
Redis database are dropped afterwards unless ``--keep`` (``--reuse`` skips the drop at
start: the loader's commit ledger then makes the load a no-op).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch_load import dataset  # noqa: E402  (the same cached 1M-row file)

from features.config import resolve_settings  # noqa: E402
from features.ops.examples import applicant_schema  # noqa: E402

PG_SCHEMA = "bench_online"
REDIS_DB = 11
SCHEMA = "credit_applicant"


def setup(path: Path, compiled: Any, settings: Any, *, reuse: bool) -> tuple[float, Any]:
    """Load ``path`` into the scratch stores; returns (seconds, summary)."""
    import psycopg

    from features.load import load

    if not reuse:
        drop(settings)
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}")
    t0 = time.perf_counter()
    summary = load([path], compiled, settings, search_path=PG_SCHEMA)
    seconds = time.perf_counter() - t0
    assert summary.adds_up, summary
    return seconds, summary


def drop(settings: Any) -> None:
    import psycopg
    import redis

    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    client.close()


def stored_ids(settings: Any) -> tuple[np.ndarray, int, int]:
    """Every stored id (as a NumPy object array) and the event-time range in micros."""
    import psycopg

    with psycopg.connect(settings.postgres_dsn, autocommit=True,
                         options=f"-c search_path={PG_SCHEMA}") as conn:
        ids = [r[0] for r in conn.execute(f"SELECT application_id FROM {SCHEMA}").fetchall()]
        lo, hi = conn.execute("SELECT (extract(epoch FROM min(submitted_at)) * 1e6)::bigint, "
                              "(extract(epoch FROM max(submitted_at)) * 1e6)::bigint "
                              f"FROM {SCHEMA}").fetchone()
    return np.array(ids, dtype=object), int(lo), int(hi)


# --------------------------------------------------------------------------- online


def percentiles(ns: list[int]) -> tuple[float, float]:
    us = np.asarray(ns, dtype=np.float64) / 1000.0
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


def online(fs: Any, url: str, ids: np.ndarray, batch: int, reps: int, warmup: int,
           rng: np.random.Generator) -> dict[str, list[int]]:
    """Latencies (ns) of ``fs.online``, ``fs.online_dicts`` and raw for ``batch`` random
    ids, the three in a rotating order on the same ids each repetition."""
    import redis

    from features.compile.layout import entity_key

    entity = fs.schema(SCHEMA).schema.entity
    probe = fs.online(SCHEMA, [ids[0]])
    # The same request as ours: the hot features, the two checked fields, the event time.
    fields = [c for c in probe.column_names if c != entity and not c.startswith("_")] + [
        "_enc", "_schema_fingerprint", "_event_time"]
    client = redis.Redis.from_url(url)

    def raw(sample: list[str]) -> Any:
        if len(sample) == 1:  # the fastest ordinary call for one key: no pipeline object
            return [client.hmget(entity_key(SCHEMA, sample[0]), fields)]
        pipe = client.pipeline(transaction=False)
        for i in sample:
            pipe.hmget(entity_key(SCHEMA, i), fields)
        return pipe.execute()

    runners: list[tuple[str, Callable[[list[str]], Any]]] = [
        ("online", lambda sample: fs.online(SCHEMA, sample)),
        ("online_dicts", lambda sample: fs.online_dicts(SCHEMA, sample)), ("raw", raw)]
    times: dict[str, list[int]] = {name: [] for name, _ in runners}
    for rep in range(warmup + reps):
        sample = ids[rng.integers(0, len(ids), batch)].tolist()
        k = rep % len(runners)
        for name, fn in runners[k:] + runners[:k]:
            t0 = time.perf_counter_ns()
            result = fn(sample)
            elapsed = time.perf_counter_ns() - t0
            if rep >= warmup:
                times[name].append(elapsed)
            if rep == warmup and name == "online":  # once: every id must come from Redis
                assert result.column("_from").to_pylist() == ["redis"] * batch, "not all ids in Redis"
            elif rep == warmup and name == "online_dicts":  # the same rows (ages differ by the clock)
                table = fs.online(SCHEMA, sample).drop_columns(["_age_seconds"]).to_pylist()
                assert [{k: v for k, v in r.items() if k != "_age_seconds"} for r in result] == table
            elif rep == warmup:
                assert all(r[-1] is not None for r in result)
    client.close()
    return times


def profile_online(fs: Any, ids: np.ndarray, rng: np.random.Generator, reps: int = 500) -> str:
    import cProfile
    import io
    import pstats

    samples = [ids[rng.integers(0, len(ids), 100)].tolist() for _ in range(reps)]
    prof = cProfile.Profile()
    prof.enable()
    for s in samples:
        fs.online(SCHEMA, s)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
    return out.getvalue()


# --------------------------------------------------------------------------- historical


def entity_rows(ids: np.ndarray, lo: int, hi: int, n: int, rng: np.random.Generator) -> pa.Table:
    micros = rng.integers(lo, hi + 1, n)
    return pa.table({"application_id": pa.array(ids[rng.integers(0, len(ids), n)].tolist(), pa.string()),
                     "timestamp": pa.array(micros, pa.int64()).cast(pa.timestamp("us", "UTC"))})


def historical_pg_only(settings: Any, fs: Any, entity_df: pa.Table, *, fetch: bool) -> float:
    """The SDK's COPY + as-of query in psycopg alone: ``fetch`` False counts the rows in
    Postgres (the server's share), True fetches them as Python rows (no Arrow)."""
    import psycopg
    from psycopg import sql

    from features.sinks.postgres import copy_csv

    c = fs.schema(SCHEMA)
    names = [n for n in fs.historical(SCHEMA, entity_df.slice(0, 1)).column_names
             if n not in entity_df.column_names and not n.startswith("_")]
    stage = pa.table({"e": entity_df.column("application_id"), "t": entity_df.column("timestamp"),
                      "o": pa.array(np.arange(entity_df.num_rows, dtype=np.int64))})
    cols = sql.SQL(", ").join(sql.SQL("f.{}").format(sql.Identifier(x)) for x in ["submitted_at", *names])
    inner = sql.SQL(", ").join(sql.Identifier(x) for x in ["submitted_at", *names])
    query = sql.SQL(
        "SELECT {cols} FROM _asof q LEFT JOIN LATERAL ("
        "SELECT {inner} FROM {table} h WHERE h.application_id = q.e AND h.submitted_at <= q.t "
        "ORDER BY h.submitted_at DESC LIMIT 1) f ON true ORDER BY q.o").format(
        cols=cols, inner=inner, table=sql.Identifier(c.name))
    if not fetch:
        query = sql.SQL("SELECT count(*) FROM ({}) s").format(query)
    with psycopg.connect(settings.postgres_dsn, autocommit=True,
                         options=f"-c search_path={PG_SCHEMA} -c TimeZone=UTC") as conn:
        t0 = time.perf_counter()
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE _asof (e text, t timestamptz, o bigint) ON COMMIT DROP")
            with conn.cursor() as cur, cur.copy("COPY _asof (e, t, o) FROM STDIN (FORMAT csv)") as cp:
                cp.write(copy_csv(stage))
            conn.execute("ANALYZE _asof")
            rows = conn.execute(query).fetchall()
        seconds = time.perf_counter() - t0
    assert len(rows) == (entity_df.num_rows if fetch else 1)
    return seconds


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=2000, help="timed repetitions per online case")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--hist-rows", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="cProfile fs.online for 100 ids")
    ap.add_argument("--keep", action="store_true", help="leave the scratch stores in place")
    ap.add_argument("--reuse", action="store_true", help="do not drop the scratch stores first")
    args = ap.parse_args(argv)

    from features.sdk.store import FeatureStore

    base = resolve_settings(root=ROOT)
    url = base.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    settings = dataclasses.replace(base, redis_url=url)
    compiled = applicant_schema()
    rng = np.random.default_rng(args.seed)
    path = dataset(args.rows)
    print(f"{args.rows:,} applicant rows, {path.stat().st_size / 1e6:.0f} MB Parquet ({path.name}); "
          f"stores: Postgres schema {PG_SCHEMA}, Redis db {REDIS_DB}")
    load_s, summary = setup(path, compiled, settings, reuse=args.reuse)
    print(f"setup: load {load_s:.1f}s (stored {summary.stored:,}, rejected {summary.rejected:,}, "
          f"already present {summary.already_present:,})")
    try:
        ids, lo, hi = stored_ids(settings)
        fs = FeatureStore(redis_url=url, postgres_dsn=base.postgres_dsn, schemas=ROOT / "schemas",
                          search_path=PG_SCHEMA)
        import redis

        print(f"\nonline: {args.reps:,} timed calls per case after {args.warmup} warm-up, fs.online, "
              f"fs.online_dicts and raw in a rotating order on the same ids, microseconds; raw: redis-py "
              f"{redis.__version__} with hiredis {'yes' if redis.utils.HIREDIS_AVAILABLE else 'NO'} "
              "(1 key: client.hmget; more: a pipeline of HMGETs), nothing decoded", flush=True)
        print(f"{'case':<44}{'p50':>10}{'p99':>10}{'p50 / raw':>11}", flush=True)
        for batch in (1, 10, 100):
            t = online(fs, url, ids, batch, args.reps, args.warmup, rng)
            raw50, raw99 = percentiles(t["raw"])
            plural = "s" if batch > 1 else ""
            for name in ("online", "online_dicts"):
                p50, p99 = percentiles(t[name])
                print(f"{f'fs.{name}, {batch} id{plural}':<44}{p50:>10,.0f}{p99:>10,.0f}{p50 / raw50:>11.2f}")
            print(f"{f'raw HMGET, {batch} key{plural}':<44}{raw50:>10,.0f}{raw99:>10,.0f}", flush=True)
        print("targets: 1 id p50 <= 250 us and <= 2.5x raw; 100 ids <= 1.5x raw", flush=True)

        entity_df = entity_rows(ids, lo, hi, args.hist_rows, rng)
        fs.historical(SCHEMA, entity_df.slice(0, 1000))  # warm-up: schema, fingerprint, temp table
        t0 = time.perf_counter()
        got = fs.historical(SCHEMA, entity_df)
        hist_s = time.perf_counter() - t0
        hits = got.num_rows - got.column("_event_time").null_count
        pg_count_s = historical_pg_only(settings, fs, entity_df, fetch=False)
        pg_fetch_s = historical_pg_only(settings, fs, entity_df, fetch=True)
        n = entity_df.num_rows
        print(f"\nhistorical: {n:,} entity rows against {summary.stored + summary.already_present:,} stored "
              f"rows ({hits:,} with a row at or before their timestamp)")
        print(f"{'step':<52}{'seconds':>9}{'rows/s':>12}")
        for name, secs in [("fs.historical (end to end, Arrow out)", hist_s),
                           ("psycopg: COPY + as-of query, count(*) in Postgres", pg_count_s),
                           ("psycopg: COPY + as-of query, fetchall() rows", pg_fetch_s)]:
            print(f"{name:<52}{secs:>9.2f}{n / secs:>12,.0f}")
        fs.close()
        if args.profile:
            print("\ncProfile of fs.online, 100 ids, 500 calls:")
            fs = FeatureStore(redis_url=url, postgres_dsn=base.postgres_dsn, schemas=ROOT / "schemas",
                              search_path=PG_SCHEMA)
            fs.online(SCHEMA, ids[:100].tolist())
            print(profile_online(fs, ids, rng))
            fs.close()
    finally:
        if not args.keep:
            drop(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
