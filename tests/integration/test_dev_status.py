"""`features dev status` after `up` (the test command runs `up` first): four healthy parts."""

from __future__ import annotations

import os
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


def test_servers_another_project_started_are_shown_as_reused(tmp_path: Path) -> None:
    """A second project beside this checkout's running servers uses them, says so, and its
    `features dev down` leaves them running."""
    env = {**os.environ, "FEATURES_HOME": str(tmp_path), "FEATURES_CACHE_DIR": str(ROOT / ".cache")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "features.cli", "dev", *args], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)

    status = cli("status")
    assert status.returncode == 0, status.stdout + status.stderr
    owners = {line.split()[0]: line.split()[-1] for line in status.stdout.splitlines() if line.strip()}
    assert {owners[n] for n in ("postgres", "redis", "kafka")} == {"reused"}, status.stdout
    assert owners["flink-connector"] == "managed"  # the shared download is there
    down = cli("down")
    assert down.returncode == 0, down.stdout + down.stderr
    for name in ("postgres", "redis", "kafka"):
        assert f"{name}: left running (not started by this project)" in down.stdout, down.stdout
    again = cli("status")
    assert again.returncode == 0 and again.stdout == status.stdout, again.stdout
