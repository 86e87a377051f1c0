"""The PyFlink stream job against the real broker and stores: bounded run, SIGKILL + restart.

Each test produces example events (invalid ones, out-of-order ones, exact duplicates,
undecodable payloads) to a fresh 2-partition topic, runs ``jobs/stream_job.py`` in its
own process (PyFlink starts a JVM), and checks the stores against a reference computed
here from the produced records: Postgres holds exactly the valid distinct events,
Redis the newest valid event per entity, the rejects table and the dead-letter topic
exactly the invalid records.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from features.compile import CompiledSchema
from features.config import Settings
from features.ops.examples import applicant_events, applicant_schema
from features.stream.kafka import entity_keys, produce, read_topic

pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.scratch_redis_db(15)]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "stream_job.py"
REDIS_DB = 15  # the stream tests' own database, flushed by each test


@pytest.fixture()
def env(settings: Settings, pg_schema: str) -> dict[str, str]:
    """Environment for the job: the test's Postgres schema, Redis database REDIS_DB."""
    import redis

    url = settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.Redis.from_url(url).flushdb()
    sep = "&" if "?" in settings.postgres_dsn else "?"
    return {**os.environ,
            "FEATURES_POSTGRES_DSN": f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}",
            "FEATURES_REDIS_URL": url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}


def _job(args: list[str], env: dict[str, str], tmp: Path) -> list[str]:
    return [sys.executable, str(JOB), "--schema", "credit_applicant", "--state-dir", str(tmp / "state"),
            "--json", *args]


def expected(compiled: CompiledSchema, topic: str, values: list[bytes | None],
             positions: list[tuple[int, int, int]]) -> dict[str, Any]:
    """The reference: which records are valid, which rejected, the newest per entity."""
    from features.validation import validate

    valid: dict[tuple[str, Any], str] = {}
    rejected: set[str] = set()
    undecodable = 0
    newest: dict[str, Any] = {}
    objs: list[dict[str, Any]] = []
    uris: list[str] = []
    for value, (part, off, _ts) in zip(values, positions, strict=True):
        uri = f"kafka://{topic}/{part}/{off}"
        try:
            obj = json.loads(value) if value is not None and len(value) <= 65536 else None
        except (ValueError, RecursionError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict):
            rejected.add(uri)
            undecodable += 1
        else:
            objs.append(obj)
            uris.append(uri)
    # Rows are validated independently: one call for all of them, in production order.
    result = validate(objs, compiled)
    bad = set(result.rejects.column("row").to_pylist())
    rejected.update(uris[i] for i in bad)
    good = result.valid.to_pylist()
    for row, i in zip(good, result.valid_row_index.to_pylist(), strict=True):
        key = (row["application_id"], row["submitted_at"])
        valid.setdefault(key, uris[i])
        e = row["application_id"]
        if e not in newest or row["submitted_at"] > newest[e]:
            newest[e] = row["submitted_at"]
    return {"valid": valid, "rejected": rejected, "newest": newest, "undecodable": undecodable}


def check_stores(settings: Settings, pg_schema: str, topic: str, want: dict[str, Any], *,
                 redis_db: int = REDIS_DB) -> None:
    import psycopg
    import redis

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        cold = conn.execute("SELECT application_id, submitted_at, _source FROM credit_applicant").fetchall()
        # (with windowed aggregations the table also holds their lateness rejects: checked apart)
        rejects = conn.execute("SELECT _source FROM credit_applicant__rejects "
                               "WHERE errors->0->>'rule' <> 'aggregation.lateness'").fetchall()
    assert len(cold) == len({(r[0], r[1]) for r in cold}), "duplicate (entity, event time) rows"
    assert {(r[0], r[1]) for r in cold} == set(want["valid"]), "Postgres must hold exactly the valid events"
    assert sorted(r[0] for r in rejects) == sorted(want["rejected"]), "rejects table != invalid records"

    client = redis.Redis.from_url(settings.redis_url.rsplit("/", 1)[0] + f"/{redis_db}")
    keys = [k for k in client.scan_iter(match="features:credit_applicant:{*", count=10_000)]
    assert len(keys) == len(want["newest"])
    pipe = client.pipeline(transaction=False)
    entities = sorted(want["newest"])
    for e in entities:
        pipe.hget(f"features:credit_applicant:{{{e}}}", "_event_time")
    stored = pipe.execute()
    for e, micros in zip(entities, stored, strict=True):
        t = want["newest"][e]
        assert micros is not None, e
        assert int(micros) == int(t.timestamp()) * 1_000_000 + t.microsecond, f"{e}: not the newest event"

    dead = read_topic(settings.kafka_bootstrap, topic + ".rejects")
    keys_dl = {m.key().decode() for m in dead}
    assert keys_dl == want["rejected"], "dead-letter topic != invalid records"
    sample = json.loads(dead[0].value())
    assert sample["errors"] and "raw" in sample and sample["schema"] == "credit_applicant"


