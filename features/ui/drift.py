"""The Drift page: per field, the recent rows of a schema's history against a reference window.

Windows, by event time (half-open on the left: ``(start, end]``):

- *recent*: the ``recent`` duration (default 24 h) up to ``end`` (default the newest
  event time in the history);
- *reference*: the ``reference`` duration (default 7 d) up to ``reference_end``
  (default the recent window's start: the period just before it).

Each window is read from the history table through its event-time index (the DDL's
``<table>__by_event_time``, :func:`features.compile.postgres.event_time_index`), never
whole: one query counts the window's rows per time slice (:data:`SLICES` equal slices,
an index-only count each); a window of at most ``sample`` rows (default
:data:`DEFAULT_SAMPLE`) is read whole, and every figure is the report's exact one; a
larger window is read as a *stratified sample* of ``sample`` rows: from each slice, its
first rows in event-time order, as many as its share of the window's rows (``sample *
slice rows / window rows``, the remainders to the largest fractions, so that the shares
add up to ``sample``). The page states which, with both counts. Rows outside both
windows are never read.

The statistics are the validation report's (:mod:`features.report.drift`), not a second
implementation: the rows of each window go through the report's Postgres-to-Arrow
conversion (:func:`features.report.sources.arrow_column`) into a
:class:`~features.report.drift.Side`, and :func:`~features.report.drift.compare`
computes KS, PSI (the reference's decile bins, or the categories), TVD, the sampling
noise, the status against the report's default :class:`~features.report.drift.Thresholds`
and the reason a field is not compared (the entity key, dates and times, no values on a
side, a string field with too many distinct values).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from features.compile import CompiledSchema
from features.compile.postgres import cold_table_name, event_time_index_name
from features.report.core import Chunk
from features.report.drift import SAMPLE_SIZE, Side, Thresholds, compare, field_kind
from features.report.html import histogram_chart
from features.report.sources import arrow_column
from features.schema.model import TypeKind
from features.schema.syntax import duration_seconds
from features.ui.data import UIData

#: rows read per window by default, and the most a request may ask for (the report's sample)
DEFAULT_SAMPLE = 10_000
MAX_SAMPLE = SAMPLE_SIZE
#: equal time slices of a window (the strata of a sampled window)
SLICES = 100
DEFAULT_RECENT = dt.timedelta(hours=24)
DEFAULT_REFERENCE = dt.timedelta(days=7)
#: the SVG category chart: categories drawn, and label characters shown (the whole value in its title)
CHART_CATEGORIES = 8
LABEL_CHARS = 30


class BadRequest(ValueError):
    """A query parameter of the Drift page that cannot be used (the message says why)."""


@dataclass(frozen=True)
class DriftRequest:
    """The page's parameters: the windows' lengths, their ends (None: the defaults) and
    the most rows read per window."""

    recent: dt.timedelta = DEFAULT_RECENT
    reference: dt.timedelta = DEFAULT_REFERENCE
    end: dt.datetime | None = None
    reference_end: dt.datetime | None = None
    sample: int = DEFAULT_SAMPLE

    @classmethod
    def parse(cls, params: dict[str, str]) -> DriftRequest:
        """From the query string; BadRequest naming the parameter and what it takes."""
        known = {"recent", "reference", "end", "reference_end", "sample"}
        if unknown := sorted(set(params) - known):
            raise BadRequest(f"unknown parameter(s) {', '.join(map(repr, unknown))}; the page takes "
                             + ", ".join(sorted(known)))
        sample = params.get("sample", str(DEFAULT_SAMPLE))
        if not sample.isdigit() or not 1 <= int(sample) <= MAX_SAMPLE:
            raise BadRequest(f"sample must be a whole number of rows from 1 to {MAX_SAMPLE:,}, "
                             f"got {sample!r}")
        return cls(_duration("recent", params.get("recent"), DEFAULT_RECENT),
                   _duration("reference", params.get("reference"), DEFAULT_REFERENCE),
                   _instant("end", params.get("end")), _instant("reference_end", params.get("reference_end")),
                   int(sample))


def _duration(name: str, text: str | None, default: dt.timedelta) -> dt.timedelta:
    if text is None:
        return default
    seconds = int(text) if text.isdigit() else duration_seconds(text)
    if seconds is None or seconds <= 0 or seconds > 100 * 365 * 86_400:
        raise BadRequest(f"{name} must be a duration such as 24h, 7d, 90m or 1d12h (or seconds), "
                         f"positive and at most 100 years, got {text!r}")
    return dt.timedelta(seconds=seconds)


def _instant(name: str, text: str | None) -> dt.datetime | None:
    if text is None:
        return None
    try:
        value = dt.datetime.fromisoformat(text.strip().replace(" ", "T", 1) if "T" not in text else text)
    except ValueError:
        raise BadRequest(f"{name} must be an ISO 8601 time such as 2026-12-06T18:00:00Z "
                         f"(UTC when no offset is given), got {text!r}") from None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


@dataclass(frozen=True)
class Window:
    """One window ``(start, end]``: the rows it holds, the rows read (all of them, or a
    stratified sample) and the figures' side."""

    name: str
    start: dt.datetime
    end: dt.datetime
    rows: int
    read: int

    @property
    def sampled(self) -> bool:
        return self.read < self.rows


