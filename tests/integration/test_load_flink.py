"""The batch loader as a Flink BATCH job (``--engine flink``): on the local mini-cluster,
and submitted to a standalone cluster of two TaskManagers, one of which is SIGKILLed
mid-run; both end identical to a single-process load (both stores, rejects with their row
numbers, lineage). The cluster submit is the documented one (docs/loading.md), from a
folder outside the checkout: ``flink run -py "$(features job-file batch)" -pyfs
dist/<wheel>``, the client the wheel installed in a fresh environment, the cluster's
Python one with the locked dependencies and no featureline (as in
``test_stream_cluster.py``)."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from installed_env import users_shell
from test_batch_load import _env, _ledger_count, pg_snapshot, redis_snapshot
from test_stream_cluster import Cluster, _process_tree, _pyflink_home, standalone_cluster

from features.config import Settings
from features.flink.cluster import _pid_alive
from features.ops.examples import applicants

# Redis databases of their own while a test runs (test_security.py flushes 9 too: the lock)
REDIS_REFERENCE, REDIS_FLINK = 8, 9
pytestmark = [pytest.mark.services, pytest.mark.flink, pytest.mark.slow,
              pytest.mark.scratch_redis_db(REDIS_REFERENCE, REDIS_FLINK)]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "batch_job.py"  # the mini-cluster tests run the checkout's entry point


def write_files(tmp: Path, rows: int, files: int, seed: int = 31) -> list[str]:
    """Files whose ids repeat across files with shuffled rows and other event times."""
    paths = []
    for i in range(files):
        table = applicants(rows, seed=seed + i, first_id=10**9)
        order = list(range(rows))
        random.Random(seed + i).shuffle(order)
        path = tmp / f"part-{i}.parquet"
        pq.write_table(table.take(pa.array(order)), path, row_group_size=1_000)
        paths.append(str(path))
    return paths


def _flushed(settings: Settings, db: int) -> redis.Redis:
    client = redis.Redis.from_url(settings.redis_url.rsplit("/", 1)[0] + f"/{db}")
    client.flushdb()
    return client


def _reference(settings: Settings, schema: str, paths: list[str]) -> None:
    """One process, the plain loader: what every engine must end with."""
    proc = subprocess.run([sys.executable, "-m", "features.cli", "load", "--schema", "credit_applicant",
                           "--batch-rows", "500", "--no-progress", *paths],
                          env=_env(settings, schema, REDIS_REFERENCE), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture()
def two_dbs(settings: Settings) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """The reference's and the Flink run's Redis databases, flushed before and after."""
    clients = (_flushed(settings, REDIS_REFERENCE), _flushed(settings, REDIS_FLINK))
    yield clients
    for c in clients:
        c.flushdb()
        c.close()


def test_flink_engine_on_the_mini_cluster_equals_one_process(
        tmp_path: Path, settings: Settings, pg_schema: str, second_pg_schema: str,
        two_dbs: tuple[redis.Redis, redis.Redis]) -> None:
    paths = write_files(tmp_path, 2_000, files=2)
    reference, flink = two_dbs
    _reference(settings, pg_schema, paths)
    proc = subprocess.run([sys.executable, str(JOB), "--schema", "credit_applicant", "--engine", "flink",
                           "--parallelism", "2", "--batch-rows", "500", "--json", *paths],
                          env=_env(settings, second_pg_schema, REDIS_FLINK), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert '"adds_up": true' in proc.stdout and '"read": 4000' in proc.stdout, proc.stdout[-2000:]
    assert '"units": 16' in proc.stdout, proc.stdout[-2000:]  # 8 units x 2 shards: two tasks ran
    assert pg_snapshot(settings, second_pg_schema) == pg_snapshot(settings, pg_schema)
    assert redis_snapshot(flink, "") == redis_snapshot(reference, "")


VOLATILE = ("_run_id", "_ingested_at")  # differ between runs by design


def tables_snapshot(settings: Settings, pg_schema: str, name: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the schema's tables (history, rejects, aggregates when present) as
    text, without the columns that differ between runs."""
    import psycopg
    from psycopg import sql

    out = {}
    with psycopg.connect(settings.postgres_dsn) as conn:
        for table in (name, f"{name}__rejects", f"{name}__aggregates"):
            cols = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
                "table_name = %s ORDER BY ordinal_position", (pg_schema, table)).fetchall()]
            keep = [c for c in cols if c not in (*VOLATILE, "id")]
            if not keep:
                continue
            query = sql.SQL("SELECT {} FROM {}.{}").format(
                sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c)) for c in keep),
                sql.Identifier(pg_schema), sql.Identifier(table))
            out[table] = sorted(conn.execute(query).fetchall(), key=repr)
    return out


