"""A real ``features ui`` process for the UI's page tests: :func:`start_ui` starts one on a
free port over a Postgres DSN (:func:`stop_ui` stops it: it must exit 0 on SIGTERM), and
:func:`ui_namespace` gives a fresh Postgres namespace (and a Redis key prefix of its own)
with a function that starts UIs over it; everything is stopped and dropped after."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import pytest
from conftest import ROOT, search_path_dsn

from features.config import Settings


def start_ui(dsn: str, schemas: Path, cwd: Path, *args: str, views: Path | None = None,
             env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``features ui --port 0`` over ``dsn`` with the schemas of ``schemas`` (and the views
    of ``views``, default none), more ``args`` after; (the process, its base URL)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_INGEST_TOKENS": "", "FEATURES_POSTGRES_DSN": dsn,
            **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "features.cli", "ui", "--port", "0", "--schemas-dir",
                             str(schemas), "--views-dir", str(views or cwd / "no-views"), *args],
                            env=full, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("features ui: serving http://127.0.0.1:"):
        proc.kill()
        pytest.fail(f"features ui did not start: {line!r} {proc.communicate(timeout=30)[1][-2000:]}")
    return proc, line.split()[3].rstrip("/")


def stop_ui(proc: subprocess.Popen[str]) -> None:
    """SIGTERM; the UI must exit 0."""
    proc.terminate()
    _, err = proc.communicate(timeout=30)  # reads and closes both pipes
    assert proc.returncode == 0, err[-2000:]


class Serve(Protocol):
    def __call__(self, schemas: Path, cwd: Path, *args: str, views: Path | None = None) -> str: ...


@contextmanager
def ui_namespace(settings: Settings, tag: str) -> Iterator[tuple[str, str, Serve]]:
    """(namespace, Redis key prefix, ``serve(schemas_dir, cwd, *args, views=None) -> base
    URL``); each UI process exits 0 on SIGTERM, the namespace and the prefix's keys are dropped."""
    import psycopg
    import redis
    from psycopg import sql

    ns, prefix = f"t_{tag}_{uuid.uuid4().hex[:10]}", f"t_{tag}_{uuid.uuid4().hex[:10]}:"
    procs: list[subprocess.Popen[str]] = []

    def serve(schemas: Path, cwd: Path, *args: str, views: Path | None = None) -> str:
        proc, url = start_ui(search_path_dsn(settings.postgres_dsn, ns), schemas, cwd, *args, views=views)
        procs.append(proc)
        return url

    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    try:
        yield ns, prefix, serve
    finally:
        for proc in procs:
            stop_ui(proc)
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=10_000))
        if keys:
            client.delete(*keys)
        client.close()
