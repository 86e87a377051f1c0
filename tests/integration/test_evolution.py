"""Schema evolution end to end on the real stores (issue 30): load v1 and stream entities
through the real Kafka broker, migrate to a compatible v2 with ``features migrate``, read
every entity (batch-only and stream-only ones), load under v2, ``features health`` before and
after; a breaking change refused with the documented path; the diff's own SQL piped to
Postgres by hand (no ``features migrate``) still leaves every read working.

v1 -> v2 changes: ``glucose`` float32 -> float64 (its Redis text must become the float64
text of the same value, as Postgres casts it), ``trend`` int32 -> int64, ``note`` cold ->
hot and cold (its value for history comes from Postgres), ``unit`` added with a default
(hot and cold: old rows read the default, as Postgres' ADD COLUMN DEFAULT gives), ``site``
added nullable and cold only (the hot layout of that change alone does not change), an
aggregation over the widened field.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from conftest import cli_environment

from features import FeatureStore
from features.compile import compile_schema
from features.config import Settings
from features.errors import SinkError
from features.load import load
from features.schema.parse import load_schema
from features.stream.core import StreamProcessor
from features.stream.kafka import produce, read_topic

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
REDIS_DB = 14  # this file's own database, flushed before and after

V1 = """\
name: evo_readings
version: 1.0.0
entity: patient
event_time: read_at
fields:
  - {name: patient, type: string, store: [hot, cold], constraints: {required: true}}
  - {name: read_at, type: "timestamp(us, UTC)", store: [hot, cold], constraints: {required: true}}
  - {name: glucose, type: float32, store: [hot, cold], constraints: {nullable: true, min: 0}}
  - {name: trend, type: int32, store: [hot, cold], constraints: {nullable: true}}
  - {name: note, type: string, store: cold, constraints: {nullable: true}}
  - {name: device, type: string, store: hot, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 1h
  features:
    - {name: readings_1d, function: count, window: 1d, store: [hot, cold]}
    - {name: glucose_max_1d, function: max, of: glucose, window: 1d, store: [hot, cold]}
"""

V2 = (V1.replace("version: 1.0.0", "version: 1.1.0")
      .replace("{name: glucose, type: float32,", "{name: glucose, type: float64,")
      .replace("{name: trend, type: int32,", "{name: trend, type: int64,")
      .replace("{name: note, type: string, store: cold,", "{name: note, type: string, store: [hot, cold],")
      .replace("  - {name: device,",
               "  - {name: unit, type: string, store: [hot, cold], constraints: {nullable: true, "
               "default: mg/dL}}\n"
               "  - {name: site, type: string, store: cold, constraints: {nullable: true}}\n"
               "  - {name: device,"))
#: a breaking v2: a field removed without a major version
BREAKING = V1.replace("version: 1.0.0", "version: 1.2.0").replace(
    "  - {name: device, type: string, store: hot, constraints: {nullable: true}}\n", "")

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _f32(v: float | None) -> float | None:
    return None if v is None else float(np.float32(v))


def _rows(patients: list[str], per: int, seed: int, start: dt.datetime = T0) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for p in patients:
        for k in range(per):
            out.append({"patient": p, "read_at": start + dt.timedelta(minutes=5 * k + rnd.randrange(3)),
                        # float32 values (JSON carries their exact double text)
                        "glucose": _f32(rnd.choice([None, 0.1, 97.3, 180.7, rnd.uniform(40, 300)])),
                        "trend": rnd.choice([None, -2, 0, 3]), "note": rnd.choice([None, "meal", "run"]),
                        "device": rnd.choice([None, "g6", "g7"])})
    rnd.shuffle(out)
    return out


def _parquet(rows: list[dict[str, Any]], path: Path, glucose: pa.DataType | None = None) -> Path:
    table = pa.table({
        "patient": pa.array([r["patient"] for r in rows], pa.string()),
        "read_at": pa.array([r["read_at"] for r in rows], pa.timestamp("us", "UTC")),
        "glucose": pa.array([r["glucose"] for r in rows], glucose or pa.float32()),
        "trend": pa.array([r["trend"] for r in rows], pa.int32()),
        "note": pa.array([r["note"] for r in rows], pa.string()),
        "device": pa.array([r["device"] for r in rows], pa.string()),
    })
    pq.write_table(table, path)
    return path


def _stream(settings: Settings, compiled: Any, topic: str, rows: list[dict[str, Any]], pg_schema: str,
            redis_url: str) -> None:
    """The stream's core over records read back from a real Kafka topic (in event time
    order: the aggregations allow an hour of lateness)."""
    rows = sorted(rows, key=lambda r: r["read_at"])
    produce(settings.kafka_bootstrap, topic,
            [json.dumps({**r, "read_at": r["read_at"].isoformat()}).encode() for r in rows],
            keys=[r["patient"].encode() for r in rows])
    msgs = read_topic(settings.kafka_bootstrap, topic)
    assert len(msgs) == len(rows)
    cfg = dataclasses.replace(settings, redis_url=redis_url)
    proc = StreamProcessor(compiled, cfg, run_id="stream-v1", dead_letter_topic=None, search_path=pg_schema)
    proc.open()
    try:
        outcome = proc.process([m.value() for m in msgs], pa.array([topic] * len(msgs), pa.string()),
                               pa.array([m.partition() for m in msgs], pa.int32()),
                               pa.array([m.offset() for m in msgs], pa.int64()))
    finally:
        proc.close()
    assert int(outcome.sum()) == 0, "every streamed record is valid"


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _history(settings: Settings, pg_schema: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each entity's newest history row, read from Postgres (what online must serve)."""
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        cols = [d for d in ("glucose", "trend", "note", "unit") if conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND table_name = "
            "'evo_readings' AND column_name = %s", (pg_schema, d)).fetchone()]
        rows = conn.execute(f"SELECT DISTINCT ON (patient) patient, read_at, {', '.join(cols)} FROM "
                            "evo_readings WHERE patient = ANY(%s) ORDER BY patient, read_at DESC",
                            (ids,)).fetchall()
    return {r[0]: dict(zip(["read_at", *cols], r[1:], strict=True)) for r in rows}