def hashes(client: redis.Redis) -> dict[bytes, dict[bytes, bytes]]:
    """Every hash of the database (entities and aggregates) without the volatile fields."""
    return {k: {f: v for f, v in client.hgetall(k).items() if f.decode() not in VOLATILE}
            for k in client.scan_iter(count=5_000) if client.type(k) == b"hash"}


def agg_files(tmp: Path, events: int, files: int, seed: int = 44) -> list[str]:

    from aggregate_reference import history_table, random_history

    rng = random.Random(seed)
    rows = random_history(rng, events, users=300, minutes=20_000)
    rng.shuffle(rows)
    paths = []
    for i in range(files):
        paths.append(str(tmp / f"agg-{i}.parquet"))
        pq.write_table(history_table(rows[i::files]), paths[-1], row_group_size=1_000)
    return paths


@pytest.fixture(scope="class")
def killable_cluster(tmp_path_factory: pytest.TempPathFactory, deps_venv: Path) -> Iterator[Cluster]:
    """One standalone cluster of two 1-slot TaskManagers, shared by the killed-TaskManager
    cases (one JVM start of the cluster, not one per case): each case kills one of its
    TaskManagers, and the next case first starts one in its place (:func:`_two_taskmanagers`)."""
    tmp = tmp_path_factory.mktemp("killed-taskmanager")
    (tmp / "cluster").mkdir()
    with standalone_cluster(tmp, taskmanagers=2, slots=1, home=_pyflink_home(deps_venv), cwd=tmp / "cluster",
                            extra={"heartbeat.timeout": 10_000, "heartbeat.interval": 2_000}) as cluster:
        yield cluster


def _taskexecutors(cluster: Cluster) -> list[int]:
    """The TaskManagers' pids that are running now (a killed one's pid stays in the pid file)."""
    return sorted(int(p) for f in cluster.pid_dir.glob("*taskexecutor*.pid") for p in f.read_text().split()
                  if p.isdigit() and _pid_alive(int(p)))


def _two_taskmanagers(cluster: Cluster, timeout: float = 180) -> None:
    """Start TaskManagers (``taskmanager.sh start``, as ``start-cluster.sh`` does) until two
    run, then wait until the JobManager lists exactly those two, both slots free (a killed
    one is dropped after the heartbeat timeout)."""
    for _ in range(2 - len(_taskexecutors(cluster))):
        started = cluster.script("taskmanager.sh", "start")
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
    deadline = time.monotonic() + timeout
    view: dict[str, object] | None = None
    while time.monotonic() < deadline:
        view = cluster.cluster.overview()
        if view and view.get("taskmanagers") == 2 and view.get("slots-available") == 2:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the cluster did not get back to two free TaskManagers: {view}\n{cluster.logs()}")
    assert len(_taskexecutors(cluster)) == 2


def _log_sizes(cluster: Cluster) -> dict[Path, int]:
    return {f: f.stat().st_size for f in cluster.log_dir.glob("*") if f.suffix in (".log", ".out")}


