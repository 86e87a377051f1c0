"""Static schemas (``event_time: none``) against the real Redis and Postgres: one row per
entity, the newest load wins; online, historical and a view read it by key at any time
(before, between and after the loads); one load's rows of an entity leave the same
stored state whatever their order; the stream's micro-batches write through the same
code (``StreamProcessor.process``)."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features import FeatureStore
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import entity_key
from features.config import Settings
from features.load import load
from features.schema.parse import parse_schema
from features.stream.core import StreamProcessor

pytestmark = pytest.mark.services

AIRCRAFT = """\
name: aircraft
version: 1.0.0
entity: tailnum
event_time: none
hot: {ttl: 1d}
fields:
  - name: tailnum
    type: string
    constraints: {required: true}
  - name: seats
    type: int32
    store: [hot, cold]
  - name: manufacturer
    type: string
    store: [hot, cold]
"""
FLIGHTS = """\
name: flights
version: 1.0.0
entity: flight_id
event_time: dep_time
fields:
  - name: flight_id
    type: string
    constraints: {required: true}
  - name: dep_time
    type: timestamp(us, UTC)
    constraints: {required: true}
  - name: tailnum
    type: string
    store: [hot, cold]
  - name: dep_delay
    type: float64
    store: [hot, cold]
"""
VIEW = """\
name: flight_scoring
version: 1.0.0
request:
  keys:
    flight_id: string
    tailnum: string
sources:
  - schema: flights
    features: [dep_delay]
    join: {flight_id: flight_id}
  - schema: aircraft
    features: [seats, manufacturer]
    join: {tailnum: tailnum}
    prefix: plane_
