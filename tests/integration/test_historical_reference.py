"""``FeatureStore.historical`` equals an independent reference on random histories and
frames, against the real Postgres: pandas ``merge_asof`` per entity (``by`` the entity's
text, ``direction="backward"``, ``allow_exact_matches=True``, ``tolerance`` for
``max_age``) over the stored rows read back with plain psycopg.

Covered: string and integer entities; frame ids that are no value of the entity type
(``"x"``, ``"007"``, ``""``, out of range, null), unknown ids, duplicate frame rows, times
before any event, times equal to an event time and one microsecond either side,
``max_age`` (exactly at its bound too), zoned frame times in several zones and naive
ones against a naive event time, every column type a cold table holds, aggregation
columns from the ``__aggregates`` table (the newest row at or before T), and frame chunk
boundaries (``features.sdk.asof.CHUNK_ROWS`` forced down to 1, 7 and 50 rows), and a frame
that is a slice of a larger table (its arrays at an offset).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.lineage import RunContext
from features.load import load
from features.ops.examples import click_history, clicks_schema
from features.schema.parse import parse_schema
from features.sdk.store import FeatureStore
from features.sinks.base import REJECTED_ROWS_SCHEMA, WriteUnit
from features.sinks.postgres import PostgresSink

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
UTC = dt.UTC
BASE_US = int(dt.datetime(2024, 3, 30, 23, 0, tzinfo=UTC).timestamp()) * 10**6  # before Berlin's DST switch
ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata")

STRING_SCHEMA = """
name: ref_str
version: 1.0.0
entity: key
event_time: at
fields:
  - {name: key, type: string, store: cold, constraints: {required: true}}
  - {name: at, type: "timestamp(us, UTC)", store: cold, constraints: {required: true}}
  - {name: f_float, type: float64, store: cold}
  - {name: f_real, type: float32, store: cold}
  - {name: f_text, type: string, store: cold}
  - {name: f_dec, type: "decimal(10,2)", store: cold}
  - {name: f_bool, type: bool, store: cold}
  - {name: f_date, type: date, store: cold}
  - {name: f_ts, type: "timestamp(ms, America/New_York)", store: cold}
  - {name: f_i16, type: int16, store: cold}
"""

INT_SCHEMA = """
name: ref_int
version: 1.0.0
entity: key
event_time: at
fields:
  - {name: key, type: int32, store: cold, constraints: {required: true}}
  - {name: at, type: "timestamp(us)", store: cold, constraints: {required: true}}
  - {name: f_float, type: float64, store: cold}
  - {name: f_text, type: string, store: cold}
  - {name: f_naive, type: "timestamp(us)", store: cold}
