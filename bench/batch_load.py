"""Benchmark: the batch loader end to end against the limits of the same machine.

Usage::

    .venv/bin/python bench/batch_load.py [--rows 1000000] [--batch-rows 131072]

On ``--rows`` applicant rows (deterministic, ~2% invalid; ``schemas/credit_applicant.yaml``)
it measures, in one run, against the local services (``features dev up``):

1. **read**: ``pq.read_table`` of the file alone;
2. **raw Redis**: the same hot hashes (hot fields, derived hot features and lineage of
   every valid row) as Redis protocol bytes built beforehand (``HSET key f v ...``),
   written over one connection and their replies read, as ``redis-cli --pipe`` does;
   once more with each hash's ``EXPIRE`` (the schema's TTL), for information;
3. **raw Postgres**: a psycopg binary ``COPY`` (``write_row``) of the same cold rows,
   built as Python tuples beforehand, into an empty table with the same DDL;
4. **featureline**: ``features.load.load`` — read, validate, transform, write both
   stores (newest-wins script in Redis, COPY + ledger in Postgres), rejects.

Every step runs ``--repeat`` times (default 3), the rounds interleaved so that a noisy
spell of the machine hits all steps alike. It prints each round, then the median,
min and max of each step with rows/s, and our median time as a ratio to
``read + max(raw Redis, raw Postgres)`` (medians); the target is <= 2.0. Each store
gets a fresh namespace (a Postgres schema ``bench_*`` and Redis database 12/13),
dropped afterwards.
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from features.config import resolve_settings  # noqa: E402
from features.ops.examples import applicant_schema, applicants  # noqa: E402

CACHE = ROOT / ".cache" / "bench"


def dataset(rows: int) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"batch_load_{rows}.parquet"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        pq.write_table(applicants(rows, seed=42), tmp, row_group_size=131_072)
        tmp.rename(path)
    return path


def prepared_rows(path: Path, compiled: Any, settings: Any) -> pa.Table:
    """The valid, transformed rows with lineage, exactly what the sinks receive."""
    import datetime as dt

    from features.kernels import transform_program
    from features.lineage import RunContext
    from features.pipeline.prepare import process_batch
    from features.sources.parquet import ParquetSource

    program = transform_program(compiled, settings)
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "bench-raw",
                     dt.datetime.now(dt.UTC))
    parts = [process_batch(sb, compiled, program, ctx, ctx.ingested_at).rows
             for sb in ParquetSource([path], compiled).batches()]
    return pa.concat_tables(parts)


def raw_redis(rows: pa.Table, compiled: Any, url: str, *, ttl: bool = False) -> float:
    """Seconds to write pre-built HSET protocol bytes of the hot hashes and read the replies
    (with ``ttl``: each HSET followed by the schema's EXPIRE, as the hot store needs)."""
    import numpy as np
    import pyarrow.compute as pc
    import redis

    from features.compile.layout import encode_column
    from features.sinks.redis import RedisSink, _bulk, _concat_bytes, _const_bulk

    sink = RedisSink(url, compiled)
    client = redis.Redis.from_url(url)
    client.flushdb()
    n = rows.num_rows
    keys = pc.binary_join_element_wise(f"features:{compiled.name}:{{",
                                       encode_column(rows.column(sink.entity).combine_chunks()), "}", "")
    names = [*sink.hot_columns, "_source", "_schema_version", "_schema_fingerprint", "_run_id",
             "_ingested_at"]
    present = np.zeros(n, dtype=np.int64)
    pairs = []
    for name in names:
        v = encode_column(rows.column(name).combine_chunks())
        present += np.asarray(v.is_valid(), dtype=np.int64)
        pairs.append(pc.fill_null(pc.binary_join_element_wise(_const_bulk(name), _bulk(v), ""), ""))
    cmds = pc.binary_join_element_wise("*", pa.array(2 + 2 * present).cast(pa.string()), "\r\n",
                                       _const_bulk("HSET"), _bulk(keys), *pairs, "")
    per_cmd = 1
    if ttl:
        cmds = pc.binary_join_element_wise(cmds, "*3\r\n" + _const_bulk("EXPIRE"), _bulk(keys),
                                           _const_bulk(str(sink.ttl)), "")
        per_cmd = 2
    chunks = [_concat_bytes(cmds.slice(s, 50_000)) for s in range(0, n, 50_000)]
    host, port = sink.host, sink.port
    sock = socket.create_connection((host, port))
    if sink.db:
        sock.sendall(f"*2\r\n$6\r\nSELECT\r\n${len(str(sink.db))}\r\n{sink.db}\r\n".encode())
        sock.recv(100)
    t0 = time.perf_counter()
    for i, chunk in enumerate(chunks):
        sock.sendall(chunk)
        expected = min(50_000, n - i * 50_000) * per_cmd
        got = 0
        while got < expected:  # one "\n" per reply (counting "\r\n" misses one split between reads)
            got += sock.recv(1 << 20).count(b"\n")
    seconds = time.perf_counter() - t0
    sock.close()
    assert client.dbsize() == n, (client.dbsize(), n)
    client.flushdb()
    client.close()
    return seconds


def cold_tuples(rows: pa.Table, compiled: Any, dsn: str) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The cold columns and the rows as Python tuples (built once, outside the timing)."""
    from features.sinks.postgres import PostgresSink

    columns = PostgresSink(dsn, compiled).columns
    data = rows.select(list(columns))
    return columns, list(zip(*[c.to_pylist() for c in data.columns], strict=True))


def raw_postgres(columns: tuple[str, ...], tuples: list[tuple[Any, ...]], compiled: Any, dsn: str) -> float:
    """Seconds for a psycopg binary COPY (write_row) of pre-built tuples into an empty table."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench_raw CASCADE")
        conn.execute("CREATE SCHEMA bench_raw")
        conn.execute("SET search_path = bench_raw")
        conn.execute(compiled.ddl)
        oids = {r[0]: r[1] for r in conn.execute(
            "SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
            (f'"{compiled.name}"',)).fetchall()}
        cols = ", ".join(f'"{c}"' for c in columns)
        t0 = time.perf_counter()
        copy_sql = f'COPY "{compiled.name}" ({cols}) FROM STDIN (FORMAT BINARY)'
        with conn.cursor() as cur, cur.copy(copy_sql) as cp:
            cp.set_types([oids[c] for c in columns])
            for t in tuples:
                cp.write_row(t)
        seconds = time.perf_counter() - t0
        count = conn.execute(f'SELECT count(*) FROM "{compiled.name}"').fetchone()[0]
        assert count == len(tuples)
        conn.execute("DROP SCHEMA bench_raw CASCADE")
    return seconds


