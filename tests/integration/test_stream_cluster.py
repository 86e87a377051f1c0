"""The stream job, unchanged, on a standalone Flink cluster submitted with ``flink run -py``.

The cluster is the one that ships with PyFlink (``<pyflink>/bin/start-cluster.sh``): one
JobManager and one TaskManager with two slots, run from a private copy of its ``conf``
folder (free ports, logs and pid files under the test's tmp folder, small memory), so it
never meets another cluster on this machine. ``<pyflink>/bin/flink run -d -py
jobs/stream_job.py --detach`` submits the unbounded job; the test waits until the stores
hold what the produced records say they must, checks them exactly like
``test_stream.py`` does, cancels the job with ``flink cancel`` and stops the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_stream import check_stores, expected

from features.config import Settings
from features.examples import applicant_events, applicant_schema
from features.stream.kafka import entity_keys, produce

pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "stream_job.py"
# A Redis database of its own: test_stream.py's REDIS_DB (15) is flushed by each of its tests,
# 11-14 belong to other tests and the benchmarks.
REDIS_DB = 10
STORES_TIMEOUT_S = 240


def _pyflink_home() -> Path:
    import pyflink

    return Path(pyflink.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def _set(conf: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key in Flink's nested ("standard YAML") config.yaml."""
    node = conf
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