"""


@pytest.fixture()
def stores(tmp_path: Path, settings: Settings,
           pg_schema: str) -> Iterator[tuple[FeatureStore, dict[str, Any]]]:
    (tmp_path / "schemas").mkdir()
    compiled = {}
    sinks = []
    for text in (STRING_SCHEMA, INT_SCHEMA):
        c = compile_schema(parse_schema(text, "ref.yaml"))
        (tmp_path / "schemas" / f"{c.name}.yaml").write_text(text)
        sink = PostgresSink(settings.postgres_dsn, c, search_path=pg_schema, retries=2, backoff_s=0.05)
        sink.open()
        compiled[c.name] = (c, sink)
        sinks.append(sink)
    fs = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema)
    try:
        yield fs, compiled
    finally:
        fs.close()
        for sink in sinks:
            sink.close()


# --- random histories ----------------------------------------------------------------------


def _history(c: CompiledSchema, rng: np.random.Generator, entities: list[Any]) -> pa.Table:
    """0-6 events per entity on a coarse grid (ties with frame times are likely), random values."""
    keys: list[Any] = []
    times: list[int] = []
    for e in entities:
        k = int(rng.integers(0, 7))
        offs = rng.choice(200, size=k, replace=False) * 500_000 + rng.integers(0, 2, size=k)
        keys += [e] * k
        times += (BASE_US + offs).tolist()
    n = len(keys)
    perm = rng.permutation(n)  # written out of order
    keys, times = [keys[i] for i in perm], [times[i] for i in perm]

    def nulls(p: float = 0.2) -> Any:
        return rng.random(n) < p

    at = pa.array(times, pa.int64()).view(pa.timestamp("us", "UTC"))
    cols: dict[str, pa.Array] = {"f_float": pa.array(rng.normal(size=n) * 1e6, pa.float64(), mask=nulls()),
                                 "f_text": pa.array([rng.choice(["", "a,b", 'q"uote', "new\nline", "ñ"])
                                                     for _ in range(n)], pa.string(), mask=nulls())}
    if c.name == "ref_str":
        cols |= {
            "key": pa.array(keys, pa.string()), "at": at,
            "f_real": pa.array(rng.normal(size=n).astype(np.float32), pa.float32(), mask=nulls()),
            "f_dec": pa.array([Decimal(int(v)).scaleb(-2) for v in rng.integers(-10**9, 10**9, n)],
                              pa.decimal128(10, 2), mask=nulls()),
            "f_bool": pa.array(rng.random(n) < 0.5, pa.bool_(), mask=nulls()),
            "f_date": pa.array(rng.integers(-1000, 30000, n).astype(np.int32), pa.int32(),
                               mask=nulls()).view(pa.date32()),
            "f_ts": pa.array(rng.integers(-10**12, 10**13, n), pa.int64(), mask=nulls()).view(
                pa.timestamp("ms", "America/New_York")),
            "f_i16": pa.array(rng.integers(-32768, 32768, n).astype(np.int16), pa.int16(), mask=nulls()),
        }
    else:
        cols |= {"key": pa.array(keys, pa.int32()), "at": at.cast(pa.timestamp("us")),
                 "f_naive": pa.array(rng.integers(-10**15, 10**15, n), pa.int64(), mask=nulls()).view(
                     pa.timestamp("us"))}
    ctx = RunContext(c.name, c.schema.version_str, c.fingerprint, "run-ref",
                     dt.datetime(2025, 1, 1, tzinfo=UTC))
    table = pa.table({f.name: cols[f.name] for f in c.arrow_schema})
    lineage = ctx.columns(pa.array([f"file:///ref.parquet#{i}" for i in range(n)], pa.string()))
    for name, col in lineage.items():
        table = table.append_column(name, col)
    return table


def _write(sink: PostgresSink, table: pa.Table) -> None:
    for lo in range(0, table.num_rows, 97):
        part = table.slice(lo, 97)
        res = sink.write(WriteUnit(part, REJECTED_ROWS_SCHEMA.empty_table(), None, part.num_rows))
        assert res.stored == part.num_rows


def _frame(rng: np.random.Generator, ids: list[Any], extra_ids: list[Any], event_us: list[int], n: int,
           id_type: pa.DataType, zone: str | None) -> pa.Table:
    """Frame rows: known, unknown and invalid ids; times at, just around and between events,
    before all of them; then duplicates of some rows."""
    pool = ids + extra_ids
    keys = [pool[i] for i in rng.integers(0, len(pool), n)]
    kind = rng.integers(0, 5, n)
    at = (np.array(event_us, dtype=np.int64)[rng.integers(0, len(event_us), n)] if event_us
          else np.full(n, BASE_US))
    t = np.where(kind == 0, at, np.where(kind == 1, at + 1, np.where(kind == 2, at - 1, np.where(
        kind == 3, BASE_US - 10**9, BASE_US + rng.integers(0, 100 * 10**6, n)))))
    dup = rng.integers(0, n, n // 5)
    keys += [keys[i] for i in dup]
    t = np.concatenate([t, t[dup]])
    times = pa.array(t, pa.int64()).view(pa.timestamp("us", "UTC"))
    times = times.cast(pa.timestamp("us", zone)) if zone else times.cast(pa.timestamp("us"))
    return pa.table({"key": pa.array(keys, id_type), "timestamp": times,
                     "label": pa.array(np.arange(len(keys)), pa.int64())})


# --- the reference -------------------------------------------------------------------------


def reference(conn: Any, table: str, entity: str, event_time: str, columns: list[str], frame: pa.Table,
              max_age: dt.timedelta | None) -> dict[str, list[Any]]:
    """Per frame row, the stored values (as psycopg decodes them) of the entity's newest row
    at or before its time, by pandas merge_asof; None where none."""
    cols = ", ".join([entity, f"(extract(epoch FROM {event_time}) * 1000000)::int8", event_time, *columns])
    rows = conn.execute(f"SELECT {cols} FROM {table}").fetchall()
    hist = pd.DataFrame({"e": [str(r[0]) for r in rows], "t": np.array([r[1] for r in rows], dtype=np.int64),
                         "hrow": np.arange(len(rows), dtype=np.int64)})
    ids = frame.column("key").to_pylist()
    t = frame.column("timestamp").cast(pa.timestamp("us", "UTC")).cast(pa.int64()).to_numpy()
    q = pd.DataFrame({"e": ["\x00none" if i is None else str(i) for i in ids], "t": t,
                      "o": np.arange(len(ids))})
    merged = pd.merge_asof(q.sort_values("t", kind="stable"), hist.sort_values("t", kind="stable"), on="t",
                           by="e", direction="backward", allow_exact_matches=True,
                           tolerance=None if max_age is None else max_age // dt.timedelta(microseconds=1)
                           ).sort_values("o")
    hrow = merged["hrow"].to_numpy()
    out: dict[str, list[Any]] = {}
    for j, name in enumerate(["_event_time", *columns]):
        out[name] = [None if np.isnan(h) else rows[int(h)][2 + j] for h in hrow]
    return out


def _same(got: list[Any], want: list[Any]) -> bool:
    def norm(v: Any) -> Any:
        if isinstance(v, Decimal):
            return str(v)
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            return v.astimezone(UTC)
        return v
    return [norm(v) for v in got] == [norm(v) for v in want]


def check(fs: FeatureStore, conn: Any, schema: str, frame: pa.Table, max_age: dt.timedelta | None,
          features: list[str] | None = None, table: str | None = None) -> pa.Table:
    got = fs.historical(schema, frame, features, max_age=max_age, windows="event")
    c = fs.schema(schema)
    columns = features or [n for n in got.column_names if n not in frame.column_names and n != "_event_time"]
    assert got.column_names == [*frame.column_names, *columns, "_event_time"]
    for name in frame.column_names:
        assert got.column(name).combine_chunks().equals(frame.column(name).combine_chunks())
    want = reference(conn, table or schema, str(c.schema.entity), str(c.schema.event_time), columns, frame,
                     max_age)
    for name in ["_event_time", *columns]:
        g, w = got.column(name).to_pylist(), want[name]
        if got.schema.field(name).type == pa.float32():  # psycopg reads a real as the float of its text
            w = [None if v is None else float(np.float32(v)) for v in w]
        diff = [(i, a, b) for i, (a, b) in enumerate(zip(g, w, strict=True)) if a != b]
        assert _same(g, w), (name, diff[:5])
    return got


@pytest.mark.parametrize("chunk_rows", [None, 1, 7, 50])
def test_historical_equals_merge_asof_reference(
        stores: tuple[FeatureStore, dict[str, Any]], settings: Settings, pg_schema: str,
        monkeypatch: pytest.MonkeyPatch, chunk_rows: int | None) -> None:
    from features.sdk import asof

    if chunk_rows is not None:
        monkeypatch.setattr(asof, "CHUNK_ROWS", chunk_rows)
    fs, compiled = stores
    rng = np.random.default_rng(31 + (chunk_rows or 0))
    conn = psycopg.connect(settings.postgres_dsn, autocommit=True, options=f"-c search_path={pg_schema}")
    try:
        # String entities (zoned event time, every cold column type).
        c, sink = compiled["ref_str"]
        ids = [f"s{i}" for i in range(30)] + ["", "ñ,\"q\"\n"]
        hist = _history(c, rng, ids)
        _write(sink, hist)
        event_us = hist.column("at").cast(pa.int64()).to_pylist()
        hits = 0
        for round_ in range(6):
            max_age = [None, dt.timedelta(seconds=3), dt.timedelta(microseconds=500_001), dt.timedelta(0),
                       None, dt.timedelta(days=1)][round_]
            frame = _frame(rng, ids, ["zz-unknown", None], event_us, 120, pa.string(), ZONES[round_ % 4])
            got = check(fs, conn, "ref_str", frame, max_age)
            hits += got.num_rows - got.column("_event_time").null_count
        assert hits > 100  # the frames hit rows, not only misses
        check(fs, conn, "ref_str", _frame(rng, ids, [], event_us, 40, pa.string(), "UTC"), None,
              ["f_dec", "f_text"])

        # Integer entities (naive event time): ids that are no int32 match nothing.
        c, sink = compiled["ref_int"]
        int_ids = [*range(-5, 25), 2**31 - 1]
        hist = _history(c, rng, int_ids)
        _write(sink, hist)
        event_us = hist.column("at").cast(pa.int64()).to_pylist()
        text_ids = [str(i) for i in int_ids]
        invalid = ["x", "007", "", "1.0", " 1", "-0", str(2**31), "99999999999999999999", None]
        for round_ in range(4):
            max_age = [None, dt.timedelta(seconds=2), None, dt.timedelta(microseconds=1)][round_]
            zone = None if round_ % 2 == 0 else "Asia/Kolkata"  # naive = UTC wall clock; zoned also allowed
            frame = _frame(rng, text_ids, invalid, event_us, 120, pa.string(), zone)
            check(fs, conn, "ref_int", frame, max_age)
            check(fs, conn, "ref_int", frame.slice(7), max_age)  # a slice of a table: ids at an offset
            check(fs, conn, "ref_int", _frame(rng, int_ids, [10**6], event_us, 60, pa.int64(), zone), max_age)
    finally:
        conn.close()


@pytest.mark.parametrize("chunk_rows", [None, 5])
def test_historical_aggregations_equal_merge_asof_on_the_aggregates_table(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str,
        monkeypatch: pytest.MonkeyPatch, chunk_rows: int | None) -> None:
    from features.compile.postgres import aggregates_table_name
    from features.sdk import asof

    if chunk_rows is not None:
        monkeypatch.setattr(asof, "CHUNK_ROWS", chunk_rows)
    c = clicks_schema()
    path = tmp_path / "clicks.parquet"
    pq.write_table(click_history(3000, users=60), path)
    summary = load([path], c, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up
    fs = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=ROOT / "schemas", search_path=pg_schema)
    conn = psycopg.connect(settings.postgres_dsn, autocommit=True, options=f"-c search_path={pg_schema}")
    try:
        assert c.schema.aggregations is not None
        aggs = [a.name for a in c.schema.aggregations.features if "cold" in a.store]
        users = [r[0] for r in conn.execute("SELECT DISTINCT user_id FROM clicks__aggregates").fetchall()]
        at = [r[0] for r in conn.execute("SELECT (extract(epoch FROM event_time) * 1000000)::int8 "
                                         "FROM clicks__aggregates").fetchall()]
        rng = np.random.default_rng(7)
        frame = _frame(rng, users, ["u999999999"], at, 200, pa.string(), "Europe/Berlin").rename_columns(
            ["user_id", "timestamp", "label"])
        got = fs.historical("clicks", frame, aggs, windows="event")
        assert got.column_names == [*frame.column_names, *aggs, "_event_time"]
        renamed = frame.rename_columns(["key", "timestamp", "label"])
        want = reference(conn, aggregates_table_name(c.schema), "user_id", "event_time", aggs, renamed, None)
        for name in aggs:
            assert _same(got.column(name).to_pylist(), want[name]), name
        # _event_time is the history's (the clicks table's), not the aggregation row's
        hist = reference(conn, "clicks", "user_id", "event_time", [], renamed, None)
        assert _same(got.column("_event_time").to_pylist(), hist["_event_time"])
        assert sum(v is not None for v in want[aggs[0]]) > 50
    finally:
        conn.close()
        fs.close()
