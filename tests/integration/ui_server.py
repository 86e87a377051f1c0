"""A real ``features ui`` process over a fresh Postgres namespace (and a Redis key prefix
of its own), for the UI's page tests: :func:`ui_namespace` yields the namespace, the key
prefix and a function that starts the UI over it; everything is stopped and dropped after."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import ROOT, search_path_dsn

from features.config import Settings


@contextmanager
def ui_namespace(settings: Settings, tag: str) -> Iterator[tuple[str, str, Callable[[Path, Path], str]]]:
    """(namespace, Redis key prefix, ``serve(schemas_dir, cwd) -> base URL``); the UI
    process exits 0 on SIGTERM, the namespace and the prefix's keys are dropped."""
    import psycopg
    import redis
    from psycopg import sql

    ns, prefix = f"t_{tag}_{uuid.uuid4().hex[:10]}", f"t_{tag}_{uuid.uuid4().hex[:10]}:"
    procs: list[subprocess.Popen[str]] = []

    def serve(schemas: Path, cwd: Path) -> str:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FEATURES_INGEST_TOKENS": "",
               "FEATURES_POSTGRES_DSN": search_path_dsn(settings.postgres_dsn, ns)}
        proc = subprocess.Popen([sys.executable, "-m", "features.cli", "ui", "--port", "0", "--schemas-dir",
                                 str(schemas), "--views-dir", str(cwd / "no-views")], env=env, cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("features ui: serving http://127.0.0.1:"), (line, proc.poll())
        return line.split()[3].rstrip("/")

    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    try:
        yield ns, prefix, serve
    finally:
        for proc in procs:
            proc.terminate()
            _, err = proc.communicate(timeout=30)  # reads and closes both pipes
            assert proc.returncode == 0, err[-2000:]
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        client = redis.Redis.from_url(settings.redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=10_000))
        if keys:
            client.delete(*keys)
        client.close()