class Cluster:
    def __init__(self, home: Path, conf_dir: Path, log_dir: Path, rest_port: int) -> None:
        self.home = home
        self.conf_dir = conf_dir
        self.log_dir = log_dir
        self.rest_port = rest_port
        self.env = {**os.environ, "FLINK_CONF_DIR": str(conf_dir)}

    def script(self, name: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess[str]:
        run_env = {**(env or self.env), "FLINK_CONF_DIR": str(self.conf_dir)}
        for k in ("FLINK_LOG_DIR", "FLINK_PID_DIR", "FLINK_HOME", "_FLINK_HOME_DETERMINED"):
            run_env.pop(k, None)
        return subprocess.run(["bash", str(self.home / "bin" / name), *args], env=run_env,
                              capture_output=True, text=True, timeout=timeout, cwd=ROOT)

    def rest(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://localhost:{self.rest_port}{path}", timeout=10) as resp:
            return json.loads(resp.read())

    def job_state(self, job_id: str) -> str:
        for job in self.rest("/jobs/overview")["jobs"]:
            if job["jid"] == job_id:
                return str(job["state"])
        return "UNKNOWN"

    def running_ids(self) -> list[str]:
        proc = self.script("flink", "list", "-r", timeout=120)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return re.findall(r"\b([0-9a-f]{32})\b", proc.stdout)

    def logs(self, chars: int = 3000) -> str:
        parts = []
        for f in sorted(self.log_dir.glob("*")):
            if f.suffix in (".log", ".out") and f.stat().st_size:
                text = f.read_text(errors="replace")
                parts.append(f"----- {f.name} (last {chars} chars) -----\n{text[-chars:]}")
        return "\n".join(parts) or f"(no logs under {self.log_dir})"


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A standalone cluster from PyFlink's distribution, private to this test; always stopped."""
    with standalone_cluster(tmp_path) as c:
        yield c


@contextlib.contextmanager
def standalone_cluster(tmp_path: Path, *, taskmanagers: int = 1, slots: int = 2,
                       extra: dict[str, Any] | None = None) -> Iterator[Cluster]:
    """One JobManager and ``taskmanagers`` TaskManagers of ``slots`` slots on this machine
    (``conf/workers`` lists localhost once per TaskManager), private to the caller."""
    home = _pyflink_home()
    conf_dir, log_dir = tmp_path / "flink-conf", tmp_path / "flink-log"
    shutil.copytree(home / "conf", conf_dir)
    log_dir.mkdir()
    config_file = conf_dir / "config.yaml"
    conf = yaml.safe_load(config_file.read_text())
    rest_port = _free_port()
    keys = {
        "rest.port": rest_port,                   # the REST client and server (no bind-port set)
        "jobmanager.rpc.port": _free_port(),      # 6123 by default; the TaskManager's ports default to 0
        "taskmanager.numberOfTaskSlots": slots,
        "jobmanager.memory.process.size": "1000m",
        "taskmanager.memory.process.size": "1500m",
        "env.log.dir": str(log_dir),
        "env.pid.dir": str(tmp_path / "flink-pid"),  # /tmp by default: stop-cluster.sh would see others'
        "io.tmp.dirs": str(tmp_path / "flink-io"),
    }
    if "bind-port" in conf.get("rest", {}):
        keys["rest.bind-port"] = rest_port
    for key, value in {**keys, **(extra or {})}.items():
        _set(conf, key, value)
    config_file.write_text(yaml.safe_dump(conf, sort_keys=False))
    (conf_dir / "workers").write_text("localhost\n" * taskmanagers)
    c = Cluster(home, conf_dir, log_dir, rest_port)
    try:
        started = c.script("start-cluster.sh")
        assert started.returncode == 0, started.stdout + started.stderr + c.logs()
        deadline = time.time() + 180
        overview: dict[str, Any] = {}
        while time.time() < deadline:
            try:
                overview = c.rest("/overview")
            except OSError:
                overview = {}
            if (overview.get("taskmanagers", 0) >= taskmanagers
                    and overview.get("slots-total", 0) >= taskmanagers * slots):
                break
            time.sleep(1)
        assert overview.get("slots-total", 0) >= taskmanagers * slots, \
            f"cluster not up: {overview}\n{c.logs()}"
        yield c
    finally:
        stopped = c.script("stop-cluster.sh")
        print(stopped.stdout, stopped.stderr)


def _stores(settings: Settings, pg_schema: str, redis_url: str) -> tuple[int, int, int]:
    """(cold rows, rejects rows, hot keys) as they are now."""
    import psycopg
    import redis

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        counts = []
        for table in ("credit_applicant", "credit_applicant__rejects"):
            exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            n = conn.execute(f"SELECT count(*) FROM {table}").fetchone() if exists and exists[0] else None
            counts.append(int(n[0]) if n else 0)
    client = redis.Redis.from_url(redis_url)
    hot = sum(1 for _ in client.scan_iter(match="features:credit_applicant:{*", count=10_000))
    client.close()
    return counts[0], counts[1], hot


def test_unbounded_stream_job_on_a_standalone_cluster(settings: Settings, pg_schema: str,
                                                      stream_topic: str, cluster: Cluster,
                                                      tmp_path: Path) -> None:
    import redis

    topic = stream_topic
    redis_url = settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.Redis.from_url(redis_url).flushdb()
    sep = "&" if "?" in settings.postgres_dsn else "?"
    env = {**cluster.env,
           "FEATURES_POSTGRES_DSN": f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}",
           "FEATURES_REDIS_URL": redis_url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}

    compiled = applicant_schema()
    values = applicant_events(1500, seed=5, undecodable_every=150)
    positions = produce(settings.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
    want = expected(compiled, topic, values, positions)
    assert want["rejected"] and want["undecodable"] and len(want["newest"]) < len(want["valid"])

    py = sys.executable
    try:
        submit = cluster.script(
            "flink", "run", "-d", "-py", str(JOB), "-pyexec", py, "-pyclientexec", py,
            "--schema", "credit_applicant", "--topic", topic, "--state-dir", str(tmp_path / "state"),
            "--restart-attempts", "0", "--detach", "--json", env=env, timeout=400)
        out = submit.stdout + submit.stderr
        causes = dict.fromkeys(line.strip() for line in out.splitlines() if "Caused by" in line)
        assert submit.returncode == 0, (f"`flink run` exited {submit.returncode}:\n" + "\n".join(causes)
                                        + "\n----- flink run output (tail) -----\n" + out[-3000:])
        printed = [json.loads(line) for line in submit.stdout.splitlines() if line.startswith('{"job_id"')]
        assert printed and re.fullmatch(r"[0-9a-f]{32}", printed[-1]["job_id"]), out[-6000:]
        job_id = printed[-1]["job_id"]
        assert job_id in cluster.running_ids(), "`flink list -r` does not show the submitted job"

        goal = (len(want["valid"]), len(want["rejected"]), len(want["newest"]))
        now = (-1, -1, -1)
        state = ""
        deadline = time.time() + STORES_TIMEOUT_S
        while time.time() < deadline:
            state = cluster.job_state(job_id)
            if state in ("FAILED", "CANCELED", "FINISHED"):
                break
            now = _stores(settings, pg_schema, redis_url)
            if now == goal:
                break
            time.sleep(2)
        assert now == goal, f"job {state}: stores (cold, rejects, hot) = {now}, expected {goal}"
        assert cluster.job_state(job_id) == "RUNNING", "an unbounded job keeps running"
        check_stores(settings, pg_schema, topic, want, redis_db=REDIS_DB)

        cancel = cluster.script("flink", "cancel", job_id, timeout=180)
        assert cancel.returncode == 0, cancel.stdout[-2000:] + cancel.stderr[-2000:]
        for _ in range(30):
            if cluster.job_state(job_id) == "CANCELED":
                break
            time.sleep(1)
        assert cluster.job_state(job_id) == "CANCELED"
        assert job_id not in cluster.running_ids(), "`flink list -r` still shows the cancelled job"
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        raise AssertionError(f"{exc}\n\nFlink logs under {cluster.log_dir}:\n{cluster.logs()}") from exc
