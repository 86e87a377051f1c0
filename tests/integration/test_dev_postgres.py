"""The Postgres cluster ``features dev up`` starts gives nobody on the machine a
superuser (issue 29, item 6): every connection proves a password (SCRAM, the socket
too), the superuser's password is random and kept 0600 in ``.dev``, the socket's
folder is the server's user's only, and no parent folder is made world-searchable.
A cluster made by an older featureline (trust, password ``postgres``) is brought to
these rules by the next start.

Each test runs its own cluster (``features dev up``'s code, another folder and port):
the shared one is never restarted.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from features.config import Settings
from features.home import state_home
from features.ops.dev.services import Postgres

#: the rules initdb wrote for older featurelines (``--auth-local=trust --auth-host=scram-sha-256``)
OLD_HBA = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\nhost all all ::1/128 scram-sha-256\n"


@pytest.fixture()
def locked_home() -> Iterator[Path]:
    """A folder only root may enter (as a home directory is), holding the cluster's state."""
    home = state_home() / f"test-devpg-{uuid.uuid4().hex[:8]}"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _server(settings: Settings, home: Path) -> Postgres:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dsn = f"postgresql://featureline:featureline@127.0.0.1:{port}/featureline"
    return Postgres(dataclasses.replace(settings, postgres_dsn=dsn), state=home / "state")


def _refused(**kw: object) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(connect_timeout=5, dbname="postgres", **kw).close()  # type: ignore[arg-type]
    return str(caught.value)


def _assert_locked_down(pg: Postgres, home: Path) -> None:
    hba = (pg.data / "pg_hba.conf").read_text()
    rules = [line.split() for line in hba.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert rules and all(rule[-1] == "scram-sha-256" for rule in rules), hba
    for folder in (pg.dir, pg.run_dir):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(pg.password_file.stat().st_mode) == 0o600
    password = pg.password_file.read_text().strip()
    assert len(password) >= 32 and password != "postgres"
    # nothing above the state was opened to everybody
    assert home.stat().st_mode & 0o007 == 0, oct(home.stat().st_mode)
    if os.geteuid() == 0:  # the server runs as the postgres user, which got an ACL entry
        acl = subprocess.run(["getfacl", "-p", str(home)], capture_output=True, text=True, check=True).stdout
        assert "user:postgres:--x" in acl.splitlines(), acl
    host = {"host": "127.0.0.1", "port": pg.port, "user": "postgres"}
    assert "password authentication failed" in _refused(**host, password="postgres")
    assert "password" in _refused(host=str(pg.run_dir), port=pg.port, user="postgres")  # the socket too
    with psycopg.connect(**host, password=password, dbname="postgres", connect_timeout=5) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row == (True,)
    with psycopg.connect(pg.dsn, connect_timeout=5) as conn:  # the app's role, as before
        assert conn.execute("SELECT current_user").fetchone() == ("featureline",)


def test_a_new_dev_cluster_gives_nobody_a_superuser(settings: Settings, locked_home: Path) -> None:
    pg = _server(settings, locked_home)
    try:
        assert pg.start() == "started"
        _assert_locked_down(pg, locked_home)
    finally:
        pg.stop()


def test_a_cluster_an_older_featureline_made_is_locked_down_by_the_next_start(
        settings: Settings, locked_home: Path) -> None:
    pg = _server(settings, locked_home)
    try:
        pg.start()
        # what the older code left: trust over the socket, the password "postgres", no file
        with psycopg.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres",
                             password=pg.superuser_password(), autocommit=True) as conn:
            conn.execute("ALTER ROLE postgres PASSWORD 'postgres'")
        pg.stop()
        (pg.data / "pg_hba.conf").write_text(OLD_HBA)
        pg.password_file.unlink()
        assert pg.start() == "started"
        _assert_locked_down(pg, locked_home)
        # and a start of a running old-style cluster does it as well
        (pg.data / "pg_hba.conf").write_text(OLD_HBA)
        for folder in (pg.dir, pg.run_dir):
            folder.chmod(0o755)
        with psycopg.connect(host=str(pg.run_dir), port=pg.port, user="postgres", dbname="postgres",
                             password=pg.superuser_password(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        assert pg.start() == "already running"
        _assert_locked_down(pg, locked_home)
    finally:
        pg.stop()
