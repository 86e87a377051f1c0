"""What the UI's pages show, read from the schemas and Postgres (read-only).

Every query is parameterised; every table name comes from the compiled schema and
reaches SQL only as a quoted identifier (:func:`features.compile.postgres.quote_ident`).
Reads run in a read-only session (``default_transaction_read_only``): the UI never
writes. A store that cannot be reached raises :class:`~features.errors.SinkUnavailable`
(the page says so), never a psycopg type.

Runs: :mod:`features.ui.runs` (paged; each page's figures read for its runs alone).

Rejects are paged by keyset on the rejects table's primary key (``id``): a page is
``WHERE <filters> AND id > <last id of the previous page> ORDER BY id LIMIT n``; the
rejects matching are counted up to :data:`COUNT_CAP` (a bounded count: a filter by run
reads the run's index entries, a rule or field filter the GIN index on ``errors``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from features.compile import CompiledSchema
from features.compile.postgres import rejects_table_name
from features.sinks import pg
from features.ui.runs import RUNS_PAGE, Run, RunIndex, RunsPage

#: rejects per page
PAGE_SIZE = 50
#: matching rejects counted exactly up to this many (more: "more than COUNT_CAP")
COUNT_CAP = 10_000


@dataclass(frozen=True)
class Reject:
    """One row of a rejects table, its ``errors`` parsed (a list of ``{field, rule,
    reason, message, value}``) and its ``raw`` payload as JSON text."""

    id: int
    schema: str
    source: str
    row_index: int | None
    raw: str | None
    errors: list[dict[str, Any]]
    event_time: dt.datetime | None
    version: str
    fingerprint: str
    run_id: str
    ingested_at: dt.datetime


@dataclass(frozen=True)
class RejectFilter:
    """The rejects page's filters (None: any)."""

    schema: str
    run: str | None = None
    rule: str | None = None
    field: str | None = None
    after: int = 0


@dataclass(frozen=True)
class RejectPage:
    rejects: list[Reject]
    total: int  # rejects matching the filter, every page, counted up to COUNT_CAP + 1
    next_after: int | None  # the keyset of the next page, None on the last

    cap: int = COUNT_CAP

    @property
    def capped(self) -> bool:
        """More than ``cap`` rejects match (``total`` is then ``cap + 1``, a lower bound)."""
        return self.total > self.cap


_REJECT_COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in (
    "id", "_source", "row_index", "raw", "errors", "event_time", "_schema_version", "_schema_fingerprint",
    "_run_id", "_ingested_at"))