def _logs_since(cluster: Cluster, sizes: dict[Path, int]) -> str:
    """What the cluster's log files gained since ``sizes`` (new files whole): this case's
    lines only, not an earlier case's on the same cluster."""
    parts = []
    for f in sorted(cluster.log_dir.glob("*")):
        if f.suffix in (".log", ".out"):
            with f.open("rb") as fh:
                fh.seek(sizes.get(f, 0))
                parts.append(fh.read().decode(errors="replace"))
    return "\n".join(parts)


class TestKilledTaskManager:
    """The two cases share one standalone cluster (``killable_cluster``); each kills one of
    its TaskManagers mid-run and checks the job's recovery in its own log lines."""

    @pytest.mark.parametrize("schema", ["credit_applicant", "agg_props"])
    def test_backfill_on_a_standalone_cluster_survives_a_killed_taskmanager(
            self, schema: str, tmp_path: Path, settings: Settings, pg_schema: str, second_pg_schema: str,
            two_dbs: tuple[redis.Redis, redis.Redis], featureline_wheel: Path, installed_venv: Path,
            deps_venv: Path, killable_cluster: Cluster) -> None:
        """Also with windowed aggregations: the restarted task recomputes its entities' values
        from its whole shard (rows the failed attempt committed included)."""
        _backfill_survives_a_killed_taskmanager(schema, tmp_path, settings, pg_schema, second_pg_schema,
                                                two_dbs, featureline_wheel, installed_venv, deps_venv,
                                                killable_cluster)