def _redis_fingerprints(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    out: dict[str, int] = {}
    keys = [*client.scan_iter(match="features:evo_readings:{*}", count=1000),
            *client.scan_iter(match="features:evo_readings__aggregates:{*}", count=1000)]
    for k in keys:
        fp = client.hget(k, "_schema_fingerprint")
        key = fp.decode() if fp else "(none)"
        out[key] = out.get(key, 0) + 1
    client.close()
    return out


@pytest.fixture()
def env(settings: Settings, pg_schema: str) -> Any:
    with cli_environment(settings, pg_schema, REDIS_DB) as e:
        yield e


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "schemas"
    d.mkdir()
    out = {}
    for name, text in (("v1", V1), ("v2", V2), ("breaking", BREAKING)):
        (tmp_path / name).mkdir()
        out[name] = tmp_path / name / "evo_readings.yaml"
        out[name].write_text(text)
    return out


def test_load_stream_migrate_read_every_entity_then_load_under_v2(
        settings: Settings, pg_schema: str, env: dict[str, str], files: dict[str, Path], tmp_path: Path,
        kafka_topic: str) -> None:
    url = env["FEATURES_REDIS_URL"]
    v1, v2 = compile_schema(load_schema(files["v1"])), compile_schema(load_schema(files["v2"]))
    batch_ids = [f"p{i:03d}" for i in range(40)]
    stream_ids = [f"s{i:03d}" for i in range(15)]
    both = batch_ids[:5]
    cfg = dataclasses.replace(settings, redis_url=url)
    batch_rows = _rows(batch_ids, 12, seed=1)
    summary = load([_parquet(batch_rows, tmp_path / "a.parquet")], v1, cfg, search_path=pg_schema)
    assert summary.adds_up and summary.rejected == 0
    later = T0 + dt.timedelta(days=1)
    streamed = _rows(stream_ids, 6, seed=2) + _rows(both, 2, seed=3, start=later)
    _stream(settings, v1, kafka_topic, streamed, pg_schema, url)
    # each entity's aggregates at its newest event, counted here: the events in (newest - 1d, newest]
    windows: dict[str, tuple[int, float | None]] = {}
    for e in {r["patient"] for r in batch_rows + streamed}:
        mine = [r for r in batch_rows + streamed if r["patient"] == e]
        newest = max(r["read_at"] for r in mine)
        inside = [r for r in mine if newest - dt.timedelta(days=1) < r["read_at"] <= newest]
        values = [r["glucose"] for r in inside if r["glucose"] is not None]
        windows[e] = (len(inside), max(values) if values else None)
    every = batch_ids + stream_ids
    before = _cli(["health", "--schemas-dir", str(files["v1"].parent)], env)
    assert before.returncode in (0, 1), before.stderr
    assert "evo_readings" in before.stdout and "MISMATCH" not in before.stdout, before.stdout

    # health with the v2 file before the migration: unhealthy, naming the command that fixes it
    pending = _cli(["health", "--schemas-dir", str(files["v2"].parent)], env)
    assert "features migrate" in pending.stdout and "NOT healthy" in pending.stdout, pending.stdout

    # the dry run changes nothing and says what it would do
    dry = _cli(["migrate", str(files["v2"]), "--json"], env)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert plan["apply"] is False and plan["stores_hold"]["fingerprint"] == v1.fingerprint
    assert plan["redis"]["entity"]["to_rewrite"] == len(every)
    assert plan["redis"]["aggregates"]["to_rewrite"] == len(every)
    assert any("ADD COLUMN" in s for s in plan["postgres"]["statements"])
    assert _redis_fingerprints(url) == {v1.fingerprint: 2 * len(every)}

    # a reader with the v2 file before the migration: a clear error naming the command
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema) as fs, pytest.raises(SinkError, match="features migrate"):
        fs.online_dicts("evo_readings", every[:3], windows="event")

    applied = _cli(["migrate", str(files["v2"]), "--apply", "--chunk", "7"], env)
    assert applied.returncode == 0, applied.stderr
    assert f"{len(every)} of {len(every)} entity hashes rewritten" in applied.stdout.replace(",", ""), \
        applied.stdout
    assert _redis_fingerprints(url) == {v2.fingerprint: 2 * len(every)}
    again = _cli(["migrate", str(files["v2"]), "--apply"], env)  # resumable: nothing left to do
    assert again.returncode == 0 and "0 of" in again.stdout, again.stdout

    after = _cli(["health", "--schemas-dir", str(files["v2"].parent)], env)
    assert "MISMATCH" not in after.stdout and "evo_readings" in after.stdout, after.stdout

    history = _history(settings, pg_schema, every)
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema, fallback=False) as fs:
        got = {r["patient"]: r for r in fs.online_dicts("evo_readings", every, windows="event")}
        # the small-call path decodes in Python
        small = fs.online_dicts("evo_readings", every[:4], windows="event")
    assert all(r["_from"] == "redis" for r in got.values()), "every entity is still served from Redis"
    for r in small:
        assert {**r, "_age_seconds": 0} == {**got[r["patient"]], "_age_seconds": 0}
    for e in every:
        want, row = history[e], got[e]
        assert row["_event_time"] == want["read_at"], e
        # float32 widened as Postgres casts it: the same double, not the float32's text re-read
        assert row["glucose"] == want["glucose"] and row["trend"] == want["trend"], e
        assert row["note"] == want["note"], e          # cold -> hot: from Postgres
        assert row["unit"] == want["unit"] == "mg/dL", e  # the default, in both stores
        # the aggregates hash rewritten with the same values (the max widened as Postgres casts it)
        assert (row["readings_1d"], row["glucose_max_1d"]) == windows[e], e

    # a load under v2 after the migration: stores the new rows, reads stay correct
    more = _rows(batch_ids[:10], 3, seed=4, start=T0 + dt.timedelta(days=2))
    for r in more:
        r["glucose"] = 123.456789012345
    _parquet(more, tmp_path / "b.parquet", pa.float64())  # a double no float32 holds
    s2 = load([tmp_path / "b.parquet"], v2, cfg, search_path=pg_schema)
    assert s2.adds_up and s2.stored == len(more)
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema) as fs:
        rows = fs.online_dicts("evo_readings", batch_ids[:10], windows="event")
    assert all(r["glucose"] == 123.456789012345 for r in rows)


