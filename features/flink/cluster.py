"""A standalone Flink cluster on this machine, the featureline way: the one that ships
inside PyFlink (``<pyflink>/bin/start-cluster.sh``), run from a private copy of its
``conf`` folder so that nothing lands in the virtual environment or the shared temp folder
and no port clashes with another cluster.

Everything of one cluster lives in one folder (``features dev up --flink-cluster`` uses the
project's ``.dev/flink``; tests use their own)::

    conf/          a copy of PyFlink's conf/ (FLINK_CONF_DIR): free loopback ports, small memory
    log/           the JobManager's and TaskManagers' logs (env.log.dir)
    pids/          their pid files (env.pid.dir; Flink's default is /tmp, shared by every cluster)
    io/            io.tmp.dirs (shipped files, spilled data)
    cluster.json   what :func:`local_cluster` reads: the PyFlink home, the ports, the web UI

Every port is a free loopback port chosen at start (``rest.port``, ``jobmanager.rpc.port``;
the blob server's and the TaskManagers' ports are Flink's ``0``, the kernel's choice) and
every listener is bound to 127.0.0.1, so two projects on one machine each get their own
cluster. :func:`stop` sends SIGTERM to all of that cluster's daemons at once (by pid) and
SIGKILL to any still alive after its timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from features.errors import ConfigError, ServiceError
from features.home import state_home

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"
#: Flink's own defaults, which the cluster never binds (another cluster's, perhaps)
DEFAULT_PORTS = (6123, 8081)


def pyflink_home(python: Path | None = None) -> Path:
    """The PyFlink distribution (``bin/``, ``conf/``, ``lib/``, ``opt/``) of ``python``, else
    of this interpreter."""
    if python is None:
        # pyflink: heavy, and only a Flink job needs it (no other entry point loads it)
        import pyflink

        return Path(pyflink.__file__).resolve().parent
    out = subprocess.run([str(python), "-c", "import pyflink, os; print(os.path.dirname(pyflink.__file__))"],
                         capture_output=True, text=True, check=True, timeout=120, cwd="/")
    return Path(out.stdout.strip())


def free_port(host: str = HOST) -> int:
    """A port the kernel says is free on ``host`` now (never one of :data:`DEFAULT_PORTS`)."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in DEFAULT_PORTS:
            return port