def _backfill_survives_a_killed_taskmanager(
        schema: str, tmp_path: Path, settings: Settings, pg_schema: str, second_pg_schema: str,
        two_dbs: tuple[redis.Redis, redis.Redis], featureline_wheel: Path, installed_venv: Path,
        deps_venv: Path, cluster: Cluster) -> None:
    from aggregate_reference import SCHEMA

    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "agg_props.yaml").write_text(SCHEMA)
    (schemas / "credit_applicant.yaml").write_text((ROOT / "schemas" / "credit_applicant.yaml").read_text())
    paths = (write_files(tmp_path, 8_000, files=2) if schema == "credit_applicant"
             else agg_files(tmp_path, 16_000, files=2))
    reference, flink = two_dbs
    common = ["--schema", schema, "--schemas-dir", str(schemas), "--batch-rows", "500"]
    ref = subprocess.run([sys.executable, "-m", "features.cli", "load", *common, "--no-progress", *paths],
                         env=_env(settings, pg_schema, REDIS_REFERENCE), capture_output=True, text=True,
                         timeout=600)
    assert ref.returncode == 0, ref.stderr[-3000:]
    # the user's shell: the installed environment, nothing of the checkout importable
    env = users_shell(_env(settings, second_pg_schema, REDIS_FLINK), installed_venv)
    project = tmp_path / "project"
    (project / "dist").mkdir(parents=True)
    shutil.copy2(featureline_wheel, project / "dist" / featureline_wheel.name)
    job = subprocess.run([str(installed_venv.parent / "features"), "job-file", "batch"], cwd=project, env=env,
                         capture_output=True, text=True, timeout=120).stdout.strip()
    assert Path(job).is_file() and not Path(job).is_relative_to(ROOT), job
    # `flink run -p 2`: the job's default parallelism, which --engine flink (the default under
    # `flink run`) takes as its number of shard tasks
    args = ["run", "-p", "2", "-py", job, "-pyfs", f"dist/{featureline_wheel.name}",
            "-pyexec", str(deps_venv), "-pyclientexec", str(installed_venv), *common, "--json", *paths]
    _two_taskmanagers(cluster)  # an earlier case on this cluster killed one
    sizes = _log_sizes(cluster)
    client_flink = _pyflink_home(installed_venv) / "bin" / "flink"
    submit = subprocess.Popen(["bash", str(client_flink), *args],
                              env={**env, "FLINK_CONF_DIR": str(cluster.conf_dir)}, cwd=project,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # kill one TaskManager (and its Python worker: a lost machine) once units are committed
        deadline = time.monotonic() + 300
        while _ledger_count(settings, second_pg_schema) < 6 and submit.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert submit.poll() is None, "the job ended before a TaskManager could be killed"
        pids = _taskexecutors(cluster)
        assert len(pids) == 2, pids
        victim = next(p for p in pids if len(_process_tree(p)) > 1)  # the one running a Python task
        for pid in _process_tree(victim):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        killed_at = _ledger_count(settings, second_pg_schema)
        out, err = submit.communicate(timeout=900)
        assert submit.returncode == 0, (f"flink run exited {submit.returncode}\n{err[-3000:]}\n"
                                        f"{cluster.logs()}")
    finally:  # a failed case leaves no job on the shared cluster
        if submit.poll() is None:
            submit.kill()
            submit.communicate()
            for job_id in cluster.running_ids():
                cluster.script("flink", "cancel", job_id)
    assert '"adds_up": true' in out, out[-2000:]
    logs = _logs_since(cluster, sizes)  # this case's lines only
    assert "Map (2/2)" in logs, "the job did not run two shard tasks"
    assert "switched from state RUNNING to RESTARTING" in logs, "no task was restarted"
    # the workers ran the cluster's Python with the shipped wheel as their PYTHONPATH
    assert f"Python interpreter path: {deps_venv}\n" in logs, logs[-3000:]
    assert all(Path(p).name == featureline_wheel.name
               for p in re.findall(r"PYTHONPATH of python worker: (\S+)", logs)), logs[-3000:]
    assert 0 < killed_at, killed_at
    assert tables_snapshot(settings, second_pg_schema, schema) == tables_snapshot(settings, pg_schema, schema)
    assert hashes(flink) == hashes(reference)


def test_flink_engine_backfills_aggregations_equal_to_the_reference(
        tmp_path: Path, settings: Settings, pg_schema: str, two_dbs: tuple[redis.Redis, redis.Redis]) -> None:
    """Windowed aggregations through --engine flink (3 shard tasks, two loads, the later
    time range first): every event's values equal the reference, Redis the newest's."""

    import psycopg
    from aggregate_reference import (
        BASE_US,
        MINUTE_US,
        SCHEMA,
        T,
        check_hot,
        history_table,
        random_history,
        reference,
    )
    from psycopg import sql

    from features.compile import compile_schema
    from features.schema import parse_schema

    agg = compile_schema(parse_schema(SCHEMA))
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    (schemas / "agg_props.yaml").write_text(SCHEMA)
    rng = random.Random(12)
    events = random_history(rng, 1_200, users=30, minutes=900)
    rng.shuffle(events)
    cut = BASE_US + 450 * MINUTE_US
    _, hot = two_dbs
    for i, rows in enumerate([[e for e in events if e[T] >= cut], [e for e in events if e[T] < cut]]):
        path = tmp_path / f"load{i}.parquet"
        pq.write_table(history_table(rows), path, row_group_size=200)
        proc = subprocess.run([sys.executable, str(JOB), "--schema", "agg_props", "--schemas-dir",
                               str(schemas), "--engine", "flink", "--parallelism", "3", "--json", str(path)],
                              env=_env(settings, pg_schema, REDIS_FLINK), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert '"adds_up": true' in proc.stdout, proc.stdout[-2000:]
    want = reference(agg.schema, events)
    names = [a.name for a in agg.schema.aggregations.features]  # type: ignore[union-attr]
    with psycopg.connect(settings.postgres_dsn) as conn:
        got_rows = conn.execute(sql.SQL("SELECT uid, ts, {} FROM {}.agg_props__aggregates").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in names), sql.Identifier(pg_schema))).fetchall()
    got = {(u, int(ts.timestamp()) * 1_000_000 + ts.microsecond): tuple(v) for u, ts, *v in got_rows}
    assert len(got) == len(got_rows) and got == want
    check_hot(hot, "", agg.schema, want)
