"""``features rollback --run RUN_ID`` on real Postgres and Redis (``schemas/clicks.yaml``:
windowed aggregations, request-time tiles, hot-only derived features).

A good load A, then a bad load B that writes later and earlier events of some of A's
users and events of new users: rolling B back leaves both stores equal to a reference
where A alone was loaded (every table's rows, the ledger, every Redis hash: entity,
aggregates and tiles hashes, and the Redis ledger), but for the lineage that names a run
(``_run_id``, ``_ingested_at``: they differ between runs by design). A second rollback
changes nothing; B's files load again afterwards (its ledger units were cleared); a run
whose entities a later run wrote is refused naming it, and with ``--include-later`` both
go; a rollback killed with SIGKILL at random points, then run again, ends equal too; a
stream run (B's rows as Kafka records through the stream's micro-batch step) rolls back
the same way.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from features.compile import CompiledSchema
from features.config import Settings
from features.errors import ConfigError
from features.load import load
from features.ops.examples import applicant_schema, applicants, click_history, click_records, clicks_schema
from features.ops.rollback import LaterRuns, plan_rollback, rollback
from features.stream.core import StreamProcessor

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
VOLATILE = ("_run_id", "_ingested_at")  # name the run: differ between runs by design
REDIS_DB = 12  # this file's own database (the CLI's keys have no prefix), flushed before and after


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return clicks_schema()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Load A: users 0-99 whole and 60% of the events of users 100-149; load B: the other
    40% of users 100-149 (earlier and later events than A's) and users 150-199 (new);
    load C: more events of some of B's users (a later run)."""
    d = tmp_path_factory.mktemp("rollback")
    history = click_history(6_000, users=200)
    user = np.array([int(u[1:]) if u and u[1:].isdigit() else -1  # an invalid id: a reject of A
                     for u in history.column("user_id").to_pylist()])
    rng = np.random.default_rng(34)
    pick = rng.random(len(user))
    in_a = (user < 100) | ((user < 150) & (pick < 0.6))
    in_c = (user >= 140) & (user < 160) & (pick > 0.85)
    out = {}
    for name, mask in (("a", in_a), ("b", ~in_a & ~in_c), ("c", in_c)):
        part = history.filter(pa.array(mask))
        if name == "b":  # some rows B's rejects keep: dwell_ms below its min
            dwell = part.column("dwell_ms").to_numpy(zero_copy_only=False).copy()
            dwell[::97] = -5
            part = part.set_column(part.schema.get_field_index("dwell_ms"), "dwell_ms",
                                   pa.array(dwell, pa.int32(), mask=np.isnan(dwell.astype(float))))
        out[name] = d / f"{name}.parquet"
        pq.write_table(part, out[name], row_group_size=500)
    return out


def pg_state(settings: Settings, ns: str, schema: str = "clicks") -> dict[str, list[Any]]:
    """Every row of the schema's tables (all columns but the run's lineage), the ledger and the
    run counts."""
    out: dict[str, list[Any]] = {}
    tables = {schema: (), f"{schema}__rejects": ("id",), f"{schema}__aggregates": ()}
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={ns}") as conn:
        for table, skip in tables.items():
            cols = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                "AND table_name = %s ORDER BY ordinal_position", (ns, table)).fetchall()
                    if r[0] not in (*VOLATILE, *skip)]
            if not cols:
                continue  # no such table (a schema without aggregations)
            keep = ", ".join(f'"{c}"::text' for c in cols)
            out[table] = conn.execute(f"SELECT {keep} FROM {table} ORDER BY {keep}").fetchall()
        out["ledger"] = conn.execute(
            "SELECT unit, read, stored, already_present, rejected FROM featureline_ledger "
            "WHERE schema_name = %s ORDER BY unit", (schema,)).fetchall()
        out["run_counts"] = conn.execute(
            "SELECT run_id, kind, read, stored, already_present, rejected FROM featureline_run_counts "
            "WHERE schema_name = %s ORDER BY run_id", (schema,)).fetchall()
    return out