@dataclass
class DriftView:
    """What the page shows of one schema (``problem``: why nothing is compared)."""

    schema: str
    event_time: str | None
    request: DriftRequest
    thresholds: Thresholds
    newest: dt.datetime | None = None
    recent: Window | None = None
    reference: Window | None = None
    indexed: bool = False
    problem: str | None = None
    #: :func:`features.report.drift.compare`'s entries, sorted: compared fields by PSI
    #: (highest first), then the fields not compared
    fields: list[dict[str, Any]] | None = None

    @property
    def flagged(self) -> list[str]:
        return [f["field"] for f in self.fields or [] if f["status"] in ("fail", "warn")]


#: the report's default thresholds (``features report``'s --psi-warn, --psi-threshold, --ks-threshold)
THRESHOLDS = Thresholds()


def read_drift(data: UIData, schema: str, request: DriftRequest, thresholds: Thresholds = THRESHOLDS
               ) -> DriftView:
    """The Drift page's figures for ``schema`` (KeyError when the project has none);
    BadRequest when the windows asked for cannot be compared (overlapping)."""
    c = data.schemas[schema]
    et = c.schema.event_time
    view = DriftView(schema, et, request, thresholds)
    if et is None:
        view.problem = "the schema has no event time (event_time: none): there are no time windows to compare"
        return view
    table = cold_table_name(c.schema)
    with data.session("reading the history for drift") as conn:
        if not data.exists(conn, table):
            view.problem = f"no history table {table!r} yet: load data first"
            return view
        view.indexed = data.exists(conn, event_time_index_name(c.schema))
        row = conn.execute(sql.SQL("SELECT max({}) FROM {}").format(sql.Identifier(et), sql.Identifier(table))
                           ).fetchone()
        view.newest = None if row is None or row[0] is None else _utc(row[0])
        end = request.end or view.newest
        if end is None:
            view.problem = f"the history table {table!r} holds no rows"
            return view
        recent_start = end - request.recent
        reference_end = request.reference_end or recent_start
        if reference_end > recent_start:
            raise BadRequest(f"the reference window must end at or before the recent window's start "
                             f"({recent_start.isoformat()}), got reference_end {reference_end.isoformat()}")
        naive = _naive_column(c)
        stored = {r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
            "AND NOT attisdropped", [sql.Identifier(table).as_string(conn)])}
        columns = [f.name for f in c.schema.fields if f.name in stored and field_kind(
            f, c.schema.entity) is not None]
        sides: list[tuple[Window, Side]] = []
        for name, start, stop in (("reference", reference_end - request.reference, reference_end),
                                  ("recent", recent_start, end)):
            window, side = _read_window(conn, c, columns, name, start, stop, request.sample, naive)
            sides.append((window, side))
    (view.reference, reference), (view.recent, recent) = sides
    drift = compare(reference, recent, thresholds, {"kind": "table", "table": table}, sample_size=MAX_SAMPLE)
    entries = drift["fields"]
    for e in entries:
        if e["status"] == "skipped" and str(e.get("reason", "")).startswith("no values"):
            e["reason"] = _no_values(e, view.reference, view.recent)
    compared = sorted((e for e in entries if e["status"] != "skipped"), key=lambda e: -float(e["psi"]))
    view.fields = compared + [e for e in entries if e["status"] == "skipped"]
    return view


def _no_values(e: dict[str, Any], reference: Window, recent: Window) -> str:
    """Why a field has no values to compare, per window: no rows, or every row null."""
    parts = []
    for w, rows, values in ((reference, e["reference_rows"], e["reference_values"]),
                            (recent, e["data_rows"], e["data_values"])):
        if values:
            continue
        parts.append(f"the {w.name} window holds no rows" if rows == 0
                     else f"all {rows:,} rows of the {w.name} window are null")
    return "no values to compare: " + "; ".join(parts)


def _utc(value: Any) -> dt.datetime:
    """An event time from Postgres (timestamptz, timestamp or date) as an aware UTC datetime."""
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
    return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)


def _naive_column(c: CompiledSchema) -> bool:
    """The event-time column holds no zone (``timestamp`` or ``date``): bounds go as naive UTC."""
    assert c.schema.event_time is not None
    t = c.schema.field(c.schema.event_time).type
    return t.kind == TypeKind.DATE or t.tz is None


def _bound(value: dt.datetime, naive: bool) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(tzinfo=None) if naive else value


