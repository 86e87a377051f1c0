"""The batch loader end to end against the real Postgres and Redis: counts, lineage,
rejects, exact re-runs, crashes, stores down, refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features.compile import CompiledSchema, compile_schema
from features.compile.layout import entity_key
from features.config import Settings
from features.errors import SinkError, SinkUnavailable, SourceError
from features.load import load
from features.ops.examples import applicant_schema, applicants
from features.schema import load_schema

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]
VOLATILE = ("_run_id", "_ingested_at")  # differ between runs by design


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


def write_files(tmp: Path, rows: int, files: int = 2, row_group: int = 2_000, seed: int = 7) -> list[Path]:
    paths = []
    for i in range(files):
        table = applicants(rows, seed=seed + i, first_id=10**9 + i * rows)
        path = tmp / f"part-{i}.parquet"
        pq.write_table(table, path, row_group_size=row_group)
        paths.append(path)
    return paths


def pg_snapshot(settings: Settings, schema: str) -> tuple[list[Any], list[Any]]:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={schema}") as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = 'credit_applicant' ORDER BY ordinal_position", (schema,)).fetchall()]
        keep = ", ".join(f'"{c}"::text' for c in cols if c not in VOLATILE)
        rows = conn.execute(f"SELECT {keep} FROM credit_applicant ORDER BY 1, 2").fetchall()
        rejects = conn.execute("SELECT _source, row_index, raw::text, errors::text FROM "
                               "credit_applicant__rejects ORDER BY _source").fetchall()
    return rows, rejects


def redis_snapshot(client: redis.Redis, prefix: str) -> dict[bytes, dict[bytes, bytes]]:
    out = {}
    for key in client.scan_iter(match=prefix + "features:credit_applicant:{*", count=5_000):
        h = client.hgetall(key)
        out[key.removeprefix(prefix.encode())] = {k: v for k, v in h.items()
                                                  if k.decode() not in VOLATILE}
    return out


def test_load_counts_lineage_and_rejects(tmp_path: Path, settings: Settings, compiled: CompiledSchema,
                                         pg_schema: str, redis_prefix: str) -> None:
    paths = write_files(tmp_path, 5_000)
    s = load(paths, compiled, settings, batch_rows=1_500, search_path=pg_schema, key_prefix=redis_prefix)
    assert s.read == 10_000
    assert s.adds_up and s.already_present == 0
    assert 100 < s.rejected < 400  # ~2% invalid
    rows, rejects = pg_snapshot(settings, pg_schema)
    assert len(rows) == s.stored and len(rejects) == s.rejected
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        src, name, version, fp, run_id = conn.execute(
            "SELECT _source, _schema_name, _schema_version, _schema_fingerprint, _run_id "
            "FROM credit_applicant WHERE application_id = 'APP-001000000003'").fetchone()
        raw, errors = conn.execute("SELECT raw, errors FROM credit_applicant__rejects ORDER BY _source "
                                   "LIMIT 1").fetchone()
    assert src == f"{paths[0].resolve().as_uri()}#3"
    assert (name, version, fp, run_id) == ("credit_applicant", "3.2.1", compiled.fingerprint, s.run_id)
    assert set(raw) >= {"application_id", "income_monthly"}  # raw values kept as JSON
    assert errors and all(e["message"].startswith("field ") for e in errors)
    # Every reject rule counted by the run is in the table's errors.
    assert sum(s.by_rule.values()) >= s.rejected
    client = redis.Redis.from_url(settings.redis_url)
    hot = client.hgetall(redis_prefix + entity_key("credit_applicant", "APP-001000000003"))
    assert hot[b"_source"] == src.encode() and hot[b"_enc"] == b"1"
    assert hot[b"_schema_fingerprint"] == compiled.fingerprint.encode()
    assert len(redis_snapshot(client, redis_prefix)) == s.stored  # unique ids: one hash per stored row


def test_rerun_changes_nothing(tmp_path: Path, settings: Settings, compiled: CompiledSchema,
                               pg_schema: str, redis_prefix: str) -> None:
    paths = write_files(tmp_path, 3_000)
    first = load(paths, compiled, settings, batch_rows=1_000, search_path=pg_schema, key_prefix=redis_prefix)
    client = redis.Redis.from_url(settings.redis_url)
    before = pg_snapshot(settings, pg_schema), redis_snapshot(client, redis_prefix)
    second = load(paths, compiled, settings, batch_rows=1_000, search_path=pg_schema,
                  key_prefix=redis_prefix)
    assert (second.read, second.stored, second.rejected) == (first.read, 0, 0)
    assert second.already_present == first.read and second.skipped_units == second.units
    # Another batch size means other ledger units: rows are re-offered, none stored twice,
    # and counted as the skipped units' are (their rejects are already stored too).
    third = load(paths, compiled, settings, batch_rows=700, search_path=pg_schema, key_prefix=redis_prefix)
    assert third.stored == 0 and third.adds_up and third.already_present == first.read
    assert third.rejected == 0 and not third.by_rule and first.rejected > 0
    after = pg_snapshot(settings, pg_schema), redis_snapshot(client, redis_prefix)
    assert after == before


def test_out_of_order_files_keep_newest_in_redis_and_all_history_in_postgres(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
        redis_prefix: str) -> None:
    base = applicants(200, seed=3, invalid_share=0.0)
    ts = base.column("submitted_at")
    later = base.set_column(base.schema.get_field_index("submitted_at"), "submitted_at",
                            pa.compute.add(ts, pa.scalar(3_600_000_000, pa.duration("us"))))
    pq.write_table(later, tmp_path / "a-newer.parquet")
    pq.write_table(base, tmp_path / "b-older.parquet")   # loaded second (sorted paths), older events
    s = load([tmp_path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert (s.read, s.stored, s.rejected) == (400, 400, 0)
    client = redis.Redis.from_url(settings.redis_url)
    hot = client.hgetall(redis_prefix + entity_key("credit_applicant", "APP-001000000000"))
    assert hot[b"_source"].decode().endswith("a-newer.parquet#0")
    assert s.sinks["redis"].written == 200 and s.sinks["redis"].unchanged == 200


def _env(settings: Settings, pg_schema: str, redis_db: int) -> dict[str, str]:
    dsn = settings.postgres_dsn + ("&" if "?" in settings.postgres_dsn else "?") + \
        "options=" + quote(f"-c search_path={pg_schema}")
    url = settings.redis_url.rsplit("/", 1)[0] + f"/{redis_db}"
    return {**os.environ, "FEATURES_POSTGRES_DSN": dsn, "FEATURES_REDIS_URL": url}


def _batch_job(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(ROOT / "jobs" / "batch_job.py"), "--no-progress", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ledger_count(settings: Settings, schema: str) -> int:
    with psycopg.connect(settings.postgres_dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".featureline_ledger',)).fetchone()[0]
        if exists is None:
            return 0
        return int(conn.execute(f'SELECT count(*) FROM "{schema}".featureline_ledger').fetchone()[0])


@pytest.fixture()
def redis_dbs(settings: Settings) -> Any:
    """Two scratch Redis databases (14, 15), flushed before and after."""
    clients = [redis.Redis.from_url(settings.redis_url.rsplit("/", 1)[0] + f"/{db}") for db in (14, 15)]
    for c in clients:
        c.flushdb()
    yield clients
    for c in clients:
        c.flushdb()


@pytest.mark.scratch_redis_db(14, 15)
def test_sigkill_at_random_points_then_rerun_equals_uninterrupted_run(
        tmp_path: Path, settings: Settings, pg_schema: str, second_pg_schema: str, redis_dbs: Any) -> None:
    paths = [str(p) for p in write_files(tmp_path, 12_000, files=2, row_group=3_000)]
    args = ["--schema", "credit_applicant", "--batch-rows", "1000", *paths]
    units = 24
    # Reference: one uninterrupted run.
    ref = _batch_job(args, _env(settings, second_pg_schema, 15))
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err
    # Crashing runs: SIGKILL right after a random number of committed units.
    env = _env(settings, pg_schema, 14)
    rng = random.Random(1234)
    kills = []
    for target in sorted(rng.sample(range(1, units - 1), 3)):
        proc = _batch_job(args, env)
        deadline = time.monotonic() + 240
        while (_ledger_count(settings, pg_schema) < target and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        kills.append(_ledger_count(settings, pg_schema))
    assert any(0 < k < units for k in kills), kills  # the kills really landed mid-load
    final = _batch_job(args, env)
    out, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    assert "[adds up]" in out
    assert pg_snapshot(settings, pg_schema) == pg_snapshot(settings, second_pg_schema)
    crashed, reference = redis_dbs
    assert redis_snapshot(crashed, "") == redis_snapshot(reference, "")


def test_store_down_at_start_fails_clearly_and_writes_nothing(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    paths = [str(p) for p in write_files(tmp_path, 500, files=1)]
    env = _env(settings, pg_schema, 0)
    env["FEATURES_REDIS_URL"] = "redis://127.0.0.1:1/0"
    proc = subprocess.run([sys.executable, "-m", "features.cli", "load", "--schema", "credit_applicant",
                           *paths], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Redis unreachable at 127.0.0.1:1" in proc.stderr
    with psycopg.connect(settings.postgres_dsn) as conn:
        table = f'"{pg_schema}".credit_applicant'
        assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None
    env = _env(settings, pg_schema, 0)
    env["FEATURES_POSTGRES_DSN"] = "postgresql://featureline:featureline@127.0.0.1:1/featureline"
    proc = subprocess.run([sys.executable, "-m", "features.cli", "load", "--schema", "credit_applicant",
                           *paths], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Postgres unreachable at 127.0.0.1:1" in proc.stderr


@pytest.fixture()
def own_redis(tmp_path: Path) -> Any:
    """A private redis-server on a free port, so the test can kill and restart it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
           "--dir", str(tmp_path)]

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=port).ping():
                    return p
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("private redis did not start")

    state = {"proc": start()}
    yield port, state, start
    state["proc"].kill()
    state["proc"].wait()