def _port_open(port: int, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def _runs_conf(pid: int, conf_dir: Path) -> bool:
    """Whether process ``pid``'s command line names ``conf_dir`` (a daemon of that cluster)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return str(conf_dir) in cmdline


def _set(conf: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key in Flink's nested ("standard YAML") config.yaml."""
    node = conf
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


@dataclass(frozen=True)
class Cluster:
    """One cluster's folder, PyFlink home and ports (what ``cluster.json`` records)."""

    dir: Path
    home: Path
    rest_port: int
    rpc_port: int
    taskmanagers: int = 1
    slots: int = 2
    host: str = HOST

    @property
    def conf_dir(self) -> Path:
        return self.dir / "conf"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    @property
    def pid_dir(self) -> Path:
        return self.dir / "pids"

    @property
    def io_dir(self) -> Path:
        return self.dir / "io"

    @property
    def web_ui(self) -> str:
        """The web UI and REST address (what ``flink run -m`` and the jobs' client take)."""
        return f"http://{self.host}:{self.rest_port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.rest_port}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (else this process's environment) for Flink's scripts: FLINK_CONF_DIR
        this cluster's, none of the variables that would point them elsewhere."""
        out = {**(os.environ if base is None else base), "FLINK_CONF_DIR": str(self.conf_dir)}
        for k in ("FLINK_LOG_DIR", "FLINK_PID_DIR", "FLINK_HOME", "_FLINK_HOME_DETERMINED"):
            out.pop(k, None)
        return out

    def script(self, name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """``<home>/bin/<name> args`` with this cluster's conf, from ``cwd`` (else its folder)."""
        return subprocess.run(["bash", str(self.home / "bin" / name), *args], env=self.env(env),
                              capture_output=True, text=True, timeout=timeout, cwd=cwd or self.dir)

    def rest(self, path: str, timeout: float = 10) -> Any:
        """GET ``path`` of the REST API, decoded; raises OSError when it does not answer."""
        with urllib.request.urlopen(f"{self.web_ui}{path}", timeout=timeout) as resp:
            return json.loads(resp.read())

    def overview(self) -> dict[str, Any] | None:
        """``/overview`` (task managers, slots, jobs, version); None when it does not answer."""
        try:
            out = self.rest("/overview", timeout=3)
        except (OSError, ValueError):
            return None
        return out if isinstance(out, dict) else None

    def healthy(self) -> bool:
        """Its REST API answers with every TaskManager registered."""
        view = self.overview()
        return view is not None and int(view.get("taskmanagers", 0)) >= self.taskmanagers

    def pids(self) -> list[int]:
        """The live processes whose pid files this cluster's scripts wrote."""
        out = []
        for f in sorted(self.pid_dir.glob("*.pid")):
            for word in f.read_text().split():
                if word.isdigit() and _pid_alive(int(word)):
                    out.append(int(word))
        return out

    def ports(self) -> list[int]:
        """The ports chosen for it (the others are the kernel's choice)."""
        return [self.rest_port, self.rpc_port]

    def logs(self, chars: int = 3000) -> str:
        """The tail of each log file (for error messages)."""
        parts = []
        for f in sorted(self.log_dir.glob("*")):
            if f.suffix in (".log", ".out") and f.stat().st_size:
                text = f.read_text(errors="replace")
                parts.append(f"----- {f.name} (last {chars} chars) -----\n{text[-chars:]}")
        return "\n".join(parts) or f"(no logs under {self.log_dir})"


def configure(folder: Path, *, home: Path | None = None, taskmanagers: int = 1, slots: int = 2,
              extra: dict[str, Any] | None = None) -> Cluster:
    """Lay out ``folder`` for a new cluster (conf/ copied from ``home``'s, new free ports,
    ``cluster.json``) and return it; starts nothing. ``extra``: more config keys (dotted)."""
    if taskmanagers < 1 or slots < 1:
        raise ServiceError(f"a cluster needs >= 1 TaskManager and >= 1 slot, got {taskmanagers} and {slots}",
                           service="flink-cluster")
    home = home or pyflink_home()
    folder.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(folder.resolve(), home, free_port(), free_port(), taskmanagers, slots)
    if cluster.conf_dir.exists():
        shutil.rmtree(cluster.conf_dir)
    shutil.copytree(home / "conf", cluster.conf_dir)
    for d in (cluster.log_dir, cluster.pid_dir, cluster.io_dir):
        d.mkdir(exist_ok=True)
    config_file = cluster.conf_dir / "config.yaml"
    conf = yaml.safe_load(config_file.read_text())
    keys: dict[str, Any] = {
        "jobmanager.rpc.address": HOST, "jobmanager.bind-host": HOST,
        "jobmanager.rpc.port": cluster.rpc_port,   # 6123 by default
        "taskmanager.host": HOST, "taskmanager.bind-host": HOST,
        "rest.address": HOST, "rest.bind-address": HOST,
        "rest.port": cluster.rest_port,            # 8081 by default
        "rest.bind-port": cluster.rest_port,
        "taskmanager.numberOfTaskSlots": slots,
        "jobmanager.memory.process.size": "1000m",
        "taskmanager.memory.process.size": "1500m",
        "env.log.dir": str(cluster.log_dir),       # the venv's site-packages by default
        "env.pid.dir": str(cluster.pid_dir),       # /tmp by default: stop-cluster.sh would see others'
        "io.tmp.dirs": str(cluster.io_dir),
    }
    for key, value in {**keys, **(extra or {})}.items():
        _set(conf, key, value)
    config_file.write_text(yaml.safe_dump(conf, sort_keys=False))
    (cluster.conf_dir / "workers").write_text("localhost\n" * taskmanagers)
    (cluster.conf_dir / "masters").write_text(f"{HOST}:{cluster.rest_port}\n")
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cluster).items()}
    (folder / STATE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return cluster


def read(folder: Path) -> Cluster | None:
    """The cluster ``folder/cluster.json`` records (running or not); None when there is none."""
    try:
        record = json.loads((folder / STATE_FILE).read_text())
        return Cluster(Path(record["dir"]), Path(record["home"]), int(record["rest_port"]),
                       int(record["rpc_port"]), int(record["taskmanagers"]), int(record["slots"]),
                       str(record["host"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def start(cluster: Cluster, *, timeout: float = 180, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> None:
    """``start-cluster.sh`` with the cluster's conf, from ``cwd`` (else its folder: the daemons'
    folder is also their Python workers' folder, first on those workers' ``sys.path``) and
    ``env`` (else this process's environment, which the daemons and their Python workers
    inherit: PYTHONPATH included); wait
    until every TaskManager has registered. Raises ServiceError (with the logs' tails) when a
    chosen port is taken or it does not come up, after stopping what it started."""
    taken = [p for p in cluster.ports() if _port_open(p, cluster.host)]
    if taken:
        raise ServiceError(f"port(s) {taken} chosen for the Flink cluster are taken now; start it again",
                           service="flink-cluster")
    started = cluster.script("start-cluster.sh", cwd=cwd, env=env)
    if started.returncode != 0:
        stop(cluster)
        raise ServiceError(f"start-cluster.sh exited {started.returncode}: {started.stderr[-2000:]}",
                           service="flink-cluster", log=str(cluster.log_dir))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = cluster.overview() or {}
        if (int(view.get("taskmanagers", 0)) >= cluster.taskmanagers
                and int(view.get("slots-total", 0)) >= cluster.taskmanagers * cluster.slots):
            return
        time.sleep(0.5)
    logs = cluster.logs()
    stop(cluster)
    raise ServiceError(f"the Flink cluster did not register {cluster.taskmanagers} TaskManager(s) within "
                       f"{timeout:.0f}s\n{logs}", service="flink-cluster", log=str(cluster.log_dir))


#: How long :func:`stop` waits for its stopped daemons to be reaped (seconds).
REAP_WAIT_S = 10.0


def stop(cluster: Cluster, *, timeout: float = 60) -> bool:
    """SIGTERM to every daemon a pid file of this cluster names, all at once, then SIGKILL to
    those still running after ``timeout`` s. What ``stop-cluster.sh`` does, without its
    wait: it stops the daemons one after another, each after a JVM that parses the conf
    (seconds each). A SIGTERM is a daemon's graceful shutdown either way (Flink's own hook
    halts the JVM 5 s after it at the latest). Only processes whose command line names this
    cluster's conf folder are signalled (a pid file's stale pid may be another process's
    now). Returns whether anything was running."""
    were = [pid for pid in cluster.pids() if _runs_conf(pid, cluster.conf_dir)]
    if not were:
        for f in cluster.pid_dir.glob("*.pid"):
            f.unlink(missing_ok=True)
        return False
    for pid in were:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_pid_alive(p) for p in were):
        time.sleep(0.1)
    for pid in were:
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # the daemons run detached: each exited one stays a zombie until init reaps it (about a
    # second here); wait for that (a little), so that none is listed when this returns
    reaped = time.monotonic() + REAP_WAIT_S
    while time.monotonic() < reaped and any(Path(f"/proc/{p}").exists() for p in were):
        time.sleep(0.1)
    for f in cluster.pid_dir.glob("*.pid"):
        f.unlink(missing_ok=True)
    return True


def local_cluster(folder: Path) -> Cluster | None:
    """The cluster recorded in ``folder`` when it is running (its REST API answers); else None."""
    cluster = read(folder)
    return cluster if cluster is not None and cluster.overview() is not None else None


def project_folder() -> Path:
    """The folder of the project's cluster: ``.dev/flink`` (``features.home.state_home``)."""
    return state_home() / "flink"


def project_cluster() -> Cluster | None:
    """The project's cluster (``features dev up --flink-cluster``) when it is running, else None."""
    return local_cluster(project_folder())


def flink_python_jar(home: Path | None = None) -> Path:
    """PyFlink's ``opt/flink-python-*.jar`` (what ``flink run -py`` adds to a Python job)."""
    jars = sorted(((home or pyflink_home()) / "opt").glob("flink-python-*.jar"))
    if not jars:
        raise ServiceError(f"no flink-python jar under {(home or pyflink_home()) / 'opt'}: reinstall PyFlink",
                           service="flink-cluster")
    return jars[-1]


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``http(s)://host:port[/]`` -> (host, port); raises ConfigError."""
    parts = urlsplit(address if "://" in address else f"http://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.path not in ("", "/"):
        raise ConfigError(f"Flink cluster address {address!r}: expected HOST:PORT or http://HOST:PORT "
                          "(its REST API, the web UI's address)", key="cluster")
    return parts.hostname, port


#: what ``--cluster`` given without an address means: the project's cluster
PROJECT = "project"


def resolve(cluster: str | None) -> str | None:
    """What a command's ``--cluster`` names, as the REST address ``host:port`` to submit to:
    None (no flag: the mini-cluster in this process) stays None; :data:`PROJECT` (the flag
    alone) is the project's running cluster (``features dev up --flink-cluster``; raises
    ConfigError when none runs); any other value is a cluster's REST address. A remote
    cluster is checked to answer (ConfigError otherwise)."""
    if cluster is None:
        return None
    if cluster == PROJECT:
        found = project_cluster()
        if found is None:
            raise ConfigError(f"--cluster: no Flink cluster of this project runs (nothing answers at the one "
                              f"{project_folder() / STATE_FILE} records): run `features dev up "
                              "--flink-cluster`, or give the address of a running cluster", key="cluster")
        return found.address
    host, port = split_address(cluster)
    view = Cluster(Path("."), Path("."), port, 0, host=host).overview()
    if view is None:
        raise ConfigError(f"--cluster {cluster}: no Flink REST API answers at http://{host}:{port}/overview",
                          key="cluster")
    return f"{host}:{port}"


def slots(address: str) -> int:
    """The cluster's slots in all (``/overview``'s ``slots-total``); ConfigError when it does
    not answer."""
    host, port = split_address(address)
    view = Cluster(Path("."), Path("."), port, 0, host=host).overview()
    if view is None:
        raise ConfigError(f"no Flink REST API answers at http://{host}:{port}/overview", key="cluster")
    return int(view.get("slots-total", 0))
