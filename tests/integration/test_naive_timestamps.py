"""Naive timestamps, one rule everywhere (docs/types.md, "Naive timestamps"): a naive
``timestamp(s)`` event time holds UTC wall-clock times. On real Postgres and Redis,
with a schema like a CGM export's (naive readings, 5 minutes apart):

- ``online``/``online_dicts`` give ``_event_time`` naive, as stored (Redis rows on the
  small-call and the Arrow path, Postgres fallback rows), and ``_age_seconds`` reads it
  as UTC;
- ``historical`` takes a naive entity frame (as UTC) and gives what the same instants
  zoned give; against a zoned event time a naive frame is refused, saying why;
- ``FeatureStore.validate``, the batch loader and the stream take zoned values for the
  naive field as their UTC wall clock;
- the stream's lateness message prints naive times without an offset they never had.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features import FeatureStore
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import entity_key
from features.config import Settings
from features.errors import ConfigError
from features.load import load
from features.schema.parse import parse_schema
from features.stream.core import StreamProcessor

pytestmark = pytest.mark.services

NAME = "cgm_naive"
SCHEMA = """
name: cgm_naive
version: 1.0.0
entity: patient_id
event_time: read_at
fields:
  - name: patient_id
    type: string
    store: [hot, cold]
    constraints: {required: true}
  - name: read_at
    type: timestamp(s)
    store: [hot, cold]
    constraints: {required: true}
  - name: glucose
    type: float64
    store: [hot, cold]
aggregations:
  allowed_lateness: 10m
  features:
    - {name: readings_1h, function: count, window: 1h, store: [hot, cold]}
