"""PostgreSQL (cold) sink: full history keyed by (entity, event time, digest), rejects, ledger.

A static schema (``event_time: none``) has one row per entity instead: a unit's rows
are upserted, the greater version (``_ingested_at``, then ``_digest``) winning
(``features.sinks.redis``, "a static schema's row version"); the rest of this contract holds as it is.

Contract:

- ``open()`` connects (an unreachable server raises SinkUnavailable naming the
  address), applies the generated DDL when the cold table is missing, and refuses to
  write (SinkError) when ``featureline_schemas`` records another fingerprint for the
  schema: the message names both versions and the migration command.
- ``write(unit)`` runs one transaction: the rows, the rejects, and (for a unit with a
  ledger key) a ``featureline_ledger`` row, or (for a counted unit without one: a stream's
  micro-batch, ``WriteUnit.counted``) its counts added to its run's
  ``featureline_run_counts`` row. Either all of it commits or none of it: a replayed
  micro-batch whose first write committed counts its rows already present.
  Two writers of one unit at once (two loads of one file) are serialised by a
  transaction advisory lock on the unit: the second waits, then finds the ledger row and
  returns ``skipped`` (the run counts the unit as already present).
- Rows go in with ``COPY ... FROM STDIN (FORMAT binary)``, encoded from Arrow by
  :mod:`features.sinks.pgbinary` (no Python loop over rows); a table with a column that
  encoder cannot write exactly (e.g. ``jsonb``, ``numeric`` wider than 18 digits) gets
  ``COPY ... (FORMAT csv)`` produced by Arrow instead. **The history is keyed by (entity,
  event time, content digest)** (``_digest``, :mod:`features.kernels.digest`): every
  distinct event is stored, two different events at one instant included, and a row
  whose exact copy is stored already (same key) is counted ``already_present`` and not
  written. Only when COPY hits such a copy does the unit take the slower path: COPY into
  a temporary table, then ``INSERT ... SELECT ... ON CONFLICT DO NOTHING``. A unit
  without a ledger key (a stream's micro-batch, where replays and duplicate events are
  normal) first looks its keys up (COPY of the keys into a temporary table, one index
  lookup each) and COPYs the rows with new keys straight in; a key stored by another
  writer in between sends it the slower path.
- Rejects are unique per (``_source``, fingerprint): a replay inserts none twice, and
  ``write`` returns the positions of the rejects the table already held
  (``WriteResult.rejects_held``; the ledger row and the run count them already present).
  A unit whose ``_source`` names its run (a Python table, ``python://<run id>#<row>``)
  carries ``content`` (its input without the run, recorded in the ledger): when the
  ledger holds a unit of that content, its rejects are stored already, under that unit's
  ``_source``, and are all held; so one table's rejects are stored once whatever the run id.
- Connection losses during a write are retried with exponential backoff (the
  transaction was rolled back, so a retry is exact); after ``retries`` attempts the
  write raises SinkUnavailable.

Why one module of this size: :class:`PostgresSink` is one connection and one transaction
protocol (ledger, COPY, upserts, rejects, history reads) that its methods share; the
wire-level parts already live apart (``features.sinks.pg``,
``features.sinks.pgbinary``).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import psycopg
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg import sql

from features.compile import CompiledSchema
from features.compile.layout import stored_aggregations, stored_fields
from features.compile.listtext import POSTGRES, list_text
from features.compile.migration import mismatch_hint
from features.compile.postgres import (
    SCHEMAS_TABLE,
    aggregates_table_name,
    cold_keys,
    cold_table_name,
    history_index_names,
    history_indexes,
    quote_ident,
    record_version,
    rejects_index_names,
    rejects_indexes,
    rejects_table_name,
    versions_table,
)
from features.errors import SinkError, SinkUnavailable
from features.lineage import DIGEST, INGESTED_AT, LINEAGE_COLUMNS, SOURCE
from features.sinks import pg
from features.sinks.base import WriteResult, WriteUnit, retrying, with_digest
from features.sinks.pgbinary import copy_binary

#: a run's counts, as the ledger (per unit) and the run counts (per run) hold them:
#: read = stored + already present + rejected
_COUNTS = ("read", "stored", "already_present", "rejected")
_COUNTS_DDL = "".join(f"    {quote_ident(c)} bigint NOT NULL,\n" for c in _COUNTS)
#: the ledger's and the run counts' first columns: whose rows they count
_COUNTED_DDL = '    "schema_name" text NOT NULL,\n    "fingerprint" text NOT NULL,\n'

LEDGER_TABLE = "featureline_ledger"
LEDGER_DDL = f"""
CREATE TABLE IF NOT EXISTS {quote_ident(LEDGER_TABLE)} (
{_COUNTED_DDL}    "unit" text NOT NULL,
    "run_id" text NOT NULL,
{_COUNTS_DDL}    "committed_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("schema_name", "fingerprint", "unit")
)
"""
#: The ledger's ``content`` column (``WriteUnit.content``: a unit's input named without
#: the run, for the Python tables whose ``_source`` names it) and its index: added to a
#: ledger that lacks them (a new one, or one made before them), see ``_prepare``.
LEDGER_CONTENT_DDL = f"""
ALTER TABLE {quote_ident(LEDGER_TABLE)} ADD COLUMN IF NOT EXISTS "content" text;
CREATE INDEX IF NOT EXISTS {quote_ident(LEDGER_TABLE + "__content")} ON {quote_ident(LEDGER_TABLE)}
    ("schema_name", "fingerprint", "content") WHERE "content" IS NOT NULL
