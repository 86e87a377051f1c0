"""The loop both jobs share: source -> validate -> transform -> sinks, with exact counts.

``run(source, compiled, sinks, ...)`` reads every batch of ``source``, validates it
with the compiled rules, runs the transform program on the valid rows, attaches
lineage, and hands each sink one :class:`~features.sinks.base.WriteUnit`. The batch
loader and the streaming job call this same code (the stream through
:func:`process_batch`, one micro-batch at a time).

Counts are conserved for every run: ``read == stored + rejected + already_present``
where ``already_present`` counts valid rows the cold store already held, rejected rows
whose reject it already held (an earlier run read the same input record: see
:mod:`features.sinks.postgres` for the key), and every row of a unit the ledger says is
committed. So ``rejected`` counts the rejects this run stored, each under its run id,
however the input was cut into units (``--workers``, Flink's parallelism): a second run
over the same input counts each row one way whatever its shard count. Rejected rows are
never dropped: each goes to the rejects table with its raw values, all its errors and
its lineage.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.kernels.digest import content_digests, field_defaults
from features.lineage import DIGEST, LINEAGE_COLUMNS, RunContext
from features.observe.metrics import RunMetrics
from features.observe.progress import Progress
from features.sinks.base import REJECTED_ROWS_SCHEMA, Sink, WriteResult, WriteUnit
from features.sources.base import Source, SourceBatch
from features.sources.names import as_fields
from features.validation import validate
from features.validation.result import ValidationResult

if TYPE_CHECKING:
    from features.kernels import TransformProgram

_MAX_EXAMPLES = 3


@dataclass
class SinkStats:
    """Per-sink totals: rows written, rows left as they were, units skipped, seconds.
    ``restored``: of ``written``, the rows of units the primary (cold) store already held
    whole (committed in an earlier run, or all its valid rows already present): a store
    that had lost them (Redis after a FLUSHDB) got them again."""

    written: int = 0
    unchanged: int = 0
    skipped_units: int = 0
    seconds: float = 0.0
    restored: int = 0


@dataclass
class RunSummary:
    """What a run did. ``read == stored + rejected + already_present`` always."""

    run_id: str
    schema: str
    read: int = 0
    stored: int = 0
    rejected: int = 0
    already_present: int = 0
    units: int = 0
    skipped_units: int = 0
    by_rule: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    sinks: dict[str, SinkStats] = field(default_factory=dict)
    seconds: float = 0.0
    #: the windowed aggregations' counts (``features.aggregate.writer.AggregateCounts``), if any
    aggregations: dict[str, Any] | None = None

    @property
    def restored(self) -> int:
        """Rows the other stores wrote that the primary already held (``SinkStats.restored``)."""
        return sum(st.restored for st in self.sinks.values())

    @property
    def adds_up(self) -> bool:
        agg_ok = self.aggregations is None or bool(self.aggregations.get("adds_up"))
        return self.read == self.stored + self.rejected + self.already_present and agg_ok

    def top_reasons(self, n: int = 5) -> list[tuple[str, int, list[str]]]:
        return [(rule, count, self.examples.get(rule, [])) for rule, count in self.by_rule.most_common(n)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "schema": self.schema, "read": self.read, "stored": self.stored,
            "rejected": self.rejected, "already_present": self.already_present,
            "restored": self.restored, "adds_up": self.adds_up, "units": self.units,
            "skipped_units": self.skipped_units,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.read / self.seconds) if self.seconds else None,
            "top_reasons": [{"rule": r, "count": c, "examples": e} for r, c, e in self.top_reasons(10)],
            "sinks": {k: vars(v) for k, v in self.sinks.items()},
            **({"aggregations": self.aggregations} if self.aggregations is not None else {}),
        }


def merge_summaries(run_id: str, schema: str, parts: Sequence[RunSummary], *, seconds: float) -> RunSummary:
    """The summary of one run made of ``parts`` (``features load --workers``: one per
    shard): every count summed, ``seconds`` the run's wall time."""
    out = RunSummary(run_id, schema, seconds=seconds)
    for p in parts:
        out.read += p.read
        out.stored += p.stored
        out.rejected += p.rejected
        out.already_present += p.already_present
        out.units += p.units
        out.skipped_units += p.skipped_units
        out.by_rule.update(p.by_rule)
        for rule, examples in p.examples.items():
            have = out.examples.setdefault(rule, [])
            have.extend(examples[:max(0, _MAX_EXAMPLES - len(have))])
        for name, st in p.sinks.items():
            total = out.sinks.setdefault(name, SinkStats())
            total.written += st.written
            total.unchanged += st.unchanged
            total.skipped_units += st.skipped_units
            total.seconds += st.seconds
            total.restored += st.restored
        if p.aggregations is not None:
            agg = out.aggregations if out.aggregations is not None else {}
            for key, value in p.aggregations.items():
                if key == "adds_up":
                    agg[key] = bool(agg.get(key, True)) and bool(value)
                elif isinstance(value, int | float):
                    agg[key] = agg.get(key, 0) + value
            out.aggregations = agg
    return out


