"""HTTP ingest's lineage survives the stream: a record produced with the
``featureline-source`` header (``http://<request id>#<index>``, as ``features serve``
writes it) is stored, in Postgres and in Redis, with ``_source`` =
``kafka://topic/partition/offset via http://<request id>#<index>``; a header that is not
such a value (too long, other characters, not UTF-8) is left out of the lineage. A
rejected record keeps it too, in the rejects table and as its dead-letter key."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from features.config import Settings
from features.ops.examples import applicant_events, applicant_schema
from features.stream.kafka import entity_keys, produce, read_topic

pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.scratch_redis_db(5)]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "stream_job.py"
REDIS_DB = 5  # checked by this test's own entity ids only (never flushed)


def test_http_source_header_reaches_both_stores_with_the_kafka_coordinates(
        settings: Settings, pg_schema: str, stream_topic: str, tmp_path: Path) -> None:
    import psycopg
    import redis

    from features.validation import validate

    base = random.randrange(10**11, 9 * 10**11)
    objs = [json.loads(v) for v in applicant_events(200, seed=3) if v is not None and v.startswith(b"{")]
    for i, obj in enumerate(objs):
        obj["application_id"] = f"APP-{base + i:012d}"
    good = validate(objs, applicant_schema()).valid_row_index.to_pylist()
    values = [json.dumps(objs[i]).encode() for i in good[:6]]
    # two rejects (income_monthly under its min), one with a valid header, one with a bad one
    bad = [{**objs[i], "application_id": f"APP-{base + 500 + k:012d}", "income_monthly": -5}
           for k, i in enumerate(good[6:8])]
    values += [json.dumps(obj).encode() for obj in bad]
    headers: list[list[tuple[str, str | bytes | None]] | None] = [
        [("featureline-source", b"http://req-7.a:b#0")],
        [("featureline-source", b"http://req-7.a:b#1")],
        [("featureline-source", b"http://evil#1 <script>")],    # a character the lineage refuses
        [("featureline-source", b"http://" + b"a" * 5000 + b"#0")],  # too long
        [("featureline-source", b"http://r\xff#0")],             # not UTF-8
        None,                                                    # no header: the Kafka URI alone
        [("featureline-source", b"http://req-8#3")],             # rejected: the header kept
        [("featureline-source", b"http://req-8#4\n")],          # rejected, bad header: left out
    ]
    keys = entity_keys(values, "application_id")
    positions = produce(settings.kafka_bootstrap, stream_topic, values, keys=keys, headers=headers)
    url = settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    sep = "&" if "?" in settings.postgres_dsn else "?"
    dsn = f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}"
    env = {**os.environ, "FEATURES_POSTGRES_DSN": dsn,
           "FEATURES_REDIS_URL": url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    proc = subprocess.run([sys.executable, str(JOB), "--schema", "credit_applicant", "--state-dir",
                           str(tmp_path / "state"), "--json", "--topic", stream_topic, "--bounded",
                           "--restart-attempts", "0"], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    assert (summary["stored"], summary["rejected"]) == (6, 2), summary

    kafka = [f"kafka://{stream_topic}/{p}/{o}" for p, o, _ in positions]
    want = {json.loads(v)["application_id"]: uri for v, uri in zip(values[:6], kafka, strict=False)}
    want_rejected = sorted([kafka[6] + " via http://req-8#3", kafka[7]])
    ids = list(want)
    want[ids[0]] += " via http://req-7.a:b#0"
    want[ids[1]] += " via http://req-7.a:b#1"
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        cold = dict(conn.execute("SELECT application_id, _source FROM credit_applicant").fetchall())
        rejects = conn.execute("SELECT _source FROM credit_applicant__rejects "
                               "WHERE errors->0->>'rule' <> 'aggregation.lateness'").fetchall()
    assert cold == want
    assert sorted(r[0] for r in rejects) == want_rejected
    dead = read_topic(settings.kafka_bootstrap, stream_topic + ".rejects")
    assert sorted(m.key().decode() for m in dead) == want_rejected
    client = redis.Redis.from_url(url)
    try:
        hot = {e: client.hget(f"features:credit_applicant:{{{e}}}", "_source") for e in ids}
        assert {e: (s.decode() if s is not None else None) for e, s in hot.items()} == want
    finally:
        client.delete(*[f"features:credit_applicant:{{{e}}}" for e in ids])
