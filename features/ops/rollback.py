"""``features rollback --run RUN_ID``: undo a load (or a stream run) from its lineage.

Every stored row carries the run that wrote it (``_run_id``), so a bad run can be taken
out of both stores and the stores put back as if it had never run:

1. **plan** (one transaction): the entities the run wrote (history and aggregates rows
   with its ``_run_id``) and its ledger units are written to a journal
   (``featureline_rollbacks``, ``featureline_rollback_entities``) before anything is
   deleted, because the deletion takes that knowledge away. Runs that wrote one of those
   entities *after* the run started (history rows with a later ``_ingested_at``) make the
   rollback refuse (:class:`LaterRuns`, naming them) unless they are rolled back too
   (``include_later``: the same closure over their entities);
2. **delete** (one transaction): the runs' history rows, rejects, ledger rows and counts
   (``featureline_run_counts``: a stream run's); their aggregates rows whose event no
   longer has a history row (an aggregates row the run rewrote for an earlier event
   stays, and step 3 puts its value back);
3. **restore**, entity by entity in chunks, from what Postgres now holds: each touched
   entity's Redis hashes (hot features, hot aggregations, request-time tiles) are
   deleted, its aggregations computed again over its remaining history
   (:func:`features.ops.recompute.recompute_aggregations`, the engine every load uses;
   the aggregates rows upserted, the aggregates hash and the tiles written again), and
   its hot hash rewritten from its newest remaining history row (hot-only derived
   features computed again with the transform kernels from the fields Postgres holds);
   an entity with no row left keeps no hash;
4. the runs' ledger units are taken out of the Redis ledger, so loading the same files
   again writes them again; the journal says ``done``.

Each step is idempotent and the Redis state is derived from Postgres alone, so a
rollback killed at any point (SIGKILL included) and run again ends exactly where one
uninterrupted rollback ends; running it after it finished changes nothing. While it runs
it holds the schema's writers' lock exclusively (the lock ``features migrate --apply``
takes): loads and stream micro-batches of the schema wait.

A stream run's id names every micro-batch of one job run: rolling it back removes all
its records' rows. Its Kafka offsets are not moved back (they live in Flink's
checkpoints): records consumed after the rollback are not those of the rolled back run,
and replaying them needs the job restarted from offsets before it (docs/operations.md).

Limits: a field stored only in Redis (``store: hot``) has no history to restore from;
a hash restored from Postgres lacks it (reported as skipped). A static schema
(``event_time: none``) keeps one row per entity, the one a later load replaced is gone:
rolling it back is refused.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate.engine import AggSpec
from features.aggregate.writer import AggregateWriter
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import cold_columns, hot_columns, rows_to_table
from features.compile.postgres import aggregates_table_name, cold_table_name, quote_ident, rejects_table_name
from features.config import Settings
from features.errors import ConfigError
from features.kernels import transform_program
from features.lineage import (
    DIGEST,
    INGESTED_AT,
    RUN_ID,
    SCHEMA_FINGERPRINT,
    SCHEMA_VERSION,
    SOURCE,
    RunContext,
)
from features.ops.recompute import feature_inputs, recompute_aggregations
from features.sdk.columns import entity_pg_type
from features.sinks import pg
from features.sinks.base import WriteUnit
from features.sinks.postgres import RUN_COUNTS_TABLE, WRITERS_LOCK
from features.sinks.redis import RedisSink
from features.sinks.stores import aggregate_stores

#: entities restored at a time (their hashes deleted, aggregations computed, hashes written)
DEFAULT_CHUNK_ENTITIES = 10_000
JOURNAL_TABLE = "featureline_rollbacks"
JOURNAL_ENTITIES = "featureline_rollback_entities"
JOURNAL_DDL = f"""
CREATE TABLE IF NOT EXISTS "{JOURNAL_TABLE}" (
    "schema_name" text NOT NULL,
    "run_id" text NOT NULL,
    "runs" text[] NOT NULL,
    "units" text[] NOT NULL,
    "state" text NOT NULL,
    "started_at" timestamptz NOT NULL DEFAULT now(),
    "finished_at" timestamptz,
    PRIMARY KEY ("schema_name", "run_id")
);
CREATE TABLE IF NOT EXISTS "{JOURNAL_ENTITIES}" (
    "schema_name" text NOT NULL,
    "run_id" text NOT NULL,
    "entity" text NOT NULL,
    PRIMARY KEY ("schema_name", "run_id", "entity")
)
"""


class LaterRuns(ConfigError):
    """Runs after the one to roll back wrote some of its entities: rolling it back alone
    would leave their values computed over its rows. ``later``: run id -> history rows of
    those entities it wrote."""

    def __init__(self, message: str, *, later: dict[str, int]) -> None:
        super().__init__(message, key="run")
        self.later = later


@dataclass
class RollbackPlan:
    """What a rollback of ``run_id`` in schema ``schema`` removes and restores."""

    schema: str
    run_id: str
    runs: list[str]                      # the run and, with include_later, the later ones
    state: str = "new"                   # new | resumed (a rollback stopped half way) | done
    history_rows: int = 0
    rejects_rows: int = 0
    #: rows with the runs' _run_id (those of events still stored are computed again)
    aggregates_rows: int = 0
    ledger_units: int = 0
    entities: int = 0
    hashes_restored: int = 0             # entities keeping history: hashes rewritten from Postgres
    hashes_deleted: int = 0              # entities left without a row: no hash
    later: dict[str, int] = field(default_factory=dict)  # later runs (rolled back too with include_later)


@dataclass
class RolledBack:
    """What a rollback did."""

    plan: RollbackPlan
    entities_done: int = 0
    keys_deleted: int = 0
    hashes_written: int = 0
    aggregate_rows_written: int = 0
    aggregate_hashes_written: int = 0
    tiles_written: int = 0
    units_cleared: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # hot column -> why it is not restored
    seconds: float = 0.0


def _names(c: CompiledSchema) -> dict[str, str]:
    s = c.schema
    return {"hist": quote_ident(cold_table_name(s)), "rej": quote_ident(rejects_table_name(s)),
            "agg": quote_ident(aggregates_table_name(s)) if s.aggregations is not None else "",
            "ent": quote_ident(str(s.entity)), "et": quote_ident(str(s.event_time)),
            "type": entity_pg_type(c), "ledger": '"featureline_ledger"',
            "counts": quote_ident(RUN_COUNTS_TABLE),
            "journal": quote_ident(JOURNAL_TABLE), "jent": quote_ident(JOURNAL_ENTITIES)}


def _check(c: CompiledSchema) -> None:
    s = c.schema
    if not s.loadable:
        raise ConfigError(f"schema {c.name!r} is validation-only: it stores nothing to roll back",
                          key="schema")
    if s.static:
        raise ConfigError(f"schema {c.name!r} is static (event_time: none): a load replaces each entity's "
                          "one row, so the rows before the run are gone; load the earlier source again "
                          "instead", key="schema")


def _exists(conn: Any, table: str) -> bool:
    return bool(conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0])


def _later(conn: Any, n: dict[str, str], runs: list[str]) -> dict[str, int]:
    """Other runs that stored history rows of the runs' entities after the runs began."""
    rows = conn.execute(
        f"WITH e AS (SELECT DISTINCT {n['ent']} FROM {n['hist']} WHERE \"_run_id\" = ANY(%(runs)s)), "
        f"s AS (SELECT min(\"_ingested_at\") AS t FROM {n['hist']} WHERE \"_run_id\" = ANY(%(runs)s)) "
        f"SELECT h.\"_run_id\", count(*) FROM {n['hist']} h JOIN e USING ({n['ent']}) "
        f"WHERE h.\"_run_id\" <> ALL(%(runs)s) AND h.\"_ingested_at\" > (SELECT t FROM s) "
        f"GROUP BY h.\"_run_id\" ORDER BY min(h.\"_ingested_at\"), h.\"_run_id\"", {"runs": runs}).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def _count(conn: Any, table: str, column: str, runs: list[str]) -> int:
    if not table:
        return 0
    return int(conn.execute(f"SELECT count(*) FROM {table} WHERE {column} = ANY(%s)", (runs,)).fetchone()[0])


