"""Real local services for development and tests, on loopback only.

``features dev up`` installs what is missing and starts, with data under the project's
``.dev/`` folder and downloads in the per-user cache (``features.home``: the project is
``FEATURES_HOME`` or the folder holding ``featureline.toml``, the cache
``FEATURES_CACHE_DIR`` or ``~/.cache/featureline``):

- PostgreSQL (Debian package ``postgresql``), a ``featureline`` role and database;
- Redis (Debian package ``redis-server``), no persistence;
- Apache Kafka 4.x, single node in KRaft mode, from Maven Central artefacts fetched
  with ``mvn dependency:copy-dependencies`` (``features/ops/dev/maven/kafka/pom.xml``, package
  data, so it ships in the wheel) and started with ``java -cp``;
- the Flink Kafka SQL connector jar matching the pinned PyFlink
  (``features/ops/dev/maven/flink/pom.xml``);
- Prometheus and promtool (Debian package ``prometheus``, installed without its
  recommended node exporter and never started as the system's service: the alert tests run
  ``promtool`` and start their own server on a free loopback port; docs/operations.md,
  "Alerts and dashboards");
- with ``--flink-cluster``, the project's standalone Flink cluster (PyFlink's
  ``start-cluster.sh`` with its state in ``.dev/flink`` and free loopback ports:
  :mod:`features.flink.cluster`).

A service whose ``FEATURES_*`` variable points somewhere other than the default is
*external*: ``up`` does not start it, ``status`` only checks it. A server already
answering at its address (this project's, or another project's it reuses) is kept as it
is: ``up`` installs and downloads nothing for it (a reused broker needs no Kafka jars
here). ``down`` stops only processes whose pid files ``up`` wrote.

``status`` (and ``up``) end with two verdict lines and an exit code that says which part
is missing (:data:`EXIT_CODES`): ``servers:`` (Postgres, Redis, Kafka, the Redis Cluster
when it runs) and ``stream:`` (what the PyFlink job needs beside the servers: the Flink
Kafka connector jar, PyFlink, a Java runtime).

Why one module of this size: each local service is one class (Postgres, Redis,
RedisCluster, Kafka, the Flink connector and cluster, Chromium, Prometheus) over the process, port
and file helpers at the top that all of them use; a module per class is the seam when
one of them grows.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal
from urllib.parse import urlsplit

import redis
from confluent_kafka.admin import AdminClient

from features.config import (
    DEFAULT_KAFKA_BOOTSTRAP,
    DEFAULT_POSTGRES_DSN,
    DEFAULT_REDIS_URL,
    Settings,
    cache_home,
    read_project_file,
)
from features.errors import ServiceError
from features.flink import cluster as local_flink
from features.flink.connector import KAFKA_CONNECTOR_ARTIFACT, connector_jar, flink_jars
from features.home import CACHE_VAR, CONFIG_FILE, project_home, shown, state_home
from features.sinks import pg

POMS = Path(__file__).resolve().parent / "maven"
"""The Maven poms of what ``up`` fetches (package data: they ship in the wheel)."""


def kafka_libs() -> Path:
    """Kafka's jars (the broker ``up`` starts, the SASL test's broker)."""
    return cache_home() / "kafka-libs"


def _cache_source() -> str:
    """Which setting chose the download cache (what ``cache_home`` read)."""
    if os.environ.get(CACHE_VAR):
        return f"{CACHE_VAR}"
    if read_project_file(project_home()).get("cache_dir"):
        return f"cache_dir in {shown(project_home() / CONFIG_FILE)}"
    return "the per-user cache: no FEATURES_CACHE_DIR, no cache_dir setting"


def _m2() -> Path:
    return cache_home() / "m2"


#: what a part is: a ``server`` (a process at an address: Postgres, Redis, Kafka, the Redis
#: Cluster), a part of the ``stream`` job (the connector jar) or a ``tool`` (Chromium,
#: which only the report tests use; Prometheus and promtool, which the alert tests run)
PartKind = Literal["server", "stream", "tool"]

#: ``features dev status`` / ``up`` exit codes, the first that applies
EXIT_OK: Final = 0
EXIT_SERVER_DOWN: Final = 1
EXIT_STREAM_NOT_READY: Final = 3
EXIT_TOOL_MISSING: Final = 4
EXIT_CODES: Final = {
    EXIT_OK: "every server healthy, the stream ready, every tool installed",
    EXIT_SERVER_DOWN: "a server (Postgres, Redis, Kafka; the Redis Cluster when it runs) is down",
    EXIT_STREAM_NOT_READY: "every server healthy, but the stream job cannot run here: the Flink Kafka "
                           "connector jar, PyFlink or Java is missing (the stream: line says which)",
    EXIT_TOOL_MISSING: "servers and stream ready, only a tool missing: Chromium (the report tests' browser) "
                       "or Prometheus (the alert tests' promtool and server)",
}


@dataclass(frozen=True)
class ServiceStatus:
    """One line of ``features dev status``."""

    name: str
    address: str
    healthy: bool
    version: str
    owner: str
    """``managed``: this project's ``features dev up`` started or installed it (a pid file
    under its ``.dev/``), so ``features dev down`` stops it; ``reused``: at the local default
    address but started by something else (another project, a system service), left alone by
    ``down``; ``external``: the settings point elsewhere."""
    detail: str = ""
    kind: PartKind = "server"

    def line(self) -> str:
        state = "healthy" if self.healthy else "DOWN" if self.kind == "server" else "MISSING"
        extra = f"  {self.detail}" if self.detail else ""
        return f"{self.name:<16} {state:<8} {self.address:<22} {self.version:<28} {self.owner}{extra}"


@dataclass(frozen=True)
class StatusReport:
    """What ``features dev status`` prints: a line per part, then the verdicts."""

    rows: tuple[ServiceStatus, ...]
    #: what the stream job has here (``PyFlink 2.2.0``, ...) and what it lacks, each
    #: with how to get it
    stream_found: tuple[str, ...]
    stream_missing: tuple[str, ...]

    @property
    def stream_ready(self) -> bool:
        return not self.stream_missing

    def servers_down(self) -> list[str]:
        return [r.name for r in self.rows if r.kind == "server" and not r.healthy]

    def exit_code(self) -> int:
        """:data:`EXIT_CODES`: the first that applies."""
        if self.servers_down():
            return EXIT_SERVER_DOWN
        if not self.stream_ready:
            return EXIT_STREAM_NOT_READY
        if any(r.kind == "tool" and not r.healthy for r in self.rows):
            return EXIT_TOOL_MISSING
        return EXIT_OK

    def lines(self) -> list[str]:
        out = [r.line() for r in self.rows]
        servers = [r.name for r in self.rows if r.kind == "server"]
        down = self.servers_down()
        out.append(f"servers: DOWN: {', '.join(down)} (run `features dev up`)" if down
                   else f"servers: healthy ({', '.join(servers)})")
        if self.stream_ready:
            out.append(f"stream:  ready ({', '.join(self.stream_found)})")
        else:
            out.append(f"stream:  NOT READY: {'; '.join(self.stream_missing)}")
        return out


def _say(msg: str) -> None:
    print(msg, flush=True)


def _run(cmd: Sequence[str], *, service: str, user: str | None = None, **kw: object) -> str:
    """Run ``cmd`` (as ``user`` when root), return stdout; raise ServiceError on failure."""
    full = list(cmd)
    if user and os.geteuid() == 0:
        full = ["runuser", "-u", user, "--", *full]
    proc = subprocess.run(full, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise ServiceError(
            f"command failed ({proc.returncode}): {' '.join(full)}\n{proc.stderr.strip()[-2000:]}",
            service=service,
        )
    return str(proc.stdout)


def _apt_install(package: str, *, service: str, recommends: bool = True) -> None:
    if os.geteuid() != 0:
        raise ServiceError(
            f"{package} is not installed and installing it needs root: run `sudo apt-get install {package}`",
            service=service,
        )
    _say(f"{service}: installing Debian package {package} ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", *(() if recommends else ("--no-install-recommends",)), package]
    try:
        _run(cmd, service=service, env=env)
    except ServiceError:
        _run(["apt-get", "update", "-q"], service=service, env=env)
        _run(cmd, service=service, env=env)


def _port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited child not yet reaped) still answers kill(0): check its state.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _pid_alive(pid) else None


def _wait(what: str, check: Callable[[], bool], *, service: str, timeout: float, log: Path | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise ServiceError(f"timed out after {timeout:.0f}s waiting for {what}", service=service,
                       log=str(log) if log else None)


def _stop_pid(pid: int, *, timeout: float = 30.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.2)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host or "127.0.0.1"), int(port or default_port)


def _ensure_traversable(path: Path, user: str) -> None:
    """Let ``user`` search every parent of ``path`` (Postgres must not run as root): an ACL
    entry for that one user (``setfacl -m u:<user>:x``, Debian's ``acl`` package) on each
    parent it cannot search yet, never a world-searchable bit."""
    if os.geteuid() != 0:
        return
    blocked = [p for p in reversed(path.parents)
               if subprocess.run(["runuser", "-u", user, "--", "test", "-x", str(p)]).returncode != 0]
    if blocked and shutil.which("setfacl") is None:
        _apt_install("acl", service="postgres")
    for parent in blocked:
        _run(["setfacl", "-m", f"u:{user}:x", str(parent)], service="postgres")


def _private_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file only its owner may read (mode 0600 from the start)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


#: pg_hba.conf: every connection, over the socket too, proves the password (SCRAM).
_HBA = """# featureline dev cluster (features dev up): SCRAM passwords for every connection.
# TYPE  DATABASE  USER  ADDRESS        METHOD
local   all       all                  scram-sha-256
host    all       all   127.0.0.1/32   scram-sha-256
host    all       all   ::1/128        scram-sha-256
"""


class Postgres:
    name = "postgres"
    kind: PartKind = "server"

    def __init__(self, settings: Settings, *, state: Path | None = None) -> None:
        """``state``: the folder for data, socket, log and pid file (default: the project's
        ``.dev``; tests start private servers in their own folder)."""
        self.dsn = settings.postgres_dsn
        self.external = self.dsn != DEFAULT_POSTGRES_DSN and state is None
        state = state_home() if state is None else state
        parts = urlsplit(self.dsn) if "://" in self.dsn else None
        self.host = (parts.hostname if parts else None) or "127.0.0.1"
        self.port = (parts.port if parts else None) or 5432
        self.dir = state / "postgres"
        self.data = self.dir / "data"
        self.run_dir = self.dir / "run"
        self.log = self.dir / "postgres.log"
        self.pidfile = state / "pids" / "postgres.pid"
        #: the cluster superuser's password: random, made once, mode 0600
        self.password_file = self.dir / "superuser-password"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def superuser_password(self) -> str:
        """The password of the cluster's superuser ``postgres`` (made on first use: 32
        random bytes, in ``.dev/postgres/superuser-password``, mode 0600). Tests and
        administrators connect with it; nothing else on the machine can."""
        if not self.password_file.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            _private_file(self.password_file, secrets.token_urlsafe(32) + "\n")
        return self.password_file.read_text().strip()

    def _bin(self) -> Path | None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                       key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
        found = [p for p in found if (p.parent / "postgres").exists()]
        return found[-1].parent if found else None

    def install(self) -> None:
        if self._bin() is None:
            _apt_install("postgresql", service=self.name)
        if self._bin() is None:
            raise ServiceError("postgresql installed but no server binaries found under "
                               "/usr/lib/postgresql/*/bin", service=self.name)

    def _user(self) -> str | None:
        return "postgres" if os.geteuid() == 0 else None

    def running(self) -> bool:
        return _read_pid(self.pidfile) is not None

    def start(self) -> str:
        if self.running() and self.healthy():
            self._secure()
            return "already running"
        if _port_open(self.host, self.port):
            if self.healthy():
                return "reusing the server already listening there (not started by this project)"
            raise ServiceError(f"port {self.port} is already in use by a process that is not ours; "
                               "stop it or set FEATURES_POSTGRES_DSN to use it", service=self.name)
        bindir = self._bin()
        assert bindir is not None  # install() ran first
        user = self._user()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        password = self.superuser_password()
        for folder in (self.dir, self.run_dir):  # the socket's folder: the server's user only
            folder.chmod(0o700)
            if user:
                shutil.chown(folder, user, user)
        if user:
            _ensure_traversable(self.dir, user)
        if not (self.data / "PG_VERSION").exists():
            self.data.mkdir(parents=True, exist_ok=True)
            if user:
                shutil.chown(self.data, user, user)
            pwfile = self.dir / "pwfile"
            _private_file(pwfile, password + "\n")
            try:
                if user:
                    shutil.chown(pwfile, user, user)
                _run([str(bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8",
                      "--locale=C.UTF-8", "--auth-local=scram-sha-256", "--auth-host=scram-sha-256",
                      f"--pwfile={pwfile}"], service=self.name, user=user)
            finally:
                pwfile.unlink(missing_ok=True)
        # A throwaway dev/test cluster: durability settings off for speed (never for production).
        opts = (f"-c listen_addresses={self.host} -p {self.port} -c unix_socket_directories={self.run_dir} "
                "-c fsync=off -c full_page_writes=off -c synchronous_commit=off "
                "-c max_connections=200 -c shared_buffers=256MB")
        _run([str(bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w",
              "-t", "60", "start"], service=self.name, user=user)
        pid = (self.data / "postmaster.pid").read_text().split()[0]
        self.pidfile.write_text(pid + "\n")
        self._secure()
        self._ensure_role()
        return "started"

    def _secure(self) -> None:
        """Bring a cluster made by an older featureline (``--auth-local=trust``, superuser
        password ``postgres``, folders 0755) to this one's rules: the folders 0700, the
        random superuser password, then :data:`_HBA` and a reload. A no-op on a cluster
        that already follows them."""
        for folder in (self.dir, self.run_dir):  # an older featureline left them 0755
            folder.chmod(0o700)
        hba = self.data / "pg_hba.conf"
        if hba.read_text() == _HBA:
            return
        password = self.superuser_password().replace("'", "''")
        self._psql(f"ALTER ROLE postgres PASSWORD '{password}'")  # still trusted: the old rules
        hba.write_text(_HBA)
        self._psql("SELECT pg_reload_conf()")

    def _psql(self, sql: str, db: str = "postgres") -> str:
        """Run ``sql`` (read from stdin, so that no statement shows in ``ps``) as the
        superuser over the socket, with the password from :meth:`superuser_password`."""
        bindir = self._bin()
        psql = str(bindir / "psql") if bindir and (bindir / "psql").exists() else "psql"
        env = {**os.environ, "PGPASSWORD": self.superuser_password()}
        return _run([psql, "-h", str(self.run_dir), "-p", str(self.port), "-U", "postgres", "-d", db,
                     "-v", "ON_ERROR_STOP=1", "-At", "-f", "-"], service=self.name, user=self._user(),
                    input=sql, env=env)

    def _ensure_role(self) -> None:
        parts = urlsplit(self.dsn)
        role, password = parts.username or "featureline", parts.password or "featureline"
        db = (parts.path or "/featureline").lstrip("/") or "featureline"
        for ident in (role, db):
            if not re.fullmatch(r"[a-z_][a-z0-9_]*", ident):
                raise ServiceError(f"unsafe role/database name {ident!r} in the default DSN",
                                   service=self.name)
        if self._psql(f"SELECT 1 FROM pg_roles WHERE rolname = '{role}'").strip() != "1":
            self._psql(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        if self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{db}'").strip() != "1":
            self._psql(f"CREATE DATABASE {db} OWNER {role}")

    def stop(self) -> str:
        pid = _read_pid(self.pidfile)
        if pid is None:
            return "not running"
        bindir = self._bin()
        if bindir is not None:
            try:
                _run([str(bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
                     service=self.name, user=self._user())
            except ServiceError:
                _stop_pid(pid)
        else:
            _stop_pid(pid)
        self.pidfile.unlink(missing_ok=True)
        return "stopped"

    def healthy(self) -> bool:
        try:
            with pg.connect(self.dsn, timeout_s=3) as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:  # any failure means "not healthy"; status reports it, never raises
            return False

    def version(self) -> str:
        try:
            with pg.connect(self.dsn, timeout_s=3) as conn:
                row = conn.execute("SHOW server_version").fetchone()
            return f"PostgreSQL {row[0].split()[0]}" if row else "?"
        except Exception:  # unreachable: report "unknown" rather than fail status
            return "unknown"


class Redis:
    name = "redis"
    kind: PartKind = "server"

    def __init__(self, settings: Settings) -> None:
        self.url = settings.redis_url
        self.external = self.url != DEFAULT_REDIS_URL
        parts = urlsplit(self.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        state = state_home()
        self.dir = state / "redis"
        self.log = self.dir / "redis.log"
        self.pidfile = state / "pids" / "redis.pid"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def install(self) -> None:
        if shutil.which("redis-server") is None:
            _apt_install("redis-server", service=self.name)

    def running(self) -> bool:
        return _read_pid(self.pidfile) is not None

    def start(self) -> str:
        if self.running() and self.healthy():
            return "already running"
        if _port_open(self.host, self.port):
            if self.healthy():
                return "reusing the server already listening there (not started by this project)"
            raise ServiceError(f"port {self.port} is already in use by a process that is not ours; "
                               "stop it or set FEATURES_REDIS_URL to use it", service=self.name)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        _run(["redis-server", "--bind", self.host, "--port", str(self.port), "--save", "",
              "--appendonly", "no", "--daemonize", "yes", "--pidfile", str(self.pidfile),
              "--logfile", str(self.log), "--dir", str(self.dir), "--protected-mode", "yes"],
             service=self.name)
        _wait("redis to answer PING", self.healthy, service=self.name, timeout=30, log=self.log)
        return "started"

    def stop(self) -> str:
        pid = _read_pid(self.pidfile)
        if pid is None:
            return "not running"
        _stop_pid(pid)
        self.pidfile.unlink(missing_ok=True)
        return "stopped"

    def healthy(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=2).ping())
        except Exception:  # any failure means "not healthy"
            return False

    def version(self) -> str:
        try:
            client = redis.Redis.from_url(self.url, socket_timeout=2)
            info: dict[str, object] = client.info("server")  # type: ignore[assignment]  # sync client
            return f"Redis {info['redis_version']}"
        except Exception:  # unreachable: report "unknown"
            return "unknown"


class RedisCluster:
    """A local Redis Cluster: three primaries with one replica each, from the Debian
    ``redis-server`` package, on loopback ports ``base_port`` .. ``base_port + 5`` (each
    node also listens on its port + 10000, the cluster bus). Throwaway: no persistence,
    a 2 s node timeout so failovers finish quickly in tests. Not part of a plain
    ``features dev up``: ``features dev up --redis-cluster`` or the tests start it."""

    NODES = 6
    kind: PartKind = "server"

    def __init__(self, base_port: int = 7101, *, name: str = "redis-cluster") -> None:
        self.name = name
        self.host = "127.0.0.1"
        self.ports = [base_port + i for i in range(self.NODES)]
        self.state = state_home()
        self.dir = self.state / name
        self.log = self.dir / f"{self.ports[0]}.log"
        self.external = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.ports[0]}-{self.ports[-1]}"

    @property
    def url(self) -> str:
        """The ``redis+cluster://`` URL naming the three first nodes as seeds."""
        return "redis+cluster://" + ",".join(f"{self.host}:{p}" for p in self.ports[:3])

    def pidfile(self, port: int) -> Path:
        return self.state / "pids" / f"{self.name}-{port}.pid"

    def install(self) -> None:
        if shutil.which("redis-server") is None:
            _apt_install("redis-server", service=self.name)

    def running(self) -> bool:
        return any(_read_pid(self.pidfile(p)) is not None for p in self.ports)

    def start(self) -> str:
        """Start the six nodes and create the cluster (idempotent: a healthy cluster is kept;
        a broken one, e.g. after a fault test, is stopped and created afresh)."""
        if self.healthy():
            return "already running"
        self.stop()
        for port in self.ports:
            if _port_open(self.host, port) or _port_open(self.host, port + 10000):
                raise ServiceError(f"port {port} (or its cluster bus port {port + 10000}) is already in "
                                   "use by a process that is not ours", service=self.name)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.state / "pids").mkdir(parents=True, exist_ok=True)
        for port in self.ports:
            (self.dir / f"nodes-{port}.conf").unlink(missing_ok=True)
            self.start_node(port)
        for port in self.ports:
            _wait(f"redis node {port} to answer PING", functools.partial(self._ping, port),
                  service=self.name, timeout=30, log=self.dir / f"{port}.log")
        _run(["redis-cli", "--cluster", "create", *(f"{self.host}:{p}" for p in self.ports),
              "--cluster-replicas", "1", "--cluster-yes"], service=self.name, timeout=120)
        _wait("the cluster to cover every slot with every replica attached", self.healthy,
              service=self.name, timeout=60, log=self.log)
        return "started"

    def start_node(self, port: int) -> None:
        """Start (or restart, after a test killed it) the node on ``port``; it rejoins the
        cluster from its nodes file."""
        _run(["redis-server", "--bind", self.host, "--port", str(port), "--cluster-enabled", "yes",
              "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", "2000",
              "--save", "", "--appendonly", "no", "--daemonize", "yes",
              # each node its own file: a node never loads another's data (the default
              # dump.rdb in the shared folder, written by a replica's full sync)
              "--dbfilename", f"dump-{port}.rdb",
              "--pidfile", str(self.pidfile(port)), "--logfile", str(self.dir / f"{port}.log"),
              "--dir", str(self.dir), "--protected-mode", "yes"], service=self.name)

    def _client(self, port: int) -> object:
        return redis.Redis(host=self.host, port=port, socket_timeout=2)

    def _ping(self, port: int) -> bool:
        try:
            return bool(self._client(port).ping())  # type: ignore[attr-defined]
        except Exception:  # not up yet
            return False

    def healthy(self) -> bool:
        """Every node answers, the cluster state is ok and every primary has its replica."""
        try:
            for port in self.ports:
                info = self._client(port).cluster("info")  # type: ignore[attr-defined]
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != self.NODES:
                    return False
            synced = 0  # replicas whose link to their primary is up
            for port in self.ports:
                repl = self._client(port).info("replication")  # type: ignore[attr-defined]
                synced += repl.get("role") == "slave" and repl.get("master_link_status") == "up"
            return synced == self.NODES // 2
        except Exception:  # any failure means "not healthy"
            return False

    def stop(self) -> str:
        stopped = False
        for port in self.ports:
            pid = _read_pid(self.pidfile(port))
            if pid is not None:
                _stop_pid(pid)
                stopped = True
            self.pidfile(port).unlink(missing_ok=True)
        return "stopped" if stopped else "not running"

    def version(self) -> str:
        try:
            info = self._client(self.ports[0]).info("server")  # type: ignore[attr-defined]
            return f"Redis {info['redis_version']} cluster"
        except Exception:  # unreachable: report "unknown"
            return "unknown"