def redis_state(client: redis.Redis, prefix: str, schema: str = "clicks") -> dict[bytes, Any]:
    """Every key of the schema under ``prefix``: hashes (entity, aggregates, tiles) field by
    field but for the run's lineage, the ledger's members."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(match=prefix + f"features:{schema}*", count=5_000):
        name = key.removeprefix(prefix.encode())
        if client.type(key) == b"set":
            out[name] = sorted(client.smembers(key))  # type: ignore[arg-type]  # sync client
        else:
            out[name] = {k: v for k, v in client.hgetall(key).items()  # type: ignore[union-attr]
                         if k.decode() not in VOLATILE}
    return out


@dataclasses.dataclass
class Loaded:
    ns: str
    prefix: str
    a: str
    b: str


@pytest.fixture()
def reference(settings: Settings, compiled: CompiledSchema, files: dict[str, Path], second_pg_schema: str,
              redis_prefix: str) -> tuple[dict[str, list[Any]], dict[bytes, Any]]:
    """Both stores after load A alone (another namespace, another key prefix)."""
    prefix = redis_prefix + "ref:"
    s = load([files["a"]], compiled, settings, search_path=second_pg_schema, key_prefix=prefix)
    assert s.adds_up and s.stored > 0 and s.rejected > 0
    return pg_state(settings, second_pg_schema), redis_state(redis.Redis.from_url(settings.redis_url), prefix)


@pytest.fixture()
def loaded(settings: Settings, compiled: CompiledSchema, files: dict[str, Path], pg_schema: str,
           redis_prefix: str) -> Loaded:
    """Load A, then the bad load B, into the test's own namespace."""
    a = load([files["a"]], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    b = load([files["b"]], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert a.adds_up and b.adds_up and b.stored > 0 and b.rejected > 0
    return Loaded(pg_schema, redis_prefix, a.run_id, b.run_id)


def test_rollback_puts_both_stores_back_to_load_a_alone(
        settings: Settings, compiled: CompiledSchema, files: dict[str, Path], loaded: Loaded,
        reference: tuple[dict[str, list[Any]], dict[bytes, Any]]) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    ref_pg, ref_redis = reference
    after_b = pg_state(settings, loaded.ns), redis_state(client, loaded.prefix)
    assert after_b[0] != ref_pg and after_b[1] != ref_redis  # B changed both stores
    plan = plan_rollback(compiled, settings, loaded.b, search_path=loaded.ns)
    assert plan.state == "new" and plan.runs == [loaded.b] and plan.later == {}
    assert plan.history_rows == len(after_b[0]["clicks"]) - len(ref_pg["clicks"])
    assert plan.rejects_rows == len(after_b[0]["clicks__rejects"]) - len(ref_pg["clicks__rejects"])
    users_a, users_b = run_users(settings, loaded.ns, loaded.a), run_users(settings, loaded.ns, loaded.b)
    assert len(users_b - users_a) > 10 and len(users_b & users_a) > 10  # new users, and A's users
    assert plan.entities == len(users_b) and plan.hashes_restored == len(users_b & users_a)
    assert plan.hashes_deleted == len(users_b - users_a)
    # a plan writes nothing
    assert (pg_state(settings, loaded.ns), redis_state(client, loaded.prefix)) == after_b

    done = rollback(compiled, settings, loaded.b, search_path=loaded.ns, key_prefix=loaded.prefix,
                    chunk_entities=30)
    assert done.entities_done == len(users_b) and done.hashes_written == len(users_b & users_a)
    assert done.tiles_written > 0
    assert done.units_cleared == plan.ledger_units > 0
    assert done.skipped == {}  # clicks' hot-only features are computed from fields Postgres holds
    assert pg_state(settings, loaded.ns) == ref_pg
    assert redis_state(client, loaded.prefix) == ref_redis

    # again: nothing to do, nothing changes
    again = rollback(compiled, settings, loaded.b, search_path=loaded.ns, key_prefix=loaded.prefix)
    assert again.plan.state == "done" and again.entities_done == 0
    assert pg_state(settings, loaded.ns) == ref_pg and redis_state(client, loaded.prefix) == ref_redis

    # B's files load again (its ledger units are gone from both stores): B is back as it was
    b2 = load([files["b"]], compiled, settings, search_path=loaded.ns, key_prefix=loaded.prefix)
    assert b2.adds_up and b2.skipped_units == 0 and b2.stored == plan.history_rows
    assert pg_state(settings, loaded.ns) == after_b[0]
    assert redis_state(client, loaded.prefix) == after_b[1]


def test_later_runs_refuse_then_go_along(
        settings: Settings, compiled: CompiledSchema, files: dict[str, Path], loaded: Loaded,
        reference: tuple[dict[str, list[Any]], dict[bytes, Any]]) -> None:
    c = load([files["c"]], compiled, settings, search_path=loaded.ns, key_prefix=loaded.prefix)
    assert c.stored > 0
    client = redis.Redis.from_url(settings.redis_url)
    before = pg_state(settings, loaded.ns), redis_state(client, loaded.prefix)
    with pytest.raises(LaterRuns) as info:
        rollback(compiled, settings, loaded.b, search_path=loaded.ns, key_prefix=loaded.prefix)
    assert list(info.value.later) == [c.run_id] and 0 < info.value.later[c.run_id] <= c.stored
    assert c.run_id in str(info.value) and "--include-later" in str(info.value)
    # refused: nothing done
    assert (pg_state(settings, loaded.ns), redis_state(client, loaded.prefix)) == before
    done = rollback(compiled, settings, loaded.b, search_path=loaded.ns, key_prefix=loaded.prefix,
                    include_later=True)
    assert done.plan.runs == [loaded.b, c.run_id]
    ref_pg, ref_redis = reference
    assert pg_state(settings, loaded.ns) == ref_pg
    assert redis_state(client, loaded.prefix) == ref_redis


def test_a_stream_run_rolls_back_too(
        settings: Settings, compiled: CompiledSchema, files: dict[str, Path], pg_schema: str,
        redis_prefix: str, reference: tuple[dict[str, list[Any]], dict[bytes, Any]]) -> None:
    """B's rows as Kafka records through the stream's micro-batch step (run id ``stream-b``)
    after the batch load A: rolling the stream run back leaves A alone (its run counts
    row goes with its rows)."""
    load([files["a"]], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    records = click_records(pq.read_table(files["b"]))
    proc = StreamProcessor(compiled, settings, run_id="stream-b", dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix)
    proc.open()
    try:
        for at in range(0, len(records), 250):  # one partition: each user's records in order
            part = records[at:at + 250]
            proc.process([v for _, v in part], pa.array(["clicks-rollback"] * len(part)),
                         pa.array([0] * len(part), pa.int32()),
                         pa.array(range(at, at + len(part)), pa.int64()))
    finally:
        proc.close()
    client = redis.Redis.from_url(settings.redis_url)
    ref_pg, ref_redis = reference
    assert run_users(settings, pg_schema, "stream-b") and pg_state(settings, pg_schema) != ref_pg
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        [(read, stored, present, rejected, history)] = conn.execute(
            "SELECT read, stored, already_present, rejected, (SELECT count(*) FROM clicks WHERE _run_id = "
            "'stream-b') FROM featureline_run_counts WHERE run_id = 'stream-b'").fetchall()
    assert read == len(records) == stored + present + rejected and stored == history > 0
    done = rollback(compiled, settings, "stream-b", search_path=pg_schema, key_prefix=redis_prefix)
    assert done.plan.ledger_units == 0 and done.plan.rejects_rows > 0  # a stream has no ledger units
    assert pg_state(settings, pg_schema) == ref_pg
    assert redis_state(client, redis_prefix) == ref_redis


def test_a_schema_without_aggregations(settings: Settings, tmp_path: Path, pg_schema: str,
                                        second_pg_schema: str, redis_prefix: str) -> None:
    """``credit_applicant``: no aggregations, hot-only derived features (``income_log``,
    ``employment_status_hash``) computed again from the fields Postgres holds; B writes
    newer and older events of half of A's applications and new ones."""
    c = applicant_schema()
    paths = []
    for i, first in enumerate((10**9, 10**9 + 300)):
        paths.append(tmp_path / f"app{i}.parquet")
        pq.write_table(applicants(600, seed=40 + i, first_id=first), paths[-1], row_group_size=200)
    client = redis.Redis.from_url(settings.redis_url)
    load([paths[0]], c, settings, search_path=second_pg_schema, key_prefix=redis_prefix + "ref:")
    ref = pg_state(settings, second_pg_schema, c.name), redis_state(client, redis_prefix + "ref:", c.name)
    load([paths[0]], c, settings, search_path=pg_schema, key_prefix=redis_prefix)
    b = load([paths[1]], c, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert (pg_state(settings, pg_schema, c.name), redis_state(client, redis_prefix, c.name)) != ref
    done = rollback(c, settings, b.run_id, search_path=pg_schema, key_prefix=redis_prefix)
    assert done.skipped == {} and done.hashes_written > 0 and done.aggregate_rows_written == 0
    assert pg_state(settings, pg_schema, c.name) == ref[0]
    assert redis_state(client, redis_prefix, c.name) == ref[1]


def test_on_a_redis_cluster(settings: Settings, compiled: CompiledSchema, files: dict[str, Path],
                            pg_schema: str, redis_cluster: Any, redis_cluster_prefix: str,
                            reference: tuple[dict[str, list[Any]], dict[bytes, Any]]) -> None:
    """The hashes' deletion and the ledger's units routed by slot: the cluster ends as a
    single server where A alone was loaded."""
    from redis.cluster import ClusterNode, RedisCluster

    on_cluster = dataclasses.replace(settings, redis_url=redis_cluster.url)
    prefix = redis_cluster_prefix
    load([files["a"]], compiled, on_cluster, search_path=pg_schema, key_prefix=prefix)
    b = load([files["b"]], compiled, on_cluster, search_path=pg_schema, key_prefix=prefix)
    done = rollback(compiled, on_cluster, b.run_id, search_path=pg_schema, key_prefix=prefix)
    assert done.units_cleared > 0 and done.keys_deleted > 0
    nodes = [ClusterNode("127.0.0.1", p) for p in redis_cluster.ports[:3]]  # type: ignore[no-untyped-call]
    client = RedisCluster(startup_nodes=nodes, socket_timeout=5)
    state: dict[bytes, Any] = {}
    try:
        for node in client.get_primaries():
            conn = client.get_redis_connection(node)
            state.update(redis_state(conn, prefix))
    finally:
        client.close()
    assert pg_state(settings, pg_schema) == reference[0]
    assert state == reference[1]


def test_unknown_run_id_is_a_clear_error(settings: Settings, compiled: CompiledSchema, loaded: Loaded,
                                         pg_schema: str) -> None:
    with pytest.raises(ConfigError) as info:
        rollback(compiled, settings, "no-such-run", search_path=loaded.ns, key_prefix=loaded.prefix)
    assert info.value.key == "run" and "unknown run id 'no-such-run'" in str(info.value)
    with cli_env(settings, pg_schema) as env:
        proc = subprocess.run([sys.executable, "-m", "features.cli", "rollback", "--run", "no-such-run"],
                              env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown run id 'no-such-run'" in proc.stderr, proc.stderr


def run_users(settings: Settings, ns: str, run_id: str) -> set[str]:
    """The users a run stored history rows of."""
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={ns}") as conn:
        return {r[0] for r in conn.execute("SELECT DISTINCT user_id FROM clicks WHERE _run_id = %s",
                                           (run_id,)).fetchall()}


def cli_env(settings: Settings, pg_schema: str) -> Any:
    from conftest import cli_environment

    return cli_environment(settings, pg_schema, REDIS_DB)


def _cli(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "features.cli", "rollback", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_mid_rollback_then_rerun_ends_exact(
        settings: Settings, compiled: CompiledSchema, files: dict[str, Path], pg_schema: str,
        reference: tuple[dict[str, list[Any]], dict[bytes, Any]]) -> None:
    ref_pg, ref_redis = reference
    with cli_env(settings, pg_schema) as env:
        local = dataclasses.replace(settings, redis_url=env["FEATURES_REDIS_URL"])
        load([files["a"]], compiled, local, search_path=pg_schema)
        b = load([files["b"]], compiled, local, search_path=pg_schema)
        client = redis.Redis.from_url(env["FEATURES_REDIS_URL"])
        # the dry run names what would change, and changes nothing
        dry = subprocess.run([sys.executable, "-m", "features.cli", "rollback", "--run", b.run_id,
                              "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
        assert dry.returncode == 0, dry.stderr
        users = run_users(settings, pg_schema, b.run_id)
        assert f"history rows: {b.stored:,}" in dry.stdout and f"entities: {len(users):,} " in dry.stdout
        assert "dry run: nothing changed" in dry.stdout
        rng = random.Random(34)
        kills = []
        # killed at a random time (most often while it starts), then three times after a
        # random number of restored chunks (of 5 entities each)
        first = _cli(env, "--run", b.run_id, "--chunk-entities", "5")
        try:
            first.wait(timeout=rng.uniform(0.2, 1.0))
        except subprocess.TimeoutExpired:
            pass
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
        for _ in range(3):
            proc = _cli(env, "--run", b.run_id, "--chunk-entities", "5")
            target = rng.randrange(0, 20)
            assert proc.stderr is not None
            seen = 0
            while seen < target:
                line = proc.stderr.readline()
                if not line:
                    break
                seen += "entities restored" in line
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
            kills.append((target, seen, proc.returncode))
        # every kill landed mid-rollback: the journal says it has not finished
        assert all(rc == -signal.SIGKILL and seen == target for target, seen, rc in kills), kills
        with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
            state = conn.execute("SELECT state FROM featureline_rollbacks WHERE run_id = %s",
                                 (b.run_id,)).fetchone()
        assert state == ("deleted",)
        final = _cli(env, "--run", b.run_id)
        out, err = final.communicate(timeout=300)
        assert final.returncode == 0, err
        assert pg_state(settings, pg_schema) == ref_pg
        assert redis_state(client, "") == ref_redis
        again = _cli(env, "--run", b.run_id)
        out, err = again.communicate(timeout=300)
        assert again.returncode == 0 and "rolled back already" in out, err