def test_a_breaking_change_is_refused_with_the_documented_path(
        settings: Settings, pg_schema: str, env: dict[str, str], files: dict[str, Path],
        tmp_path: Path) -> None:
    url = env["FEATURES_REDIS_URL"]
    v1 = compile_schema(load_schema(files["v1"]))
    cfg = dataclasses.replace(settings, redis_url=url)
    load([_parquet(_rows(["a", "b"], 3, seed=5), tmp_path / "a.parquet")], v1, cfg, search_path=pg_schema)
    for args in (["migrate", str(files["breaking"])], ["migrate", str(files["breaking"]), "--apply"]):
        proc = _cli(args, env)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "refused" in proc.stderr and "device" in proc.stderr and "docs/evolution.md" in proc.stderr
    assert _redis_fingerprints(url) == {v1.fingerprint: 4}  # nothing changed
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        assert conn.execute("SELECT fingerprint FROM featureline_schemas").fetchone()[0] == v1.fingerprint


def test_the_diffs_own_sql_applied_by_hand_keeps_reads_fills_and_prewarm_working(
        settings: Settings, pg_schema: str, env: dict[str, str], files: dict[str, Path],
        tmp_path: Path) -> None:
    """The report's path: `features schema diff --sql` piped to Postgres, no features migrate:
    a load under v2 stores nothing new in Redis, and every read still works (the old hashes
    are rewritten as they are read); after a FLUSHDB, prewarm and the read-through fill write
    the new version, so the next read works too."""
    url = env["FEATURES_REDIS_URL"]
    v1, v2 = compile_schema(load_schema(files["v1"])), compile_schema(load_schema(files["v2"]))
    cfg = dataclasses.replace(settings, redis_url=url)
    data = _parquet(_rows([f"p{i}" for i in range(20)], 5, seed=6), tmp_path / "a.parquet")
    load([data], v1, cfg, search_path=pg_schema)
    sql = _cli(["schema", "diff", str(files["v1"]), str(files["v2"]), "--sql"], env)
    assert sql.returncode == 0, sql.stderr
    assert sql.stdout.startswith("BEGIN;") and "COMMIT;" in sql.stdout and "compatible" not in sql.stdout
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}",
                         autocommit=True) as conn:
        conn.execute(sql.stdout)
    s2 = load([data], v2, cfg, search_path=pg_schema)
    assert s2.adds_up and s2.stored == 0
    ids = [f"p{i}" for i in range(20)]
    history = _history(settings, pg_schema, ids)
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema) as fs:
        rows = fs.online_dicts("evo_readings", ids, windows="event")
        assert [r["glucose"] for r in rows] == [history[i]["glucose"] for i in ids]
        assert all(r["unit"] == "mg/dL" and r["_from"] == "redis" for r in rows)
        redis.Redis.from_url(url).flushdb()
        assert fs.prewarm("evo_readings", ids=ids[:10])["written"] == 20  # entity + aggregates hashes
        filled = fs.online_dicts("evo_readings", ids, windows="event")  # ids[10:] by the read-through fill
        assert [r["glucose"] for r in filled] == [history[i]["glucose"] for i in ids]
        assert fs.online_dicts("evo_readings", ids, windows="event")[0]["_from"] == "redis"
    assert set(_redis_fingerprints(url)) == {v2.fingerprint}
    del v1


