"""Moving the stores to a compatible new version of a schema (``features migrate``,
:mod:`features.cli.migrate`): :func:`plan` compares the version the stores hold with the
file's, :func:`apply_postgres` runs the Postgres part, :func:`count_versions` counts the
Redis hashes by version. The recorded versions and the :class:`Upgrader` that rewrites
what earlier versions wrote live below the SDK, in :mod:`features.sinks.versions` (the SDK
reads through them); their names are imported here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.compile.fingerprint import fingerprint
from features.compile.layout import aggregates_key, entity_key, reply_columns
from features.compile.migration import Migration, plan_migration
from features.compile.postgres import SCHEMAS_TABLE, quote_ident
from features.errors import ConfigError, SinkError
from features.schema import Schema
from features.schema.parse import load_schema
from features.sdk.connections import Connections
from features.sdk.fallback import redis_py_client
from features.sinks.postgres import MIGRATING_LOCK, WRITERS_LOCK
from features.sinks.versions import (
    Newer,
    Recorded,
    Upgrader,
    Version,
    compiled_version,
    newer_readable,
    read_recorded,
)

#: What a breaking change needs instead (the refusal's last words, docs/evolution.md).
BREAKING_PATH = ("features migrate moves the stores only across compatible changes: give the new major "
                 "version its own tables (another schema name, or another Postgres schema and Redis "
                 "database) and load it there from the source data, or migrate by hand "
                 "(docs/evolution.md, \"Breaking changes\")")
#: Hashes read and rewritten at a time.
DEFAULT_CHUNK = 10_000


def scan_keys(store: Connections, name: str, aggregates: bool, count: int) -> Any:
    """Every entity (or aggregates) hash key of schema ``name``, ``count`` at a time (SCAN
    on every primary of a cluster)."""
    key = (aggregates_key if aggregates else entity_key)(name, "*")
    pattern = glob_escape(store.key_prefix + key[:-2]) + "*}"
    client = redis_py_client(store.redis_url, store.timeout_s)
    batch: list[str] = []
    try:
        for k in client.scan_iter(match=pattern, count=max(count, 100)):
            batch.append(k.decode() if isinstance(k, bytes) else k)
            if len(batch) >= count:
                yield batch
                batch = []
        if batch:
            yield batch
    finally:
        client.close()


def glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def count_versions(store: Connections, c: CompiledSchema, chunk: int) -> dict[str, dict[str, int]]:
    """Per hash kind (``entity``, ``aggregates``): how many hashes hold each fingerprint."""
    out: dict[str, dict[str, int]] = {}
    kinds = [("entity", False)] + ([("aggregates", True)] if c.schema.aggregations is not None else [])
    for kind, aggs in kinds:
        tally: dict[str, int] = {}
        for keys in scan_keys(store, c.name, aggs, chunk):
            fps = reply_columns(store.redis_pool.hmget_many([(keys, ["_schema_fingerprint"])]), 1)[0]
            for v in pc.value_counts(fps).to_pylist():
                fp = v["values"] if v["values"] is not None else "(none)"
                tally[fp] = tally.get(fp, 0) + v["counts"]
        out[kind] = tally
    return out


# --------------------------------------------------------------------------- the command


@dataclass
class Plan:
    """What ``features migrate`` would do."""

    schema: Schema
    recorded: Recorded
    old: Schema | None                  # the version the stores hold (None: nothing to migrate from)
    migration: Migration | None         # the Postgres part (None: Postgres already holds ``schema``)
    refusal: str | None = None
    notes: list[str] = field(default_factory=list)


def plan(store: Connections, c: CompiledSchema, old_file: str | None) -> Plan:
    """Compare the version the stores hold with ``c``'s; never changes anything."""
    schema = c.schema
    recorded = store.run_postgres("the version read", lambda conn: read_recorded(conn, c.name))
    old: Schema | None = None
    if old_file is not None:
        old = load_schema(old_file)
        if old.name != schema.name:
            raise ConfigError(f"--from {old_file} is schema {old.name!r}, not {schema.name!r}", key="from")
    if recorded.fingerprint is None:
        return Plan(schema, recorded, None, None, notes=[
            f"Postgres holds no version of {schema.name} yet: nothing to migrate (the first load creates "
            "the tables)"])
    if recorded.fingerprint == c.fingerprint:
        return Plan(schema, recorded, None, None)
    if old is None:
        v = recorded.versions.get(recorded.fingerprint)
        if v is None or v.text is None:
            raise ConfigError(
                f"the stores hold {schema.name} {recorded.version} (fingerprint {recorded.fingerprint[:12]}) "
                "but Postgres has no YAML text for it (loaded before featureline recorded one): pass the "
                "file "
                "it was loaded with, `features migrate NEW.yaml --from OLD.yaml`", key="from")
        old = compiled_version(v, schema.name).schema
    else:
        if fingerprint(old) != recorded.fingerprint:
            raise ConfigError(f"--from {old_file} is {old.version_str} (fingerprint "
                              f"{fingerprint(old)[:12]}), "
                              f"but the stores hold {recorded.version} (fingerprint "
                              f"{recorded.fingerprint[:12]})", key="from")
    if c.fingerprint in recorded.ancestors(recorded.fingerprint):
        return Plan(schema, recorded, old, None, refusal=(
            f"the stores hold {recorded.version}, which was migrated from this file's {schema.version_str}: "
            "give the readers and writers the newer schema file instead"))
    migration = plan_migration(old, schema)
    refusal = None
    if not migration.diff.compatible or migration.diff.refusal is not None:
        breaking = "; ".join(f"{ch.field} {ch.kind.value}: {ch.detail}" for ch in migration.diff.changes
                             if not ch.compatible)
        refusal = (f"{old.version_str} -> {schema.version_str} is a breaking change ({breaking}); "
                   f"{BREAKING_PATH}")
    return Plan(schema, recorded, old, migration, refusal)