def _plan(conn: Any, c: CompiledSchema, run_id: str, include_later: bool) -> RollbackPlan:
    """The plan of a rollback of ``run_id`` read in ``conn``'s transaction (nothing written)."""
    n = _names(c)
    if not _exists(conn, n["hist"]):
        raise ConfigError(f"unknown run id {run_id!r}: schema {c.name!r} has no history table "
                          f"({n['hist']}) in this database", key="run")
    has_journal = _exists(conn, n["journal"])
    row = conn.execute(f"SELECT runs, state FROM {n['journal']} WHERE schema_name = %s AND run_id = %s",
                       (c.name, run_id)).fetchone() if has_journal else None
    plan = RollbackPlan(c.name, run_id, [run_id])
    if row is not None and row[1] != "done":
        plan.runs, plan.state = list(row[0]), "resumed"
    else:
        runs = [run_id]
        later: dict[str, int] = {}
        while True:  # the later runs' own later runs too, until none is left
            found = _later(conn, n, runs)
            later.update(found)
            if not include_later or not found:
                break
            runs = [*runs, *found]
        plan.runs, plan.later = runs, later
    runs = plan.runs
    plan.history_rows = _count(conn, n["hist"], '"_run_id"', runs)
    plan.rejects_rows = _count(conn, n["rej"] if _exists(conn, n["rej"]) else "", '"_run_id"', runs)
    plan.aggregates_rows = _count(conn, n["agg"] if n["agg"] and _exists(conn, n["agg"]) else "", '"_run_id"',
                                  runs)
    plan.ledger_units = int(conn.execute(
        f"SELECT count(*) FROM {n['ledger']} WHERE schema_name = %s AND run_id = ANY(%s)",
        (c.name, runs)).fetchone()[0]) if _exists(conn, n["ledger"]) else 0
    if row is not None and row[1] == "done" and not (plan.history_rows or plan.rejects_rows
                                                     or plan.aggregates_rows or plan.ledger_units):
        plan.state = "done"  # rolled back already, and nothing of it came back since
        plan.later = {}
        return plan
    if plan.state == "new" and not (plan.history_rows or plan.rejects_rows or plan.aggregates_rows
                                    or plan.ledger_units):
        raise ConfigError(f"unknown run id {run_id!r}: no row of schema {c.name!r} carries it (looked in "
                          f"{n['hist']}, its rejects, its aggregates and the ledger)", key="run")
    if plan.state == "resumed":
        ents = conn.execute(f"SELECT entity FROM {n['jent']} WHERE schema_name = %s AND run_id = %s",
                            (c.name, run_id)).fetchall()
        texts = [r[0] for r in ents]
    else:
        texts = [r[0] for r in conn.execute(_entities_query(n), {"runs": runs}).fetchall()]
    plan.entities = len(texts)
    plan.hashes_restored = int(conn.execute(
        f"SELECT count(DISTINCT {n['ent']}) FROM {n['hist']} WHERE {n['ent']} = ANY(%s::{n['type']}[]) "
        "AND \"_run_id\" <> ALL(%s)", (texts, runs)).fetchone()[0])
    plan.hashes_deleted = plan.entities - plan.hashes_restored
    return plan


