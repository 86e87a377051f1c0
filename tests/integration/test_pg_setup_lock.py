"""The Postgres sink's table setup (``PostgresSink.open``) under concurrency: one applier
at a time per namespace, none across namespaces.

Every schema's DDL also creates the namespace's shared tables (``featureline_schemas``, the
ledger). With the setup lock keyed on the schema's name, six first-time loaders of six
schemas into one fresh namespace failed in 9 of 10 rounds with a unique violation on
``pg_type`` (two ``CREATE TABLE IF NOT EXISTS featureline_schemas`` at once), and a loader
waited for one of the same schema in another namespace.
"""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.schema import parse_schema
from features.sinks.postgres import PostgresSink

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]


def _schemas(n: int) -> list[CompiledSchema]:
    base = yaml.safe_load((ROOT / "schemas" / "credit_applicant.yaml").read_text())
    return [compile_schema(parse_schema(yaml.safe_dump({**base, "name": f"setup_race_{i}"})))
            for i in range(n)]


@pytest.fixture()
def namespaces(pg_schema: str, second_pg_schema: str, third_pg_schema: str) -> list[str]:
    """Three fresh Postgres schemas, dropped after the test."""
    return [pg_schema, second_pg_schema, third_pg_schema]


def _open_at_once(settings: Settings, compiled: list[CompiledSchema], namespace: str) -> list[BaseException]:
    """Open one sink per schema in ``namespace``, all released at once; their errors."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(compiled))

    def open_one(c: CompiledSchema) -> None:
        sink = PostgresSink(settings.postgres_dsn, c, search_path=namespace, retries=1)
        start.wait()
        try:
            sink.open()
        except BaseException as exc:  # collected: the assertion names them
            errors.append(exc)
        finally:
            sink.close()

    threads = [threading.Thread(target=open_one, args=(c,)) for c in compiled]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def test_first_loaders_of_many_schemas_into_one_namespace_all_set_up(
        settings: Settings, namespaces: list[str]) -> None:
    compiled = _schemas(6)
    for namespace in namespaces:  # three fresh namespaces: three races
        errors = _open_at_once(settings, compiled, namespace)
        assert not errors, errors
        with psycopg.connect(settings.postgres_dsn) as conn:
            got = conn.execute(sql.SQL("SELECT schema_name FROM {}.featureline_schemas ORDER BY 1").format(
                sql.Identifier(namespace))).fetchall()
        assert [r[0] for r in got] == sorted(c.name for c in compiled)


def test_setup_in_one_namespace_does_not_wait_for_another(settings: Settings, namespaces: list[str]) -> None:
    (compiled,) = _schemas(1)
    busy, free = namespaces[:2]
    # another applier holds the setup lock of `busy` (the sink's own lock expression)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={busy}") as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('featureline:ddl:' || "
                       "coalesce(current_schema(), '')))")
        sink = PostgresSink(settings.postgres_dsn + "?options=-c%20lock_timeout%3D5000", compiled,
                            search_path=free, retries=1)
        try:
            sink.open()  # before the fix: waits for `busy`'s lock, then lock_timeout
        finally:
            sink.close()
        waiting = PostgresSink(settings.postgres_dsn + "?options=-c%20lock_timeout%3D1000", compiled,
                               search_path=busy, retries=1)
        with pytest.raises(Exception, match="lock timeout"):
            waiting.open()  # the same namespace does wait
        waiting.close()
