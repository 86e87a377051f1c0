"""``features dev up --flink-cluster``: a real standalone Flink cluster (PyFlink's
``start-cluster.sh``) of a project, with its conf, logs and pid files under the project's
``.dev/flink`` and free loopback ports; a second project gets a cluster of its own; ``features
stream --cluster`` and ``features load --engine flink --cluster`` submit to it and the rows
arrive in Postgres and Redis; ``dev status`` shows its web UI; ``dev down`` leaves no process
of it (by pid) and nothing listening on its ports."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import redis
from test_stream import check_stores, expected

from features.config import Settings
from features.flink import cluster as local_flink
from features.ops.examples import applicant_events, applicant_schema, applicants
from features.stream.kafka import entity_keys, produce

pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.slow, pytest.mark.serial,
              pytest.mark.scratch_redis_db(6)]

ROOT = Path(__file__).resolve().parents[2]
REDIS_DB = 6  # this file's own database, flushed before and after


def _features(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 400) -> \
        subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "features.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def _project(tmp_path: Path, name: str) -> Path:
    project = tmp_path / name
    (project / "schemas").mkdir(parents=True)
    (project / "featureline.toml").write_text("")
    shutil.copy2(ROOT / "schemas" / "credit_applicant.yaml", project / "schemas")
    return project


def _env(settings: Settings, project: Path, pg_schema: str) -> dict[str, str]:
    sep = "&" if "?" in settings.postgres_dsn else "?"
    return {**os.environ, "FEATURES_HOME": str(project),
            "FEATURES_POSTGRES_DSN": f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}",
            "FEATURES_REDIS_URL": settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}",
            "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket of ``pid`` (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," in line:
            local = line.split()[3]
            host, _, port = local.rpartition(":")
            found.append((host, int(port)))
    return found


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _up(project: Path, env: dict[str, str]) -> local_flink.Cluster:
    up = _features(["dev", "up", "--flink-cluster"], env, project)
    assert up.returncode in (0, 4), up.stdout[-3000:] + up.stderr[-3000:]  # 4: only chromium missing
    cluster = local_flink.read(project / ".dev" / "flink")
    assert cluster is not None, up.stdout
    assert cluster.dir == (project / ".dev" / "flink").resolve()
    return cluster


def _check_private(cluster: local_flink.Cluster) -> list[int]:
    """Its JobManager and TaskManager run, listen on loopback only and not on Flink's default
    ports; their conf, logs and pid files are in the cluster's folder. Returns their pids."""
    pids = cluster.pids()
    assert len(pids) == 2, (pids, cluster.logs())
    names = sorted(f.name for f in cluster.pid_dir.glob("*.pid"))
    assert any("standalonesession" in n for n in names) and any("taskexecutor" in n for n in names), names
    assert any(f.name.endswith(".log") and "taskexecutor" in f.name for f in cluster.log_dir.iterdir())
    assert set(cluster.ports()).isdisjoint(local_flink.DEFAULT_PORTS)
    sockets = [s for pid in pids for s in _listening(pid)]
    assert (cluster.rest_port in {p for _, p in sockets}) and (cluster.rpc_port in {p for _, p in sockets})
    assert all(host.strip("[]").removeprefix("::ffff:") == "127.0.0.1" for host, _ in sockets), sockets
    assert not {p for _, p in sockets} & set(local_flink.DEFAULT_PORTS), sockets
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert str(cluster.conf_dir) in cmdline, cmdline[:500]
    return pids