def _entities_query(n: dict[str, str]) -> str:
    agg = (f" UNION SELECT {n['ent']}::text FROM {n['agg']} WHERE \"_run_id\" = ANY(%(runs)s)"
           if n["agg"] else "")
    return f"SELECT {n['ent']}::text FROM {n['hist']} WHERE \"_run_id\" = ANY(%(runs)s){agg}"


def plan_rollback(c: CompiledSchema, settings: Settings, run_id: str, *, search_path: str | None = None,
                  include_later: bool = False) -> RollbackPlan:
    """What :func:`rollback` would do (``--dry-run``): writes nothing. ConfigError for an
    unknown run id or schema that cannot be rolled back; the later runs are listed in
    ``plan.later`` (not raised)."""
    _check(c)
    with pg.map_psycopg_errors(settings.postgres_dsn, "the rollback plan"), \
            pg.connect(settings.postgres_dsn, utc=True, search_path=search_path) as conn:
        with conn.transaction():
            return _plan(conn, c, run_id, include_later)


def rollback(c: CompiledSchema, settings: Settings, run_id: str, *, search_path: str | None = None,
             key_prefix: str = "", include_later: bool = False, chunk_entities: int = DEFAULT_CHUNK_ENTITIES,
             progress: Callable[[RolledBack], None] | None = None) -> RolledBack:
    """Roll ``run_id`` back in schema ``c``'s stores (the module docstring says how).

    Raises ConfigError for an unknown run id, :class:`LaterRuns` naming the runs that
    wrote its entities later (unless ``include_later``), SinkError/SinkUnavailable for a
    store that refuses or cannot be reached (run it again: it resumes). A run rolled back
    already gives a plan with ``state == "done"`` and changes nothing."""
    _check(c)
    t0 = time.perf_counter()
    n = _names(c)
    with pg.map_psycopg_errors(settings.postgres_dsn, "the rollback"), \
            pg.connect(settings.postgres_dsn, utc=True, search_path=search_path, autocommit=True) as conn:
        # loads and stream micro-batches of the schema wait (the writers' lock, shared by them)
        conn.execute(f"SELECT pg_advisory_lock({WRITERS_LOCK})", (c.name,))
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('featureline:ddl:' || "
                         "coalesce(current_schema(), '')))")
            conn.execute(JOURNAL_DDL)
        with conn.transaction():
            plan = _plan(conn, c, run_id, include_later)
            out = RolledBack(plan)
            if plan.state == "done":
                out.seconds = time.perf_counter() - t0
                return out
            if plan.later and not include_later:
                raise LaterRuns(
                    f"refusing to roll back run {run_id!r} of {c.name}: later runs wrote the same entities: "
                    + ", ".join(f"{r} ({k:,} rows)" for r, k in plan.later.items())
                    + "; roll those back too with --include-later, or first roll them back one by one",
                    later=plan.later)
            if plan.state == "new":
                _journal(conn, c, n, plan)
        with conn.transaction():  # again when resumed: deletes nothing the second time
            _delete(conn, c, n, plan.runs)
            conn.execute(f"UPDATE {n['journal']} SET state = 'deleted' "
                         "WHERE schema_name = %s AND run_id = %s", (c.name, run_id))
        _restore(conn, c, settings, n, out, search_path=search_path, key_prefix=key_prefix,
                 chunk_entities=chunk_entities, progress=progress)
        held = conn.execute(f"SELECT units FROM {n['journal']} WHERE schema_name = %s AND run_id = %s",
                            (c.name, run_id)).fetchone()
        units: list[str] = held[0] if held is not None else []
        out.units_cleared = _forget_units(c, settings, key_prefix, [tuple(u.split(" ", 1)) for u in units])
        conn.execute(f"UPDATE {n['journal']} SET state = 'done', finished_at = now() "
                     "WHERE schema_name = %s AND run_id = %s", (c.name, run_id))
        conn.execute(f"DELETE FROM {n['jent']} WHERE schema_name = %s AND run_id = %s", (c.name, run_id))
    out.seconds = time.perf_counter() - t0
    return out