def _read_window(conn: psycopg.Connection[tuple[Any, ...]], c: CompiledSchema, columns: list[str], name: str,
                 start: dt.datetime, end: dt.datetime, sample: int, naive: bool) -> tuple[Window, Side]:
    """Window ``(start, end]`` of the history: its row count (per slice, through the
    index) and the compared ``columns`` of its rows, all of them or a stratified sample of
    ``sample`` (module docstring)."""
    s = c.schema
    assert s.event_time is not None
    table, et = sql.Identifier(cold_table_name(s)), sql.Identifier(s.event_time)
    side = Side(c, sample_size=MAX_SAMPLE)
    edges = [_bound(start + (end - start) * i / SLICES, naive) for i in range(SLICES + 1)]
    # one index-only count a slice (cheaper than bucketing every row of the window)
    counts = [int(n) for (n,) in conn.execute(sql.SQL(
        "SELECT r.n FROM unnest(%s, %s) WITH ORDINALITY AS s(lo, hi, i) CROSS JOIN LATERAL "
        "(SELECT count(*) AS n FROM {t} WHERE {et} > s.lo AND {et} <= s.hi) r ORDER BY s.i").format(
        et=et, t=table), [edges[:-1], edges[1:]])]
    rows = sum(counts)
    select = sql.SQL(", ").join(sql.Identifier(n) for n in columns) if columns else sql.SQL("NULL")
    if rows == 0:
        records: list[tuple[Any, ...]] = []
    elif rows <= sample:
        records = conn.execute(sql.SQL("SELECT {} FROM {} WHERE {et} > %s AND {et} <= %s").format(
            select, table, et=et), [edges[0], edges[-1]]).fetchall()
    else:
        take = allocate(sample, counts)
        lo, hi, k = zip(*[(edges[i], edges[i + 1], t) for i, t in enumerate(take) if t > 0], strict=True)
        records = conn.execute(sql.SQL(
            "SELECT r.* FROM unnest(%s, %s, %s::int[]) AS s(lo, hi, k) CROSS JOIN LATERAL "
            "(SELECT {} FROM {} WHERE {et} > s.lo AND {et} <= s.hi ORDER BY {et} LIMIT s.k) r").format(
            select, table, et=et), [list(lo), list(hi), list(k)]).fetchall()
    if records:
        targets = c.arrow_schema
        by_column = list(zip(*records, strict=True))
        batch = pa.RecordBatch.from_pydict({n: arrow_column(list(v), targets.field(n).type, n)
                                            for n, v in zip(columns, by_column, strict=True)}
                                           if columns else {"__none__": pa.nulls(len(records))})
        side.add(Chunk(batch, 0, lambda i: None))
    return Window(name, start, end, rows, len(records)), side


def allocate(sample: int, counts: list[int]) -> list[int]:
    """``sample`` rows shared among slices of ``counts`` rows in proportion (largest
    remainders: the shares add up to ``sample`` exactly; none above its slice's rows)."""
    total = sum(counts)
    exact = [sample * n / total for n in counts]
    take = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(counts)), key=lambda i: (take[i] - exact[i], i))
    for i in by_remainder[: sample - sum(take)]:
        take[i] += 1
    return [min(t, n) for t, n in zip(take, counts, strict=True)]


# --------------------------------------------------------------------------- charts


def numeric_chart(entry: dict[str, Any]) -> dict[str, Any] | None:
    """The report's overlaid histograms (reference vs recent, equal-width bins over both)."""
    h = entry.get("histogram")
    return histogram_chart(h) if h else None


def category_chart(entry: dict[str, Any]) -> dict[str, Any] | None:
    """Paired horizontal bars (reference above recent) of the first categories, as SVG
    geometry; each label cut to :data:`LABEL_CHARS` characters (the whole value goes in
    the bar's title). The template escapes every label."""
    cats = (entry.get("categories") or [])[:CHART_CATEGORIES]
    if not cats:
        return None
    top = max(max(float(x["reference_share"]), float(x["data_share"])) for x in cats) or 1.0
    label_w, bar_w, row_h = 210, 200, 18
    rows = []
    for i, x in enumerate(cats):
        value = str(x["value"])
        y = i * row_h
        rows.append({
            "value": value, "label": value if len(value) <= LABEL_CHARS else value[: LABEL_CHARS - 1] + "…",
            "y": y, "text_y": y + 12,
            "bars": [{"series": series, "y": y + 2 + 7 * j, "share": float(x[f"{key}_share"]),
                      "width": f"{bar_w * float(x[f'{key}_share']) / top:.1f}"}
                     for j, (series, key) in enumerate((("reference", "reference"), ("recent", "data")))],
        })
    return {"width": label_w + bar_w + 50, "height": row_h * len(cats), "x": label_w, "rows": rows}


__all__ = ["DEFAULT_SAMPLE", "MAX_SAMPLE", "SLICES", "BadRequest", "DriftRequest", "DriftView", "Window",
           "category_chart", "numeric_chart", "read_drift"]