def _maven_fetch(pom: Path, out: Path, *, service: str, extra: Sequence[str] = ()) -> None:
    """Fetch ``pom``'s dependencies into ``out`` (cached: skipped when the pom is unchanged)."""
    stamp = out / ".pom"
    if stamp.exists() and stamp.read_text() == pom.read_text():
        return
    if shutil.which("mvn") is None:
        _apt_install("maven", service=service)
    _say(f"{service}: fetching jars from Maven Central into {shown(out)} ...")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    _run(["mvn", "-q", "-B", f"-Dmaven.repo.local={_m2()}", "-f", str(pom),
          "dependency:copy-dependencies", f"-DoutputDirectory={out}", *extra], service=service)
    stamp.write_text(pom.read_text())


class Kafka:
    name = "kafka"
    kind: PartKind = "server"

    def __init__(self, settings: Settings) -> None:
        self.bootstrap = settings.kafka_bootstrap
        self.external = self.bootstrap != DEFAULT_KAFKA_BOOTSTRAP
        self.host, self.port = _host_port(self.bootstrap.split(",")[0], 9092)
        self.controller_port = self.port + 1
        state = state_home()
        self.dir = state / "kafka"
        self.data = self.dir / "data"
        self.log = self.dir / "kafka.log"
        self.pidfile = state / "pids" / "kafka.pid"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def install(self) -> None:
        java = shutil.which("java")
        if java is None:
            _apt_install("openjdk-17-jre-headless", service=self.name)
        _maven_fetch(POMS / "kafka" / "pom.xml", kafka_libs(), service=self.name,
                     extra=["-DincludeScope=runtime"])

    def _java(self) -> list[str]:
        return ["java", "-Xms512m", "-Xmx512m", "-cp", f"{kafka_libs()}/*",
                f"-Dlog4j2.configurationFile=file:{self.dir / 'log4j2.properties'}"]

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        h, p, c = self.host, self.port, self.controller_port
        props = self.dir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.bootstrap.servers={h}:{c}",
            f"listeners=PLAINTEXT://{h}:{p},CONTROLLER://{h}:{c}",
            f"advertised.listeners=PLAINTEXT://{h}:{p},CONTROLLER://{h}:{c}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            f"log.dirs={self.data}",
            "num.partitions=2",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "",
        ]))
        (self.dir / "log4j2.properties").write_text("\n".join([
            "status = warn",
            "appender.console.type = Console",
            "appender.console.name = STDOUT",
            "appender.console.layout.type = PatternLayout",
            "appender.console.layout.pattern = [%d] %p %m (%c)%n",
            "rootLogger.level = info",
            "rootLogger.appenderRef.stdout.ref = STDOUT",
            "logger.kafka.name = kafka",
            "logger.kafka.level = warn",
            "logger.ak.name = org.apache.kafka",
            "logger.ak.level = warn",
            "",
        ]))
        return props

    def running(self) -> bool:
        return _read_pid(self.pidfile) is not None

    def start(self) -> str:
        if self.running() and self.healthy():
            return "already running"
        if _port_open(self.host, self.port) and self.healthy():
            return "reusing the broker already listening there (not started by this project)"
        if _port_open(self.host, self.port) or _port_open(self.host, self.controller_port):
            raise ServiceError(f"port {self.port} or {self.controller_port} is already in use by a process "
                               "that is not ours; stop it or set FEATURES_KAFKA_BOOTSTRAP to use it",
                               service=self.name)
        props = self._write_config()
        if not (self.data / "meta.properties").exists():
            cluster_id = _run([*self._java(), "kafka.tools.StorageTool", "random-uuid"],
                              service=self.name).strip().splitlines()[-1]
            _run([*self._java(), "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id,
                  "-c", str(props)], service=self.name)
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            proc = subprocess.Popen([*self._java(), "kafka.Kafka", str(props)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.pidfile.write_text(f"{proc.pid}\n")

        def ready() -> bool:
            if proc.poll() is not None:
                raise ServiceError(f"broker exited with code {proc.returncode} during start-up",
                                   service=self.name, log=str(self.log))
            return self.healthy()

        _wait("the Kafka broker to accept connections", ready, service=self.name, timeout=90, log=self.log)
        return "started"

    def stop(self) -> str:
        pid = _read_pid(self.pidfile)
        if pid is None:
            return "not running"
        _stop_pid(pid, timeout=45)
        self.pidfile.unlink(missing_ok=True)
        return "stopped"

    def healthy(self) -> bool:
        if not _port_open(self.host, self.port):
            return False
        try:
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
            meta = admin.list_topics(timeout=3)
            return bool(meta.brokers)
        except Exception:  # KafkaException or timeout: not healthy yet
            return False

    def version(self) -> str:
        jars = sorted(kafka_libs().glob("kafka_2.13-*.jar"))
        if self.external or not jars:
            return "Kafka (external)" if self.external else "unknown"
        return "Kafka " + jars[-1].stem.removeprefix("kafka_2.13-") + " (KRaft)"


class FlinkConnector:
    """Not a process: the Kafka connector jar PyFlink jobs load (``pipeline.jars``)."""

    name = "flink-connector"
    kind: PartKind = "stream"
    external = False

    def __init__(self, settings: Settings) -> None:
        self.pom = POMS / "flink" / "pom.xml"

    @property
    def address(self) -> str:
        jar = self.jar()
        return shown(jar if jar else flink_jars())

    def jar(self) -> Path | None:
        return connector_jar()

    def install(self) -> None:
        # PyFlink's mini-cluster is a JVM too (installed here as well: a reused broker
        # installs no Java)
        if _java() is None:
            _apt_install("openjdk-17-jre-headless", service=self.name)
        _maven_fetch(self.pom, flink_jars(), service=self.name, extra=["-DexcludeTransitive=true"])

    def running(self) -> bool:
        return self.jar() is not None

    def start(self) -> str:
        return "ready"

    def stop(self) -> str:
        return "nothing to stop"

    def healthy(self) -> bool:
        jar = self.jar()
        return jar is not None and jar.stat().st_size > 1_000_000

    def version(self) -> str:
        jar = self.jar()
        if jar is None:
            return "missing"
        try:
            import pyflink.version  # PyFlink: the status reports it missing (ImportError), never fails on it

            flink = pyflink.version.__version__
        except ImportError:
            flink = "?"
        return f"{jar.stem.removeprefix(KAFKA_CONNECTOR_ARTIFACT + '-')} (PyFlink {flink})"


class FlinkCluster:
    """This project's standalone Flink cluster (``features dev up --flink-cluster``): PyFlink's
    own ``start-cluster.sh`` with its state in ``.dev/flink`` and free loopback ports
    (:mod:`features.flink.cluster`). Not part of a plain ``up``; ``status`` and ``down`` see
    it whenever ``.dev/flink/cluster.json`` records one."""

    name = "flink-cluster"
    kind: PartKind = "server"
    external = False

    def __init__(self, settings: Settings) -> None:
        self.folder = local_flink.project_folder()

    def _cluster(self) -> local_flink.Cluster | None:
        return local_flink.read(self.folder)

    def recorded(self) -> bool:
        return self._cluster() is not None

    @property
    def address(self) -> str:
        cluster = self._cluster()
        return cluster.web_ui if cluster else "-"

    def install(self) -> None:
        if _java() is None:
            _apt_install("openjdk-17-jre-headless", service=self.name)

    def running(self) -> bool:
        cluster = self._cluster()
        return cluster is not None and bool(cluster.pids())

    def start(self) -> str:
        cluster = self._cluster()
        if cluster is not None and cluster.pids() and cluster.healthy():
            return "already running"
        if cluster is not None:
            local_flink.stop(cluster)  # a broken one: start afresh
        cluster = local_flink.configure(self.folder)
        local_flink.start(cluster)
        return f"started (web UI {cluster.web_ui}, logs {shown(cluster.log_dir)})"

    def stop(self) -> str:
        cluster = self._cluster()
        if cluster is None:
            return "not running"
        stopped = local_flink.stop(cluster)
        (self.folder / local_flink.STATE_FILE).unlink(missing_ok=True)
        return "stopped" if stopped else "not running"

    def healthy(self) -> bool:
        cluster = self._cluster()
        return cluster is not None and cluster.healthy()

    def version(self) -> str:
        cluster = self._cluster()
        view = cluster.overview() if cluster else None
        if cluster is None or view is None:
            return "unknown"
        return (f"Flink {view.get('flink-version', '?')} {view.get('taskmanagers', 0)} TM "
                f"{view.get('slots-total', 0)} slots")


class DebianTool:
    """Not a process: Debian packages whose programs the tests run. ``programs``: (program,
    its package) pairs; the first one's ``--version`` is what ``status`` shows."""

    name = ""
    kind: PartKind = "tool"
    external = False
    programs: tuple[tuple[str, str], ...] = ()

    def __init__(self, settings: Settings) -> None:
        pass

    @property
    def address(self) -> str:
        return shutil.which(self.programs[0][0]) or "-"

    def missing(self) -> list[tuple[str, str]]:
        """The (program, package) pairs not on PATH."""
        return [(prog, pkg) for prog, pkg in self.programs if shutil.which(prog) is None]

    def apt_install(self, package: str) -> None:
        _apt_install(package, service=self.name)

    def install(self) -> None:
        for package in dict.fromkeys(pkg for _, pkg in self.missing()):
            self.apt_install(package)

    def running(self) -> bool:
        return not self.missing()

    def start(self) -> str:
        return "ready"

    def stop(self) -> str:
        return "nothing to stop"

    def healthy(self) -> bool:
        return not self.missing()

    def version(self) -> str:
        binary = shutil.which(self.programs[0][0])
        if binary is None:
            return "missing"
        if missing := self.missing():
            program, package = missing[0]
            return f"{program} missing (apt-get install {package})"
        try:
            out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return "unknown"
        return self.version_of(out) or "unknown"

    def version_of(self, out: str) -> str | None:
        """The version in the first program's ``--version`` output."""
        return out.split()[-1] if out.strip() else None


class Chromium(DebianTool):
    """Debian's headless-capable Chromium and its WebDriver (``chromium-driver``), which the
    report tests use to render ``report.html`` (``chromium --headless --screenshot``, and
    Selenium through ``chromedriver``)."""

    name = "chromium"
    programs = (("chromium", "chromium"), ("chromedriver", "chromium-driver"))

    def version_of(self, out: str) -> str | None:
        return out.strip().removeprefix("Chromium ").split()[0] if out.strip() else None


#: What apt's maintainer scripts ask before starting a service: 101 is "not allowed"
#: (invoke-rc.d and deb-systemd-invoke both honour it), so installing ``prometheus`` does not
#: start the system's server on 0.0.0.0:9090.
_POLICY_RC_D: Final = Path("/usr/sbin/policy-rc.d")


class Prometheus(DebianTool):
    """Debian's ``prometheus`` package (Prometheus 2.42 and ``promtool``), what the alert
    tests run (``promtool check rules``, ``promtool test rules``, and a server of their own
    on a free loopback port with its data in a temporary folder). Installed without its
    recommended node exporter, and without starting the package's systemd service
    (:data:`_POLICY_RC_D`): nothing listens until a test starts its own server."""

    name = "prometheus"
    programs = (("prometheus", "prometheus"), ("promtool", "prometheus"))

    def apt_install(self, package: str) -> None:
        placed = False
        if os.geteuid() == 0 and not _POLICY_RC_D.exists():
            _POLICY_RC_D.write_text("#!/bin/sh\n# featureline dev up: installing prometheus, start nothing\n"
                                    "exit 101\n")
            _POLICY_RC_D.chmod(0o755)
            placed = True
        try:
            _apt_install(package, service=self.name, recommends=False)
        finally:
            if placed:
                _POLICY_RC_D.unlink(missing_ok=True)

    def version_of(self, out: str) -> str | None:
        match = re.match(r"prometheus, version (\S+)", out)
        return match.group(1) if match else None


Service = Postgres | Redis | Kafka | FlinkConnector | Chromium | Prometheus | RedisCluster | FlinkCluster


def services(settings: Settings, *, redis_cluster: bool = False, flink: bool = False) -> list[Service]:
    """The parts, in start order (with ``redis_cluster``: the local Redis Cluster too; with
    ``flink``, or when ``.dev/flink`` records one: the project's Flink cluster, last)."""
    out: list[Service] = [Postgres(settings), Redis(settings), Kafka(settings), FlinkConnector(settings),
                          Chromium(settings), Prometheus(settings)]
    if redis_cluster or RedisCluster().running():
        out.insert(2, RedisCluster())
    cluster = FlinkCluster(settings)
    if flink or cluster.recorded():
        out.append(cluster)
    return out


def up(settings: Settings, *, redis_cluster: bool = False, flink_cluster: bool = False) -> StatusReport:
    """Install what is missing and start every managed service; idempotent. A server that
    already answers at its address (this project's, or one ``start`` reuses) is not
    installed again: nothing is downloaded for it (e.g. Kafka's jars for a reused broker).
    ``flink_cluster``: also this project's standalone Flink cluster (:class:`FlinkCluster`)."""
    for svc in services(settings, redis_cluster=redis_cluster, flink=flink_cluster):
        if svc.external:
            _say(f"{svc.name}: external ({svc.address}), not starting it")
            continue
        t0 = time.monotonic()
        if svc.kind != "server" or not svc.healthy():
            svc.install()
        outcome = svc.start()
        _say(f"{svc.name}: {outcome} ({svc.address}, {time.monotonic() - t0:.1f}s)")
    return status(settings)


def down(settings: Settings) -> None:
    """Stop, in reverse order, only the processes ``up`` started (pid files)."""
    for svc in reversed(services(settings)):
        if svc.external:
            continue
        if not svc.running() and svc.healthy():  # another project's (or a system) server
            _say(f"{svc.name}: left running (not started by this project)")
            continue
        outcome = svc.stop()
        if outcome != "nothing to stop":
            _say(f"{svc.name}: {outcome}")


def status(settings: Settings) -> StatusReport:
    """Check every service (managed or external) and the stream job's parts; never raises
    for a down service."""
    out = []
    for svc in services(settings):
        healthy = svc.healthy()
        detail = ""
        if not healthy and not svc.external and not svc.running():
            verb = "not started" if svc.kind == "server" else "not installed"
            flag = f" --{svc.name}" if svc.name in ("flink-cluster", "redis-cluster") else ""
            detail = f"({verb}: run `features dev up{flag}`)"
        owner = "external" if svc.external else "managed" if svc.running() or not healthy else "reused"
        out.append(ServiceStatus(svc.name, svc.address, healthy,
                                 svc.version() if healthy else "-", owner, detail, svc.kind))
    found, missing = stream_parts()
    return StatusReport(tuple(out), found, missing)


def stream_parts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What the PyFlink stream job needs beside the servers: (what is here, what is
    missing with its fix). The Flink Kafka connector jar (``pipeline.jars``), PyFlink (the
    ``stream`` extra) and a Java runtime (``$JAVA_HOME/bin/java``, else ``java`` on PATH,
    as PyFlink looks for it)."""
    found: list[str] = []
    missing: list[str] = []
    jar = connector_jar()
    if jar is not None and jar.stat().st_size > 1_000_000:
        found.append(f"Flink Kafka connector {jar.stem.removeprefix(KAFKA_CONNECTOR_ARTIFACT + '-')}")
    else:
        missing.append(f"no Flink Kafka connector jar under {shown(flink_jars())} ({_cache_source()}): run "
                       "`features dev up` to fetch it there, or share another project's download: point "
                       "FEATURES_CACHE_DIR (or cache_dir in featureline.toml) at the cache that holds it; "
                       "projects that leave cache_dir unset share ~/.cache/featureline")
    try:
        import pyflink.version  # PyFlink: a missing install is listed as missing, not an import error

        found.append(f"PyFlink {pyflink.version.__version__}")
    except ImportError:
        missing.append("PyFlink is not importable (apache-flink, a dependency of featureline: reinstall "
                       "with requirements.lock)")
    java = _java()
    if java is not None:
        found.append(f"Java {java}")
    else:
        java_home = os.environ.get("JAVA_HOME")
        where = f"no {Path(java_home) / 'bin' / 'java'} ($JAVA_HOME)" if java_home else "no java on PATH"
        missing.append(f"{where} (run `features dev up`, or install Java 17)")
    return tuple(found), tuple(missing)


def _java() -> str | None:
    """The java PyFlink starts: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else the
    ``java`` on PATH; None when there is none."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    return java if java is not None and os.access(java, os.X_OK) else None