def ours(path: Path, compiled: Any, settings: Any, batch_rows: int) -> tuple[float, Any]:
    import psycopg
    import redis

    from features.load import load

    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench_ours CASCADE")
        conn.execute("CREATE SCHEMA bench_ours")
    redis.Redis.from_url(settings.redis_url).flushdb()
    t0 = time.perf_counter()
    summary = load([path], compiled, settings, batch_rows=batch_rows, search_path="bench_ours")
    seconds = time.perf_counter() - t0
    assert summary.adds_up and summary.stored + summary.rejected == summary.read
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA bench_ours CASCADE")
    redis.Redis.from_url(settings.redis_url).flushdb()
    return seconds, summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch-rows", type=int, default=131_072)
    ap.add_argument("--repeat", type=int, default=3,
                    help="measure every step this many times, interleaved; the ratio uses the medians")
    args = ap.parse_args(argv)

    base = resolve_settings(root=ROOT)
    redis_base = base.redis_url.rsplit("/", 1)[0]
    compiled = applicant_schema()
    path = dataset(args.rows)
    n = args.rows
    print(f"{n:,} applicant rows, {path.stat().st_size / 1e6:.0f} MB Parquet ({path.name}); "
          f"{args.repeat} rounds", flush=True)
    rows = prepared_rows(path, compiled, base)
    valid = rows.num_rows
    columns, tuples = cold_tuples(rows, compiled, base.postgres_dsn)
    settings = dataclasses.replace(base, redis_url=f"{redis_base}/12")
    steps = ["parquet read alone", f"raw Redis HSET pipe ({valid:,} hashes)", "raw Redis HSET + EXPIRE pipe",
             f"raw Postgres binary COPY ({valid:,})", "featureline load (end to end)"]
    counts = [n, valid, valid, valid, n]
    runs: list[list[float]] = []
    summary = None
    for r in range(args.repeat):
        t0 = time.perf_counter()
        table = pq.read_table(path)
        read_s = time.perf_counter() - t0
        del table
        redis_s = raw_redis(rows, compiled, f"{redis_base}/13")
        redis_ttl_s = raw_redis(rows, compiled, f"{redis_base}/13", ttl=True)
        pg_s = raw_postgres(columns, tuples, compiled, base.postgres_dsn)
        ours_s, summary = ours(path, compiled, settings, args.batch_rows)
        runs.append([read_s, redis_s, redis_ttl_s, pg_s, ours_s])
        limit = read_s + max(redis_s, pg_s)
        print(f"round {r + 1}: read {read_s:.2f}s, raw Redis {redis_s:.2f}s (+EXPIRE {redis_ttl_s:.2f}s), "
              f"raw Postgres {pg_s:.2f}s, ours {ours_s:.2f}s: ours / limit = {ours_s / limit:.2f}",
              flush=True)
    med = [statistics.median([run[i] for run in runs]) for i in range(len(steps))]
    title = f"step (median of {args.repeat})"
    print(f"{title:<38}{'seconds':>9}{'rows/s':>14}{'min':>8}{'max':>8}")
    for i, name in enumerate(steps):
        values = [run[i] for run in runs]
        print(f"{name:<38}{med[i]:>9.2f}{counts[i] / med[i]:>14,.0f}{min(values):>8.2f}{max(values):>8.2f}")
    limit = med[0] + max(med[1], med[3])
    print(f"limit = read + slower raw write = {limit:.2f}s; "
          f"ours / limit = {med[4] / limit:.2f} (target <= 2.0; medians)")
    with_ttl = med[0] + max(med[2], med[3])
    print(f"for information, against raw writes that also set the TTL: ours / {with_ttl:.2f}s = "
          f"{med[4] / with_ttl:.2f}")
    assert summary is not None
    print(f"summary (last round): read {summary.read:,} = stored {summary.stored:,} + rejected "
          f"{summary.rejected:,} + already present {summary.already_present:,}; sink seconds "
          + ", ".join(f"{k} {v.seconds:.1f}" for k, v in summary.sinks.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