def _journal(conn: Any, c: CompiledSchema, n: dict[str, str], plan: RollbackPlan) -> None:
    """Record the plan before anything is deleted: the entities and the ledger units."""
    units = [f"{fp} {unit}" for fp, unit in conn.execute(
        f"SELECT fingerprint, unit FROM {n['ledger']} WHERE schema_name = %s AND run_id = ANY(%s) "
        "ORDER BY unit", (c.name, plan.runs)).fetchall()] if _exists(conn, n["ledger"]) else []
    conn.execute(f"DELETE FROM {n['journal']} WHERE schema_name = %s AND run_id = %s", (c.name, plan.run_id))
    conn.execute(f"DELETE FROM {n['jent']} WHERE schema_name = %s AND run_id = %s", (c.name, plan.run_id))
    conn.execute(f"INSERT INTO {n['journal']} (schema_name, run_id, runs, units, state) "
                 "VALUES (%s, %s, %s, %s, 'planned')", (c.name, plan.run_id, plan.runs, units))
    conn.execute(f"INSERT INTO {n['jent']} (schema_name, run_id, entity) SELECT DISTINCT %(s)s, %(r)s, x.* "
                 f"FROM ({_entities_query(n)}) x", {"s": c.name, "r": plan.run_id, "runs": plan.runs})


