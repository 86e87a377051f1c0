"""The stream job on a standalone Flink cluster, submitted with ``flink run`` from a user's
project: nothing of this checkout is on any Python's path.

The cluster is the one that ships with PyFlink (``<pyflink>/bin/start-cluster.sh``) of
``deps_venv``, a fresh virtual environment outside the checkout with the locked
dependencies and no featureline: one JobManager and one TaskManager with two slots, run
from a private copy of its ``conf`` folder (free loopback ports, logs and pid files under
the test's tmp folder, small memory: :mod:`features.flink.cluster`, the code ``features dev
up --flink-cluster`` starts a project's cluster with) and started from that tmp folder without PYTHONPATH, so
it never meets another cluster on this machine and its Python workers (``python -m``,
started in the TaskManager's folder) cannot import the checkout.

The user's project is a tmp folder made by ``features init`` with the credit_applicant
schema copied in and the wheel in ``dist/``; the client is ``installed_venv`` (the wheel
installed), run from that folder with no PYTHONPATH. The submit is the documented one
(docs/streaming.md, "On a Flink cluster")::

    <pyflink>/bin/flink run -d -py "$(features job-file stream)" -pyfs dist/featureline-*.whl \
        -pyexec <cluster's python> -pyclientexec <project's python> --schema ... --detach

``-pyfs`` ships the wheel; each Python worker gets it on its PYTHONPATH and imports the
package from it (a wheel is a zip: zipimport). The TaskManager's log must show the cluster's
Python and the shipped wheel as the workers' only PYTHONPATH entry. The test then waits until
the stores hold what the produced records say they must, checks them exactly like
``test_stream.py`` does, cancels the job with ``flink cancel`` and stops the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from installed_env import site_packages, users_shell
from test_stream import check_stores, expected

from features.config import Settings
from features.flink import cluster as local_flink
from features.ops.examples import applicant_events, applicant_schema
from features.stream.kafka import entity_keys, produce

pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.slow, pytest.mark.serial,
              pytest.mark.scratch_redis_db(10)]

ROOT = Path(__file__).resolve().parents[2]
# A Redis database of its own: test_stream.py's REDIS_DB (15) is flushed by each of its tests,
# 11-14 belong to other tests and the benchmarks.
REDIS_DB = 10
STORES_TIMEOUT_S = 240


def _pyflink_home(python: Path | None = None) -> Path:
    """The PyFlink distribution (``bin/``, ``conf/``, ``lib/``) of ``python``, else of this
    interpreter."""
    return local_flink.pyflink_home(python)


class Cluster:
    """A cluster of :mod:`features.flink.cluster` (the one way featureline starts one, as
    ``features dev up --flink-cluster`` does) and the folder its daemons started in."""

    def __init__(self, cluster: local_flink.Cluster, cwd: Path) -> None:
        self.cluster = cluster
        self.home = cluster.home
        self.conf_dir = cluster.conf_dir
        self.log_dir = cluster.log_dir
        self.pid_dir = cluster.pid_dir
        self.io_dir = cluster.io_dir
        self.rest_port = cluster.rest_port
        self.cwd = cwd

    def script(self, name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180,
               home: Path | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``<home>/bin/<name> args`` (``home``: the cluster's PyFlink unless given) with this
        cluster's conf, from ``cwd`` (else the cluster's folder), without PYTHONPATH."""
        run_env = self.cluster.env(env)
        run_env.pop("PYTHONPATH", None)
        return subprocess.run(["bash", str((home or self.home) / "bin" / name), *args], env=run_env,
                              capture_output=True, text=True, timeout=timeout, cwd=cwd or self.cwd)

    def rest(self, path: str) -> Any:
        return self.cluster.rest(path)

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
        return self.cluster.logs(chars)


@pytest.fixture()
def cluster(tmp_path: Path, deps_venv: Path) -> Iterator[Cluster]:
    """A standalone cluster from the PyFlink distribution of ``deps_venv`` (no featureline),
    started from this test's tmp folder, private to this test; always stopped."""
    cwd = tmp_path / "cluster"
    cwd.mkdir()
    with standalone_cluster(tmp_path, home=_pyflink_home(deps_venv), cwd=cwd) as c:
        yield c


@contextlib.contextmanager
def standalone_cluster(tmp_path: Path, *, taskmanagers: int = 1, slots: int = 2,
                       extra: dict[str, Any] | None = None, home: Path | None = None,
                       cwd: Path = ROOT) -> Iterator[Cluster]:
    """One JobManager and ``taskmanagers`` TaskManagers of ``slots`` slots on this machine,
    private to the caller: :func:`features.flink.cluster.configure` in ``tmp_path/flink``
    (free loopback ports; conf, logs, pid files and io.tmp.dirs in that folder), started
    by :mod:`features.flink.cluster` without PYTHONPATH, killed at the end
    (:func:`_kill_at_once`).

    ``home``: the PyFlink distribution (this interpreter's unless given). ``cwd``: the folder
    the daemons start in, which is also their Python workers' folder and first on those
    workers' ``sys.path`` (they run ``python -m``): the checkout unless given."""
    c = local_flink.configure(tmp_path / "flink", home=home, taskmanagers=taskmanagers, slots=slots,
                              extra=extra)
    env = c.env()
    env.pop("PYTHONPATH", None)
    try:
        local_flink.start(c, cwd=cwd, env=env)
        yield Cluster(c, cwd)
    finally:
        _kill_at_once(c)
        local_flink.stop(c)  # whatever outlived that (normally nothing): SIGTERM, then SIGKILL