def test_redis_lost_mid_run_fails_after_retries_then_rerun_completes_exactly(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, own_redis: Any) -> None:
    port, state, start = own_redis
    paths = write_files(tmp_path, 6_000, files=1, row_group=1_000)
    # 3 tries, 0.1 s then 0.2 s apart (settings store_retries, store_backoff_s; default 5 from 0.5 s)
    hot_settings = dataclasses.replace(settings, redis_url=f"redis://127.0.0.1:{port}/0", store_retries=3,
                                       store_backoff_s=0.1)
    from features.pipeline import write as runner

    killed = {"done": False}
    real = runner.process_batch

    def process_and_kill_once(*a: Any, **kw: Any) -> Any:
        # After the second batch is prepared, the Redis server dies (a real SIGKILL).
        out = real(*a, **kw)
        if not killed["done"] and a[0].lineage.first_row >= 2_000:
            killed["done"] = True
            state["proc"].kill()
            state["proc"].wait()
        return out

    runner.process_batch = process_and_kill_once
    try:
        t0 = time.monotonic()
        with pytest.raises(SinkUnavailable) as info:
            load(paths, compiled, hot_settings, batch_rows=1_000, search_path=pg_schema)
        assert time.monotonic() - t0 >= 0.1 + 0.2  # bounded retries with exponential backoff
    finally:
        runner.process_batch = real
    assert info.value.store == "redis" and f"127.0.0.1:{port}" in str(info.value)
    assert "after 3 attempts" in str(info.value)
    state["proc"] = start()  # the server comes back (empty: no persistence)
    s = load(paths, compiled, hot_settings, batch_rows=1_000, search_path=pg_schema)
    assert s.adds_up
    hot = redis.Redis(port=port)
    rows, _ = pg_snapshot(settings, pg_schema)
    # Redis missed the units after the crash and, being empty after the restart, every
    # unit Postgres committed before it: the re-run rewrites all that Redis lacks.
    assert len(list(hot.scan_iter(match="features:credit_applicant:{*"))) == len(rows)


