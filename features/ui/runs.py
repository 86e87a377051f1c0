"""The Runs pages' queries: every run of the stores, paged, newest first, each page's
figures read only for the runs it shows, from indexed queries.

A run is found in four places, per schema:

- the ledger (``featureline_ledger``): a batch load's units, summed per run (read = stored
  + already present + rejected). The ledger holds a row per unit, not per row: it is
  grouped whole.
- the run counts (``featureline_run_counts``): a stream run's counts, one row per run
  (and fingerprint), upserted by each micro-batch in the transaction that writes its rows
  and rejects (read = stored + already present + rejected, exact under a replay): read
  whole, no history scan. Its ``kind`` (``stream``) is the run's.
- ``featureline_gate_verdicts``: a run the batch gates judged; a refused load
  (``refused``) is listed as ``refused`` with the verdict's counts (read, rejected;
  nothing stored), a load that passed has its ledger rows too.
- the rejects table (``<schema>__rejects``), for the runs found in none of those (an HTTP
  ingest, whose valid records the stream job stores; a stream run written before the run
  counts existed): its distinct ``_run_id`` values are walked on the ``(_run_id, id)``
  index (a skip scan: one index probe per run, never a scan of the rejects), each run's
  first and last reject by ``id`` giving its time span.

Then, only for the runs of one page: a run found by its rejects alone has them counted on
the ``_run_id`` index and its stored rows counted in the history (``<schema>._run_id``,
unindexed: a scan of the history, for those old runs only); the top rules from the errors
of the page's rejects (on the ``_run_id`` index), and each run's gates (the verdicts'
primary key).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from features.compile import CompiledSchema
from features.compile.postgres import cold_table_name, rejects_table_name
from features.sinks.postgres import GATE_VERDICTS_TABLE, LEDGER_TABLE, RUN_COUNTS_TABLE

#: runs per page of /runs
RUNS_PAGE = 50
#: reasons shown per run
TOP_REASONS = 5

Conn = psycopg.Connection[tuple[Any, ...]]
_EPOCH = dt.datetime.min.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class GateOutcome:
    """One batch gate as judged for one run (a ``featureline_gate_verdicts`` row)."""

    gate: str
    kind: str
    rule: str | None
    measured: float
    rows: int
    limit: float
    on_breach: str
    breached: bool

    @property
    def is_rate(self) -> bool:
        return self.kind != "min_rows"


@dataclass
class Run:
    """One run of one schema: its counts. ``kind``: ``load`` (ledger rows), ``refused`` (a
    load its gates refused: the verdict's counts, nothing stored), or the kind its run
    counts row names (``stream``: ``counted``), or ``stream`` for a run found by its
    rejects alone (an HTTP ingest, a stream older than the run counts: its rejects and
    stored rows, counted by :meth:`RunIndex.fill`). ``units``: ledger units, or counted
    writes (micro-batch chunks)."""

    schema: str
    run_id: str
    kind: str
    read: int
    stored: int
    already_present: int
    rejected: int
    units: int
    first: dt.datetime | None
    last: dt.datetime | None
    reasons: list[tuple[str, int]] = field(default_factory=list)
    gates: list[GateOutcome] = field(default_factory=list)
    #: the counts are ``featureline_run_counts``' (exact, read whole)
    counted: bool = False

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

    @property
    def verdict(self) -> str | None:
        """``refused`` (a load its gates refused), ``tripped`` (a stream or HTTP run whose
        breaker stopped a micro-batch or refused a request: a ``fail`` gate breached; its
        earlier records are stored), ``warned`` (a ``warn`` gate breached), ``passed``, or
        None: not judged."""
        if not self.gates:
            return None
        if any(g.breached and g.on_breach == "fail" for g in self.gates) or self.kind == "refused":
            return "tripped" if self.kind == "stream" else "refused"
        return "warned" if any(g.breached for g in self.gates) else "passed"


@dataclass(frozen=True)
class RunsPage:
    """One page of runs, newest first: ``total`` runs in all, ``page`` of ``pages`` (from 1)."""

    runs: list[Run]
    total: int
    page: int
    pages: int


def _exists(conn: Conn, table: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL",
                       [sql.Identifier(table).as_string(conn)]).fetchone()
    return bool(row and row[0])


def _newest_first(run: Run) -> tuple[dt.datetime, str, str]:
    return (run.last or _EPOCH, run.schema, run.run_id)


class RunIndex:
    """Every run of ``schemas`` with the figures that come cheaply (the ledger's sums, the
    verdicts'), newest first; :meth:`fill` completes the ones a page shows."""

    def __init__(self, conn: Conn, schemas: Sequence[CompiledSchema], run_id: str | None = None) -> None:
        self.conn = conn
        self.schemas = {c.name: c for c in schemas}
        self.ledger = _exists(conn, LEDGER_TABLE)
        self.verdicts = _exists(conn, GATE_VERDICTS_TABLE)
        self.counts = _exists(conn, RUN_COUNTS_TABLE)
        self.runs: list[Run] = []
        for c in schemas:
            self.runs.extend(self._schema_runs(c, run_id))
        self.runs.sort(key=_newest_first, reverse=True)

    def _schema_runs(self, c: CompiledSchema, run_id: str | None) -> list[Run]:
        runs: dict[str, Run] = {}
        if self.ledger:
            for rid, read, stored, present, rejected, units, first, last in self.conn.execute(sql.SQL(
                    "SELECT run_id, sum(read)::bigint, sum(stored)::bigint, sum(already_present)::bigint, "
                    "sum(rejected)::bigint, count(*), min(committed_at), max(committed_at) FROM {} "
                    "WHERE schema_name = %s AND (%s::text IS NULL OR run_id = %s) GROUP BY run_id"
                    ).format(sql.Identifier(LEDGER_TABLE)), [c.name, run_id, run_id]):
                runs[rid] = Run(c.name, rid, "load", read, stored, present, rejected, units, first, last)
        if self.counts:  # stream runs: one row per run and fingerprint
            for rid, kind, units, read, stored, present, rejected, first, last in self.conn.execute(sql.SQL(
                    "SELECT run_id, min(kind), sum(units)::bigint, sum(read)::bigint, sum(stored)::bigint, "
                    "sum(already_present)::bigint, sum(rejected)::bigint, min(first_at), max(last_at) "
                    "FROM {} WHERE schema_name = %s AND (%s::text IS NULL OR run_id = %s) GROUP BY run_id"
                    ).format(sql.Identifier(RUN_COUNTS_TABLE)), [c.name, run_id, run_id]):
                if rid not in runs:
                    runs[rid] = Run(c.name, rid, str(kind), read, stored, present, rejected, units, first,
                                    last, counted=True)
        if self.verdicts:  # refused loads: no ledger rows, the verdict's counts
            for rid, read, rejected, judged in self.conn.execute(sql.SQL(
                    "SELECT run_id, max(read), max(rejected), max(judged_at) FROM {} WHERE schema_name = %s "
                    "AND refused AND (%s::text IS NULL OR run_id = %s) GROUP BY run_id").format(
                    sql.Identifier(GATE_VERDICTS_TABLE)), [c.name, run_id, run_id]):
                if rid not in runs:
                    runs[rid] = Run(c.name, rid, "refused", int(read), 0, 0, int(rejected), 0, judged, judged)
        rejects = rejects_table_name(c.schema)
        if _exists(self.conn, rejects):
            for rid, first, last in self._reject_runs(rejects, run_id):
                if rid not in runs:  # counted by fill(), for the runs of a page only
                    runs[rid] = Run(c.name, rid, "stream", 0, 0, 0, 0, 0, first, last)
                elif runs[rid].kind == "refused":
                    runs[rid].first = min(first, runs[rid].first or first)
        return list(runs.values())

    def _reject_runs(self, table: str, run_id: str | None) -> list[tuple[str, dt.datetime, dt.datetime]]:
        """(run, first and last ingestion time) of every run in the rejects table ``table``:
        a skip scan of its ``(_run_id, id)`` index, one probe per run."""
        t = sql.Identifier(table)
        if run_id is not None:
            runs = sql.SQL("SELECT %s::text AS run WHERE EXISTS (SELECT 1 FROM {t} WHERE _run_id = %s)"
                           ).format(t=t)
            params: list[Any] = [run_id, run_id]
        else:
            runs = sql.SQL(
                "WITH RECURSIVE r(run) AS ((SELECT _run_id FROM {t} ORDER BY _run_id LIMIT 1) UNION ALL "
                "SELECT (SELECT _run_id FROM {t} WHERE _run_id > r.run ORDER BY _run_id LIMIT 1) FROM r "
                "WHERE r.run IS NOT NULL) SELECT run FROM r WHERE run IS NOT NULL").format(t=t)
            params = []
        q = sql.SQL(
            "WITH runs AS ({runs}), ends AS (SELECT run, "
            "(SELECT min(id) FROM {t} WHERE _run_id = run) AS lo, "
            "(SELECT max(id) FROM {t} WHERE _run_id = run) AS hi FROM runs) "
            "SELECT e.run, a._ingested_at, b._ingested_at FROM ends e JOIN {t} a ON a.id = e.lo "
            "JOIN {t} b ON b.id = e.hi").format(runs=runs, t=t)
        return [(str(r), a, b) for r, a, b in self.conn.execute(q, params)]

    def page(self, number: int, size: int = RUNS_PAGE) -> RunsPage:
        """Page ``number`` (from 1; past the last: empty) of the runs, filled."""
        pages = max(1, -(-len(self.runs) // size))
        shown = self.runs[(number - 1) * size: number * size]
        self.fill(shown)
        return RunsPage(shown, len(self.runs), number, pages)

    def fill(self, runs: Iterable[Run], *, reasons: bool = True) -> None:
        """Count the ``runs`` found by their rejects alone (rejects, stored rows), and read
        the top rules and the gates of every one of ``runs``: queries on those runs alone."""
        by_schema: dict[str, list[Run]] = {}
        for r in runs:
            by_schema.setdefault(r.schema, []).append(r)
        for name, group in by_schema.items():
            c = self.schemas[name]
            streams = {r.run_id: r for r in group if r.kind == "stream" and not r.counted}
            rejects = rejects_table_name(c.schema)
            has_rejects = _exists(self.conn, rejects)
            if streams and has_rejects:
                for rid, n in self.conn.execute(sql.SQL(
                        "SELECT _run_id, count(*) FROM {} WHERE _run_id = ANY(%s) GROUP BY 1").format(
                        sql.Identifier(rejects)), [list(streams)]):
                    streams[rid].rejected = streams[rid].read = int(n)
            if streams and _exists(self.conn, cold_table_name(c.schema)):
                for rid, n in self.conn.execute(sql.SQL(
                        "SELECT _run_id, count(*) FROM {} WHERE _run_id = ANY(%s) GROUP BY 1").format(
                        sql.Identifier(cold_table_name(c.schema))), [list(streams)]):
                    streams[rid].stored = int(n)
                    streams[rid].read += int(n)
            ids = [r.run_id for r in group]
            if reasons and has_rejects:
                shown = {r.run_id: r for r in group}
                for rid, rule, n in self.conn.execute(sql.SQL(
                        "SELECT _run_id, e->>'rule', count(*) FROM {} r, jsonb_array_elements(r.errors) e "
                        "WHERE _run_id = ANY(%s) GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2").format(
                        sql.Identifier(rejects)), [ids]):
                    if len(shown[rid].reasons) < TOP_REASONS:
                        shown[rid].reasons.append((str(rule), int(n)))
            if self.verdicts:
                judged = {r.run_id: r for r in group}
                for rid, *g in self.conn.execute(sql.SQL(
                        "SELECT run_id, gate, kind, rule, measured, rows, \"limit\", on_breach, breached "
                        "FROM {} WHERE schema_name = %s AND run_id = ANY(%s) ORDER BY run_id, gate").format(
                        sql.Identifier(GATE_VERDICTS_TABLE)), [name, ids]):
                    judged[rid].gates.append(GateOutcome(*g))