V3 = (V2.replace("version: 1.1.0", "version: 1.2.0")
      .replace("aggregations:\n", "features:\n  - {name: glucose_log, from: glucose, "
               "steps: [{fill_null: 0}, log1p], dtype: float64, store: [hot, cold]}\naggregations:\n")
      + "    - {name: glucose_min_1d, function: min, of: glucose, window: 1d, store: [hot, cold]}\n")


def _table(conn: Any, ns: str, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    from psycopg import sql

    return conn.execute(sql.SQL("SELECT {} FROM {}.{} ORDER BY 1, 2").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns), sql.Identifier(ns),
        sql.Identifier(table))).fetchall()


def test_recompute_gives_a_new_aggregation_and_derived_feature_the_values_of_a_fresh_load(
        settings: Settings, pg_schema: str, second_pg_schema: str, redis_prefix: str, env: dict[str, str],
        files: dict[str, Path], tmp_path: Path) -> None:
    """v1 loaded, migrated to a v3 that adds an aggregation and a derived feature: after
    `features recompute` both stores hold what one load of the same rows under v3 gives
    (into another namespace), and a second recompute changes nothing."""
    url = env["FEATURES_REDIS_URL"]
    (tmp_path / "v3").mkdir()
    v3_file = tmp_path / "v3" / "evo_readings.yaml"
    v3_file.write_text(V3)
    v1, v3 = compile_schema(load_schema(files["v1"])), compile_schema(load_schema(v3_file))
    ids = [f"p{i:02d}" for i in range(25)]
    data = _parquet(_rows(ids, 30, seed=8), tmp_path / "a.parquet")
    load([data], v1, dataclasses.replace(settings, redis_url=url), search_path=pg_schema)
    migrated = _cli(["migrate", str(v3_file), "--apply"], env)
    assert migrated.returncode == 0, migrated.stderr
    with psycopg.connect(settings.postgres_dsn) as conn:
        before = _table(conn, pg_schema, "evo_readings__aggregates", ["glucose_min_1d", "patient"])
        assert {r[0] for r in before} == {None}, "no values before the recompute"
    args = ["recompute", "--schema", "evo_readings", "--schemas-dir", str(v3_file.parent), "--json"]
    first = _cli(args, env)
    assert first.returncode == 0, first.stderr
    got = json.loads(first.stdout)
    assert got["history_rows"] == 25 * 30 and got["features"] == ["glucose_log"] and not got["skipped"]
    # rows whose new value is null (no glucose in the window) held it already
    assert 0 < got["aggregate_rows_written"] <= 25 * 30 and got["feature_rows_updated"] > 0
    again = json.loads(_cli(args, env).stdout)
    assert again["aggregate_rows_written"] == 0 and again["feature_rows_updated"] == 0

    load([data], v3, settings, search_path=second_pg_schema, key_prefix=redis_prefix)  # the reference
    aggs = ["patient", "read_at", "readings_1d", "glucose_max_1d", "glucose_min_1d"]
    hist = ["patient", "read_at", "glucose", "glucose_log", "unit"]
    with psycopg.connect(settings.postgres_dsn) as conn:
        for table, cols in (("evo_readings__aggregates", aggs), ("evo_readings", hist)):
            assert _table(conn, pg_schema, table, cols) == _table(conn, second_pg_schema, table, cols), table
    lineage = {"_age_seconds"}
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=v3_file,
                      search_path=pg_schema, fallback=False) as fs, \
            FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=v3_file,
                         search_path=second_pg_schema, key_prefix=redis_prefix, fallback=False) as ref:
        mine = fs.online_dicts("evo_readings", ids, windows="event")
        want = ref.online_dicts("evo_readings", ids, windows="event")
    assert all(r["_from"] == "redis" for r in mine)
    assert [{k: v for k, v in r.items() if k not in lineage} for r in mine] == [
        {k: v for k, v in r.items() if k not in lineage} for r in want]


@pytest.mark.parametrize("kind", ["redis-cluster"])
def test_migrate_rewrites_every_hash_on_a_redis_cluster(
        kind: str, settings: Settings, pg_schema: str, redis_cluster: Any, redis_cluster_prefix: str,
        files: dict[str, Path], tmp_path: Path) -> None:
    """The library behind `features migrate --apply` on a Redis Cluster: SCAN reaches every
    primary, each rewrite lands on its slot's node, and every entity reads v2 after."""
    from features.ops.migrate import Upgrader, apply_postgres, plan, read_recorded, scan_keys

    url = redis_cluster.url
    v1, v2 = compile_schema(load_schema(files["v1"])), compile_schema(load_schema(files["v2"]))
    ids = [f"c{i:03d}" for i in range(60)]
    cfg = dataclasses.replace(settings, redis_url=url)
    load([_parquet(_rows(ids, 4, seed=9), tmp_path / "a.parquet")], v1, cfg, search_path=pg_schema,
         key_prefix=redis_cluster_prefix)
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema, key_prefix=redis_cluster_prefix, fallback=False) as fs:
        p = plan(fs, v2, None)
        assert p.refusal is None and p.migration is not None
        apply_postgres(fs, p)
        up = Upgrader(fs, v2, fs.run_postgres("read", lambda conn: read_recorded(conn, "evo_readings")))
        try:
            rewritten = sum(up.upgrade(keys, aggs) for aggs in (False, True)
                            for keys in scan_keys(fs, "evo_readings", aggs, 16))
        finally:
            up.close()
        assert rewritten == 2 * len(ids)
        rows = fs.online_dicts("evo_readings", ids, windows="event")
    history = _history(settings, pg_schema, ids)
    assert [r["glucose"] for r in rows] == [history[i]["glucose"] for i in ids]
    assert all(r["_from"] == "redis" and r["unit"] == "mg/dL" for r in rows)
    del v1