def test_fingerprint_mismatch_refuses_to_write(tmp_path: Path, settings: Settings, compiled: CompiledSchema,
                                               pg_schema: str, redis_prefix: str) -> None:
    paths = write_files(tmp_path, 300, files=1)
    load(paths, compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    text = (ROOT / "schemas" / "credit_applicant.yaml").read_text().replace("max: 120", "max: 110")
    (tmp_path / "credit_applicant.yaml").write_text(text)
    changed = compile_schema(load_schema(tmp_path / "credit_applicant.yaml"))
    with pytest.raises(SinkError) as info:
        load(paths, changed, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert info.value.store == "postgres"
    assert "features migrate" in str(info.value) and compiled.fingerprint[:12] in str(info.value)


def test_missing_required_column_and_incompatible_type_refuse_to_start(tmp_path: Path,
                                                                       compiled: CompiledSchema) -> None:
    from features.sources.parquet import ParquetSource

    table = applicants(50, seed=1)
    pq.write_table(table.drop_columns(["submitted_at"]), tmp_path / "missing.parquet")
    with pytest.raises(SourceError, match="missing required column 'submitted_at'"):
        ParquetSource([tmp_path / "missing.parquet"], compiled)
    bad = table.set_column(table.schema.get_field_index("age"), "age", pa.array(["x"] * 50))
    pq.write_table(bad, tmp_path / "typed.parquet")
    with pytest.raises(SourceError, match="column 'age' has type string, incompatible with int16"):
        ParquetSource([tmp_path / "typed.parquet"], compiled)
    extra = table.append_column("notes", pa.array(["n"] * 50))
    pq.write_table(extra, tmp_path / "extra.parquet")
    with pytest.warns(UserWarning, match="ignoring column.*notes"):
        ParquetSource([tmp_path / "extra.parquet"], compiled)
    with pytest.raises(SourceError, match="no Parquet file found at"):
        ParquetSource([tmp_path / "nothing-*.parquet"], compiled)


@pytest.mark.scratch_redis_db(13)
def test_cli_json_summary(tmp_path: Path, settings: Settings, pg_schema: str) -> None:
    paths = [str(p) for p in write_files(tmp_path, 800, files=1)]
    proc = subprocess.run([sys.executable, "-m", "features.cli", "load", "--schema", "credit_applicant",
                           "--json", *paths], env=_env(settings, pg_schema, 13), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["read"] == 800 and summary["adds_up"] is True
    assert summary["read"] == summary["stored"] + summary["rejected"] + summary["already_present"]
    assert summary["top_reasons"] and summary["top_reasons"][0]["examples"]
    redis.Redis.from_url(settings.redis_url.rsplit("/", 1)[0] + "/13").flushdb()


@pytest.fixture()
def own_postgres(settings: Settings) -> Any:
    """A private PostgreSQL server (own cluster, free port) that the test may kill."""
    import shutil
    import uuid

    from features.home import state_home
    from features.ops.dev.services import Postgres

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = state_home() / f"test-pg-{uuid.uuid4().hex[:8]}"
    dsn = f"postgresql://featureline:featureline@127.0.0.1:{port}/featureline"
    pg = Postgres(dataclasses.replace(settings, postgres_dsn=dsn), state=state)
    pg.start()
    yield pg
    pg.stop()
    shutil.rmtree(state, ignore_errors=True)


def test_postgres_lost_mid_run_fails_after_retries_then_rerun_completes_exactly(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, redis_prefix: str,
        own_postgres: Any) -> None:
    pg = own_postgres
    paths = write_files(tmp_path, 6_000, files=1, row_group=1_000)
    cold = dataclasses.replace(settings, postgres_dsn=pg.dsn, store_retries=3, store_backoff_s=0.1)
    from features.pipeline import write as runner

    killed: dict[str, Any] = {"done": False}
    real = runner.process_batch

    def process_and_kill_once(*a: Any, **kw: Any) -> Any:
        out = real(*a, **kw)
        if not killed["done"] and a[0].lineage.first_row >= 2_000:
            killed["done"] = True
            pid = int((pg.data / "postmaster.pid").read_text().split()[0])
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            killed["backends"] = [Path(f"/proc/{c}") for c in children]
            os.kill(pid, signal.SIGKILL)
        return out

    runner.process_batch = process_and_kill_once
    try:
        with pytest.raises(SinkUnavailable) as info:
            load(paths, compiled, cold, batch_rows=1_000, key_prefix=redis_prefix)
    finally:
        runner.process_batch = real
    assert info.value.store == "postgres" and f"127.0.0.1:{pg.port}" in str(info.value)
    assert "after 3 attempts" in str(info.value)
    # the killed postmaster's backends notice its death and exit; until they have, they hold
    # its shared memory and a new server refuses to start (an operator waits the same)
    deadline = time.monotonic() + 30
    while any(p.exists() for p in killed["backends"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    pg.pidfile.unlink(missing_ok=True)
    (pg.data / "postmaster.pid").unlink(missing_ok=True)  # killed server: stale pid file
    pg.start()  # crash recovery replays the WAL: committed units survive
    s = load(paths, compiled, cold, batch_rows=1_000, key_prefix=redis_prefix)
    # Units Postgres committed before the crash (how many depends on timing) are
    # skipped, the rest stored: together exactly once.
    assert s.adds_up and s.read == 6_000
    with psycopg.connect(pg.dsn) as conn:
        stored = conn.execute("SELECT count(*), count(DISTINCT (application_id, submitted_at)) "
                              "FROM credit_applicant").fetchone()
        rejects = conn.execute("SELECT count(*) FROM credit_applicant__rejects").fetchone()[0]
        ledger = conn.execute("SELECT sum(read), sum(stored) + sum(already_present) + sum(rejected) "
                              "FROM featureline_ledger").fetchone()
    assert stored[0] == stored[1]  # no duplicates
    assert stored[0] + rejects == 6_000 and ledger == (6_000, 6_000)


# --------------------------------------------------------------------------- text and null markers


CGM_CSV = """\
patient,at,glucose,device
p1,2024-01-01T00:00:00Z,22.59,devA
p1,2024-01-01T00:05:00Z,nil,nil
p2,2024-01-01T00:00:00Z,nil,devB
p2,2024-01-01T00:05:00Z,7.1,devB
p3,2024-01-01T00:00:00Z,,devC
"""
CGM_KEYS = """\
name: {name}
version: 1.0.0
entity: patient
event_time: at
fields:
  - {{name: patient, type: string, store: [hot, cold], constraints: {{required: true}}}}
  - {{name: at, type: "timestamp(s, UTC)", accept_strings: true, store: [hot, cold],
      constraints: {{required: true}}}}
"""
CGM_PLAIN = CGM_KEYS + """\
  - {{name: glucose, type: float64, store: [hot, cold]}}
  - {{name: device, type: string, store: [hot, cold]}}
"""
CGM_MARKERS = CGM_KEYS + """\
  - {{name: glucose, type: float64, accept_strings: true, null_values: [nil], store: [hot, cold]}}
  - {{name: device, type: string, null_values: [nil], store: [hot, cold]}}
"""


def _cgm_parquet(tmp_path: Path) -> Path:
    """A CSV export with ``nil`` for missing values, as pandas writes it to Parquet: every
    column is text (``22.59`` too); the empty cell is pandas' NaN, a null."""
    import pandas as pd

    (tmp_path / "cgm.csv").write_text(CGM_CSV)
    path = tmp_path / "cgm.parquet"
    pd.read_csv(tmp_path / "cgm.csv").to_parquet(path)
    assert pq.read_schema(path).field("glucose").type == pa.string()
    return path


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_validate_and_load_give_one_verdict_and_hint_on_numbers_as_text(
        tmp_path: Path, settings: Settings, pg_schema: str) -> None:
    """Issue 30: ``features validate`` rejected every row (``got '22.59', expected
    float64``, no hint) where ``features load`` refused the file with the hint."""
    path = _cgm_parquet(tmp_path)
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "cgm_text.yaml").write_text(CGM_PLAIN.format(name="cgm_text"))
    env = {**_env(settings, pg_schema, 0), "PYTHONPATH": str(ROOT)}
    common = ["--schema", "cgm_text", "--schemas-dir", str(schemas), str(path)]
    validated, loaded = _cli(["validate", *common], env), _cli(["load", "--no-progress", *common], env)
    assert (validated.returncode, loaded.returncode) == (2, 2), (validated.stdout, loaded.stderr)
    # one problem (device is a string field: its text column fits), one message, one hint
    refusal = (": refusing to load with schema 'cgm_text': column 'glucose' has type string, incompatible "
               "with float64 (set accept_strings: true to parse text)")
    assert validated.stderr.strip() == f"features validate: error: {path}{refusal}"
    assert f"features load: error: {path.resolve()}{refusal}" in loaded.stderr.splitlines()
    assert validated.stdout == ""
    with psycopg.connect(settings.postgres_dsn) as conn:  # the load refused before any store
        assert conn.execute("SELECT to_regclass(%s)", (f'"{pg_schema}".cgm_text',)).fetchone()[0] is None


def test_null_values_markers_load_as_nulls_in_postgres_and_redis(
        tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    path = _cgm_parquet(tmp_path)
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "cgm_nil.yaml").write_text(CGM_MARKERS.format(name="cgm_nil"))
    validated = _cli(["validate", "--json", "--schema", "cgm_nil", "--schemas-dir", str(schemas), str(path)],
                     {**os.environ, "PYTHONPATH": str(ROOT)})
    assert validated.returncode == 0, validated.stderr
    doc = json.loads(validated.stdout)
    assert (doc["input_rows"], doc["valid_rows"], doc["rejected_rows"]) == (5, 5, 0)
    compiled = compile_schema(load_schema(schemas / "cgm_nil.yaml"))
    s = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert (s.read, s.stored, s.rejected) == (5, 5, 0) and s.adds_up
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        rows = conn.execute("SELECT patient, to_char(at AT TIME ZONE 'UTC', 'HH24:MI'), glucose, device "
                            "FROM cgm_nil ORDER BY 1, 2").fetchall()
    assert rows == [("p1", "00:00", 22.59, "devA"), ("p1", "00:05", None, None),
                    ("p2", "00:00", None, "devB"), ("p2", "00:05", 7.1, "devB"),
                    ("p3", "00:00", None, "devC")]
    client = redis.Redis.from_url(settings.redis_url)
    hot = {p: client.hgetall(redis_prefix + entity_key("cgm_nil", p)) for p in ("p1", "p2", "p3")}
    # the newest event of each patient; a null is an absent hash field (never the text 'nil')
    assert b"glucose" not in hot["p1"] and b"device" not in hot["p1"]
    assert hot["p2"][b"glucose"] == b"7.1" and hot["p2"][b"device"] == b"devB"
    assert b"glucose" not in hot["p3"] and hot["p3"][b"device"] == b"devC"
    assert all(b"nil" not in h.values() for h in hot.values())