def _kill_at_once(c: local_flink.Cluster, timeout: float = 30) -> None:
    """SIGKILL to every daemon of this test's own cluster and the processes under them (its
    Python workers) at once, and wait until they are gone (up to ``timeout`` s): the test
    has read what it checks, nothing of the cluster is kept. ``features dev down`` (its
    graceful SIGTERM, ``local_flink.stop``) is ``test_dev_flink_cluster.py``'s."""
    pids = c.pids()
    for pid in [p for daemon in pids for p in _process_tree(daemon)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while c.pids() and time.monotonic() < deadline:
        time.sleep(0.05)


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``pgrep -P``), parents first."""
    out = [pid]
    for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
        out += _process_tree(int(child))
    return out


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


def _project(tmp_path: Path, installed_venv: Path, wheel: Path, env: dict[str, str]) -> Path:
    """A user's project folder outside the checkout: ``features init``, the credit_applicant
    schema, the wheel in ``dist/``."""
    init = subprocess.run([str(installed_venv.parent / "features"), "init", "project"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert init.returncode == 0, init.stdout + init.stderr
    project = tmp_path / "project"
    shutil.copy2(ROOT / "schemas" / "credit_applicant.yaml", project / "schemas")
    (project / "dist").mkdir()
    shutil.copy2(wheel, project / "dist" / wheel.name)
    return project


def _user_env(settings: Settings, pg_schema: str, redis_url: str, installed_venv: Path) -> dict[str, str]:
    """A user's shell (``installed_env.users_shell``: the Kafka connector jar, which travels
    with the job, comes from the shared download cache) with the stores of this test."""
    sep = "&" if "?" in settings.postgres_dsn else "?"
    return users_shell({
        **os.environ,
        "FEATURES_POSTGRES_DSN": f"{settings.postgres_dsn}{sep}options=-csearch_path%3D{pg_schema}",
        "FEATURES_REDIS_URL": redis_url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap},
        installed_venv)


def test_unbounded_stream_job_from_a_users_project_on_a_standalone_cluster(
        settings: Settings, pg_schema: str, stream_topic: str, tmp_path: Path, featureline_wheel: Path,
        installed_venv: Path, deps_venv: Path, cluster: Cluster) -> None:
    import redis

    topic = stream_topic
    redis_url = settings.redis_url.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.Redis.from_url(redis_url).flushdb()
    env = _user_env(settings, pg_schema, redis_url, installed_venv)
    project = _project(tmp_path, installed_venv, featureline_wheel, env)
    for path in (project, installed_venv, deps_venv, cluster.cwd):
        assert not path.resolve().is_relative_to(ROOT), path
    bare = subprocess.run([str(deps_venv), "-c", "import features"], cwd=cluster.cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "No module named 'features'" in bare.stderr, "the cluster's Python must not have featureline"
    job_file = subprocess.run([str(installed_venv.parent / "features"), "job-file", "stream"], cwd=project,
                              env=env, capture_output=True, text=True, timeout=120)
    assert job_file.returncode == 0, job_file.stderr
    job = Path(job_file.stdout.strip())
    assert job.is_file() and job.is_relative_to(site_packages(installed_venv)), job

    compiled = applicant_schema()
    values = applicant_events(1500, seed=5, undecodable_every=150)
    positions = produce(settings.kafka_bootstrap, topic, values, keys=entity_keys(values, "application_id"))
    want = expected(compiled, topic, values, positions)
    assert want["rejected"] and want["undecodable"] and len(want["newest"]) < len(want["valid"])

    try:
        submit = cluster.script(
            "flink", "run", "-d", "-py", str(job), "-pyfs", f"dist/{featureline_wheel.name}",
            "-pyexec", str(deps_venv), "-pyclientexec", str(installed_venv),
            "--schema", "credit_applicant", "--topic", topic, "--state-dir", str(tmp_path / "state"),
            "--restart-attempts", "0", "--detach", "--json",
            env=env, timeout=400, home=_pyflink_home(installed_venv), cwd=project)
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
            time.sleep(0.5)
        assert now == goal, f"job {state}: stores (cold, rejects, hot) = {now}, expected {goal}"
        assert cluster.job_state(job_id) == "RUNNING", "an unbounded job keeps running"
        check_stores(settings, pg_schema, topic, want, redis_db=REDIS_DB)

        # The workers ran the cluster's Python (-pyexec, not the client's) with the shipped
        # wheel (a copy under the TaskManager's io.tmp.dirs) as their only PYTHONPATH entry.
        tm_log = "\n".join(f.read_text(errors="replace") for f in cluster.log_dir.glob("*taskexecutor*.log"))
        assert f"Python interpreter path: {deps_venv}\n" in tm_log, cluster.logs()
        paths = re.findall(r"PYTHONPATH of python worker: (\S+)", tm_log)
        assert paths, cluster.logs()
        for entries in paths:
            shipped = Path(entries)  # one entry: no os.pathsep
            assert shipped.name == featureline_wheel.name and shipped.is_relative_to(cluster.io_dir), entries

        cancel = cluster.script("flink", "cancel", job_id, timeout=180)
        assert cancel.returncode == 0, cancel.stdout[-2000:] + cancel.stderr[-2000:]
        for _ in range(150):
            if cluster.job_state(job_id) == "CANCELED":
                break
            time.sleep(0.2)
        assert cluster.job_state(job_id) == "CANCELED"
        assert job_id not in cluster.running_ids(), "`flink list -r` still shows the cancelled job"
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        raise AssertionError(f"{exc}\n\nFlink logs under {cluster.log_dir}:\n{cluster.logs()}") from exc