def _delete(conn: Any, c: CompiledSchema, n: dict[str, str], runs: list[str]) -> None:
    """The runs' rows out of Postgres (one transaction, the caller's)."""
    conn.execute(f"DELETE FROM {n['hist']} WHERE \"_run_id\" = ANY(%s)", (runs,))
    if _exists(conn, n["rej"]):
        conn.execute(f"DELETE FROM {n['rej']} WHERE \"_run_id\" = ANY(%s)", (runs,))
    if n["agg"] and _exists(conn, n["agg"]):
        # an aggregates row of an event still stored stays: its value is computed again
        conn.execute(f"DELETE FROM {n['agg']} a WHERE a.\"_run_id\" = ANY(%s) AND NOT EXISTS "
                     f"(SELECT 1 FROM {n['hist']} h WHERE h.{n['ent']} = a.{n['ent']} "
                     f"AND h.{n['et']} = a.{n['et']})", (runs,))
    if _exists(conn, n["ledger"]):
        conn.execute(f"DELETE FROM {n['ledger']} WHERE schema_name = %s AND run_id = ANY(%s)", (c.name, runs))
    if _exists(conn, n["counts"]):
        conn.execute(f"DELETE FROM {n['counts']} WHERE schema_name = %s AND run_id = ANY(%s)", (c.name, runs))


def _forget_units(c: CompiledSchema, settings: Settings, key_prefix: str,
                  units: Sequence[tuple[str, ...]]) -> int:
    if not units:
        return 0
    sink = RedisSink(settings.redis_url, c, key_prefix=key_prefix, retries=settings.store_retries,
                     backoff_s=settings.store_backoff_s)
    sink.open()
    try:
        return sink.forget_units([(u[0], u[1]) for u in units])
    finally:
        sink.close()


def _restore(conn: Any, c: CompiledSchema, settings: Settings, n: dict[str, str], out: RolledBack, *,
             search_path: str | None, key_prefix: str, chunk_entities: int,
             progress: Callable[[RolledBack], None] | None) -> None:
    """Step 3 over the journal's entities, ``chunk_entities`` at a time."""
    s = c.schema
    spec = AggSpec.of(s)
    entity_type = c.arrow_schema.field(str(s.entity)).type
    ctx = RunContext(c.name, s.version_str, c.fingerprint, f"rollback-{out.plan.run_id}",
                     dt.datetime.now(dt.UTC))
    hot = RedisSink(settings.redis_url, c, key_prefix=key_prefix, retries=settings.store_retries,
                    backoff_s=settings.store_backoff_s)
    writer = None
    if spec is not None:
        writer = AggregateWriter(c, aggregate_stores(c, settings, search_path=search_path,
                                                     key_prefix=key_prefix))
    restorer = _HotRestore(c, settings, key_prefix)
    out.skipped = restorer.skipped
    try:
        hot.open()
        if writer is not None:
            writer.open()
        rows = conn.execute(
            f"SELECT entity::{n['type']} FROM {n['jent']} WHERE schema_name = %s AND run_id = %s "
            "ORDER BY entity",
            (c.name, out.plan.run_id)).fetchall()
        ids = [r[0] for r in rows]
        for at in range(0, len(ids), chunk_entities):
            part = ids[at:at + chunk_entities]
            entities = pa.array(part, entity_type)
            out.keys_deleted += hot.delete_entities(entities)
            spans = conn.execute(
                f"SELECT {n['ent']}, (extract(epoch FROM min({n['et']})) * 1000000)::bigint, "
                f"(extract(epoch FROM max({n['et']})) * 1000000)::bigint FROM {n['hist']} "
                f"WHERE {n['ent']} = ANY(%s::{n['type']}[]) GROUP BY 1 ORDER BY 1", (part,)).fetchall()
            if spans and writer is not None and spec is not None:
                kept = pa.array([r[0] for r in spans], entity_type)
                done = recompute_aggregations(spec, writer, ctx, kept,
                                              np.array([r[1] for r in spans], dtype=np.int64),
                                              np.array([r[2] for r in spans], dtype=np.int64), tiles=True)
                out.aggregate_rows_written += done.rows_written
                out.aggregate_hashes_written += done.hot_written
                out.tiles_written += done.tiles_written
            if spans and hot.hot_columns:
                out.hashes_written += restorer.write(conn, hot, [r[0] for r in spans])
            out.entities_done += len(part)
            if progress is not None:
                progress(out)
    finally:
        if writer is not None:
            writer.close()
        hot.close()


