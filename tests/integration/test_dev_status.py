"""`features dev status` after `up` (the test command runs `up` first): four healthy parts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]


def test_status_shows_four_healthy_parts() -> None:
    proc = subprocess.run([sys.executable, "-m", "features.cli", "dev", "status"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    # the local Redis Cluster is listed too once started (`up --redis-cluster`, the cluster tests)
    assert set(lines) - {"redis-cluster"} == {"postgres", "redis", "kafka", "flink-connector", "chromium"}
    for _name, line in lines.items():
        assert line.split()[1] == "healthy", line
    assert "PostgreSQL 1" in lines["postgres"] and "127.0.0.1:5433" in lines["postgres"]
    assert "Redis 7" in lines["redis"]
    assert "Kafka 4." in lines["kafka"] and "KRaft" in lines["kafka"]
    assert "PyFlink 2.2" in lines["flink-connector"]
    if "redis-cluster" in lines:
        assert "127.0.0.1:7101-7106" in lines["redis-cluster"] and "cluster" in lines["redis-cluster"]
    # where it keeps things: this checkout is a project whose downloads stay in its .cache/
    assert f"project state: {ROOT / '.dev'}  downloads: {ROOT / '.cache'}" in proc.stderr, proc.stderr


def test_up_is_idempotent() -> None:
    proc = subprocess.run([sys.executable, "-m", "features.cli", "dev", "up"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("postgres", "redis", "kafka"):
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{name}: "))
        # this checkout's own server, or another checkout's on the same port: never a second one
        assert line.startswith((f"{name}: already running", f"{name}: reusing")), line