def test_a_cold_field_added_by_the_diffs_sql_leaves_online_reads_and_health_working(
        settings: Settings, pg_schema: str, env: dict[str, str], tmp_path: Path) -> None:
    """The issue's smallest case: 1.1.0 only adds a nullable cold field (the hot layout
    does not change). After the diff's SQL and a load, online_dicts works and health is
    healthy for the schema; before the fix it raised 'Redis holds ... hashes written with
    schema fingerprint ...' while health said ok."""
    url = env["FEATURES_REDIS_URL"]
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "evo_readings.yaml").write_text(V1)
    (new / "evo_readings.yaml").write_text(V1.replace("version: 1.0.0", "version: 1.1.0").replace(
        "  - {name: device,", "  - {name: site, type: string, store: cold, constraints: {nullable: true}}\n"
        "  - {name: device,"))
    v1 = compile_schema(load_schema(old / "evo_readings.yaml"))
    v2 = compile_schema(load_schema(new / "evo_readings.yaml"))
    cfg = dataclasses.replace(settings, redis_url=url)
    data = _parquet(_rows(["a", "b", "c"], 4, seed=10), tmp_path / "a.parquet")
    load([data], v1, cfg, search_path=pg_schema)
    sql = _cli(["schema", "diff", str(old / "evo_readings.yaml"), str(new / "evo_readings.yaml"), "--sql"],
               env)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}",
                         autocommit=True) as conn:
        conn.execute(sql.stdout)
    assert load([data], v2, cfg, search_path=pg_schema).stored == 0
    pending = _cli(["health", "--schemas-dir", str(new)], env)  # Redis still holds 1.0.0's hashes
    assert pending.returncode == 1 and "hold 1.0.0" in pending.stdout and "features migrate" in pending.stdout
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=new, search_path=pg_schema,
                      fallback=False) as fs:
        rows = fs.online_dicts("evo_readings", ["a", "b", "c"], windows="event")
    assert all(r["_found"] and r["_from"] == "redis" for r in rows)
    health = _cli(["health", "--schemas-dir", str(new)], env)
    line = next(x for x in health.stdout.splitlines() if "evo_readings" in x)
    assert " ok " in line and "MISMATCH" not in line, health.stdout
    assert set(_redis_fingerprints(url)) == {v2.fingerprint}  # the reads rewrote what they met


def test_a_rename_allowed_by_a_rule_carries_the_hot_value_over(
        settings: Settings, pg_schema: str, env: dict[str, str], files: dict[str, Path],
        tmp_path: Path) -> None:
    """`device` renamed `sensor` with `breaking_change: false`: the migration renames the
    Redis field too, so online reads the old value under the new name."""
    url = env["FEATURES_REDIS_URL"]
    (tmp_path / "ren").mkdir()
    ren = tmp_path / "ren" / "evo_readings.yaml"
    ren.write_text(V1.replace("version: 1.0.0", "version: 1.1.0").replace("{name: device,", "{name: sensor,")
                   + "evolution_rules:\n  - {field: sensor, breaking_change: false, description: renamed}\n")
    v1 = compile_schema(load_schema(files["v1"]))
    rows = _rows(["r1", "r2", "r3", "r4"], 5, seed=11)
    load([_parquet(rows, tmp_path / "a.parquet")], v1, dataclasses.replace(settings, redis_url=url),
         search_path=pg_schema)
    dry = json.loads(_cli(["migrate", str(ren), "--json"], env).stdout)  # device is hot only: no column
    assert dry["redis"]["entity"]["to_rewrite"] == 4
    applied = _cli(["migrate", str(ren), "--apply"], env)
    assert applied.returncode == 0, applied.stderr
    newest = {}
    for r in sorted(rows, key=lambda r: r["read_at"]):
        newest[r["patient"]] = r["device"]
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=ren, search_path=pg_schema,
                      fallback=False) as fs:
        got = {r["patient"]: r["sensor"]
               for r in fs.online_dicts("evo_readings", sorted(newest), windows="event")}
    assert got == newest
    client = redis.Redis.from_url(url)
    assert client.hget("features:evo_readings:{r1}", "device") is None
    client.close()


def _job(schema_dir: Path, topic: str, env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    args = ["--schema", "evo_readings", "--schemas-dir", str(schema_dir), "--topic", topic, "--bounded",
            "--restart-attempts", "0", "--state-dir", str(tmp), "--json"]
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "stream_job.py"), *args], env=env,
                          capture_output=True, text=True, timeout=400)


