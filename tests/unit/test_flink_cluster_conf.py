"""``features.flink.cluster`` without starting anything: the conf a cluster gets (its own
folder, free loopback ports, never Flink's defaults), what ``--cluster`` accepts and the
errors when nothing answers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from features.errors import ConfigError
from features.flink import cluster as local_flink


def test_configure_puts_everything_under_its_folder_with_free_loopback_ports(tmp_path: Path) -> None:
    c = local_flink.configure(tmp_path / "flink", taskmanagers=2, slots=3)
    conf = yaml.safe_load((c.conf_dir / "config.yaml").read_text())
    assert conf["rest"]["port"] == conf["rest"]["bind-port"] == c.rest_port
    assert conf["jobmanager"]["rpc"]["port"] == c.rpc_port
    assert c.rest_port != c.rpc_port and not set(c.ports()) & set(local_flink.DEFAULT_PORTS)
    assert conf["rest"]["bind-address"] == conf["jobmanager"]["bind-host"] == "127.0.0.1"
    assert conf["taskmanager"]["bind-host"] == conf["taskmanager"]["host"] == "127.0.0.1"
    assert conf["taskmanager"]["numberOfTaskSlots"] == 3
    assert conf["env"]["log"]["dir"] == str(c.log_dir) and conf["env"]["pid"]["dir"] == str(c.pid_dir)
    assert conf["io"]["tmp"]["dirs"] == str(c.io_dir)
    assert all(p.is_relative_to((tmp_path / "flink").resolve()) for p in (c.log_dir, c.pid_dir, c.io_dir))
    assert (c.conf_dir / "workers").read_text() == "localhost\nlocalhost\n"
    # PyFlink's own conf is left as it was
    shipped = yaml.safe_load((local_flink.pyflink_home() / "conf" / "config.yaml").read_text())
    assert shipped["jobmanager"]["rpc"]["port"] == 6123
    record = json.loads((tmp_path / "flink" / local_flink.STATE_FILE).read_text())
    assert record["rest_port"] == c.rest_port
    assert local_flink.read(tmp_path / "flink") == c
    assert c.pids() == [] and not c.healthy() and local_flink.local_cluster(tmp_path / "flink") is None
    assert local_flink.stop(c) is False  # nothing runs: nothing to stop


def _detached(*args: str) -> int:
    """The pid of ``python -c 'sleep 60' ARGS`` started detached, as the daemons are (init
    reaps it)."""
    code = "import time; time.sleep(60)"
    out = subprocess.run(["bash", "-c", f'nohup "$0" -c "{code}" "$@" >/dev/null 2>&1 & echo $!',
                          sys.executable, *args], capture_output=True, text=True, check=True, timeout=30)
    return int(out.stdout)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_stop_signals_only_processes_of_its_own_conf(tmp_path: Path) -> None:
    """``stop`` ends (SIGTERM), by pid file, a process whose command line names the
    cluster's conf folder, as a daemon's does, and leaves one a stale pid file names."""
    c = local_flink.configure(tmp_path / "flink")
    c.pid_dir.mkdir(parents=True, exist_ok=True)
    daemon, stranger = _detached(str(c.conf_dir)), _detached()
    try:
        (c.pid_dir / "flink-standalonesession.pid").write_text(f"{stranger}\n")
        assert local_flink.stop(c) is False and _running(stranger)  # a stale pid: not ours
        assert not list(c.pid_dir.glob("*.pid"))
        (c.pid_dir / "flink-taskexecutor.pid").write_text(f"{daemon}\n")
        assert local_flink.stop(c, timeout=30) is True
        assert not Path(f"/proc/{daemon}").exists() and _running(stranger)
        assert not list(c.pid_dir.glob("*.pid"))
    finally:
        for pid in (daemon, stranger):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("text, want", [("127.0.0.1:8082", ("127.0.0.1", 8082)),
                                        ("http://jm.example:18081/", ("jm.example", 18081)),
                                        ("https://jm:443", ("jm", 443))])
def test_split_address(text: str, want: tuple[str, int]) -> None:
    assert local_flink.split_address(text) == want


@pytest.mark.parametrize("text", ["jm", "http://jm", "jm:port", "http://jm:8081/jobs"])
def test_split_address_refuses(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        local_flink.split_address(text)
    assert err.value.key == "cluster" and text in str(err.value)


def test_cluster_flag_without_a_running_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEATURES_HOME", str(tmp_path))
    assert local_flink.resolve(None) is None
    with pytest.raises(ConfigError) as err:
        local_flink.resolve(local_flink.PROJECT)
    assert "features dev up --flink-cluster" in str(err.value)
    port = local_flink.free_port()  # nothing listens there
    with pytest.raises(ConfigError) as err:
        local_flink.resolve(f"127.0.0.1:{port}")
    assert f"http://127.0.0.1:{port}/overview" in str(err.value)