def test_bounded_stream_stores_valid_events_and_rejects_the_rest(settings: Settings, pg_schema: str,
                                                                 stream_topic: str, env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    topic = stream_topic
    compiled = applicant_schema()
    values = applicant_events(3000, seed=7, undecodable_every=200)
    positions = produce(settings.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
    want = expected(compiled, topic, values, positions)
    assert len(want["rejected"]) > 60 and len(want["newest"]) < len(want["valid"])  # the data is mixed

    proc = subprocess.run(_job(["--topic", topic, "--bounded", "--batch-size", "700", "--restart-attempts",
                                "0"], env, tmp_path), env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["read"] == len(values)
    assert summary["adds_up"]
    assert summary["rejected"] == len(want["rejected"])
    assert summary["stored"] == len(want["valid"])
    assert summary["already_present"] == len(values) - len(want["rejected"]) - len(want["valid"])
    assert summary["by_rule"]["_payload.decode"] == want["undecodable"] > 0
    check_stores(settings, pg_schema, topic, want)


@pytest.mark.slow
def test_sigkill_mid_stream_then_restart_from_checkpoint_is_exact(settings: Settings, pg_schema: str,
                                                                  stream_topic: str, env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    import psycopg

    from features.flink.stream import latest_checkpoint

    topic = stream_topic
    compiled = applicant_schema()
    values = applicant_events(24_000, seed=11, undecodable_every=400)
    positions = produce(settings.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
    want = expected(compiled, topic, values, positions)

    log = (tmp_path / "first.log").open("w")
    # Small micro-batches and frequent checkpoints: the job takes several seconds for the
    # topic, so the kill below lands mid-stream, after at least one checkpoint.
    first = subprocess.Popen(_job(["--topic", topic, "--bounded", "--batch-size", "100", "--max-wait-ms",
                                   "200", "--checkpoint-interval-ms", "1000"], env, tmp_path),
                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    checkpoints = tmp_path / "state" / "credit_applicant" / "checkpoints"
    deadline = time.time() + 300
    stored = 0
    try:
        while time.time() < deadline:
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-4000:]
            with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
                exists = conn.execute("SELECT to_regclass('credit_applicant')").fetchone()[0]
                stored = conn.execute("SELECT count(*) FROM credit_applicant").fetchone()[0] if exists else 0
            if stored > 3000 and latest_checkpoint(checkpoints):
                break
            time.sleep(0.2)
        assert stored > 3000, "the job never got going"
        assert stored < len(want["valid"]), "killed too late: the job had already finished"
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the Python client and its Flink JVM, mid-stream
        first.wait(30)
        log.close()

    # Restart from the last checkpoint through the consumer group's offsets, which the source
    # commits when a checkpoint completes (a bounded job cannot restore a checkpoint itself:
    # FLINK-31006). Offsets committed ahead of the writes would lose rows here.
    proc = subprocess.run(_job(["--topic", topic, "--bounded", "--restart-attempts", "0"], env, tmp_path),
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert summary["adds_up"]
    assert 0 < summary["read"] < len(values), "the restart must resume from the checkpoint, not the start"
    check_stores(settings, pg_schema, topic, want)

    # the run counts: exact for the killed run too (a micro-batch it had not committed counts
    # nothing, the restart's replay of what it committed after its checkpoint counts already
    # present), each run's stored rows are the history's rows of that run
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        counts = {r[0]: list(r[1:]) for r in conn.execute(
            "SELECT run_id, read, stored, already_present, rejected, "
            "(SELECT count(*) FROM credit_applicant h WHERE h._run_id = n.run_id), "
            "(SELECT count(*) FROM credit_applicant__rejects r WHERE r._run_id = n.run_id) "
            "FROM featureline_run_counts n").fetchall()}
    assert len(counts) == 2 and summary["run_id"] in counts
    for read, stored, present, rejected, history, rejects in counts.values():
        assert read == stored + present + rejected and (stored, rejected) == (history, rejects)
    assert counts[summary["run_id"]][:4] == [summary[k] for k in ("read", "stored", "already_present",
                                                                 "rejected")]
    assert sum(c[1] for c in counts.values()) == len(want["valid"])
    assert sum(c[3] for c in counts.values()) == len(want["rejected"])
    assert sum(c[0] for c in counts.values()) >= len(values)  # the replay read some records twice


@pytest.mark.slow
def test_the_breaker_stops_a_burst_then_a_restart_with_the_gate_raised_ends_exact(
        settings: Settings, pg_schema: str, stream_topic: str, env: dict[str, str], tmp_path: Path) -> None:
    import psycopg

    topic = stream_topic
    compiled = applicant_schema()
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    text = (ROOT / "schemas" / "credit_applicant.yaml").read_text()
    quality = ("quality:\n  owner: risk-data\n  max_reject_rate: {}\n  window_records: 400\n"
               "  window_min_records: 200\n")
    (schemas / "credit_applicant.yaml").write_text(text + quality.format(0.3))
    values = applicant_events(8000, seed=17, undecodable_every=0)
    for i in range(6000, 6400):  # a bad release: every income in cents, over the max
        if values[i] is not None:
            obj = json.loads(values[i])  # type: ignore[arg-type]
            values[i] = json.dumps({**obj, "income_monthly": "100000000.00"}).encode()
    positions = produce(settings.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
    want = expected(compiled, topic, values, positions)
    args = ["--schemas-dir", str(schemas), "--topic", topic, "--bounded", "--restart-attempts", "0"]
    first = subprocess.run(_job([*args, "--batch-size", "100", "--checkpoint-interval-ms", "300"], env,
                                tmp_path), env=env, capture_output=True, text=True, timeout=400)
    assert first.returncode == 3, first.stdout[-2000:] + first.stderr[-4000:]
    assert "quality gate max_reject_rate" in first.stderr and "data owner: risk-data" in first.stderr
    assert "income_monthly.max" in first.stderr and "a restart resumes" in first.stderr
    tripped = json.loads(first.stdout)["gates"]["tripped"]
    resume = tripped["resume_offsets"]
    part, off = tripped["record"].rsplit("/", 2)[1:]
    assert int(off) >= resume[f"{topic}/{part}"]
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        sources = [r[0] for r in conn.execute("SELECT _source FROM credit_applicant").fetchall()]
    assert sources, "the job stored nothing before the burst"
    for uri in sources:  # nothing stored at or after the offsets a restart resumes from
        p, o = uri.rsplit("/", 2)[1:]
        assert int(o) < resume[f"{topic}/{p}"], (uri, resume)

    # raise the gate: not a new data version, the same tables; restart from the group offsets
    (schemas / "credit_applicant.yaml").write_text(text + quality.format(0.9))
    second = subprocess.run(_job(args, env, tmp_path), env=env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-4000:]
    summary = json.loads(second.stdout)
    assert summary["adds_up"] and summary["gates"]["tripped"] is None
    assert 0 < summary["read"] < len(values), "the restart must resume from the checkpoint, not the start"
    check_stores(settings, pg_schema, topic, want)
