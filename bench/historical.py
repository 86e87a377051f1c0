"""Benchmark: the as-of join behind ``FeatureStore.historical`` (issue 31, item 4).

Usage::

    .venv/bin/python bench/historical.py [--rows 1000000] [--frames 100000,1000000] [--rounds 3]
                                         [--duckdb-path DIR] [--keep] [--reuse]

Setup: ``--rows`` applicant rows (``schemas/credit_applicant.yaml``, the batch-load
benchmark's cached file, ~2% invalid) loaded with the batch loader into a scratch Postgres
schema ``bench_historical`` (and Redis database 12). Entity frames as in the issue's
measurement: random stored rows, each an hour after or a day before its event.

Methods, measured in interleaved rounds (the order rotates each round), each printed as
it is measured, then median and min/max per method and frame size:

- ``a lateral``: the previous ``historical`` (git 7f017cd ``features/store.py``, loaded
  as it was): COPY the frame into a temp table, one ``LEFT JOIN LATERAL`` per row;
- ``b copy+numpy``: ``fs.historical`` now (``features.sdk.asof``): the frame's entities'
  history copied out (COPY ... TO STDOUT csv, ``pyarrow.csv``), joined in NumPy;
- ``c copy+duckdb``: the same copy, then DuckDB's ``ASOF LEFT JOIN`` over the Arrow
  tables (``--duckdb-path``: a folder DuckDB is installed in, e.g. ``pip install --target``);
- ``d pg window``: a Postgres plan without the per-row probe: the frame and the history
  in one ``UNION ALL``, ``max(event time) OVER (PARTITION BY entity ORDER BY time)``,
  counted in Postgres (a lower bound: the columns are not even fetched);
- baselines: ``copy binary``: a plain binary COPY of the whole history (the same
  columns) out of Postgres, bytes only; ``pandas merge_asof``: the frame against that
  history already in pandas (sorts included).

Results are checked: ``b`` equals ``a`` on the first round's frame of each size.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import subprocess
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

PG_SCHEMA = "bench_historical"
REDIS_DB = 12
SCHEMA = "credit_applicant"
#: the first N cold features only (``--features``; None: all)
FEATURES: int | None = None
OLD_COMMIT = "7f017cd"  # the last commit with the lateral-join historical


def old_store_module() -> Any:
    """``features/store.py`` as it was at :data:`OLD_COMMIT` (the lateral join)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:features/store.py"],
                          check=True, capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("_store_lateral", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    exec(compile(text, f"{OLD_COMMIT}:features/store.py", "exec"), mod.__dict__)
    return mod


def setup(settings: Any, compiled: Any, rows: int, *, reuse: bool) -> None:
    import psycopg

    from features.load import load

    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        if not reuse:
            conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {PG_SCHEMA}")
    t0 = time.perf_counter()
    summary = load([dataset(rows)], compiled, settings, search_path=PG_SCHEMA)
    print(f"setup: load {time.perf_counter() - t0:.1f}s (stored {summary.stored:,}, "
          f"already present {summary.already_present:,})", flush=True)
    with scratch(settings) as conn:
        conn.execute(f"VACUUM ANALYZE {SCHEMA}")


def scratch(settings: Any) -> Any:
    import psycopg

    return psycopg.connect(settings.postgres_dsn, autocommit=True, options=f"-c search_path={PG_SCHEMA}")


def history_ids(settings: Any) -> tuple[np.ndarray, np.ndarray]:
    with scratch(settings) as conn:
        rows = conn.execute("SELECT application_id, (extract(epoch FROM submitted_at) * 1e6)::bigint "
                            f"FROM {SCHEMA}").fetchall()
    return np.array([r[0] for r in rows], dtype=object), np.array([r[1] for r in rows], dtype=np.int64)


def frame(ids: np.ndarray, times: np.ndarray, n: int, rng: np.random.Generator) -> pa.Table:
    """Random stored rows, each an hour after or a day before its event (the issue's frame)."""
    pick = rng.integers(0, len(ids), n)
    shift = np.where(rng.random(n) < 0.5, 3_600, -86_400) * 1_000_000
    return pa.table({"application_id": pa.array(ids[pick].tolist(), pa.string()),
                     "timestamp": pa.array(times[pick] + shift, pa.int64()).view(pa.timestamp("us", "UTC")),
                     "label": pa.array(rng.integers(0, 2, n), pa.int8())})


def cold_select(fs: Any) -> tuple[list[str], str]:
    from features.compile.postgres import quote_ident
    from features.sdk.columns import requested_columns

    c = fs.schema(SCHEMA)
    cols = requested_columns(c, None, "cold")[:FEATURES]
    names = [str(c.schema.entity), str(c.schema.event_time), *cols]
    return cols, ", ".join(quote_ident(x) for x in names)


def copy_binary(fs: Any) -> Callable[[pa.Table], int]:
    _, select = cold_select(fs)

    def run(_: pa.Table) -> int:
        def go(conn: Any) -> int:
            n = 0
            with conn.cursor() as cur, cur.copy(f"COPY (SELECT {select} FROM {SCHEMA}) TO STDOUT "
                                                "(FORMAT binary)") as cp:
                for block in cp:
                    n += len(block)
            return n
        return int(fs.run_postgres("copy", go))
    return run


def merge_asof(fs: Any) -> Callable[[pa.Table], int]:
    import pandas as pd

    _, select = cold_select(fs)
    hist = fs.run_postgres("history", lambda conn: conn.execute(f"SELECT {select} FROM {SCHEMA}").fetchall())
    cols, _ = cold_select(fs)
    h = pd.DataFrame(hist, columns=["application_id", "submitted_at", *cols])
    h["submitted_at"] = pd.to_datetime(h["submitted_at"], utc=True).astype("datetime64[us, UTC]")

    def run(df: pa.Table) -> int:
        q = df.to_pandas()
        q["o"] = np.arange(len(q))
        out = pd.merge_asof(q.sort_values("timestamp"), h.sort_values("submitted_at"), left_on="timestamp",
                            right_on="submitted_at", by="application_id", direction="backward",
                            allow_exact_matches=True).sort_values("o")
        return len(out)
    return run


def duckdb_join(fs: Any, path: str) -> Callable[[pa.Table], int]:
    sys.path.insert(0, path)
    import duckdb
    import pyarrow.compute as pc

    from features import asof
    from features.compile.layout import entity_values

    c = fs.schema(SCHEMA)
    cols, _ = cold_select(fs)
    con = duckdb.connect()

    def run(df: pa.Table) -> int:
        enc = entity_values(c, df.column("application_id")).combine_chunks().dictionary_encode()
        t = asof._micros(df.column("timestamp"))
        bounds = (int(pc.min(t).as_py()), int(pc.max(t).as_py()))
        hist = asof._fetch(fs, c, SCHEMA, enc.dictionary, cols, bounds, None)
        q = pa.table({"k": enc.indices, "t": t, "o": pa.array(np.arange(len(t)))})
        con.register("q", q)
        con.register("h", hist)
        out = con.execute("SELECT * FROM q ASOF LEFT JOIN h ON q.k = h.__k AND q.t >= h.__t "
                          "ORDER BY q.o").to_arrow_table()
        con.unregister("q")
        con.unregister("h")
        return int(out.num_rows)
    return run


def pg_window(fs: Any) -> Callable[[pa.Table], int]:
    from features.sinks.postgres import copy_csv

    def run(df: pa.Table) -> int:
        stage = pa.table({"e": df.column("application_id"), "t": df.column("timestamp"),
                          "o": pa.array(np.arange(df.num_rows, dtype=np.int64))})

        def go(conn: Any) -> int:
            with conn.transaction():
                conn.execute("CREATE TEMP TABLE IF NOT EXISTS _bench_win (e text, t timestamptz, o bigint) "
                             "ON COMMIT DELETE ROWS")
                with conn.cursor() as cur, cur.copy("COPY _bench_win FROM STDIN (FORMAT csv)") as cp:
                    cp.write(copy_csv(stage))
                conn.execute("ANALYZE _bench_win")
                row = conn.execute(
                    "SELECT count(hit) FROM (SELECT o, max(CASE WHEN o IS NULL THEN t END) OVER ("
                    "PARTITION BY e ORDER BY t, o NULLS FIRST ROWS UNBOUNDED PRECEDING) AS hit FROM ("
                    "SELECT e, t, o FROM _bench_win UNION ALL SELECT application_id, submitted_at, NULL "
                    f"FROM {SCHEMA} WHERE application_id IN (SELECT e FROM _bench_win)) u) w "
                    "WHERE o IS NOT NULL").fetchone()
                return int(row[0])
        return int(fs.run_postgres("window", go))
    return run


def join_only(fs: Any, df: pa.Table, duckdb_path: str | None, rounds: int) -> None:
    """The join step alone, on one fetched history (no Postgres in the timing): NumPy
    (``features.sdk.asof._match`` + the takes) against DuckDB's ASOF JOIN, interleaved."""
    import pyarrow.compute as pc

    from features import asof
    from features.compile.layout import entity_values

    c = fs.schema(SCHEMA)
    cols, _ = cold_select(fs)
    enc = entity_values(c, df.column("application_id")).combine_chunks().dictionary_encode()
    t = asof._micros(df.column("timestamp"))
    bounds = (int(pc.min(t).as_py()), int(pc.max(t).as_py()))
    hist = asof._fetch(fs, c, SCHEMA, enc.dictionary, cols, bounds, None)
    codes = np.asarray(enc.indices, dtype=np.int64)
    t_q = np.asarray(t, dtype=np.int64)
    ok = np.ones(len(codes), dtype=bool)

    def numpy_join() -> int:
        idx = asof._match(hist, codes, t_q, ok, None)
        take = pa.array(idx, mask=idx < 0)
        return sum(len(hist.column(n).take(take)) for n in [*cols, "__t"])

    runners: dict[str, Callable[[], int]] = {"numpy join": numpy_join}
    if duckdb_path:
        sys.path.insert(0, duckdb_path)
        import duckdb

        con = duckdb.connect()
        q = pa.table({"k": enc.indices, "t": t, "o": pa.array(np.arange(len(t)))})
        con.register("q", q)
        con.register("h", hist)
        sql = "SELECT * FROM q ASOF LEFT JOIN h ON q.k = h.__k AND q.t >= h.__t ORDER BY q.o"
        runners["duckdb ASOF JOIN"] = lambda: int(con.sql(sql).to_arrow_table().num_rows)
    got: dict[str, list[float]] = {k: [] for k in runners}
    for r in range(rounds):
        for name in list(runners)[r % len(runners):] + list(runners)[:r % len(runners)]:
            t0 = time.perf_counter()
            runners[name]()
            got[name].append(time.perf_counter() - t0)
    for name, v in got.items():
        print(f"join only, {df.num_rows:,} frame rows x {hist.num_rows:,} history rows: {name:<18} median "
              f"{statistics.median(v):.3f}s (min-max {min(v):.3f}-{max(v):.3f}, {rounds} rounds)", flush=True)


def main() -> int:
    global PG_SCHEMA, FEATURES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--frames", default="100000,1000000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duckdb-path", default=None)
    ap.add_argument("--join-only", action="store_true",
                    help="time only the join step (NumPy vs DuckDB) on one fetched history, then stop")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--methods", default=None,
                    help="comma-separated prefixes of the methods to run (e.g. b,copy,pandas); default all")
    ap.add_argument("--features", type=int, default=None,
                    help="read only the first N cold features (default: all)")
    ap.add_argument("--pg-schema", default=PG_SCHEMA,
                    help="the scratch Postgres schema (bench_online: reuse bench/online.py's --keep load)")
    ap.add_argument("--redis-db", type=int, default=REDIS_DB)
    args = ap.parse_args()
    PG_SCHEMA, FEATURES = args.pg_schema, args.features

    import psycopg

    from features.sdk.store import FeatureStore

    base = resolve_settings(root=ROOT)
    url = base.redis_url.rsplit("/", 1)[0] + f"/{args.redis_db}"
    settings = dataclasses.replace(base, redis_url=url)
    compiled = applicant_schema()
    setup(settings, compiled, args.rows, reuse=args.reuse)
    kw = {"redis_url": url, "postgres_dsn": base.postgres_dsn, "schemas": ROOT / "schemas",
          "search_path": PG_SCHEMA}
    fs = FeatureStore(**kw)
    lateral = not args.methods or any("a lateral".startswith(w) for w in args.methods.split(","))
    # (loaded only when a runs: 7f017cd's store.py imports modules that have moved since)
    fs_old = old_store_module().FeatureStore(**kw) if lateral else None
    ids, times = history_ids(settings)
    print(f"history: {len(ids):,} rows in Postgres", flush=True)
    rng = np.random.default_rng(31)
    if args.join_only:
        for n in [int(x) for x in args.frames.split(",")]:
            join_only(fs, frame(ids, times, n, rng), args.duckdb_path, args.rounds)
        return 0
    cols, _ = cold_select(fs)
    methods: dict[str, Callable[[pa.Table], int]] = {
        "a lateral": lambda df: fs_old.historical(SCHEMA, df, cols).num_rows,  # type: ignore[union-attr]
        "b copy+numpy": lambda df: fs.historical(SCHEMA, df, cols).num_rows,
        "d pg window (count only)": pg_window(fs),
        "copy binary (baseline)": copy_binary(fs),
        "pandas merge_asof (baseline)": merge_asof(fs),
    }
    if args.duckdb_path:
        methods["c copy+duckdb"] = duckdb_join(fs, args.duckdb_path)
    if args.methods:
        wanted = args.methods.split(",")
        methods = {k: v for k, v in methods.items() if any(k.startswith(w) for w in wanted)}
    times_s: dict[tuple[str, int], list[float]] = {}
    sizes = [int(x) for x in args.frames.split(",")]
    frames = {n: frame(ids, times, n, rng) for n in sizes}
    for n, df in frames.items():  # warm-up and the check: the new result equals the old one
        new = fs.historical(SCHEMA, df, cols)
        if "a lateral" not in methods:
            print(f"warm-up: b on {n:,} entity rows ({n - new.column('_event_time').null_count:,} hits; "
                  "not checked against a: not selected)", flush=True)
            continue
        prev = fs_old.historical(SCHEMA, df, cols)  # type: ignore[union-attr]
        assert new.equals(prev), f"b differs from a at {n:,} rows"
        print(f"check: b == a on {n:,} entity rows ({n - new.column('_event_time').null_count:,} hits)",
              flush=True)
    names = list(methods)
    for r in range(args.rounds):
        for n, df in frames.items():
            k = r % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                methods[name](df)
                s = time.perf_counter() - t0
                times_s.setdefault((name, n), []).append(s)
                print(f"round {r + 1} {n:>9,} {name:<30} {s:7.2f}s {n / s:>12,.0f} rows/s", flush=True)
    print(f"\n{'method':<30}{'frame':>10}{'median s':>10}{'min-max s':>14}{'rows/s (median)':>17}")
    for n in sizes:
        for name in names:
            v = times_s[(name, n)]
            med = statistics.median(v)
            print(f"{name:<30}{n:>10,}{med:>10.2f}{f'{min(v):.2f}-{max(v):.2f}':>14}{n / med:>17,.0f}")
    fs.close()
    if fs_old is not None:
        fs_old.close()
    if not args.keep:
        with psycopg.connect(base.postgres_dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {PG_SCHEMA} CASCADE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