def apply_postgres(store: Connections, p: Plan, waiting: Callable[[str], None] | None = None) -> None:
    """The migration DDL, the recorded version and both versions' text, in one
    transaction that first checks the stores still hold the planned version.

    Writers of the schema (loads, streams: :class:`features.sinks.postgres.WriterGuard`)
    are kept out: the migrating lock stops each before its next unit, and the transaction
    waits until every unit in flight is in both stores (``waiting`` is told which
    sessions it waits for); those writers then stop naming the new version."""
    assert p.migration is not None and p.old is not None
    expected = p.recorded.fingerprint
    name = p.schema.name

    def run(conn: Any) -> None:
        conn.execute(f"SELECT pg_advisory_lock({MIGRATING_LOCK})", (name,))
        held = False
        try:
            held = conn.execute(f"SELECT pg_try_advisory_lock({WRITERS_LOCK})", (name,)).fetchone()[0]
            if not held:
                if waiting is not None:
                    waiting(_writers(conn, name))
                conn.execute(f"SELECT pg_advisory_lock({WRITERS_LOCK})", (name,))
                held = True
            migrate(conn)
        finally:
            if held:
                conn.execute(f"SELECT pg_advisory_unlock({WRITERS_LOCK})", (name,))
            conn.execute(f"SELECT pg_advisory_unlock({MIGRATING_LOCK})", (name,))

    def migrate(conn: Any) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('featureline:ddl:' || "
                         "coalesce(current_schema(), '')))")
            row = conn.execute(f"SELECT fingerprint FROM {quote_ident(SCHEMAS_TABLE)} WHERE schema_name = %s "
                               "FOR UPDATE", (p.schema.name,)).fetchone()
            if row is None or row[0] != expected:
                now = row[0][:12] if row else "nothing"
                raise SinkError(f"the stores moved on meanwhile (now {now}, planned from "
                                f"{str(expected)[:12]}): run features migrate again", store="postgres")
            for statement in p.migration.statements:  # type: ignore[union-attr]
                conn.execute(statement)

    store.run_postgres("the migration", run)


def _writers(conn: Any, name: str) -> str:
    """The sessions writing schema ``name`` now (holding its writers' lock), as a line."""
    rows = conn.execute(
        "SELECT a.pid, coalesce(nullif(a.application_name, ''), '-'), coalesce(host(a.client_addr), 'local') "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' "
        "AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = "
        f"current_database()) AND ((l.classid::bigint << 32) | l.objid::bigint) = {WRITERS_LOCK} "
        "ORDER BY a.pid", (name,)).fetchall()
    who = ", ".join(f"pid {pid} ({app}, {host})" for pid, app, host in rows) or "a writer that just finished"
    return (f"waiting for the writers of {name} to finish the batch they are writing (they stop after it): "
            f"{who}")


__all__ = ["BREAKING_PATH", "Newer", "Plan", "Recorded", "Upgrader", "Version", "apply_postgres",
           "compiled_version", "count_versions", "newer_readable", "plan", "read_recorded", "scan_keys"]
