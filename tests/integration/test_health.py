"""``features health`` against the real stores: exit codes, fingerprints, no secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from features.config import Settings

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]


def _health(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "features.cli", "health", "--schemas-dir", str(ROOT / "schemas"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)


def _env(settings: Settings, pg_schema: str, **extra: str) -> dict[str, str]:
    sep = "&" if "?" in settings.postgres_dsn else "?"
    dsn = f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}"
    return {**os.environ, "FEATURES_POSTGRES_DSN": dsn, "FEATURES_REDIS_URL": settings.redis_url,
            "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap, **extra}


def test_healthy_then_a_fingerprint_mismatch(settings: Settings, pg_schema: str, pg_conn: Any) -> None:
    env = _env(settings, pg_schema)
    ok = _health(env, "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    report = json.loads(ok.stdout)
    assert report["healthy"]
    by_name = {c["name"]: c for c in report["checks"]}
    assert {"postgres", "redis", "kafka", "credit_applicant", "clicks"} <= set(by_name)
    assert "not loaded" in by_name["credit_applicant"]["detail"]  # a fresh schema: nothing recorded

    from features.compile.postgres import SCHEMAS_TABLE, quote_ident

    table = quote_ident(SCHEMAS_TABLE)
    pg_conn.execute(f"CREATE TABLE {table} (schema_name text PRIMARY KEY, version text, fingerprint text)")
    pg_conn.execute(f"INSERT INTO {table} VALUES ('credit_applicant', '3.1.0', '0123456789abcdef')")
    pg_conn.commit()
    bad = _health(env)
    assert bad.returncode == 1
    assert "MISMATCH" in bad.stdout and "3.1.0 (0123456789ab)" in bad.stdout and "NOT healthy" in bad.stdout
    # --schema NAME: that schema's line only (the other schema is healthy: only the named one fails)
    one = _health(env, "--schema", "clicks", "--json")
    assert one.returncode == 0, one.stdout + one.stderr
    assert [c["name"] for c in json.loads(one.stdout)["checks"] if c["kind"] == "schema"] == ["clicks"]
    assert _health(env, "--schema", "credit_applicant").returncode == 1
    unknown = _health(env, "--schema", "cgm_readings")
    assert unknown.returncode == 2 and "no schema 'cgm_readings'" in unknown.stderr, unknown.stderr
    assert "credit_applicant" in unknown.stderr  # the schemas there


def test_stores_down_exit_1_without_secrets(settings: Settings, pg_schema: str) -> None:
    env = _env(settings, pg_schema)
    env["FEATURES_POSTGRES_DSN"] = "postgresql://featureline:hunter2@127.0.0.1:1/featureline"
    env["FEATURES_REDIS_URL"] = "redis://:s3cret@127.0.0.1:1/0"
    down = _health(env, "--timeout", "2")
    assert down.returncode == 1
    lines = {line.split()[1]: line for line in down.stdout.splitlines()
             if line.startswith(("store", "schema"))}
    assert "FAIL" in lines["postgres"] and "127.0.0.1" in lines["postgres"]
    assert "FAIL" in lines["redis"] and "127.0.0.1:1" in lines["redis"]
    assert "hunter2" not in down.stdout + down.stderr and "s3cret" not in down.stdout + down.stderr