def test_dev_flink_cluster_runs_stream_and_load_jobs_and_down_leaves_nothing(
        settings: Settings, pg_schema: str, second_pg_schema: str, stream_topic: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}")
    client.flushdb()
    project, other = _project(tmp_path, "project"), _project(tmp_path, "other")
    env = _env(settings, project, pg_schema)
    clusters: list[local_flink.Cluster] = []
    try:
        cluster = _up(project, env)
        clusters.append(cluster)
        pids = _check_private(cluster)

        status = _features(["dev", "status"], env, project)
        assert re.search(rf"^flink-cluster\s+healthy\s+{re.escape(cluster.web_ui)}\s+Flink \S+ 1 TM 2 slots",
                         status.stdout, re.M), status.stdout
        assert "flink-cluster" in status.stdout.splitlines()[-2], status.stdout  # servers: ... flink-cluster
        assert cluster.rest("/overview")["taskmanagers"] == 1  # the web UI's REST API at that address

        # a second project: a cluster of its own, other ports, other processes
        other_env = _env(settings, other, pg_schema)
        second = _up(other, other_env)
        clusters.append(second)
        other_pids = _check_private(second)
        assert set(second.ports()).isdisjoint(cluster.ports()) and set(other_pids).isdisjoint(pids)
        down = _features(["dev", "down"], other_env, other)
        assert down.returncode == 0, down.stderr
        assert second.pids() == [] and not any(_port_open(p) for p in second.ports())
        assert cluster.healthy() and cluster.pids() == pids, "the other project's down stopped this one"

        # the stream job, submitted to the cluster by `features stream --cluster`
        compiled = applicant_schema()
        values = applicant_events(600, seed=9, undecodable_every=100)
        positions = produce(settings.kafka_bootstrap, stream_topic, values,
                            keys=entity_keys(values, "application_id"))
        want = expected(compiled, stream_topic, values, positions)
        proc = _features(["stream", "--schema", "credit_applicant", "--topic", stream_topic, "--bounded",
                          "--cluster", "--restart-attempts", "0", "--state-dir", str(tmp_path / "state"),
                          "--json"], env, project, timeout=500)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:] + cluster.logs()
        summary = json.loads(proc.stdout)
        assert summary["read"] == len(values) and summary["adds_up"], summary
        check_stores(settings, pg_schema, stream_topic, want, redis_db=REDIS_DB)
        jobs = {j["name"]: j["state"] for j in cluster.rest("/jobs/overview")["jobs"]}
        assert jobs.get(f"featureline stream credit_applicant <- {stream_topic}") == "FINISHED", jobs

        # the batch job: `features load --engine flink --cluster`, its slots as its shards
        path = tmp_path / "applicants.parquet"
        pq.write_table(applicants(800, seed=4, first_id=10**9), path, row_group_size=200)
        load_env = _env(settings, project, second_pg_schema)
        proc = _features(["load", "--schema", "credit_applicant", "--engine", "flink", "--cluster", "--json",
                          str(path)], load_env, project, timeout=500)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:] + cluster.logs()
        loaded = json.loads(proc.stdout)
        assert loaded["read"] == 800 and loaded["adds_up"] and loaded["stored"] > 0, loaded
        import psycopg

        with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={second_pg_schema}") as conn:
            row = conn.execute("SELECT count(*) FROM credit_applicant").fetchone()
        assert row is not None and row[0] == loaded["stored"]
        jobs = {j["name"]: j["state"] for j in cluster.rest("/jobs/overview")["jobs"]}
        assert jobs.get("featureline load credit_applicant") == "FINISHED", jobs
        logs = cluster.logs(1_000_000)
        assert "Map (2/2)" in logs, "the load did not run one shard task per slot"

        down = _features(["dev", "down"], env, project)
        assert down.returncode == 0, down.stderr
        assert "flink-cluster: stopped" in down.stdout, down.stdout
        assert not any(Path(f"/proc/{pid}").exists() for pid in pids), "a Flink process outlived `dev down`"
        assert not any(_port_open(p) for p in cluster.ports())
        assert local_flink.read(project / ".dev" / "flink") is None
        after = _features(["dev", "status"], env, project)
        assert "flink-cluster" not in after.stdout, after.stdout
    finally:
        for c in clusters:
            local_flink.stop(c)
        client.flushdb()
        client.close()