"""
UTC = dt.UTC


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "views").mkdir()
    (tmp_path / "schemas" / "aircraft.yaml").write_text(AIRCRAFT)
    (tmp_path / "schemas" / "flights.yaml").write_text(FLIGHTS)
    (tmp_path / "views" / "flight_scoring.yaml").write_text(VIEW)
    return tmp_path


@pytest.fixture()
def aircraft() -> CompiledSchema:
    return compile_schema(parse_schema(AIRCRAFT, "aircraft.yaml"))


def store(settings: Settings, project: Path, pg_schema: str, redis_prefix: str, *,
          clock: float | None = None, fill: bool = False) -> FeatureStore:
    return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                        schemas=project / "schemas", views=project / "views", search_path=pg_schema,
                        key_prefix=redis_prefix, fill=fill,
                        clock=None if clock is None else (lambda: clock))


def write(path: Path, rows: list[tuple[str, int | None, str | None]]) -> Path:
    pq.write_table(pa.table({"tailnum": [r[0] for r in rows],
                             "seats": pa.array([r[1] for r in rows], pa.int32()),
                             "manufacturer": [r[2] for r in rows]}), path)
    return path


def cold_rows(settings: Settings, pg_schema: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(
            "SELECT tailnum, seats, manufacturer, _digest, _ingested_at FROM aircraft").fetchall()}


def hot_rows(settings: Settings, redis_prefix: str, ids: list[str]) -> dict[str, dict[str, str]]:
    hot = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    return {i: dict(hot.hgetall(redis_prefix + entity_key("aircraft", i))) for i in ids}


FIRST = [("N101", 150, "BOEING"), ("N202", 80, "EMBRAER"), ("N303", None, "AIRBUS")]
#: the second load: N101 refitted (more seats), N202 re-registered to another maker,
#: N404 new; N303 not in it (it keeps the first load's row)
SECOND = [("N101", 180, "BOEING"), ("N202", 80, "BOMBARDIER"), ("N404", 200, "AIRBUS")]
NEWEST = {"N101": (180, "BOEING"), "N202": (80, "BOMBARDIER"), "N303": (None, "AIRBUS"),
          "N404": (200, "AIRBUS")}


@pytest.fixture()
def two_loads(tmp_path: Path, settings: Settings, aircraft: CompiledSchema, pg_schema: str,
              redis_prefix: str) -> Iterator[tuple[dt.datetime, dt.datetime]]:
    """The two loads, one after the other; yields the instants between them and after."""
    a = load([write(tmp_path / "a.parquet", FIRST)], aircraft, settings, search_path=pg_schema,
             key_prefix=redis_prefix)
    assert (a.stored, a.rejected, a.already_present) == (3, 0, 0), a
    time.sleep(0.01)
    between = dt.datetime.now(UTC)
    time.sleep(0.01)
    b = load([write(tmp_path / "b.parquet", SECOND)], aircraft, settings, search_path=pg_schema,
             key_prefix=redis_prefix)
    # every row of the newer load replaces its entity's row (N202's seats are the same,
    # its maker is not): stored counts rows written, as for a timed schema
    assert (b.stored, b.rejected, b.already_present) == (3, 0, 0), b
    time.sleep(0.01)
    yield between, dt.datetime.now(UTC)


def test_the_newest_load_wins_in_both_stores(two_loads: tuple[dt.datetime, dt.datetime], settings: Settings,
                                             pg_schema: str, redis_prefix: str) -> None:
    cold = cold_rows(settings, pg_schema)
    assert {k: v[:2] for k, v in cold.items()} == NEWEST  # one row per entity
    between, _ = two_loads
    assert cold["N303"][3] < between < cold["N101"][3]  # N303: the first load's row
    hot = hot_rows(settings, redis_prefix, sorted(NEWEST))
    for tail, (seats, maker) in NEWEST.items():
        assert hot[tail].get("seats") == (None if seats is None else str(seats))
        assert hot[tail]["manufacturer"] == maker
        assert hot[tail]["_digest"] == cold[tail][2]  # both stores hold one version


def test_a_reload_of_an_older_file_is_a_newer_load(
        tmp_path: Path, two_loads: tuple[dt.datetime, dt.datetime], settings: Settings,
        aircraft: CompiledSchema, pg_schema: str, redis_prefix: str) -> None:
    """"Newest" is the load's time, not the file's content. A re-run of the first file
    changes nothing (the ledger has it: already present); the same rows in a file the
    ledger has not seen are a newer load and put the first values back."""
    again = load([tmp_path / "a.parquet"], aircraft, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert (again.stored, again.already_present) == (0, 3), again
    assert {k: v[:2] for k, v in cold_rows(settings, pg_schema).items()} == NEWEST
    copy = tmp_path / "a_again.parquet"
    copy.write_bytes((tmp_path / "a.parquet").read_bytes())
    again = load([copy], aircraft, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert again.stored == 3, again
    cold = cold_rows(settings, pg_schema)
    assert {k: v[:2] for k, v in cold.items()} == {**NEWEST, **{r[0]: r[1:] for r in FIRST}}
    assert hot_rows(settings, redis_prefix, ["N101"])["N101"]["seats"] == "150"


def test_online_historical_and_the_view_give_the_newest_row_at_any_time(
        two_loads: tuple[dt.datetime, dt.datetime], tmp_path: Path, settings: Settings, project: Path,
        pg_schema: str, redis_prefix: str) -> None:
    between, after = two_loads
    before = dt.datetime(2013, 1, 1, tzinfo=UTC)  # long before either load
    flights = compile_schema(parse_schema(FLIGHTS, "flights.yaml"))
    dep = [dt.datetime(2013, 1, 1, 5, tzinfo=UTC), between, after]
    pq.write_table(pa.table({"flight_id": ["F1", "F2", "F3"],
                             "dep_time": pa.array(dep, pa.timestamp("us", "UTC")),
                             "tailnum": ["N101", "N202", "N999"], "dep_delay": [2.0, -1.0, 30.0]}),
                   tmp_path / "flights.parquet")
    assert load([tmp_path / "flights.parquet"], flights, settings, search_path=pg_schema,
                key_prefix=redis_prefix).stored == 3
    ids = ["N101", "N202", "N303", "N404", "N999"]
    want_seats = [NEWEST[i][0] if i in NEWEST else None for i in ids]
    want_maker = [NEWEST[i][1] if i in NEWEST else None for i in ids]
    for at in (before, between, after):
        with store(settings, project, pg_schema, redis_prefix, clock=at.timestamp()) as fs:
            on = fs.online("aircraft", ids)
            assert on.column("seats").to_pylist() == want_seats, at
            assert on.column("manufacturer").to_pylist() == want_maker, at
            hist = fs.historical("aircraft", pa.table({"tailnum": ids, "timestamp": pa.array(
                [at] * len(ids), pa.timestamp("us", "UTC"))}))
            assert hist.column("seats").to_pylist() == want_seats, at
            assert hist.column("manufacturer").to_pylist() == want_maker, at
            assert hist.column("_event_time").is_valid().to_pylist() == [i in NEWEST for i in ids]
            requests = (("F1", "N101"), ("F2", "N202"), ("F3", "N999"))
            view = fs.online_view("flight_scoring", [{"flight_id": f, "tailnum": t} for f, t in requests])
            assert view.column("plane_seats").to_pylist() == [180, 80, None], at
            assert view.column("plane_manufacturer").to_pylist() == ["BOEING", "BOMBARDIER", None], at
    with store(settings, project, pg_schema, redis_prefix) as fs:
        # a training set: each request at its own time, the aircraft's current row at every one
        frame = pa.table({"flight_id": ["F1", "F2", "F3", "F1"], "tailnum": ["N101", "N202", "N999", "N303"],
                          "timestamp": pa.array([before, between, after, after], pa.timestamp("us", "UTC"))})
        tv = fs.historical_view("flight_scoring", frame)
        assert tv.column("plane_seats").to_pylist() == [180, 80, None, None]
        assert tv.column("plane_manufacturer").to_pylist() == ["BOEING", "BOMBARDIER", None, "AIRBUS"]
        # the timed source still answers as of each time: at 00:00 F1 (05:00) had not departed
        assert tv.column("dep_delay").to_pylist() == [None, -1.0, 30.0, 2.0]
        # the fallback (an entity Redis lost) gives the same row, from Postgres
        redis.Redis.from_url(settings.redis_url).delete(redis_prefix + entity_key("aircraft", "N202"))
        on = fs.online("aircraft", ["N202"])
        assert on.column("_from").to_pylist() == ["postgres"]
        assert on.column("manufacturer").to_pylist() == ["BOMBARDIER"]


def test_one_loads_rows_of_an_entity_give_one_state_whatever_their_order(
        tmp_path: Path, settings: Settings, aircraft: CompiledSchema, pg_schema: str, second_pg_schema: str,
        redis_prefix: str) -> None:
    """Several rows of one entity in one load (a source with duplicates): the row kept
    depends on their content, not on their order nor on how the load is cut into units."""
    rng = np.random.default_rng(7)
    tails = [f"N{i:03d}" for i in range(40)]
    rows = [(t, int(rng.integers(50, 400)), str(rng.choice(["BOEING", "AIRBUS", "EMBRAER"])))
            for t in tails for _ in range(3)]
    states = []
    for k, (order, ns, batch) in enumerate(((np.arange(len(rows)), pg_schema, 1000),
                                            (rng.permutation(len(rows)), second_pg_schema, 7))):
        path = write(tmp_path / f"dup{k}.parquet", [rows[i] for i in order])
        prefix = f"{redis_prefix}{k}:"
        s = load([path], aircraft, settings, search_path=ns, key_prefix=prefix, batch_rows=batch)
        assert s.read == len(rows) and s.stored + s.already_present == len(rows), s
        cold = cold_rows(settings, ns)
        hot = hot_rows(settings, prefix, tails)
        assert len(cold) == len(tails)
        assert {t: (h["seats"], h["manufacturer"]) for t, h in hot.items()} == \
            {t: (str(v[0]), v[1]) for t, v in cold.items()}
        states.append({t: v[:3] for t, v in cold.items()})
    assert states[0] == states[1]
    # the stored row is one of the entity's rows in the input
    for t, (seats, maker, _) in states[0].items():
        assert (t, seats, maker) in rows


def test_the_stream_writes_static_rows_through_the_same_code(
        settings: Settings, aircraft: CompiledSchema, pg_schema: str, redis_prefix: str) -> None:
    """Two micro-batches of ``StreamProcessor.process``: the second (a later load) replaces
    the first's rows; within one micro-batch, two records of an entity leave the row whose
    content wins, as a batch load does."""
    proc = StreamProcessor(aircraft, settings, run_id="static-stream", dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix)

    def batch(records: list[dict[str, Any]], first: int) -> list[int]:
        n = len(records)
        out = proc.process([json.dumps(r).encode() for r in records], pa.array(["aircraft"] * n),
                           pa.array([0] * n, pa.int32()), pa.array(range(first, first + n), pa.int64()))
        return [int(x) for x in out]

    proc.open()
    try:
        one = [{"tailnum": "N1", "seats": 100, "manufacturer": "A"},
               {"tailnum": "N1", "seats": 120, "manufacturer": "B"},
               {"tailnum": "N2", "seats": 50, "manufacturer": "C"}]
        assert batch(one, 0) == [0, 0, 0]
        first = cold_rows(settings, pg_schema)
        assert first["N1"][:2] in {(100, "A"), (120, "B")}
        after_one = dict(first)
        assert batch([{"tailnum": "N2", "seats": 55, "manufacturer": "C"}], 3) == [0]
    finally:
        proc.close()
    cold = cold_rows(settings, pg_schema)
    assert cold["N2"][:2] == (55, "C")  # the later micro-batch
    assert cold["N1"] == after_one["N1"]
    hot = hot_rows(settings, redis_prefix, ["N1", "N2"])
    assert (hot["N1"]["seats"], hot["N2"]["seats"]) == (str(cold["N1"][0]), "55")
    # the same two records in the other order, in a fresh namespace's stream: the same row
    proc = StreamProcessor(aircraft, settings, run_id="static-stream-2", dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix + "r:")
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}",
                         autocommit=True) as conn:
        conn.execute("TRUNCATE aircraft")
    proc.open()
    try:
        assert batch(list(reversed(one)), 0) == [0, 0, 0]
    finally:
        proc.close()
    assert cold_rows(settings, pg_schema)["N1"][:3] == first["N1"][:3]