class _HotRestore:
    """Each entity's hot hash from its newest history row: the hot columns Postgres holds,
    the hot-only derived features computed again from the fields it holds."""

    def __init__(self, c: CompiledSchema, settings: Settings, key_prefix: str) -> None:
        self.c = c
        s = c.schema
        cold = set(cold_columns(c))
        cold_fields = {f.name for f in s.fields if f.name in cold}
        self.skipped: dict[str, str] = {}
        derived = []
        for f in s.features:
            if "hot" not in f.store or "cold" in f.store:
                continue
            if missing := [x for x in feature_inputs(f) if x not in cold_fields]:
                for col in s.feature_columns(f):
                    self.skipped[col] = (f"its input field {missing[0]!r} is not stored in Postgres: the "
                                         "restored hash lacks it until the entity is written again")
            else:
                derived.append(f)
        derived_cols = {col for f in derived for col in s.feature_columns(f)}
        self.direct = [x for x in hot_columns(c) if x in cold]
        for x in hot_columns(c):
            if x not in cold and x not in derived_cols and x not in self.skipped:
                self.skipped[x] = ("stored in Redis only: Postgres has no value to restore; the restored "
                                   "hash lacks it until the entity is written again")
        self.derived = [col for f in derived for col in s.feature_columns(f)]
        self.program = None
        self.inputs: list[str] = []
        if derived:
            only = dataclasses.replace(s, features=tuple(derived))
            self.program = transform_program(compile_schema(only), Settings(device="cpu"))
            self.inputs = sorted({x for f in derived for x in feature_inputs(f)})

    def write(self, conn: Any, sink: Any, ids: list[Any]) -> int:
        """Rewrite the hashes of ``ids`` (deleted before) from their newest history rows;
        returns how many were written."""
        s = self.c.schema
        ent, et = str(s.entity), str(s.event_time)
        names = list(dict.fromkeys([ent, et, *self.direct, *self.inputs, DIGEST, SOURCE, RUN_ID,
                                    INGESTED_AT]))
        qe, qt, qd = (quote_ident(x) for x in (ent, et, DIGEST))
        query = (f"SELECT DISTINCT ON (h.{qe}) {', '.join('h.' + quote_ident(x) for x in names)} "
                 f"FROM {quote_ident(cold_table_name(s))} h "
                 f"WHERE h.{qe} = ANY(%s::{entity_pg_type(self.c)}[]) "
                 f"ORDER BY h.{qe}, h.{qt} DESC, h.{qd} DESC")
        got = rows_to_table(self.c, names, conn.execute(query, (ids,)).fetchall())
        if got.num_rows == 0:
            return 0
        # one write per run (the sink stamps a write's run id and ingestion time from its first row)
        runs = got.group_by([RUN_ID, INGESTED_AT]).aggregate([]).to_pylist()
        written = 0
        for r in runs:
            part = got.filter(pc.and_(pc.equal(got.column(RUN_ID), r[RUN_ID]),
                                      pc.equal(got.column(INGESTED_AT), pa.scalar(r[INGESTED_AT],
                                                                                  got.schema.field(INGESTED_AT).type))))
            cols = {x: part.column(x) for x in names}
            if self.program is not None:
                batch = pa.RecordBatch.from_arrays([part.column(x).combine_chunks() for x in self.inputs],
                                                   names=self.inputs)
                result = self.program.run(batch, reference_time=r[INGESTED_AT])
                keep = result.kept_row_index
                cols = {x: v.take(keep) for x, v in cols.items()}
                cols.update({x: result.features.column(x) for x in self.derived})
            m = len(cols[ent])
            for x in self.skipped:  # absent fields (a null is an absent field)
                cols[x] = pa.nulls(m, pa.string())
            cols[SCHEMA_VERSION] = pa.repeat(pa.scalar(s.version_str, pa.string()), m)
            cols[SCHEMA_FINGERPRINT] = pa.repeat(pa.scalar(self.c.fingerprint, pa.string()), m)
            rows = pa.table(cols)
            written += sink.write(WriteUnit(rows, rows.slice(0, 0), None, rows.num_rows)).stored
        return written


__all__ = ["DEFAULT_CHUNK_ENTITIES", "LaterRuns", "RollbackPlan", "RolledBack", "plan_rollback", "rollback"]
