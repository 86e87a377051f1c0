"""`features dev status` after `up` (the test command runs `up` first): every part healthy;
its exit code says which part is missing; `up` beside running servers downloads nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: serial: `dev status` and `dev up` over the shared servers, which other tests may be starting.
pytestmark = [pytest.mark.services, pytest.mark.serial]

ROOT = Path(__file__).resolve().parents[2]


def test_status_shows_four_healthy_parts() -> None:
    proc = subprocess.run([sys.executable, "-m", "features.cli", "dev", "status"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    servers, stream = lines.pop("servers:"), lines.pop("stream:")
    # the local Redis Cluster is listed too once started (`up --redis-cluster`, the cluster tests)
    assert set(lines) - {"redis-cluster"} == {"postgres", "redis", "kafka", "flink-connector", "chromium",
                                               "prometheus"}
    assert servers.startswith("servers: healthy (postgres, redis, ") and "kafka" in servers, servers
    assert stream.startswith("stream:  ready (Flink Kafka connector 5.0.0-2.2, PyFlink 2.2"), stream
    for _name, line in lines.items():
        assert line.split()[1] == "healthy", line
    assert "PostgreSQL 1" in lines["postgres"] and "127.0.0.1:5433" in lines["postgres"]
    assert "Redis 7" in lines["redis"]
    assert "Kafka 4." in lines["kafka"] and "KRaft" in lines["kafka"]
    assert "PyFlink 2.2" in lines["flink-connector"]
    assert "2.42" in lines["prometheus"]  # Debian's prometheus (with promtool): the alert tests'
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
    owners = {line.split()[0]: line.split()[-1] for line in status.stdout.splitlines()
              if line.strip() and not line.startswith(("servers:", "stream:"))}
    assert {owners[n] for n in ("postgres", "redis", "kafka")} == {"reused"}, status.stdout
    assert owners["flink-connector"] == "managed"  # the shared download is there
    down = cli("down")
    assert down.returncode == 0, down.stdout + down.stderr
    for name in ("postgres", "redis", "kafka"):
        assert f"{name}: left running (not started by this project)" in down.stdout, down.stdout
    again = cli("status")
    assert again.returncode == 0 and again.stdout == status.stdout, again.stdout


def _project(tmp_path: Path, cache: Path) -> dict[str, str]:
    """The environment of a fresh project beside the running servers, with its own
    download cache ``cache`` (this checkout's .cache is never touched)."""
    (tmp_path / "project").mkdir()
    cache.mkdir(exist_ok=True)
    return {**os.environ, "FEATURES_HOME": str(tmp_path / "project"), "FEATURES_CACHE_DIR": str(cache)}


def test_status_says_the_stream_is_not_ready_apart_from_healthy_servers(tmp_path: Path) -> None:
    """The connector jar missing (an empty download cache) while every server is healthy:
    the servers are reported healthy, the stream not ready on its own line, exit 3."""
    cache = tmp_path / "empty-cache"
    env = _project(tmp_path, cache)
    proc = subprocess.run([sys.executable, "-m", "features.cli", "dev", "status"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=tmp_path / "project")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in lines if line.strip()}
    for name in ("postgres", "redis", "kafka"):
        assert rows[name][1] == "healthy", proc.stdout
    assert rows["flink-connector"][1] == "MISSING", proc.stdout
    assert "servers: healthy (postgres, redis, kafka)" in lines, proc.stdout
    stream = next(line for line in lines if line.startswith("stream:"))
    # where it looked, which setting chose that cache, and how to share another project's download
    where = f"no Flink Kafka connector jar under {cache / 'flink-jars'} (FEATURES_CACHE_DIR): "
    assert stream.startswith(f"stream:  NOT READY: {where}run `features dev up` to fetch it there"), stream
    assert "point FEATURES_CACHE_DIR (or cache_dir in featureline.toml) at the cache that holds it" in stream
    assert "3 every server healthy but" in subprocess.run(
        [sys.executable, "-m", "features.cli", "dev", "status", "--help"], capture_output=True, text=True,
        timeout=60, env=env).stdout.replace("\n", " ")
    assert list(cache.iterdir()) == []  # status downloads nothing


def test_up_beside_a_running_broker_downloads_nothing(tmp_path: Path) -> None:
    """`up` in a project whose cache has no Kafka jars, with the broker (and Postgres,
    Redis) already answering: it reuses them and fetches nothing from Maven Central."""
    cache = tmp_path / "cache"
    cache.mkdir()
    # the stream's connector is in this cache (a copy): only what the servers would need is absent
    shutil.copytree(ROOT / ".cache" / "flink-jars", cache / "flink-jars")
    before = sorted((p.name, p.stat().st_size) for p in (cache / "flink-jars").iterdir())
    env = _project(tmp_path, cache)
    proc = subprocess.run([sys.executable, "-m", "features.cli", "dev", "up"], capture_output=True,
                          text=True, timeout=600, env=env, cwd=tmp_path / "project")
    out = proc.stdout + proc.stderr
    assert "fetching" not in out and "installing" not in out, out
    assert sorted(p.name for p in cache.iterdir()) == ["flink-jars"], out  # no kafka-libs, no m2
    assert sorted((p.name, p.stat().st_size) for p in (cache / "flink-jars").iterdir()) == before
    assert "kafka: reusing the broker already listening there (not started by this project)" in proc.stdout, \
        out
    for name in ("postgres", "redis"):
        assert f"{name}: reusing the server already listening there" in proc.stdout, out
    assert proc.returncode == 0, out