@dataclass(frozen=True)
class Prepared:
    """One source batch after validation and transforms: what the sinks receive."""

    rows: pa.Table
    rejects: pa.Table
    rejected_rows: int
    reject_rules: Counter[str]
    examples: dict[str, list[str]]
    #: for each row of ``rows``, its row in the source batch (None: not tracked)
    index: npt.NDArray[np.int64] | None = None
    #: one row per failed rule of ``rejects`` (``group``: its row in ``rejects``, ``rule``,
    #: ``message``), in the order ``reject_rules`` and ``examples`` were counted from
    entries: pa.Table | None = None

    def reasons(self, held: npt.NDArray[np.int64] | None) -> tuple[Counter[str], dict[str, list[str]]]:
        """``reject_rules`` and ``examples`` of the rejects other than the rows ``held``
        (positions in ``rejects``: the ones the store already held, counted already
        present); all of them when ``held`` is None or empty."""
        if held is None or len(held) == 0 or self.entries is None:
            return self.reject_rules, self.examples
        kept = self.entries.filter(pc.invert(pc.is_in(self.entries.column("group"),
                                                      value_set=pa.array(held, pa.int64()))))
        return reject_reasons(kept)


def reject_reasons(entries: pa.Table) -> tuple[Counter[str], dict[str, list[str]]]:
    """Per rule, how many of ``entries`` (one row per failed rule: ``rule``, ``message``)
    are of it, and up to three example messages from the first 200 entries."""
    rule_counts: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    if entries.num_rows == 0:
        return rule_counts, examples
    for entry in pc.value_counts(entries.column("rule").combine_chunks()).to_pylist():
        rule_counts[str(entry["values"])] = int(entry["counts"])
    head = entries.slice(0, 200)
    for rule, message in zip(head.column("rule").to_pylist(), head.column("message").to_pylist(),
                             strict=True):
        ex = examples.setdefault(rule, [])
        if len(ex) < _MAX_EXAMPLES:
            ex.append(message)
    return rule_counts, examples


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