def _produce(settings: Settings, topic: str, rows: list[dict[str, Any]]) -> None:
    rows = sorted(rows, key=lambda r: r["read_at"])
    produce(settings.kafka_bootstrap, topic,
            [json.dumps({**r, "read_at": r["read_at"].isoformat()}).encode() for r in rows],
            keys=[r["patient"].encode() for r in rows])


@pytest.mark.flink
def test_the_pyflink_job_before_and_after_a_migration(
        settings: Settings, pg_schema: str, env: dict[str, str], files: dict[str, Path], tmp_path: Path,
        stream_topic: str) -> None:
    """The real PyFlink stream job writes v1; after `features migrate --apply` a job still
    given the v1 file is refused naming the newer version, a job given v2 streams on, and
    every entity (batch-only, stream-only, both) reads as Postgres' newest row."""
    url = env["FEATURES_REDIS_URL"]
    v1 = compile_schema(load_schema(files["v1"]))
    batch_ids, stream_ids = [f"b{i:02d}" for i in range(10)], [f"s{i:02d}" for i in range(8)]
    load([_parquet(_rows(batch_ids, 6, seed=12), tmp_path / "a.parquet")], v1,
         dataclasses.replace(settings, redis_url=url), search_path=pg_schema)
    _produce(settings, stream_topic, _rows(stream_ids, 5, seed=13))
    first = _job(files["v1"].parent, stream_topic, env, tmp_path / "s1")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert json.loads(first.stdout)["stored"] == 40
    applied = _cli(["migrate", str(files["v2"]), "--apply"], env)
    assert applied.returncode == 0, applied.stderr
    later = T0 + dt.timedelta(days=3)
    _produce(settings, stream_topic, _rows(stream_ids[:4] + batch_ids[:3], 2, seed=14, start=later))
    old = _job(files["v1"].parent, stream_topic, env, tmp_path / "s2")
    assert old.returncode != 0 and "newer version" in old.stdout + old.stderr, old.stderr[-3000:]
    new = _job(files["v2"].parent, stream_topic, env, tmp_path / "s3")
    assert new.returncode == 0, new.stdout[-2000:] + new.stderr[-3000:]
    every = batch_ids + stream_ids
    history = _history(settings, pg_schema, every)
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema, fallback=False) as fs:
        rows = {r["patient"]: r for r in fs.online_dicts("evo_readings", every, windows="event")}
    for e in every:
        assert rows[e]["_from"] == "redis" and rows[e]["_event_time"] == history[e]["read_at"], e
        assert rows[e]["glucose"] == history[e]["glucose"] and rows[e]["unit"] == history[e]["unit"], e
    assert max(history[e]["read_at"] for e in stream_ids[:4]) >= later  # the v2 job wrote them


