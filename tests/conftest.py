"""Shared fixtures: real services only (started by `features dev up`), isolated per test.

Each test gets its own Postgres schema, Redis key prefix and Kafka topic, so tests
never see each other's data. When a service is unreachable the test fails with the
address and the command to run; it never silently skips.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from features.config import Settings, resolve_settings

ROOT = Path(__file__).resolve().parents[1]

#: The JVMs the tests start all read ``JVM_ARGS``: PyFlink's local gateway and mini-cluster,
#: ``flink run``, a standalone cluster's daemons (Kafka and the other servers do not). Their
#: jobs last seconds, so the C2 compiler's threads only compete with the job for this
#: machine's cores: C1 alone (three mini-cluster jobs back to back: 37.3 s -> 32.4 s, again
#: 39.4 s -> 34.0 s). No collector flag: ``taskmanager.sh`` adds -XX:+UseG1GC to JVM_ARGS,
#: and two would clash. A JVM_ARGS already set is kept.
os.environ.setdefault("JVM_ARGS", "-XX:TieredStopAtLevel=1")


def pytest_collection_finish(session: pytest.Session) -> None:
    """When a PyFlink job is among the tests to run, every JVM that reads ``JVM_ARGS`` also
    maps a class-data-sharing archive of PyFlink's gateway (``jvm_archive.with_archive``:
    made once into ``.cache/jvm-archives/``, about 15 s; each job's JVM then starts ~2 s
    faster). ``FEATURES_TEST_JVM_ARCHIVE=off``: none."""
    if any(item.get_closest_marker("flink") for item in session.items):
        from jvm_archive import with_archive

        os.environ["JVM_ARGS"] = with_archive(os.environ["JVM_ARGS"])


def search_path_dsn(dsn: str, search_path: str) -> str:
    """``dsn`` (a URL) whose sessions use ``search_path`` (libpq ``options=-c search_path=...``)."""
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options=-csearch_path%3D{search_path}"


#: A `features demo` summary line: "batch  (Parquet): read N = stored N + rejected N + already present N".
DEMO_LINE = re.compile(r"(batch|stream) +\((?:Parquet|Kafka)\): +read ([\d,]+) = stored ([\d,]+) "
                       r"\+ rejected ([\d,]+) \+ already present ([\d,]+)")


def demo_counts(out: str) -> dict[str, tuple[int, ...]]:
    """The (read, stored, rejected, already present) of the batch and the stream summary lines
    of `features demo`'s output ``out``; asserts that both lines are there."""
    found = {m[1]: tuple(int(x.replace(",", "")) for x in m.groups()[1:]) for m in DEMO_LINE.finditer(out)}
    assert set(found) == {"batch", "stream"}, out[-3000:]
    return found