# jsonb refuses the escape \u0000 (a NUL character): keep it as the six characters
# \u0000 instead. Only an escape, i.e. one preceded by an even run of backslashes.
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def _json_safe(value: Any) -> Any:
    """NaN and ±inf are not JSON (and Postgres jsonb refuses them): keep them as text,
    also inside lists and objects (a decoded record's ``[NaN]``). Nested values are
    copied without recursion: a record may nest as deep as ``json.loads`` allows."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # 'nan', 'inf', '-inf'
    if not isinstance(value, list | dict):
        return value
    root: list[Any] | dict[Any, Any] = [] if isinstance(value, list) else {}
    todo: list[tuple[Any, list[Any] | dict[Any, Any]]] = [(value, root)]
    while todo:
        source, target = todo.pop()
        for key, item in (source.items() if isinstance(source, dict) else enumerate(source)):
            if isinstance(item, list | dict):
                copied: Any = [] if isinstance(item, list) else {}
                todo.append((item, copied))
            else:
                copied = _json_safe(item)
            if isinstance(target, list):
                target.append(copied)
            else:
                target[key] = copied
    return root


def _raw_json(batch: pa.RecordBatch, rows: npt.NDArray[np.int64]) -> list[str]:
    """The input values of ``rows`` as JSON objects (only rejected rows come here).

    Always valid JSON that Postgres jsonb accepts: decimals, dates and times become
    strings, NaN/inf become the strings ``nan``/``inf``/``-inf``, bytes are decoded as
    UTF-8 with replacement, a NUL character becomes the text ``\\u0000``.
    """
    taken = batch.take(pa.array(rows, pa.int64())).to_pylist()
    return [_dumps({k: _json_safe(v) for k, v in r.items()}) for r in taken]


def raw_json_rows(rows: Sequence[dict[str, Any]], index: npt.NDArray[np.int64]) -> list[str]:
    """Like :func:`_raw_json` for decoded JSON objects (a stream's rows)."""
    return [_dumps({k: _json_safe(v) for k, v in rows[int(i)].items()}) for i in index]


def _dumps(obj: Any) -> str:
    """JSON text that Postgres jsonb accepts (see :func:`_raw_json`)."""
    text = json.dumps(obj, default=_json_default, ensure_ascii=False, allow_nan=False)
    return _NUL_ESCAPE.sub(r"\1\\\\u0000", text)


RowsToJson = Callable[[npt.NDArray[np.int64]], list[str]]


def group_rejects(rejects: pa.Table, batch: Any, row_uris: Callable[[pa.Array], pa.Array],
                   ctx: RunContext, raw: RowsToJson | None = None, row_offset: int = 0,
                   row_numbers: Callable[[pa.Array], pa.Array] | None = None) -> pa.Table:
    """Reject entries (one per failed rule) -> one row per rejected input row.
    ``row_index`` is the row in the source: ``row_numbers(rows)`` when given, else the
    batch's first row (``row_offset``) + its row in the batch."""
    if rejects.num_rows == 0:
        return REJECTED_ROWS_SCHEMA.empty_table()
    rejects = rejects.sort_by([("row", "ascending")])
    rows = rejects.column("row").to_numpy()
    uniq, starts = np.unique(rows, return_index=True)
    entries = rejects.select(["field", "rule", "reason", "message", "value"]).to_pylist()
    bounds = [*starts.tolist(), len(entries)]
    errors = [_dumps(entries[bounds[i]:bounds[i + 1]])
              for i in range(len(uniq))]  # loop over rejected rows only: the exception path
    raws = raw(uniq) if raw is not None else _raw_json(batch, uniq)
    idx = pa.array(uniq, pa.int64())
    lineage = ctx.columns(row_uris(idx))
    n = len(uniq)
    return pa.table({
        "_source": lineage["_source"],
        "row_index": (row_numbers(idx) if row_numbers is not None
                      else pc.add(idx, row_offset) if row_offset else idx),
        "raw": pa.array(raws, pa.string()),
        "errors": pa.array(errors, pa.string()),
        "event_time": pa.nulls(n, pa.timestamp("us", "UTC")),
        **{k: v for k, v in lineage.items() if k != "_source"},
    }, schema=REJECTED_ROWS_SCHEMA)


def process_batch(sb: SourceBatch, compiled: CompiledSchema, program: TransformProgram | None,
                  ctx: RunContext,
                  reference_time: dt.datetime,
                  raw: RowsToJson | None = None,
                  extra_rejects: pa.Table | None = None,
                  validated: ValidationResult | None = None) -> Prepared:
    """Validate, transform and attach lineage to one source batch.

    ``program`` is a compiled transform program (``features.kernels``) or None. Its
    rejects (a transform producing NaN/inf under ``on_invalid: reject``) join the
    validator's. ``extra_rejects`` (same columns as validator rejects) lets a stream
    add decode failures for rows it could not even parse. ``validated``: the batch's
    validation result when the caller already has it. The batch has the input's names
    (a field's ``source:``, :mod:`features.sources.names`): it is renamed to field
    names for validation, and the rejects' ``raw`` keeps the input's names. Pure:
    writes nothing.
    """
    batch = sb.batch
    # validated with field names; rejects' raw is rendered from ``batch`` (input names)
    result = validated if validated is not None else validate(as_fields(batch, compiled.schema), compiled)
    valid = result.valid
    valid_index = result.valid_row_index.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    reject_parts = [result.rejects]
    if extra_rejects is not None and extra_rejects.num_rows:
        reject_parts.append(extra_rejects.select(result.rejects.column_names).cast(result.rejects.schema))
    columns: dict[str, pa.Array] = {name: valid.column(i) for i, name in enumerate(valid.schema.names)}
    kept_index = valid_index
    if program is not None:
        out = program.run(valid, reference_time=reference_time)
        if out.rejects.num_rows:
            # transform rejects index rows of ``valid``: map them back to input rows
            bad = out.rejects.column("row").to_numpy()
            mapped = out.rejects.set_column(out.rejects.schema.get_field_index("row"), "row",
                                            pa.array(valid_index[bad], pa.int64()))
            reject_parts.append(mapped.select(result.rejects.column_names).cast(result.rejects.schema))
            kept = out.kept_row_index
            columns = {name: arr.take(kept) for name, arr in columns.items()}
            kept_index = valid_index[kept.to_numpy()]
    # every stored event's content digest (the history's key beside entity and event
    # time, Redis's tie-break): over the declared fields, so every entry point agrees
    digest = (content_digests({f.name: columns[f.name] for f in compiled.schema.fields}, len(kept_index),
                              field_defaults(compiled.schema))
              if compiled.schema.loadable else None)
    if program is not None:
        for i, name in enumerate(out.features.schema.names):
            columns[name] = out.features.column(i)
    data = dict(columns)
    if digest is not None:
        data[DIGEST] = digest
    data.update(ctx.columns(sb.lineage.row_uris(pa.array(kept_index, pa.int64()))))
    rows = pa.table(data)
    rejects = pa.concat_tables(reject_parts) if len(reject_parts) > 1 else reject_parts[0]
    grouped = group_rejects(rejects, batch, sb.lineage.row_uris, ctx, raw, row_numbers=sb.lineage.row_numbers)
    entries = None
    if rejects.num_rows:
        # each entry's row in ``grouped`` (one row per rejected input row, by input row)
        row = rejects.column("row").to_numpy()
        group = np.searchsorted(np.unique(row), row)
        entries = pa.table({"group": pa.array(group, pa.int64()), "rule": rejects.column("rule"),
                            "message": rejects.column("message")})
    rule_counts, examples = reject_reasons(entries) if entries is not None else (Counter(), {})
    return Prepared(rows, grouped, grouped.num_rows, rule_counts, examples, kept_index, entries)


def account(summary: RunSummary, prepared: Prepared, read: int, results: dict[str, Any],
            primary: str, metrics: RunMetrics | None = None, event_time: str | None = None) -> None:
    """Add one unit's outcome to ``summary`` (and to ``metrics``, by the same amounts);
    ``primary`` is the sink whose stored count defines ``stored`` (the cold store);
    ``event_time`` names the rows' event time column (for the freshness metric)."""
    summary.read += read
    summary.units += 1
    res = results.get(primary)
    if res is not None and res.skipped:
        summary.already_present += read
        summary.skipped_units += 1
        if metrics is not None:
            metrics.unit(read=read, stored=0, rejected=0, already_present=read, by_rule={})
        return
    # rejects the primary already held (an earlier run read those records) are already
    # present, as valid rows it held are: ``rejected`` is what this run stored
    held = res.rejects_held if res is not None else None
    rejected = prepared.rejected_rows - (len(held) if held is not None else 0)
    by_rule, examples = prepared.reasons(held)
    summary.rejected += rejected
    summary.by_rule.update(by_rule)
    for rule, ex in examples.items():
        have = summary.examples.setdefault(rule, [])
        have.extend(ex[: _MAX_EXAMPLES - len(have)])
    valid = prepared.rows.num_rows
    stored = res.stored if res is not None else valid
    present = valid - stored + prepared.rejected_rows - rejected
    summary.stored += stored
    summary.already_present += present
    if metrics is not None:
        metrics.unit(read=read, stored=stored, rejected=rejected, already_present=present, by_rule=by_rule)
        newest = newest_event_time(prepared.rows, event_time)
        if newest is not None:
            metrics.event_time(newest)


def newest_event_time(rows: pa.Table, column: str | None) -> float | None:
    """The newest value of ``column`` in ``rows`` as Unix seconds (a naive timestamp is
    UTC, a date its midnight UTC); None without rows, column or non-null value."""
    if column is None or rows.num_rows == 0 or column not in rows.column_names:
        return None
    newest = pc.max(rows.column(column)).as_py()
    if isinstance(newest, dt.datetime):
        return (newest if newest.tzinfo is not None else newest.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(newest, dt.date):
        return dt.datetime.combine(newest, dt.time(), dt.UTC).timestamp()
    return None


def _finish_unit(summary: RunSummary, pending: _Pending, primary: str, progress: Progress | None,
                 metrics: RunMetrics | None = None, event_time: str | None = None) -> None:
    """Wait for one unit's writes (in submission order) and account for them."""
    results: dict[str, Any] = {}
    for name, fut in pending.futures.items():
        res = fut.result()  # a sink's final error (after its retries) propagates here
        results[name] = res
        stats = summary.sinks[name]
        stats.seconds += res.seconds
        if res.skipped:
            stats.skipped_units += 1
        else:
            stats.written += res.stored
            stats.unchanged += res.already_present
            if metrics is not None:
                metrics.write(name, res.seconds)
    for name in pending.skipped:
        summary.sinks[name].skipped_units += 1
    held = results.get(primary)
    if primary and (held is None or held.skipped or held.stored == 0):
        # the primary already held every row of the unit: what another store wrote of it,
        # that store had lost (or never got)
        for name, res in results.items():
            if name != primary and not res.skipped:
                summary.sinks[name].restored += res.stored
    if primary and primary not in results:
        # the primary committed this unit in an earlier run; only other sinks caught up
        results[primary] = WriteResult(skipped=True)
    account(summary, pending.prepared, pending.read, results, primary, metrics, event_time)
    if progress:
        progress.update(summary)


class Guard(Protocol):
    """What keeps a writer and a migration of its schema apart
    (:class:`features.sinks.postgres.WriterGuard`)."""

    def enter(self, drain: Callable[[], None]) -> None: ...

    def release(self) -> None: ...


@dataclass
class _Pending:
    prepared: Prepared
    read: int
    futures: dict[str, Future[WriteResult]]
    skipped: list[str]


class BatchWriter:
    """Prepares batches and writes them to every sink, counting exactly.

    The batch loader (:func:`run`) and the streaming job share it. Each sink writes on
    its own thread, units in submission order, while the caller prepares the next
    batch: the stores work in parallel with each other and with us. At most
    ``in_flight`` units are prepared but not yet written, which bounds memory.
    :meth:`drain` waits for everything submitted (the stream calls it at the end of each
    micro-batch, so a checkpoint never covers rows that are not written). A sink's
    error (after its own bounded retries) propagates from :meth:`submit` or
    :meth:`drain` once the writes already started have finished. With ``metrics``, every
    unit accounted in ``summary`` is counted there too (same amounts), with each store's
    write seconds and the newest event time written. With ``guard``, each unit is written
    only once ``guard.enter`` lets it (a migration of the schema waiting first drains the
    units in flight, then stops the writer with SinkError); the caller releases it.
    """

    def __init__(self, compiled: CompiledSchema, sinks: Sequence[Sink], *, summary: RunSummary,
                 program: TransformProgram | None = None, progress: Progress | None = None,
                 in_flight: int = 2,
                 committed: dict[str, set[str]] | None = None,
                 observer: Callable[[pa.Table], None] | None = None,
                 metrics: RunMetrics | None = None, guard: Guard | None = None) -> None:
        self.compiled = compiled
        self.metrics = metrics
        self.guard = guard
        self._event_time = compiled.schema.event_time
        #: called with every batch's valid rows, in order, committed units included (the
        #: aggregations' backfill reads them)
        self.observer = observer
        self.sinks = list(sinks)
        self.summary = summary
        self.program = program
        self.progress = progress
        self.in_flight = in_flight
        self.primary = self.sinks[0].name if self.sinks else ""
        self.committed = committed if committed is not None else {s.name: set() for s in self.sinks}
        for s in self.sinks:
            summary.sinks.setdefault(s.name, SinkStats())
        self._pools = {s.name: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sink-{s.name}")
                       for s in self.sinks}
        self._queue: deque[_Pending] = deque()

    def submit(self, sb: SourceBatch, *, ctx: RunContext, reference_time: dt.datetime | None = None,
               prepared: Prepared | None = None, read: int | None = None) -> None:
        """Prepare ``sb`` (unless ``prepared`` is given) and start its writes. ``read``
        overrides the unit's input row count (a stream's micro-batch also holds records
        that never decoded into rows; ``prepared`` then carries their rejects)."""
        summary = self.summary
        unit = sb.lineage.unit
        n = read if read is not None else (len(sb.batch) if isinstance(sb.batch, list) else sb.batch.num_rows)
        todo = [s for s in self.sinks if unit is None or unit not in self.committed[s.name]]
        if self.observer is not None:
            if prepared is None:
                prepared = process_batch(sb, self.compiled, self.program, ctx,
                                         reference_time or ctx.ingested_at)
            self.observer(prepared.rows)
        if not todo:
            summary.read += n
            summary.units += 1
            summary.already_present += n
            summary.skipped_units += 1
            for s in self.sinks:
                summary.sinks[s.name].skipped_units += 1
            if self.metrics is not None:
                self.metrics.unit(read=n, stored=0, rejected=0, already_present=n, by_rule={})
            if self.progress:
                self.progress.update(summary)
            return
        if prepared is None:
            prepared = process_batch(sb, self.compiled, self.program, ctx, reference_time or ctx.ingested_at)
        while len(self._queue) >= self.in_flight:
            _finish_unit(summary, self._queue.popleft(), self.primary, self.progress, self.metrics,
                         self._event_time)
        if self.guard is not None:
            self.guard.enter(self.drain)
        write = WriteUnit(prepared.rows, prepared.rejects, unit, n, sb.lineage.content)
        futures = {}
        for s in todo:
            futures[s.name] = self._pools[s.name].submit(s.write, write)
        self._queue.append(_Pending(prepared, n, futures, [s.name for s in self.sinks if s not in todo]))

    def drain(self) -> None:
        """Wait for every submitted write and account for it."""
        while self._queue:
            _finish_unit(self.summary, self._queue.popleft(), self.primary, self.progress, self.metrics,
                         self._event_time)

    def close(self) -> None:
        """Let the writes already submitted finish (they commit or fail on their own)."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)


def run(source: Source, compiled: CompiledSchema, sinks: Sequence[Sink], *, ctx: RunContext,
        program: TransformProgram | None = None, reference_time: dt.datetime | None = None,
        progress: Progress | None = None,
        batches: Iterable[SourceBatch] | None = None, in_flight: int = 2,
        observer: Callable[[pa.Table], None] | None = None, metrics: RunMetrics | None = None,
        guard: Guard | None = None) -> RunSummary:
    """Load everything ``source`` yields into ``sinks`` (see :class:`BatchWriter`).

    The first sink is the primary (cold) store whose commit decides ``stored``.
    Sinks must be opened by the caller (so an unreachable store fails before any
    work). Units a sink's ledger already holds are skipped for that sink. ``metrics``
    (``features.observe.metrics.RunMetrics``) counts what ``summary`` counts, as it happens;
    ``guard``: see :class:`BatchWriter`.
    """
    summary = RunSummary(run_id=ctx.run_id, schema=compiled.name)
    committed = {s.name: s.committed_units() for s in sinks}
    t0 = time.perf_counter()
    writer = BatchWriter(compiled, sinks, summary=summary, program=program, progress=progress,
                         in_flight=in_flight, committed=committed, observer=observer, metrics=metrics,
                         guard=guard)
    try:
        for sb in (batches if batches is not None else source.batches()):
            writer.submit(sb, ctx=ctx, reference_time=reference_time)
        writer.drain()
    finally:
        writer.close()
    summary.seconds = time.perf_counter() - t0
    if progress:
        progress.close(summary)
    return summary


__all__ = ["LINEAGE_COLUMNS", "BatchWriter", "Guard", "Prepared", "RunSummary", "group_rejects",
           "newest_event_time", "process_batch", "raw_json_rows", "reject_reasons", "run"]