class UIData:
    """The stores' side of the pages: ``schemas`` (name -> compiled) and a Postgres DSN
    (its ``search_path`` option selects the namespace, as everywhere else)."""

    def __init__(self, schemas: Mapping[str, CompiledSchema], postgres_dsn: str) -> None:
        self.schemas = dict(sorted(schemas.items()))
        self.dsn = postgres_dsn

    @contextmanager
    def _session(self, what: str) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        conn = pg.connect(self.dsn, autocommit=True, utc=True)
        try:
            with pg.map_psycopg_errors(self.dsn, what):
                conn.execute("SET default_transaction_read_only = on")
                # short queries whose row estimates (jsonb_array_elements: 100 a row) reach the
                # JIT's threshold: compiling cost 70 ms of a 95 ms query (bench/ui_render.py)
                conn.execute("SET jit = off")
                yield conn
        finally:
            conn.close()

    @staticmethod
    def _exists(conn: psycopg.Connection[tuple[Any, ...]], table: str) -> bool:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [sql.Identifier(table).as_string(conn)]
                           ).fetchone()
        return bool(row and row[0])

    def _compiled(self, schema: str) -> CompiledSchema:
        if schema not in self.schemas:
            raise KeyError(schema)
        return self.schemas[schema]

    def session(self, what: str) -> AbstractContextManager[psycopg.Connection[tuple[Any, ...]]]:
        """A read-only session, for the pages' own query modules (:mod:`features.ui.drift`,
        :mod:`features.ui.registry`)."""
        return self._session(what)

    def exists(self, conn: psycopg.Connection[tuple[Any, ...]], table: str) -> bool:
        """Whether ``table`` (or an index of that name) is on the session's search_path."""
        return self._exists(conn, table)

    # --- runs (features.ui.runs) -------------------------------------------------

    def _chosen(self, schema: str | None) -> list[CompiledSchema]:
        return [c for name, c in self.schemas.items() if schema is None or name == schema]

    def runs_page(self, schema: str | None = None, page: int = 1, size: int = RUNS_PAGE,
                  chart: int = 0) -> tuple[RunsPage, list[Run]]:
        """Page ``page`` (from 1) of every run (of ``schema`` when given), newest first, and
        the newest ``chart`` runs, oldest first (the chart's points: page 1's when it holds
        them; their figures without the reasons otherwise)."""
        with self._session("reading the runs") as conn:
            index = RunIndex(conn, self._chosen(schema))
            shown = index.page(page, size)
            recent = index.runs[:chart]
            index.fill([r for r in recent if r not in shown.runs], reasons=False)
        return shown, recent[::-1]

    def run(self, schema: str, run_id: str) -> Run | None:
        """One run of ``schema`` with its figures, reasons and gates; None when unknown.
        KeyError for an unknown schema."""
        c = self._compiled(schema)
        with self._session("reading a run") as conn:
            index = RunIndex(conn, [c], run_id)
            index.fill(index.runs)
        return index.runs[0] if index.runs else None

    # --- rejects -----------------------------------------------------------------

    def rejects(self, f: RejectFilter, page_size: int = PAGE_SIZE) -> RejectPage:
        """One page of ``f.schema``'s rejects matching ``f``, by id (keyset ``f.after``).
        KeyError for an unknown schema."""
        c = self._compiled(f.schema)
        table = sql.Identifier(rejects_table_name(c.schema))
        where = [sql.SQL("TRUE")]
        params: list[Any] = []
        if f.run is not None:
            where.append(sql.SQL("_run_id = %s"))
            params.append(f.run)
        match: dict[str, str] = {}
        if f.rule is not None:
            match["rule"] = f.rule
        if f.field is not None:
            match["field"] = f.field
        if match:  # one error of the row has this rule and this field
            where.append(sql.SQL("errors @> %s::jsonb"))
            params.append(json.dumps([match]))
        cond = sql.SQL(" AND ").join(where)
        with self._session("reading the rejects") as conn:
            if not self._exists(conn, rejects_table_name(c.schema)):
                return RejectPage([], 0, None)
            total_row = conn.execute(sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} WHERE {} LIMIT %s) m"
                                             ).format(table, cond), [*params, COUNT_CAP + 1]).fetchone()
            rows = conn.execute(sql.SQL("SELECT {} FROM {} WHERE {} AND id > %s ORDER BY id LIMIT %s").format(
                _REJECT_COLUMNS, table, cond), [*params, f.after, page_size + 1]).fetchall()
        page = [self._reject(c.name, r) for r in rows[:page_size]]
        more = len(rows) > page_size
        return RejectPage(page, int(total_row[0]) if total_row else 0, page[-1].id if more else None)

    def reject(self, schema: str, reject_id: int) -> Reject | None:
        """One reject by its id; None when there is none. KeyError for an unknown schema."""
        c = self._compiled(schema)
        with self._session("reading a reject") as conn:
            if not self._exists(conn, rejects_table_name(c.schema)):
                return None
            row = conn.execute(sql.SQL("SELECT {} FROM {} WHERE id = %s").format(
                _REJECT_COLUMNS, sql.Identifier(rejects_table_name(c.schema))), [reject_id]).fetchone()
        return None if row is None else self._reject(c.name, row)

    @staticmethod
    def _reject(schema: str, r: tuple[Any, ...]) -> Reject:
        raw = None if r[3] is None else json.dumps(r[3], indent=2, ensure_ascii=False, sort_keys=True)
        errors = r[4] if isinstance(r[4], list) else json.loads(r[4])
        return Reject(r[0], schema, r[1], r[2], raw, errors, r[5], r[6], r[7], r[8], r[9])

    def recorded_version(self, schema: str) -> tuple[str, str] | None:
        """(version, fingerprint) that ``featureline_schemas`` records for ``schema``, or None."""
        with self._session("reading featureline_schemas") as conn:
            if not self._exists(conn, "featureline_schemas"):
                return None
            row = conn.execute("SELECT version, fingerprint FROM featureline_schemas WHERE schema_name = %s",
                               [schema]).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))