"""

#: Each counted run's counts (a stream's micro-batches, ``WriteUnit.counted``): one row per
#: (schema, fingerprint, run), upserted by every counted unit in the transaction that writes
#: the unit's rows and rejects, so it holds exactly what committed: read = stored + already
#: present + rejected, as the ledger's; ``units`` counts the writes, ``first_at`` and
#: ``last_at`` the first's and the last's commit. The Runs page lists a stream run from it.
RUN_COUNTS_TABLE = "featureline_run_counts"
RUN_COUNTS_DDL = f"""
CREATE TABLE IF NOT EXISTS {quote_ident(RUN_COUNTS_TABLE)} (
{_COUNTED_DDL}    "run_id" text NOT NULL,
    "kind" text NOT NULL,
    "units" bigint NOT NULL,
{_COUNTS_DDL}    "first_at" timestamptz NOT NULL DEFAULT now(),
    "last_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("schema_name", "fingerprint", "run_id")
)
"""
#: one counted unit's upsert into :data:`RUN_COUNTS_TABLE` (the last statement of its
#: transaction: the row's lock, which parallel writers of one run wait on, is held only
#: until the commit)
RUN_COUNTS_UPSERT = (
    f"INSERT INTO {quote_ident(RUN_COUNTS_TABLE)} AS t (schema_name, fingerprint, run_id, kind, units, "
    + ", ".join(quote_ident(c) for c in _COUNTS) + ") VALUES (%s, %s, %s, %s, 1, %s, %s, %s, %s) "
    "ON CONFLICT (schema_name, fingerprint, run_id) DO UPDATE SET units = t.units + 1, "
    + ", ".join(f"{quote_ident(c)} = t.{quote_ident(c)} + excluded.{quote_ident(c)}" for c in _COUNTS)
    + ", last_at = excluded.last_at")

#: The batch quality gates' verdict of each run they judged (``features.load.gates``): one
#: row per (run, gate): the rate (or rows) measured against the limit, whether it was
#: breached, whether the load was refused (a breached ``fail`` gate), the load's rows read
#: and rejected. Written in one transaction per verdict: a passed load's before its first
#: unit, a refused load's after its rejects (the evidence) are stored. The UI shows it.
GATE_VERDICTS_TABLE = "featureline_gate_verdicts"
GATE_VERDICTS_DDL = f"""
CREATE TABLE IF NOT EXISTS {quote_ident(GATE_VERDICTS_TABLE)} (
    "schema_name" text NOT NULL,
    "run_id" text NOT NULL,
    "gate" text NOT NULL,
    "kind" text NOT NULL,
    "rule" text,
    "measured" double precision NOT NULL,
    "rows" bigint NOT NULL,
    "limit" double precision NOT NULL,
    "on_breach" text NOT NULL,
    "breached" boolean NOT NULL,
    "refused" boolean NOT NULL,
    "read" bigint NOT NULL,
    "rejected" bigint NOT NULL,
    "judged_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("schema_name", "run_id", "gate")
)
"""
#: a gate's columns in :data:`GATE_VERDICTS_TABLE` (besides the schema and the run)
GATE_VERDICT_COLUMNS = ("gate", "kind", "rule", "measured", "rows", "limit", "on_breach", "breached",
                        "refused", "read", "rejected")

T = TypeVar("T")
log = logging.getLogger("features.sinks")
_CSV = pacsv.WriteOptions(include_header=False, quoting_style="needed")


def copy_csv(table: pa.Table) -> bytes:
    """``table`` as CSV for ``COPY ... (FORMAT csv)``: nulls unquoted-empty, strings quoted.

    Zoned timestamps are written as their UTC wall clock without a zone (Arrow formats
    those 20x faster); the sink's sessions run with ``TimeZone=UTC``, so Postgres reads
    them as the same instants. Lists are array literals (``{0.5,1e-45}``,
    :mod:`features.compile.listtext`).
    """
    columns = []
    for col in table.columns:
        t = col.type
        if pa.types.is_timestamp(t) and t.tz is not None:
            col = col.cast(pa.timestamp(t.unit, "UTC")).cast(pa.timestamp(t.unit))
        elif pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
            col = pa.chunked_array([list_text(c, POSTGRES) for c in col.chunks], pa.string())  # {0.5,1}
        columns.append(col)
    data = pa.table(columns, names=table.column_names)
    buf = io.BytesIO()
    # Batch by batch, skipping empty ones: pyarrow 16's write_csv emits garbage (NUL
    # bytes, a repeated header) for a table whose first chunk is empty.
    with pacsv.CSVWriter(buf, data.schema, write_options=_CSV) as writer:
        for batch in data.to_batches():
            if batch.num_rows:
                writer.write_batch(batch)
    return buf.getvalue()


#: The advisory lock every writer of a schema holds shared while it writes (a load from its
#: first unit to its last aggregation, a stream for one micro-batch), and ``features
#: migrate --apply`` takes exclusively around its transaction: the key, as SQL over the
#: schema name (``%s``) in the namespace the tables go to (``current_schema()``).
WRITERS_LOCK = "hashtextextended('featureline:writers:' || coalesce(current_schema(), '') || ':' || %s, 0)"
#: The advisory lock ``features migrate --apply`` holds exclusively from before it waits for
#: the writers until its transaction ends: a writer that cannot take it shared between two
#: batches stops writing and lets the migration go first.
MIGRATING_LOCK = ("hashtextextended('featureline:migrating:' || coalesce(current_schema(), '') || ':' || %s, "
                  "0)")


class WriterGuard:
    """Keeps a writer of schema ``compiled`` (a load, a stream) and ``features migrate
    --apply`` from overlapping (docs/evolution.md, "Writers during a migration").

    :meth:`enter` before each unit: holds :data:`WRITERS_LOCK` shared (waiting while a
    migration runs) and checks that no migration waits and that the stores still hold
    this fingerprint. When one waits, ``drain`` finishes the units in flight (both stores),
    the lock is let go, the migration runs, and SinkError says the stores moved on: the
    writer stops between batches with every unit it wrote in both stores. :meth:`release`
    when the writer has nothing in flight (a micro-batch done, the load's end). Its own
    Postgres connection (session-level locks)."""

    def __init__(self, dsn: str, compiled: CompiledSchema, *, search_path: str | None = None,
                 what: str = "load", retries: int = 5, backoff_s: float = 0.5) -> None:
        self.dsn = dsn
        self.compiled = compiled
        self.search_path = search_path
        self.what = what
        #: a lost connection (Postgres restarting) is retried as PostgresSink retries its
        #: writes: ``retries`` attempts, ``backoff_s`` doubling; the lock is taken again
        self.retries = retries
        self.backoff_s = backoff_s
        self._conn: Any = None
        self._held = False

    def open(self) -> None:
        self._conn = pg.connect(self.dsn, autocommit=True, utc=True, search_path=self.search_path)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()  # a session's advisory locks end with it
            self._conn = None
            self._held = False

    def _run(self, what: str, fn: Callable[[Any], T]) -> T:
        """``fn(conn)`` on the guard's connection; a lost connection is reconnected and
        retried with backoff (the session's locks went with it: ``_held`` is cleared, and
        ``fn`` must take what it needs again), then SinkUnavailable."""
        def attempt() -> T:
            if self._conn is None or self._conn.closed:
                self._held = False
                self.open()
            return fn(self._conn)

        def reset() -> None:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            self._held = False

        def give_up(exc: BaseException, attempts: int) -> SinkUnavailable:
            where = pg.address(self.dsn)
            return SinkUnavailable(f"Postgres at {where}: {what} failed after {attempts} attempts: "
                                   f"{str(exc).strip()}", store="postgres", address=where)

        with pg.map_psycopg_errors(self.dsn, what):
            return retrying(attempt, attempts=self.retries, backoff_s=self.backoff_s,
                            transient=(psycopg.OperationalError, SinkUnavailable), reset=reset,
                            give_up=give_up)

    def enter(self, drain: Callable[[], None]) -> None:
        """Before a unit is written: return when it may be written; else (a migration
        waits, or the stores hold another version) ``drain()``, let the migration run,
        and raise SinkError naming the version the stores moved to."""
        name = self.compiled.name

        def check(conn: Any) -> Any:
            if not self._held:  # again after a reconnect: the lost session held it
                conn.execute(f"SELECT pg_advisory_lock_shared({WRITERS_LOCK})", (name,))
                self._held = True
            return conn.execute(
                f"SELECT CASE WHEN pg_try_advisory_lock_shared({MIGRATING_LOCK}) THEN "
                f"pg_advisory_unlock_shared({MIGRATING_LOCK}) ELSE false END, (SELECT fingerprint FROM "
                f"{quote_ident(SCHEMAS_TABLE)} WHERE schema_name = %s)", (name, name, name)).fetchone()

        while True:
            gate, fp = self._run("the version check", check)
            if gate and fp == self.compiled.fingerprint:
                return
            drain()
            self.release()
            self._stop_if_moved()

    def release(self) -> None:
        """Nothing of this writer is in flight: a migration may run."""
        if self._held and self._conn is not None and not self._conn.closed:
            self._run("the writers' lock", lambda conn: conn.execute(
                f"SELECT pg_advisory_unlock_shared({WRITERS_LOCK})", (self.compiled.name,)))
        self._held = False

    def _stop_if_moved(self) -> None:
        name = self.compiled.name

        def after_migration(conn: Any) -> Any:
            conn.execute(f"SELECT pg_advisory_lock_shared({MIGRATING_LOCK})", (name,))
            conn.execute(f"SELECT pg_advisory_unlock_shared({MIGRATING_LOCK})", (name,))
            return conn.execute(f"SELECT version, fingerprint FROM {quote_ident(SCHEMAS_TABLE)} "
                                "WHERE schema_name = %s", (name,)).fetchone()

        row = self._run("the version check", after_migration)
        if row is None or row[1] == self.compiled.fingerprint:
            return  # no migration happened (refused, failed): write on
        raise SinkError(
            f"the stores were migrated to {name} {row[0]} (fingerprint {row[1][:12]}) while this {self.what} "
            f"wrote {self.compiled.schema.version_str} (fingerprint {self.compiled.fingerprint[:12]}): it "
            "stopped between batches, and every batch it wrote is in both stores; run it again with the "
            "schema file of that version (the rows already stored count as already present)",
            store="postgres")


class PostgresSink:
    """Cold rows, rejects and the commit ledger in one Postgres database."""

    name = "postgres"

    def __init__(self, dsn: str, compiled: CompiledSchema, *, search_path: str | None = None,
                 retries: int = 5, backoff_s: float = 0.5) -> None:
        if not compiled.schema.loadable:
            raise SinkError(f"schema {compiled.name!r} is validation-only (no entity/event_time): "
                            "it cannot be loaded into Postgres", store=self.name)
        self.dsn = dsn
        self.address = pg.address(dsn)
        self.compiled = compiled
        self.search_path = search_path
        self.retries = retries
        self.backoff_s = backoff_s
        schema = compiled.schema
        self.table = cold_table_name(schema)
        self.rejects_table = rejects_table_name(schema)
        keys = cold_keys(schema)
        stored = [name for name in stored_fields(schema, "cold") if name not in keys]
        features = list(schema.stored_features("cold"))

        #: a static schema (``event_time: none``): one row per entity, newest version wins
        #: (``features.sinks.redis``, "a static schema's row version")
        self.static = schema.static
        self.columns: tuple[str, ...] = (*keys, *stored, *features, DIGEST, *LINEAGE_COLUMNS)
        #: the history's key: every distinct event of one (entity, event time) is kept; a
        #: static schema's table is keyed by the entity alone
        self.keys: tuple[str, ...] = tuple(keys) if self.static else (*keys, DIGEST)
        self.aggregates_table = aggregates_table_name(schema)
        self.aggregate_values = stored_aggregations(schema, "cold")
        self.aggregate_columns: tuple[str, ...] = (
            *keys, *self.aggregate_values, *LINEAGE_COLUMNS)
        self.reject_columns = ("_source", "row_index", "raw", "errors", "event_time", "_schema_name",
                               "_schema_version", "_schema_fingerprint", "_run_id", "_ingested_at")
        self._conn: Any = None
        #: table name -> {column: Postgres type name}, read from the catalog on first use
        self._types: dict[str, dict[str, str]] = {}
        #: staging tables created on the current connection (see ``_insert_new``)
        self._staged: set[str] = set()

    # --- connection ---------------------------------------------------------------

    def _connect(self) -> Any:
        # TimeZone=UTC: COPY data carries zoned timestamps as UTC wall clock (see copy_csv).
        return pg.connect(self.dsn, utc=True, search_path=self.search_path)

    def _retrying(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)``; on a lost connection reconnect and retry with backoff (then
        SinkUnavailable); any other driver error becomes SinkError "Postgres refused <what>"."""
        def attempt() -> T:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
                self._staged.clear()
            try:
                return fn(self._conn)
            except BaseException:
                self._staged.clear()  # the failed transaction may have taken a CREATE back
                raise

        def reset() -> None:
            if self._conn is not None:
                self._conn.close()
            self._conn = None

        def give_up(exc: BaseException, attempts: int) -> SinkUnavailable:
            return SinkUnavailable(f"Postgres at {self.address}: {what} failed after {attempts} attempts: "
                                   f"{str(exc).strip()}", store=self.name, address=self.address)

        # a refusal no retry cures (a constraint, a table gone) is a SinkError naming it,
        # never the driver's own exception (callers map SinkError to their answers)
        with pg.map_psycopg_errors(self.dsn, what):
            return retrying(attempt, attempts=self.retries, backoff_s=self.backoff_s,
                            transient=(psycopg.OperationalError, SinkUnavailable), reset=reset,
                            give_up=give_up)

    def open(self) -> None:
        self._conn = self._connect()
        try:
            self._retrying("schema check", self._prepare)
        except BaseException:
            self.close()
            raise

    def _prepare(self, conn: Any) -> None:
        schema = self.compiled.schema
        with conn.transaction():
            # One applier at a time per namespace (the first schema of the search_path, where
            # the tables go): every schema's DDL also creates the namespace's shared tables
            # (featureline_schemas, the ledger), so a lock per schema name let two loaders of
            # different schemas race there (a unique violation on pg_type) and made loaders of
            # one schema into two namespaces wait on each other.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('featureline:ddl:' || "
                         "coalesce(current_schema(), '')))")
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                  (quote_ident(self.table),)).fetchone()[0]
            if not exists:
                conn.execute(self.compiled.ddl)
            elif not conn.execute("SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = "
                                  "to_regclass(%s) AND attname = %s AND attnotnull AND NOT attisdropped)",
                                  (quote_ident(self.table), DIGEST)).fetchone()[0]:
                raise SinkError(
                    f"table {self.table!r} predates content digests (it is keyed by entity and event "
                    f"time alone, so it keeps one event per instant, or its migration stopped half way): "
                    f"its {DIGEST!r} column is missing or not filled; "
                    "move it to the new key first: features migrate <its schema file> (a dry run, then "
                    "--apply; docs/evolution.md, \"Events at one instant\")",
                    store=self.name, address=self.address)
            if exists:
                self._add_missing_indexes(conn, self.rejects_table, rejects_index_names(schema),
                                          rejects_indexes(schema))
            conn.execute(LEDGER_DDL)
            conn.execute(GATE_VERDICTS_DDL)
            conn.execute(RUN_COUNTS_DDL)
            # only when missing: an ALTER TABLE locks the ledger out of every load's unit
            if not conn.execute("SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                                "AND attname = 'content' AND NOT attisdropped)",
                                (quote_ident(LEDGER_TABLE),)).fetchone()[0]:
                conn.execute(LEDGER_CONTENT_DDL)
            conn.execute(versions_table())
            row = conn.execute(
                f"SELECT version, fingerprint FROM {quote_ident(SCHEMAS_TABLE)} WHERE schema_name = %s",
                (schema.name,)).fetchone()
            if row is not None and row[1] == self.compiled.fingerprint:
                # the version's YAML text, so that readers can rebuild this layout once the
                # schema moves on (features migrate, docs/evolution.md)
                conn.execute(record_version(schema, self.compiled.fingerprint))
                if exists:  # a table of this version, perhaps created before its indexes (looked
                    # up first: CREATE INDEX locks the table against writers even when it exists)
                    self._add_missing_indexes(conn, self.table, history_index_names(schema),
                                              history_indexes(schema))
        if row is None:
            raise SinkError(f"table {self.table!r} exists but {SCHEMAS_TABLE} has no fingerprint for "
                            f"schema {schema.name!r}; apply sql/{schema.name}.sql", store=self.name,
                            address=self.address)
        version, fp = row
        if fp != self.compiled.fingerprint:
            raise SinkError(
                f"table {self.table!r} was created for schema {schema.name} {version} "
                f"(fingerprint {fp[:12]}), but this schema is {schema.version_str} "
                f"(fingerprint {self.compiled.fingerprint[:12]}): {mismatch_hint(schema, version)}",
                store=self.name, address=self.address)

    @staticmethod
    def _add_missing_indexes(conn: Any, table: str, names: Sequence[str], ddl: str) -> None:
        """``ddl`` (the ``CREATE INDEX IF NOT EXISTS`` statements of the indexes ``names``) on
        a ``table`` created before them: run once, here, when one is missing (looked up
        first: ``CREATE INDEX`` blocks writes to the table while it builds, about a second
        per million rows, docs/ui.md; nothing for a table not created yet)."""
        present = conn.execute("SELECT count(to_regclass(n)) FROM unnest(%s::text[]) n",
                               ([quote_ident(n) for n in names],)).fetchone()[0]
        if present == len(names) or not conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                                                     (quote_ident(table),)).fetchone()[0]:
            return
        t0 = time.perf_counter()
        conn.execute(ddl)
        log.info("indexes added", extra={"table": table, "indexes": list(names),
                                         "seconds": round(time.perf_counter() - t0, 3)})

    def record_gate_verdict(self, run_id: str, gates: Sequence[Mapping[str, Any]]) -> None:
        """One run's gates as judged (each a mapping of :data:`GATE_VERDICT_COLUMNS`) in
        :data:`GATE_VERDICTS_TABLE`, in one transaction; a second record of the same run
        replaces the first's rows."""
        if not gates:
            return
        rows = [(self.compiled.name, run_id, *(g[c] for c in GATE_VERDICT_COLUMNS)) for g in gates]
        cols = ", ".join(quote_ident(c) for c in ("schema_name", "run_id", *GATE_VERDICT_COLUMNS))
        table = quote_ident(GATE_VERDICTS_TABLE)
        marks = ", ".join(["%s"] * (2 + len(GATE_VERDICT_COLUMNS)))

        def run(conn: Any) -> None:
            with conn.transaction():
                conn.execute(f"DELETE FROM {table} WHERE schema_name = %s AND run_id = %s",
                             (self.compiled.name, run_id))
                with conn.cursor() as cur:
                    cur.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)

        self._retrying("gate verdict write", run)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # --- ledger -------------------------------------------------------------------

    def committed_units(self) -> set[str]:
        """Ledger keys already committed for this schema fingerprint."""
        def fetch(conn: Any) -> set[str]:
            rows = conn.execute(
                f"SELECT unit FROM {quote_ident(LEDGER_TABLE)} WHERE schema_name = %s AND fingerprint = %s",
                (self.compiled.name, self.compiled.fingerprint)).fetchall()
            conn.rollback()
            return {r[0] for r in rows}

        return self._retrying("ledger read", fetch)

    # --- writes -------------------------------------------------------------------

    def write(self, unit: WriteUnit) -> WriteResult:
        t0 = time.perf_counter()
        result = self._retrying("write", lambda conn: self._write(conn, unit))
        return dataclasses.replace(result, seconds=time.perf_counter() - t0)

    def _write(self, conn: Any, unit: WriteUnit) -> WriteResult:
        with conn.transaction():
            if unit.unit is not None:
                # Claim the unit first: a loader of the same unit elsewhere waits here until
                # this transaction ends, then finds its ledger row. The FOR UPDATE below locks
                # no row while none exists, so two loaders both went on and the second died on
                # the ledger's primary key.
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                             (f"featureline:unit:{self.compiled.name}:{self.compiled.fingerprint}:"
                              f"{unit.unit}",))
                done = conn.execute(
                    f"SELECT 1 FROM {quote_ident(LEDGER_TABLE)} WHERE schema_name = %s AND "
                    "fingerprint = %s AND unit = %s FOR UPDATE",
                    (self.compiled.name, self.compiled.fingerprint, unit.unit)).fetchone()
                if done:
                    return WriteResult(skipped=True)
            rows = with_digest(unit.rows, self.compiled.schema).select(list(self.columns))
            stored = 0
            if rows.num_rows:
                if self.static:
                    stored = self._upsert_static(conn, rows)
                elif unit.unit is not None:
                    try:
                        with conn.transaction():  # savepoint: a key conflict falls back below
                            self._copy(conn, self.table, self.columns, rows)
                        stored = rows.num_rows
                    except psycopg.errors.UniqueViolation:
                        stored = self._insert_new(conn, self.table, self.columns, rows)
                else:
                    stored = self._insert_probed(conn, rows)
            rejects_stored, held = 0, None
            if unit.rejects.num_rows and self._content_committed(conn, unit):
                held = np.arange(unit.rejects.num_rows, dtype=np.int64)  # stored with that unit
            elif unit.rejects.num_rows:
                rejects = unit.rejects.select(list(self.reject_columns))
                rejects_stored, held = self._insert_rejects(conn, rejects)
            n_held = len(held) if held is not None else 0
            # the run's counts (pipeline.write.account): a reject held already is already present
            counts = (unit.read, stored, rows.num_rows - stored + n_held, unit.rejects.num_rows - n_held)
            if unit.unit is not None:
                conn.execute(
                    f"INSERT INTO {quote_ident(LEDGER_TABLE)} (schema_name, fingerprint, unit, run_id, "
                    "read, stored, already_present, rejected, content) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (self.compiled.name, self.compiled.fingerprint, unit.unit,
                     _first(unit.rows, unit.rejects, "_run_id"), *counts, unit.content))
            elif unit.counted is not None and (rows.num_rows or unit.rejects.num_rows):
                conn.execute(RUN_COUNTS_UPSERT, (self.compiled.name, self.compiled.fingerprint,
                                                 _first(unit.rows, unit.rejects, "_run_id"), unit.counted,
                                                 *counts))
        return WriteResult(stored, rows.num_rows - stored, rejects_stored, rejects_held=held)

    def _content_committed(self, conn: Any, unit: WriteUnit) -> bool:
        """Whether the ledger holds a unit of ``unit.content`` (another run's write of the
        same input, whose rejects are stored under its own ``_source``). Writers of one
        content are serialised (a transaction advisory lock): the second sees the first's."""
        if unit.unit is None or unit.content is None:
            return False
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                     (f"featureline:content:{self.compiled.name}:{self.compiled.fingerprint}:{unit.content}",))
        return conn.execute(
            f"SELECT EXISTS (SELECT 1 FROM {quote_ident(LEDGER_TABLE)} WHERE schema_name = %s AND "
            "fingerprint = %s AND content = %s)",
            (self.compiled.name, self.compiled.fingerprint, unit.content)).fetchone()[0] is True

    def _insert_rejects(self, conn: Any, rejects: pa.Table) -> tuple[int, npt.NDArray[np.int64] | None]:
        """Insert the rejects whose key (``_source``, fingerprint) is new, in one statement
        that also says which the table held already (an earlier run read those records).
        Returns (inserted, those rows' positions in ``rejects`` or None when none was held)."""
        stage = quote_ident(self._stage(conn, self.rejects_table, self.reject_columns, rejects))
        cols = ", ".join(quote_ident(c) for c in self.reject_columns)
        src = quote_ident(SOURCE)
        found = conn.execute(
            f"WITH ins AS (INSERT INTO {quote_ident(self.rejects_table)} ({cols}) SELECT {cols} FROM {stage} "
            f"ORDER BY \"_ord\" ON CONFLICT DO NOTHING RETURNING {src}) "
            f"SELECT 0 AS kind, count(*) AS n, (SELECT min(\"_ord\") FROM {stage}) AS first FROM ins "
            f"UNION ALL SELECT 1, s.\"_ord\", NULL FROM {stage} s "
            f"WHERE NOT EXISTS (SELECT 1 FROM ins i WHERE i.{src} = s.{src})").fetchall()
        head = next(r for r in found if r[0] == 0)
        held = np.fromiter((r[1] - head[2] for r in found if r[0] == 1), np.int64)
        return int(head[1]), (held if len(held) else None)

    def insert_rejects(self, rejects: pa.Table) -> int:
        """Reject rows alone (the aggregations' late events); replays insert nothing."""
        if rejects.num_rows == 0:
            return 0

        def run(conn: Any) -> int:
            with conn.transaction():
                return self._insert_new(conn, self.rejects_table, self.reject_columns,
                                        rejects.select(list(self.reject_columns)), raw_json=True)

        return self._retrying("rejects write", run)

    def rejected_by(self, sources: pa.Array, rule: str) -> pa.Array:
        """Of ``sources`` (distinct record sources), those with a stored reject whose first
        error is ``rule`` (any version of the schema): one indexed lookup (the rejects'
        key starts with ``_source``)."""
        if len(sources) == 0:
            return pa.array([], pa.string())
        wanted = sources.cast(pa.string()).to_pylist()  # a few records: those a restart replays

        def run(conn: Any) -> list[Any]:
            with conn.transaction():
                return list(conn.execute(
                    f"SELECT {quote_ident(SOURCE)} FROM {quote_ident(self.rejects_table)} "
                    f"WHERE {quote_ident(SOURCE)} = ANY(%s) AND errors->0->>'rule' = %s",
                    (wanted, rule)).fetchall())

        return pa.array([r[0] for r in self._retrying("rejects read", run)], pa.string())

    def upsert_aggregates(self, rows: pa.Table, *, new: bool = False) -> int:
        """Aggregation values, one row per (entity, event time): a new key is inserted, an
        existing one updated only where a value differs (a late event changed it). Rows
        must hold each key once. Returns how many rows were inserted or changed.

        The keys are looked up first and the new ones COPYed straight in (about half the
        server time of the upsert), the others upserted; past half stored, everything takes
        the upsert. ``new``: the caller expects every key to be new (a first backfill of
        its entities): no lookup, one COPY, and the lookup only if a key was stored."""
        if rows.num_rows == 0:
            return 0
        table, cols = self.aggregates_table, self.aggregate_columns
        keys = cols[:2]
        names = ", ".join(quote_ident(c) for c in cols)
        values = [quote_ident(c) for c in self.aggregate_values]
        if values:
            sets = ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in cols[2:])
            target = ", ".join(f"t.{v}" for v in values)
            excluded = ", ".join(f"EXCLUDED.{v}" for v in values)
            action = (f"DO UPDATE SET {sets} WHERE ({target}, NULL) IS DISTINCT FROM ({excluded}, NULL)")
        else:
            action = "DO NOTHING"
        stage = f"_stage_{table}"[:63]
        data = rows.select(list(cols))

        def upsert(conn: Any, part: pa.Table) -> int:
            conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {quote_ident(stage)} "
                         f"(LIKE {quote_ident(table)} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
            self._copy(conn, stage, cols, part)
            cur = conn.execute(
                f"INSERT INTO {quote_ident(table)} AS t ({names}) "
                f"SELECT {names} FROM {quote_ident(stage)} "
                f"ON CONFLICT ({', '.join(quote_ident(k) for k in keys)}) {action}")
            conn.execute(f"TRUNCATE {quote_ident(stage)}")
            return int(cur.rowcount)

        def run(conn: Any) -> int:
            with conn.transaction():
                if new:
                    try:
                        with conn.transaction():  # savepoint: a stored key falls back below
                            self._copy(conn, table, cols, data)
                        return int(data.num_rows)
                    except psycopg.errors.UniqueViolation:
                        pass
                stored = self._stored_positions(conn, table, data, keys)
                if len(stored) * 2 > data.num_rows:
                    return upsert(conn, data)
                old = np.zeros(data.num_rows, dtype=np.bool_)
                old[stored] = True
                fresh = data.filter(pa.array(~old))
                try:
                    with conn.transaction():  # savepoint: a key stored meanwhile falls back below
                        self._copy(conn, table, cols, fresh)
                except psycopg.errors.UniqueViolation:
                    return upsert(conn, data)
                return int(fresh.num_rows) + (upsert(conn, data.filter(pa.array(old))) if len(stored) else 0)

        return self._retrying("aggregates write", run)

    def read_history(self, ranges: pa.Table, fields: dict[str, pa.DataType], *,
                     exclude_run: str | None = None, aggregated: bool = False
                     ) -> tuple[pa.Array, pa.Array, dict[str, pa.Array], pa.Array]:
        """History rows in per-entity event-time ranges, for the aggregations' windows.

        ``ranges`` has columns ``entity``, ``lo``, ``hi`` (one row per entity, times of the
        event time's type): the rows of that entity with ``lo <= event time < hi`` come
        back as arrays: the entity, the event time in microseconds since the epoch (exact),
        ``{field: values}`` (read as the given Arrow types) and ``_source``; rows that run
        ``exclude_run`` wrote are left out (the caller holds them). ``aggregated``: of an
        entity that holds aggregation rows, only the events that hold one (the others were
        late for a stream: they update no aggregation). One COPY in (the ranges), one COPY
        out as CSV, parsed by Arrow in C++: no loop per row.
        """
        join = 'ON h.{ent} = r."entity" AND h.{et} >= r."lo" AND h.{et} < r."hi"'
        where = ' WHERE h."_run_id" <> {run}' if exclude_run is not None else ""
        if aggregated:
            agg = quote_ident(self.aggregates_table)
            where += (" AND " if where else " WHERE ") + (
                f"(NOT EXISTS (SELECT 1 FROM {agg} a WHERE a.{{ent}} = h.{{ent}}) OR EXISTS "
                f"(SELECT 1 FROM {agg} a WHERE a.{{ent}} = h.{{ent}} AND a.{{et}} = h.{{et}}))")
        return self._read_rows(ranges.select(["entity", "lo", "hi"]), fields, join + where,
                               {"run": exclude_run})

    def read_accepted(self, entities: pa.Array, fields: dict[str, pa.DataType], horizon_us: int
                      ) -> tuple[pa.Array, pa.Array, dict[str, pa.Array], pa.Array]:
        """The events of ``entities`` that hold an aggregation row (the stream accepted
        them, or a backfill computed them) within ``horizon_us`` before each entity's newest
        such event: a stream's aggregation state, read back. Same columns as
        :meth:`read_history`."""
        schema = self.compiled.schema
        keys = (schema.entity, schema.event_time)
        agg = quote_ident(self.aggregates_table)
        join = ('CROSS JOIN LATERAL (SELECT max(a.{et}) AS "newest" FROM ' + agg + ' a '
                'WHERE a.{ent} = r."entity") n '
                'JOIN {hist} h ON h.{ent} = r."entity" '
                'AND h.{et} >= n."newest" - {horizon} * interval \'1 microsecond\' '
                'WHERE EXISTS (SELECT 1 FROM ' + agg + ' a WHERE a.{ent} = h.{ent} AND a.{et} = h.{et})')
        assert all(keys)
        return self._read_rows(pa.table({"entity": entities}), fields, join, {"horizon": int(horizon_us)})

    def _read_rows(self, stage_rows: pa.Table, fields: dict[str, pa.DataType], join: str,
                   params: dict[str, Any]) -> tuple[pa.Array, pa.Array, dict[str, pa.Array], pa.Array]:
        """``SELECT`` entity, event time (us), ``fields``, ``_source`` ``FROM`` a temporary
        table of ``stage_rows`` (columns ``entity`` and maybe ``lo``/``hi``, typed as the
        history's key columns) ``r`` joined by ``join`` to the history ``h``: one COPY in,
        one COPY out (CSV, parsed by Arrow)."""
        schema = self.compiled.schema
        entity, event_time = schema.entity, schema.event_time
        assert entity is not None and event_time is not None
        entity_type = stage_rows.schema.field("entity").type
        if stage_rows.num_rows == 0:
            return _history_columns(b"", fields, entity_type)

        stage = "_featureline_history_" + "_".join(stage_rows.column_names)
        ent, et = quote_ident(entity), quote_ident(event_time)
        picked = "".join(f", h.{quote_ident(f)}" for f in fields)
        body = join.replace("{ent}", ent).replace("{et}", et).replace("{hist}", quote_ident(self.table))
        query = sql.SQL(f"COPY (SELECT h.{ent}, (extract(epoch FROM h.{et}) * 1000000)::bigint{picked}, "
                        f"h.{quote_ident('_source')} FROM {quote_ident(stage)} r "
                        + ("" if body.startswith("CROSS") else f"JOIN {quote_ident(self.table)} h ")
                        + body + ") TO STDOUT (FORMAT csv)").format(
            **{k: sql.Literal(v) for k, v in params.items() if "{" + k + "}" in body})

        def run(conn: Any) -> bytes:
            buf = io.BytesIO()
            with conn.transaction():
                types = self._column_types(conn, self.table)
                if not types:
                    return b""  # no history table yet: nothing stored before
                cols = {"entity": types[entity], "lo": types[event_time], "hi": types[event_time]}
                conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {quote_ident(stage)} ("
                             + ", ".join(f'"{c}" {cols[c]}' for c in stage_rows.column_names)
                             + ") ON COMMIT DELETE ROWS")
                self._copy(conn, stage, tuple(stage_rows.column_names), stage_rows)
                conn.execute(f"ANALYZE {quote_ident(stage)}")
                with conn.cursor() as cur, cur.copy(query) as copy:
                    for chunk in copy:
                        buf.write(chunk)
            return buf.getvalue()

        return _history_columns(self._retrying("history read", run), fields, entity_type)

    def _column_types(self, conn: Any, table: str) -> dict[str, str]:
        if table not in self._types:
            rows = conn.execute(
                "SELECT attname, atttypid::regtype::text FROM pg_attribute "
                "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
                (quote_ident(table),)).fetchall()
            if not rows:
                return {}
            self._types[table] = {name: kind for name, kind in rows}
        return self._types[table]

    def _copy(self, conn: Any, table: str, columns: tuple[str, ...], data: pa.Table) -> None:
        """COPY ``data`` into ``table``: binary when every column's type allows it
        (Postgres parses it with less work), else CSV."""
        types = self._column_types(conn, table)
        encoded = copy_binary(data, [types.get(c, "") for c in columns])
        if encoded is None:
            cols = ", ".join(quote_ident(c) for c in columns)
            with conn.cursor() as cur, cur.copy(
                    f"COPY {quote_ident(table)} ({cols}) FROM STDIN (FORMAT csv)") as copy:
                copy.write(copy_csv(data))
            return
        parts, order = encoded
        cols = ", ".join(quote_ident(columns[i]) for i in order)
        with conn.cursor() as cur, cur.copy(
                f"COPY {quote_ident(table)} ({cols}) FROM STDIN (FORMAT binary)") as copy:
            for part in parts:
                copy.write(part)

    def _insert_probed(self, conn: Any, rows: pa.Table) -> int:
        """Rows of a unit without a ledger key (a stream's micro-batch), each distinct event
        (entity, event time, digest) once, like :meth:`_insert_new` but cheaper for the
        usual unit that holds few stored events: the unit's first row of each key is kept,
        its keys are COPYed into a temporary table and looked up in the cold table, and
        the rows with new keys are COPYed straight in (a multi-row insert: about half the
        server time of ``INSERT ... SELECT ... ON CONFLICT``). When another writer stored
        one of those events in between, the COPY fails on the key and the unit takes
        :meth:`_insert_new` instead. Returns how many rows were inserted."""
        n = rows.num_rows
        pos = pa.array(np.arange(n, dtype=np.int64))
        names = [f"k{i}" for i in range(len(self.keys))]
        probe = pa.table({**{k: rows.column(c) for k, c in zip(names, self.keys, strict=True)}, "p": pos})
        firsts = probe.group_by(names, use_threads=False).aggregate([("p", "min")]).column("p_min")
        keep = np.zeros(n, dtype=np.bool_)
        keep[firsts.to_numpy()] = True
        keep[self._stored_positions(conn, self.table, rows, self.keys)] = False
        new = rows if keep.all() else rows.filter(pa.array(keep))
        if new.num_rows == 0:
            return 0
        try:
            with conn.transaction():  # savepoint: a key stored meanwhile falls back below
                self._copy(conn, self.table, self.columns, new)
            return int(new.num_rows)
        except psycopg.errors.UniqueViolation:
            return self._insert_new(conn, self.table, self.columns, rows)

    def _upsert_static(self, conn: Any, rows: pa.Table) -> int:
        """A static schema's rows (one per entity): staged, then per entity the row of the
        greatest version (``_ingested_at``, then ``_digest``, :mod:`features.kernels.digest`)
        is inserted, or replaces the stored row whose version is smaller. Returns how many rows
        were inserted or replaced; the others (an entity's smaller versions in the unit, or
        a version not above the stored one) are already present."""
        stage = quote_ident(self._stage(conn, self.table, self.columns, rows))
        table = quote_ident(self.table)
        ent, at, dg = (quote_ident(c) for c in (self.columns[0], INGESTED_AT, DIGEST))
        cols = ", ".join(quote_ident(c) for c in self.columns)
        assign = ", ".join(f"{quote_ident(c)} = EXCLUDED.{quote_ident(c)}" for c in self.columns[1:])
        cur = conn.execute(
            f"INSERT INTO {table} AS t ({cols}) SELECT DISTINCT ON ({ent}) {cols} FROM {stage} "
            f"ORDER BY {ent}, {at} DESC, {dg} COLLATE \"C\" DESC "
            f"ON CONFLICT ({ent}) DO UPDATE SET {assign} "
            f"WHERE (EXCLUDED.{at}, EXCLUDED.{dg} COLLATE \"C\") > (t.{at}, t.{dg} COLLATE \"C\")")
        return int(cur.rowcount)

    def _stored_positions(self, conn: Any, table: str, rows: pa.Table, keys: tuple[str, ...]) -> Any:
        """Positions of ``rows`` whose key (the columns ``keys``) ``table`` already holds:
        the keys are COPYed into a temporary table and each looked up in the table's
        primary key."""
        stage = f"_keys{len(keys)}_{table}"[:63]
        if stage not in self._staged:  # see _insert_new
            names = ", ".join(quote_ident(k) for k in keys)
            conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {quote_ident(stage)} ON COMMIT DELETE ROWS AS "
                         f"SELECT {names}, 0::bigint AS \"_pos\" FROM {quote_ident(table)} WITH NO DATA")
            self._staged.add(stage)
        pos = pa.array(np.arange(rows.num_rows, dtype=np.int64))
        probe = pa.table({**{k: rows.column(k) for k in keys}, "_pos": pos})
        self._copy(conn, stage, (*keys, "_pos"), probe)
        on = " AND ".join(f"t.{quote_ident(k)} = s.{quote_ident(k)}" for k in keys)
        # a nested loop over the keys, each an index lookup (LATERAL ... LIMIT 1): the
        # temporary table has no statistics, and a hash join would read the whole table
        lookup = f"(SELECT 1 FROM {quote_ident(table)} t WHERE {on} LIMIT 1) hit"
        stored = conn.execute(
            f"SELECT s.\"_pos\" FROM {quote_ident(stage)} s CROSS JOIN LATERAL {lookup}").fetchall()
        conn.execute(f"TRUNCATE {quote_ident(stage)}")  # a second probe in this transaction
        return np.fromiter((r[0] for r in stored), np.int64, len(stored))

    def _insert_new(self, conn: Any, table: str, columns: tuple[str, ...], data: pa.Table, *,
                    raw_json: bool = False) -> int:
        """COPY into a temporary table, then insert the rows whose key is new, first
        occurrence (input order) winning. Returns how many rows were inserted."""
        stage = self._stage(conn, table, columns, data)
        cols = ", ".join(quote_ident(c) for c in columns)
        cur = conn.execute(
            f"INSERT INTO {quote_ident(table)} ({cols}) SELECT {cols} FROM {quote_ident(stage)} "
            f"ORDER BY \"_ord\" ON CONFLICT DO NOTHING")
        return int(cur.rowcount)

    def _stage(self, conn: Any, table: str, columns: tuple[str, ...], data: pa.Table) -> str:
        """COPY ``data`` into ``table``'s temporary staging table (with ``_ord``, the input
        order); returns its name."""
        stage = f"_stage_{table}"[:63]
        if stage not in self._staged:
            # Once per connection (``_staged`` is cleared whenever a transaction fails, which
            # may have taken the CREATE back): the table empties itself at every commit and a
            # rollback takes its rows back, so a unit needs no TRUNCATE (a catalog change).
            conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {quote_ident(stage)} "
                         f"(LIKE {quote_ident(table)} INCLUDING DEFAULTS, \"_ord\" bigserial) "
                         "ON COMMIT DELETE ROWS")
            self._staged.add(stage)
        self._copy(conn, stage, columns, data)
        return stage