def _expected(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What every entity must read after the migration to v2, computed from the input rows:
    its newest row (glucose the float32 value as a double, ``unit`` the default) and its
    aggregations at that event (the events in (newest - 1d, newest])."""
    out: dict[str, dict[str, Any]] = {}
    for e in {r["patient"] for r in rows}:
        mine = [r for r in rows if r["patient"] == e]
        newest = max(mine, key=lambda r: r["read_at"])
        since = newest["read_at"] - dt.timedelta(days=1)
        inside = [r for r in mine if since < r["read_at"] <= newest["read_at"]]
        values = [r["glucose"] for r in inside if r["glucose"] is not None]
        out[e] = {"_event_time": newest["read_at"], "glucose": newest["glucose"], "trend": newest["trend"],
                  "note": newest["note"], "device": newest["device"], "unit": "mg/dL",
                  "readings_1d": len(inside), "glucose_max_1d": max(values) if values else None}
    return out


def _read(fs: FeatureStore, ids: list[str]) -> dict[str, dict[str, Any]]:
    keys = ["_event_time", "glucose", "trend", "note", "device", "unit", "readings_1d", "glucose_max_1d"]
    rows = fs.online_dicts("evo_readings", ids, windows="event")  # the aggregates hashes' values
    return {r["patient"]: {k: r[k] for k in keys} for r in rows if r["_from"] == "redis"}


def test_a_migration_killed_half_way_through_redis_is_finished_by_running_it_again(
        settings: Settings, pg_schema: str, env: dict[str, str], files: dict[str, Path],
        tmp_path: Path) -> None:
    """docs/evolution.md, "Resumable": a real `features migrate --apply` SIGKILLed after its
    first Redis chunk (Postgres committed, some hashes rewritten, most not), then the same
    command again: Postgres is not migrated a second time (no statement, no error, the
    versions table and the column types as one migration leaves them), it rewrites exactly
    the hashes still holding v1, and every entity reads the values computed here."""
    url = env["FEATURES_REDIS_URL"]
    v1, v2 = compile_schema(load_schema(files["v1"])), compile_schema(load_schema(files["v2"]))
    ids = [f"k{i:04d}" for i in range(3000)]
    rows = _rows(ids, 2, seed=21)
    summary = load([_parquet(rows, tmp_path / "a.parquet")], v1, dataclasses.replace(settings, redis_url=url),
                   search_path=pg_schema)
    assert summary.adds_up and summary.stored == len(rows)
    assert _redis_fingerprints(url) == {v1.fingerprint: 2 * len(ids)}

    seen = []
    with subprocess.Popen([sys.executable, "-m", "features.cli", "migrate", str(files["v2"]), "--apply",
                           "--chunk", "50"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as first:
        assert first.stdout is not None and first.stderr is not None
        for line in first.stdout:
            seen.append(line)
            if line.startswith("redis: entity hashes:"):
                first.kill()  # SIGKILL after its first Redis chunk: no cleanup, no finally
                break
        first.wait(timeout=60)
        errors = first.stderr.read()
    assert first.returncode == -9, "".join(seen) + errors
    assert any(line.startswith("postgres: migrated to 1.1.0") for line in seen), seen
    half = _redis_fingerprints(url)
    # half way: some hashes rewritten, most still v1 (else this test would prove nothing)
    assert set(half) == {v1.fingerprint, v2.fingerprint}, half
    assert 50 <= half[v2.fingerprint] < len(ids), half
    client = redis.Redis.from_url(url)
    left = {kind: sum(1 for k in client.scan_iter(match=f"features:{name}:{{*}}", count=1000)
                      if client.hget(k, "_schema_fingerprint") == v1.fingerprint.encode())
            for kind, name in (("entity", "evo_readings"), ("aggregates", "evo_readings__aggregates"))}
    client.close()
    assert left["entity"] + left["aggregates"] == half[v1.fingerprint]

    again = _cli(["migrate", str(files["v2"]), "--apply", "--chunk", "50", "--json"], env)
    assert again.returncode == 0, again.stdout + again.stderr
    out = json.loads(again.stdout)
    assert out["stores_hold"] == {"version": "1.1.0", "fingerprint": v2.fingerprint}
    assert out["postgres"] == {"from": "1.1.0", "statements": []}  # not migrated a second time
    # only the hashes still holding v1 were rewritten
    assert out["redis"] == {kind: {"scanned": len(ids), "rewritten": left[kind]} for kind in left}, out
    assert _redis_fingerprints(url) == {v2.fingerprint: 2 * len(ids)}

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        versions = conn.execute("SELECT fingerprint, version, migrated_from FROM featureline_schema_versions "
                                "WHERE schema_name = 'evo_readings' ORDER BY version").fetchall()
        held = conn.execute("SELECT version, fingerprint FROM featureline_schemas "
                            "WHERE schema_name = 'evo_readings'").fetchall()
        types = dict(conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = 'evo_readings' AND column_name IN ('glucose', 'trend', 'note', 'unit', 'site')",
            (pg_schema,)).fetchall())
        count = conn.execute("SELECT count(*) FROM evo_readings").fetchone()
    assert versions == [(v1.fingerprint, "1.0.0", None), (v2.fingerprint, "1.1.0", v1.fingerprint)]
    assert held == [("1.1.0", v2.fingerprint)]
    assert types == {"glucose": "double precision", "trend": "bigint", "note": "text", "unit": "text",
                     "site": "text"}
    assert count is not None and count[0] == len(rows)

    want = _expected(rows)
    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema, fallback=False) as fs:
        got = _read(fs, ids)
    assert len(got) == len(ids)
    wrong = [e for e in ids if got[e] != want[e]]
    assert not wrong, [(e, got[e], want[e]) for e in wrong[:3]]


def test_a_write_between_the_migrations_read_and_its_restamp_wins(
        settings: Settings, pg_schema: str, env: dict[str, str], files: dict[str, Path],
        tmp_path: Path) -> None:
    """docs/evolution.md, "a stream writing meanwhile wins": the Redis part of the migration
    (``Upgrader``, what `features migrate --apply` runs per chunk) reads a group of v1
    hashes, then, before its RESTAMP call, real writers change some of them
    (``before_write``, the seam at that point):

    - w0: a newer event written by ``FeatureStore.write`` with v2 (new event time, v2);
    - w1: a newer event in the v1 layout (a unit an old writer had in flight, written by the
      v1 ``RedisSink``): same fingerprint, another event time;
    - w2: a reader with v2 meets the hash and rewrites it itself: same event time, v2;
    - w3: the hash expires (deleted);
    - w4 (aggregates pass): a late event within the allowed lateness, written with v2,
      updates the aggregates of the same newest event: same event time, v2.

    None of them is overwritten with what the migration read, nor re-created; the counts it
    returns leave them out; w1, still v1, is rewritten by the next run with its own values."""
    from features.lineage import RunContext
    from features.ops.migrate import Upgrader, apply_postgres, plan, read_recorded, scan_keys
    from features.sinks.base import REJECTED_ROWS_SCHEMA, WriteUnit
    from features.sinks.redis import RedisSink

    url = env["FEATURES_REDIS_URL"]
    v1, v2 = compile_schema(load_schema(files["v1"])), compile_schema(load_schema(files["v2"]))
    ids = [f"w{i}" for i in range(8)]
    rows = _rows(ids, 4, seed=31)
    load([_parquet(rows, tmp_path / "a.parquet")], v1, dataclasses.replace(settings, redis_url=url),
         search_path=pg_schema)
    later = T0 + dt.timedelta(days=2)
    newest_w4 = max(r["read_at"] for r in rows if r["patient"] == "w4")
    late = {"patient": "w4", "read_at": newest_w4 - dt.timedelta(minutes=1), "glucose": 299.5, "trend": 1,
            "note": "late", "device": "g7"}
    client = redis.Redis.from_url(url, decode_responses=True)

    def v2_rows(rs: list[dict[str, Any]], unit: str) -> pa.Table:
        return pa.table({"patient": pa.array([r["patient"] for r in rs], pa.string()),
                         "read_at": pa.array([r["read_at"] for r in rs], pa.timestamp("us", "UTC")),
                         "glucose": pa.array([r["glucose"] for r in rs], pa.float64()),
                         "trend": pa.array([r["trend"] for r in rs], pa.int64()),
                         "note": pa.array([r["note"] for r in rs], pa.string()),
                         "unit": pa.array([unit] * len(rs), pa.string()),
                         "site": pa.array([None] * len(rs), pa.string()),
                         "device": pa.array([r["device"] for r in rs], pa.string())})

    with FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                      search_path=pg_schema, fallback=False) as fs, \
            FeatureStore(redis_url=url, postgres_dsn=settings.postgres_dsn, schemas=files["v2"],
                         search_path=pg_schema, fallback=False) as other:
        p = plan(fs, v2, None)
        assert p.refusal is None and p.migration is not None
        apply_postgres(fs, p)
        old_sink = RedisSink(url, v1)
        old_sink.open()
        calls: list[list[str]] = []

        def meanwhile(keys: list[str]) -> None:
            calls.append(sorted(keys))
            if len(calls) == 1:  # the entity hashes, read and not yet rewritten
                assert calls[0] == [f"features:evo_readings:{{{e}}}" for e in ids]
                newer = {"patient": "w0", "read_at": later, "glucose": 123.456789012345, "trend": 7,
                         "note": "newer", "device": "g7"}
                assert other.write("evo_readings", v2_rows([newer], "mmol/L")).stored == 1
                ctx = RunContext(v1.name, "1.0.0", v1.fingerprint, "old-writer", later)
                old = pa.table({"patient": ["w1"], "read_at": pa.array([later], pa.timestamp("us", "UTC")),
                                "glucose": pa.array([55.5], pa.float32()), "trend": pa.array([3], pa.int32()),
                                "device": ["g6"], **ctx.columns(pa.array(["file:///old#0"]))})
                assert old_sink.write(WriteUnit(old, REJECTED_ROWS_SCHEMA.empty_table(), None, 1)).stored == 1
                # rewrites w2
                assert other.online_dicts("evo_readings", ["w2"], windows="event")[0]["_from"] == "redis"
                assert client.hget("features:evo_readings:{w2}", "_schema_fingerprint") == v2.fingerprint
                assert client.delete("features:evo_readings:{w3}") == 1
            elif len(calls) == 2:  # the aggregates hashes
                assert "features:evo_readings__aggregates:{w4}" in keys
                assert other.write("evo_readings", v2_rows([late], "mg/dL")).stored == 1
                assert client.hget("features:evo_readings__aggregates:{w4}",
                                   "_schema_fingerprint") == v2.fingerprint

        recorded = fs.run_postgres("read", lambda conn: read_recorded(conn, "evo_readings"))
        up = Upgrader(fs, v2, recorded, before_write=meanwhile)
        try:
            entity = sum(up.upgrade(keys) for keys in scan_keys(fs, "evo_readings", False, 100))
            aggregates = sum(up.upgrade(keys, True) for keys in scan_keys(fs, "evo_readings", True, 100))
            assert len(calls) == 2
            # w1's hash as the old writer left it: its newer event, in the v1 layout
            w1 = client.hgetall("features:evo_readings:{w1}")
            assert (w1["_schema_fingerprint"], w1["_event_time"], w1["glucose"], w1["trend"],
                    w1["_source"]) == (v1.fingerprint, str(int(later.timestamp() * 1_000_000)), "55.5", "3",
                                       "file:///old#0"), w1
            assert "unit" not in w1
            # every hash the writers changed is left out: w0..w3 of the entity hashes; of the
            # aggregates hashes w0 and w2 (v2 before they were read) and w4
            assert (entity, aggregates) == (len(ids) - 4, len(ids) - 3)
            up.before_write = None
            assert up.upgrade(["features:evo_readings:{w1}"]) == 1  # the next run: w1 in v2, its own values
        finally:
            up.close()
            old_sink.close()
        got = _read(fs, ids)
    client.close()
    assert sorted(got) == [e for e in ids if e != "w3"] and not redis.Redis.from_url(url).exists(
        "features:evo_readings:{w3}")  # an expired hash is not re-created
    want = _expected([*rows, late])
    want["w0"] = {"_event_time": later, "glucose": 123.456789012345, "trend": 7, "note": "newer",
                  "device": "g7", "unit": "mmol/L", "readings_1d": 1, "glucose_max_1d": 123.456789012345}
    # w1: the old writer's event (it wrote no Postgres row: note null, unit the default), its
    # aggregates hash as the load left it
    want["w1"] = {**want["w1"], "_event_time": later, "glucose": 55.5, "trend": 3, "note": None,
                  "device": "g6"}
    assert want["w4"]["readings_1d"] == _expected(rows)["w4"]["readings_1d"] + 1  # the late event counts
    assert {e: got[e] for e in got} == {e: want[e] for e in got}
