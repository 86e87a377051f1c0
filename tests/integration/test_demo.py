"""`features demo` (the README's first command) as a test: a small run end to end (compile,
example data, batch load, Kafka + the PyFlink stream job, read back) whose summary lines add
up, then a second run that stores nothing. Isolated: its own Postgres schema, Redis
database, topic and data folder."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
import redis
from confluent_kafka.admin import AdminClient
from conftest import ROOT, demo_counts

from features.config import Settings

pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.slow, pytest.mark.scratch_redis_db(15)]


def test_demo_runs_end_to_end_and_a_second_run_stores_nothing(tmp_path: Path, settings: Settings,
                                                                pg_schema: str) -> None:
    url = settings.redis_url.rsplit("/", 1)[0] + "/15"
    hot = redis.Redis.from_url(url)
    hot.flushdb()
    topic = f"t_demo_{uuid.uuid4().hex[:8]}"
    dsn = psycopg.conninfo.make_conninfo(settings.postgres_dsn, options=f"-c search_path={pg_schema}")
    env = {**os.environ, "FEATURES_REDIS_URL": url, "FEATURES_POSTGRES_DSN": dsn}
    cmd = [str(ROOT / ".venv" / "bin" / "features"), "demo", "--no-services", "--rows", "3000",
           "--files", "2", "--events", "400", "--topic", topic, "--out", str(tmp_path / "data")]
    try:
        first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        one = demo_counts(first.stdout)
        for read, stored, rejected, present in one.values():
            assert read == stored + rejected + present and stored > 0 and rejected > 0
        assert one["batch"][0] == 3000
        assert "redis    HGETALL" in first.stdout
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        two = demo_counts(second.stdout)
        for kind, (read, stored, rejected, present) in two.items():
            assert (read, stored) == (one[kind][0], 0), (kind, two)
            assert rejected + present == read
        assert "already holds" in second.stdout  # the topic is reused, not produced again
    finally:
        hot.flushdb()
        hot.close()
        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
        admin.delete_topics([topic, f"{topic}.rejects"])