"""
#: the same schema with a zoned event time: a naive frame is refused there
ZONED = SCHEMA.replace("cgm_naive", "cgm_zoned").replace("type: timestamp(s)", "type: 'timestamp(s, UTC)'")
BERLIN = ZoneInfo("Europe/Berlin")


def naive(hh: int, mm: int = 0) -> dt.datetime:
    return dt.datetime(2024, 7, 1, hh, mm)


#: (patient, reading time, glucose): p1 and p2 in Parquet, p3 only in Postgres later
READINGS = [("p1", naive(10), 5.5), ("p1", naive(10, 5), 5.7), ("p2", naive(9, 55), 6.1),
            ("p2", naive(10, 20), 6.4), ("p3", naive(8), 7.0)]


@pytest.fixture()
def schemas(tmp_path: Path) -> Path:
    folder = tmp_path / "schemas"
    folder.mkdir()
    (folder / "cgm_naive.yaml").write_text(SCHEMA)
    (folder / "cgm_zoned.yaml").write_text(ZONED)
    return folder


@pytest.fixture()
def compiled() -> CompiledSchema:
    return compile_schema(parse_schema(SCHEMA, "cgm_naive.yaml"))


@pytest.fixture()
def fs(settings: Settings, schemas: Path, pg_schema: str, redis_prefix: str) -> Iterator[FeatureStore]:
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=schemas,
                      search_path=pg_schema, key_prefix=redis_prefix, fill=False) as store:
        yield store


def load_readings(tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
                  redis_prefix: str, read_at: pa.Array | None = None) -> None:
    path = tmp_path / "readings.parquet"
    times = read_at if read_at is not None else pa.array([r[1] for r in READINGS], pa.timestamp("s"))
    pq.write_table(pa.table({"patient_id": [r[0] for r in READINGS], "read_at": times,
                             "glucose": [r[2] for r in READINGS]}), path)
    summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert (summary.stored, summary.rejected) == (len(READINGS), 0), summary


def stored_times(settings: Settings, pg_schema: str) -> list[tuple[str, dt.datetime]]:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        return conn.execute("SELECT patient_id, read_at FROM cgm_naive ORDER BY 1, 2").fetchall()


def test_online_gives_naive_event_times_and_their_age_as_utc(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, redis_prefix: str,
        fs: FeatureStore) -> None:
    load_readings(tmp_path, settings, compiled, pg_schema, redis_prefix)
    newest = {"p1": naive(10, 5), "p2": naive(10, 20), "p3": naive(8)}
    hot = redis.Redis.from_url(settings.redis_url)
    try:  # p3 only in Postgres: the fallback serves it
        assert hot.delete(redis_prefix + entity_key(NAME, "p3")) == 1
    finally:
        hot.close()
    small = ["p1", "p2", "p3", "nobody"]
    for ids in (small, small * 5):  # <= 16 ids: the small-call path first; more: the Arrow path
        before = dt.datetime.now(dt.UTC)
        table = fs.online(NAME, ids)
        rows = fs.online_dicts(NAME, ids)
        after = dt.datetime.now(dt.UTC)
        assert table.schema.field("_event_time").type == pa.timestamp("us")
        assert table.column("_from").to_pylist() == [
            {"p1": "redis", "p2": "redis", "p3": "postgres"}.get(i) for i in ids]
        for got in (table.to_pylist(), rows):
            assert [r["_event_time"] for r in got] == [newest.get(i) for i in ids]
            for r in got:
                if r["_event_time"] is None:
                    assert r["_age_seconds"] is None
                    continue
                assert r["_event_time"].tzinfo is None
                at = r["_event_time"].replace(tzinfo=dt.UTC)  # naive = UTC
                assert (before - at).total_seconds() - 1e-6 <= r["_age_seconds"]
                assert r["_age_seconds"] <= (after - at).total_seconds() + 1e-6
    # Stored as given: the history holds the naive readings unshifted.
    assert stored_times(settings, pg_schema) == sorted((p, t) for p, t, _ in READINGS)


def test_historical_takes_a_naive_frame_as_utc(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, redis_prefix: str,
        fs: FeatureStore) -> None:
    load_readings(tmp_path, settings, compiled, pg_schema, redis_prefix)
    ids = ["p1", "p1", "p1", "p2", "p2", "p3", "p3"]
    at = [naive(9, 59), naive(10), naive(10, 4), naive(10, 19), naive(11), naive(7, 59), naive(8)]
    want_event = [None, naive(10), naive(10), naive(9, 55), naive(10, 20), None, naive(8)]
    want_glucose = [None, 5.5, 5.5, 6.1, 6.4, None, 7.0]
    frames = {
        "naive us": pa.table({"patient_id": ids, "timestamp": pa.array(at, pa.timestamp("us"))}),
        "naive pandas (ns)": pd.DataFrame({"patient_id": ids, "timestamp": pd.to_datetime(at)}),
        "UTC": pa.table({"patient_id": ids, "timestamp": pa.array([t.replace(tzinfo=dt.UTC) for t in at],
                                                                  pa.timestamp("us", "UTC"))}),
        "Berlin": pa.table({"patient_id": ids, "timestamp": pa.array(
            [t.replace(tzinfo=dt.UTC).astimezone(BERLIN) for t in at], pa.timestamp("ms", "Europe/Berlin"))}),
    }
    results = {}
    for what, frame in frames.items():
        got = fs.historical(NAME, frame, ["glucose", "readings_1h"])
        assert got.schema.field("_event_time").type == pa.timestamp("us"), what
        assert got.column("_event_time").to_pylist() == want_event, what
        assert got.column("glucose").to_pylist() == want_glucose, what
        results[what] = got.drop_columns(["timestamp"])
    assert results["naive us"].equals(results["UTC"])
    assert results["naive pandas (ns)"].equals(results["UTC"])
    assert results["Berlin"].equals(results["UTC"])
    # Against a zoned event time a naive time is refused: nothing says which zone it is in.
    with pytest.raises(ConfigError) as err:
        fs.historical("cgm_zoned", frames["naive us"])
    assert "'timestamp' is timestamp[us] (no time zone), but schema 'cgm_zoned' has event time read_at " \
           "of type timestamp(s, UTC)" in str(err.value)
    assert "A naive time is read as UTC only against a naive event time" in str(err.value)


def test_validate_and_load_take_zoned_values_as_their_utc_wall_clock(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, redis_prefix: str,
        fs: FeatureStore) -> None:
    utc = dt.datetime(2024, 7, 1, 10, tzinfo=dt.UTC)
    for rows in ([{"patient_id": "p1", "read_at": utc}],
                 [{"patient_id": "p1", "read_at": utc.astimezone(BERLIN)}],
                 [{"patient_id": "p1", "read_at": "2024-07-01T12:00:00+02:00"}],
                 pd.DataFrame({"patient_id": ["p1"], "read_at": pd.to_datetime([utc])})):
        result = fs.validate(NAME, rows)
        assert result.rejects.column("message").to_pylist() == []
        assert result.valid.column("read_at").to_pylist() == [naive(10)]
    # The batch loader: a Parquet column zoned in Berlin stores the UTC wall clock.
    berlin = pa.array([r[1].replace(tzinfo=dt.UTC).astimezone(BERLIN) for r in READINGS],
                      pa.timestamp("ms", "Europe/Berlin"))
    load_readings(tmp_path, settings, compiled, pg_schema, redis_prefix, read_at=berlin)
    assert stored_times(settings, pg_schema) == sorted((p, t) for p, t, _ in READINGS)
    assert fs.online(NAME, ["p2"]).column("_event_time").to_pylist() == [naive(10, 20)]


def stream(settings: Settings, compiled: CompiledSchema, pg_schema: str, redis_prefix: str,
           records: list[dict[str, Any]]) -> list[int]:
    """``records`` as one micro-batch of the stream job's step (Kafka partition 0); the
    outcome per record (0: a row for the stores, 1: rejected)."""
    proc = StreamProcessor(compiled, settings, run_id="naive-stream", dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix)
    proc.open()
    try:
        n = len(records)
        outcome = proc.process([json.dumps(r).encode() for r in records], pa.array(["cgm"] * n),
                               pa.array([0] * n, pa.int32()), pa.array(range(n), pa.int64()))
    finally:
        proc.close()
    return [int(x) for x in outcome]


def test_the_streams_lateness_message_prints_naive_times_without_an_offset(
        settings: Settings, compiled: CompiledSchema, pg_schema: str, redis_prefix: str,
        fs: FeatureStore) -> None:
    records = [{"patient_id": "p1", "read_at": "2024-07-01T10:00:00", "glucose": 5.5},
               {"patient_id": "p1", "read_at": "2024-07-01T10:30:00", "glucose": 5.9},
               {"patient_id": "p1", "read_at": "2024-07-01T10:05:00", "glucose": 5.6}]  # late: < 10:20
    # the late event is a valid row: stored, counted in no aggregation
    assert stream(settings, compiled, pg_schema, redis_prefix, records) == [0, 0, 0]
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        late: list[Any] = conn.execute("SELECT raw, errors FROM cgm_naive__rejects").fetchall()
    assert len(late) == 1
    raw, errors = late[0]  # jsonb: decoded by psycopg
    assert errors[0]["message"] == (
        "field read_at violates aggregation.lateness: got 2024-07-01T10:05:00, expected >= "
        "2024-07-01T10:20:00 (the newest event of patient_id 'p1' seen before it is at "
        "2024-07-01T10:30:00; allowed lateness 600s). The row is stored in the history table but "
        "updates no aggregation")
    assert [e["value"] for e in errors] == ["2024-07-01T10:05:00"]
    assert raw == {"patient_id": "p1", "read_at": "2024-07-01T10:05:00"}
    assert stored_times(settings, pg_schema) == [("p1", naive(10)), ("p1", naive(10, 5)),
                                                 ("p1", naive(10, 30))]
    got = fs.online_dicts(NAME, ["p1"], windows="event")  # as of p1's newest event
    assert [(r["_event_time"], r["readings_1h"]) for r in got] == [(naive(10, 30), 2)]


def test_the_stream_takes_text_with_an_offset_as_its_utc_wall_clock(
        settings: Settings, compiled: CompiledSchema, pg_schema: str, redis_prefix: str,
        fs: FeatureStore) -> None:
    records = [{"patient_id": "p2", "read_at": "2024-07-01T12:40:00+02:00", "glucose": 6.0},
               {"patient_id": "p2", "read_at": "2024-07-01T10:45:00Z", "glucose": 6.1},
               {"patient_id": "p2", "read_at": "2024-07-01T10:50:00", "glucose": 6.2}]
    assert stream(settings, compiled, pg_schema, redis_prefix, records) == [0, 0, 0]
    assert stored_times(settings, pg_schema) == [("p2", naive(10, 40)), ("p2", naive(10, 45)),
                                                 ("p2", naive(10, 50))]
    got = fs.online_dicts(NAME, ["p2"], windows="event")  # as of p2's newest event
    assert [(r["_event_time"], r["readings_1h"]) for r in got] == [(naive(10, 50), 3)]