#: Where the tests' cross-process locks live (one file per shared resource).
LOCK_DIR = Path(tempfile.gettempdir()) / "featureline-test-locks"
_held: dict[str, int] = {}


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` (``flock`` on a file in :data:`LOCK_DIR`) while the
    block runs: tests run by several pytest-xdist workers (``make test``) that share one
    resource take turns on it. Re-entrant within a process (a fixture and the test it serves
    may both take it)."""
    if name in _held:
        _held[name] += 1
        try:
            yield
        finally:
            _held[name] -= 1
        return
    LOCK_DIR.mkdir(exist_ok=True)
    fd = os.open(LOCK_DIR / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[name] = 1
        try:
            yield
        finally:
            del _held[name]
    finally:
        os.close(fd)  # closing releases the flock


@contextmanager
def redis_db_lock(*dbs: int) -> Iterator[None]:
    """Hold the numbered scratch Redis databases ``dbs`` of the shared server (tests whose
    CLI runs write keys without a prefix use a whole database and flush it): a test on
    another xdist worker that uses one of them waits. Taken in ascending order, so two
    tests never wait for each other."""
    if not dbs:
        yield
        return
    first, *rest = sorted(set(dbs))
    with machine_lock(f"redis-db-{first}"), redis_db_lock(*rest):
        yield


@contextmanager
def cli_environment(settings: Settings, pg_schema: str, redis_db: int) -> Iterator[dict[str, str]]:
    """The environment of a CLI subprocess: Postgres in ``pg_schema`` (its search_path),
    Redis database ``redis_db`` (the test's alone while it runs: :func:`redis_db_lock`;
    flushed before and after), this checkout's package."""
    import redis

    url = settings.redis_url.rsplit("/", 1)[0] + f"/{redis_db}"
    with redis_db_lock(redis_db):
        client = redis.Redis.from_url(url)
        client.flushdb()
        try:
            yield {**os.environ, "PYTHONPATH": str(ROOT),
                   "FEATURES_POSTGRES_DSN": search_path_dsn(settings.postgres_dsn, pg_schema),
                   "FEATURES_REDIS_URL": url, "FEATURES_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
        finally:
            client.flushdb()
            client.close()


@pytest.fixture(autouse=True)
def _scratch_redis_dbs(request: pytest.FixtureRequest) -> Iterator[None]:
    """``@pytest.mark.scratch_redis_db(N, ...)`` on a test (or its module): the numbered Redis
    databases it uses are its own while it runs (:func:`redis_db_lock`)."""
    dbs = [int(db) for mark in request.node.iter_markers("scratch_redis_db") for db in mark.args]
    with redis_db_lock(*dbs):
        yield


@pytest.fixture(scope="session")
def settings() -> Settings:
    return resolve_settings(root=ROOT)


def _unique(request: pytest.FixtureRequest, prefix: str) -> str:
    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:30]
    return f"{prefix}_{name}_{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def pg_schema(request: pytest.FixtureRequest, settings: Settings) -> Iterator[str]:
    """A fresh Postgres schema (namespace), dropped after the test."""
    import psycopg
    from psycopg import sql

    name = _unique(request, "t")
    try:
        conn = psycopg.connect(settings.postgres_dsn, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"Postgres unreachable at {settings.postgres_dsn.split('@')[-1]}: run `features dev up` "
                    f"({exc})")
    with conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        yield name
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@contextmanager
def _schema_beside(settings: Settings, name: str) -> Iterator[str]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        yield name
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture()
def second_pg_schema(pg_schema: str, settings: Settings) -> Iterator[str]:
    """A second fresh schema (a reference run beside the test's own), dropped after the test."""
    with _schema_beside(settings, pg_schema + "_b") as name:
        yield name


@pytest.fixture()
def third_pg_schema(pg_schema: str, settings: Settings) -> Iterator[str]:
    """A third fresh schema, dropped after the test."""
    with _schema_beside(settings, pg_schema + "_c") as name:
        yield name


@pytest.fixture()
def pg_conn(pg_schema: str, settings: Settings) -> Iterator[object]:
    """A connection whose search_path is the test's own schema."""
    import psycopg

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        yield conn


@pytest.fixture()
def redis_prefix(request: pytest.FixtureRequest, settings: Settings) -> Iterator[str]:
    """A unique key prefix; every key under it is deleted after the test (on every
    primary when ``settings.redis_url`` names a Redis Cluster)."""
    import redis

    from features.sinks.redis_wire import RedisEndpoint

    if RedisEndpoint.from_url(settings.redis_url).cluster:
        yield request.getfixturevalue("redis_cluster_prefix")
        return
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis unreachable at {settings.redis_url}: run `features dev up` ({exc})")
    prefix = _unique(request, "t") + ":"
    yield prefix
    keys = list(client.scan_iter(match=prefix + "*", count=10_000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[object]:
    """The local Redis Cluster (3 primaries + 3 replicas, ports 7101-7106, from the Debian
    ``redis-server``), started if it is not running (``features dev up --redis-cluster``
    starts the same one). Yields the service (``.url``: its ``redis+cluster://`` URL)."""
    from features.errors import ServiceError
    from features.ops.dev.services import RedisCluster

    cluster = RedisCluster()
    try:
        with machine_lock("redis-cluster-start"):  # two xdist workers would both start it
            cluster.install()
            cluster.start()
    except ServiceError as exc:
        pytest.fail(f"could not start the local Redis Cluster: {exc}")
    yield cluster


@pytest.fixture()
def redis_cluster_prefix(request: pytest.FixtureRequest, redis_cluster: object) -> Iterator[str]:
    """A unique key prefix on the cluster; every key under it (on every primary) is deleted after."""
    import redis
    from redis.cluster import ClusterNode, RedisCluster

    prefix = _unique(request, "t") + ":"
    yield prefix
    client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in (7101, 7102, 7103)],
                          socket_timeout=5)
    try:
        for node in client.get_primaries():
            conn = client.get_redis_connection(node)
            keys = list(conn.scan_iter(match=prefix + "*", count=10_000))
            for key in keys:
                conn.delete(key)
    except redis.RedisError:
        pass  # a fault test may have left the cluster failing over; its keys are throwaway
    finally:
        client.close()


@pytest.fixture()
def kafka_topic(request: pytest.FixtureRequest, settings: Settings) -> Iterator[str]:
    """A fresh topic (1 partition) created on the real broker, deleted after the test."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    name = _unique(request, "t")
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)],
                                  operation_timeout=15)
    try:
        futures[name].result(timeout=20)
    except Exception as exc:  # KafkaException; fail loudly with the address
        pytest.fail(f"Kafka at {settings.kafka_bootstrap} could not create topic {name}: run "
                    f"`features dev up` ({exc})")
    yield name
    admin.delete_topics([name], operation_timeout=15)


@pytest.fixture()
def stream_topic(settings: Settings) -> Iterator[str]:
    """A fresh 2-partition topic and its dead-letter topic ``<name>.rejects``, deleted after."""
    from confluent_kafka.admin import AdminClient

    from features.stream.kafka import ensure_topic

    name = f"t_stream_{uuid.uuid4().hex[:8]}"
    ensure_topic(settings.kafka_bootstrap, name, partitions=2)
    ensure_topic(settings.kafka_bootstrap, name + ".rejects", partitions=1)
    yield name
    AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).delete_topics([name, name + ".rejects"])


@pytest.fixture(scope="session")
def featureline_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from this checkout (in a temporary copy of its sources)."""
    from installed_env import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def deps_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a virtual environment outside the checkout with the locked dependencies
    and no featureline: a cluster's Python, to which a job ships the package. Kept between
    sessions while requirements.lock is unchanged (``installed_env.cached_deps_venv``;
    ``FEATURES_TEST_VENV_CACHE=off``: a fresh one in this session's temporary folder)."""
    from installed_env import cached_deps_venv, deps_cache_root, make_venv

    root = deps_cache_root()
    if root is None:
        return make_venv(tmp_path_factory.mktemp("deps-venv") / "venv", wheel=None)
    return cached_deps_venv(root)


@pytest.fixture(scope="session")
def installed_venv(tmp_path_factory: pytest.TempPathFactory, featureline_wheel: Path,
                   deps_venv: Path) -> Path:
    """The Python of a fresh virtual environment outside the checkout with the locked
    dependencies and featureline installed from its wheel: a user's project environment.
    Its dependencies are a copy of ``deps_venv``'s (pip installs the lock once:
    ``installed_env.make_venv``), then pip installs the wheel."""
    from installed_env import make_venv

    return make_venv(tmp_path_factory.mktemp("installed-venv") / "venv", wheel=featureline_wheel,
                     deps_from=deps_venv)


@pytest.fixture()
def small_view_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The request rows of each view read that takes the small-call path
    (``features.sdk.views._finish_small``: rows decoded in Python), in call order."""
    import features.sdk.views as views

    taken: list[int] = []
    real = views._finish_small

    def spy(store: Any, plan: Any, small: Any, now_s: float, as_dicts: bool = False) -> Any:
        taken.append(plan.n)
        return real(store, plan, small, now_s, as_dicts)

    monkeypatch.setattr(views, "_finish_small", spy)
    return taken