def _history_columns(data: bytes, fields: dict[str, pa.DataType], entity_type: pa.DataType
                     ) -> tuple[pa.Array, pa.Array, dict[str, pa.Array], pa.Array]:
    """``read_history``'s CSV (Postgres' COPY: NULL unquoted-empty, '' quoted) as Arrow:
    entity, time_us, {field: values}, _source."""
    types = [entity_type, pa.int64(), *fields.values(), pa.string()]
    names = [f"c{i}" for i in range(len(types))]  # positional: a field may share any name
    if data:
        convert = pacsv.ConvertOptions(column_types=dict(zip(names, types, strict=True)),
                                       strings_can_be_null=True, quoted_strings_can_be_null=False,
                                       null_values=[""], true_values=["t"], false_values=["f"])
        read = pacsv.ReadOptions(column_names=names, block_size=1 << 24)
        parse = pacsv.ParseOptions(newlines_in_values=True)
        table = pacsv.read_csv(io.BytesIO(data), read_options=read, parse_options=parse,
                               convert_options=convert).combine_chunks()
        cols = [c.combine_chunks() for c in table.columns]
    else:
        cols = [pa.array([], t) for t in types]
    return cols[0], cols[1], dict(zip(fields, cols[2:-1], strict=True)), cols[-1]


def _first(rows: pa.Table, rejects: pa.Table, column: str) -> str:
    for t in (rows, rejects):
        if t.num_rows:
            return str(t.column(column)[0].as_py())
    return ""
