"""What the UI's pages show, read from the schemas and Postgres (read-only).

Every query is parameterised; every table name comes from the compiled schema and
reaches SQL only as a quoted identifier (:func:`features.compile.postgres.quote_ident`).
Reads run in a read-only session (``default_transaction_read_only``): the UI never
writes. A store that cannot be reached raises :class:`~features.errors.SinkUnavailable`
(the page says so), never a psycopg type.

Runs: a batch load writes one ``featureline_ledger`` row per unit (file or row group) with
its counts (read = stored + already present + rejected); a run is the sum of its units.
A stream or HTTP ingest run writes no ledger rows: it is found in the rejects table and
the history (``_run_id``), its rows read counted as stored + rejected.

Rejects are paged by keyset on the rejects table's primary key (``id``): a page is
``WHERE <filters> AND id > <last id of the previous page> ORDER BY id LIMIT n``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from features.compile import CompiledSchema
from features.compile.postgres import cold_table_name, rejects_table_name
from features.sinks import pg
from features.sinks.postgres import LEDGER_TABLE

#: rejects per page
PAGE_SIZE = 50
#: reasons shown per run
TOP_REASONS = 5


@dataclass
class Run:
    """One run of one schema: its counts (``read`` None when unknown: no ledger rows)."""

    schema: str
    run_id: str
    kind: str  # "load" (ledger rows) or "stream" (rejects and history only)
    read: int
    stored: int
    already_present: int
    rejected: int
    units: int
    first: dt.datetime | None
    last: dt.datetime | None
    reasons: list[tuple[str, int]] = field(default_factory=list)

    @property
    def adds_up(self) -> bool:
        """read = stored + already present + rejected."""
        return self.read == self.stored + self.already_present + self.rejected

    @property
    def reject_rate(self) -> float | None:
        return self.rejected / self.read if self.read else None

    @property
    def seconds(self) -> float | None:
        """From the first unit's commit to the last's (None for one unit or none)."""
        if self.first is None or self.last is None or self.units < 2:
            return None
        return (self.last - self.first).total_seconds()


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
    total: int  # rejects matching the filter, every page
    next_after: int | None  # the keyset of the next page, None on the last


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

    # --- runs --------------------------------------------------------------------

    def runs(self, schema: str | None = None, run_id: str | None = None) -> list[Run]:
        """Every run (of ``schema`` / with ``run_id`` when given), newest first."""
        out: list[Run] = []
        with self._session("reading the runs") as conn:
            ledger = self._exists(conn, LEDGER_TABLE)
            for name, c in self.schemas.items():
                if schema is not None and name != schema:
                    continue
                out.extend(self._schema_runs(conn, c, ledger, run_id))
        out.sort(key=lambda r: (r.last or dt.datetime.min.replace(tzinfo=dt.UTC), r.run_id), reverse=True)
        return out

    def _schema_runs(self, conn: psycopg.Connection[tuple[Any, ...]], c: CompiledSchema, ledger: bool,
                     run_id: str | None) -> list[Run]:
        runs: dict[str, Run] = {}
        if ledger:
            for rid, read, stored, present, rejected, units, first, last in conn.execute(sql.SQL(
                    "SELECT run_id, sum(read)::bigint, sum(stored)::bigint, sum(already_present)::bigint, "
                    "sum(rejected)::bigint, count(*), min(committed_at), max(committed_at) FROM {} "
                    "WHERE schema_name = %s AND (%s::text IS NULL OR run_id = %s) GROUP BY run_id"
                    ).format(sql.Identifier(LEDGER_TABLE)), [c.name, run_id, run_id]):
                runs[rid] = Run(c.name, rid, "load", read, stored, present, rejected, units, first, last)
        rejects = rejects_table_name(c.schema)
        if not self._exists(conn, rejects):
            return list(runs.values())
        table = sql.Identifier(rejects)
        # Runs without ledger rows (a stream, HTTP ingest): their rejects and stored rows.
        ledgerless: dict[str, tuple[int, dt.datetime, dt.datetime]] = {}
        for rid, n, first, last in conn.execute(sql.SQL(
                "SELECT _run_id, count(*), min(_ingested_at), max(_ingested_at) FROM {} "
                "WHERE (%s::text IS NULL OR _run_id = %s) GROUP BY _run_id").format(table), [run_id, run_id]):
            if rid not in runs:
                ledgerless[rid] = (n, first, last)
        if ledgerless and self._exists(conn, cold_table_name(c.schema)):
            stored = dict(conn.execute(sql.SQL(
                "SELECT _run_id, count(*) FROM {} WHERE _run_id = ANY(%s) GROUP BY _run_id").format(
                sql.Identifier(cold_table_name(c.schema))), [list(ledgerless)]).fetchall())
        else:
            stored = {}
        for rid, (n, first, last) in ledgerless.items():
            kept = int(stored.get(rid, 0))
            runs[rid] = Run(c.name, rid, "stream", kept + n, kept, 0, n, 0, first, last)
        for rid, rule, n in conn.execute(sql.SQL(
                "SELECT _run_id, e->>'rule', count(*) FROM {} r, jsonb_array_elements(r.errors) e "
                "WHERE (%s::text IS NULL OR _run_id = %s) GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2"
                ).format(table), [run_id, run_id]):
            if rid in runs and len(runs[rid].reasons) < TOP_REASONS:
                runs[rid].reasons.append((str(rule), int(n)))
        return list(runs.values())

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
            total_row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {}").format(table, cond),
                                     params).fetchone()
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
