"""Quality gates: measure a load's rejects, then judge them against the schema's gates.

The batch loader checks its gates *before* it writes (``features.load.gates``): one
validation pass over the whole input (:func:`measure`) counts the rows read, the rows
rejected and the rows each rule rejected, :func:`evaluate` compares them with the
schema's ``quality:`` section (docs/schema.md, "Quality gates") and returns a
:class:`GateVerdict`. A ``fail`` gate breached means the load stores nothing (but its
rejects, the evidence); ``warn`` means it stores everything and says so. The measure
validates exactly as :func:`features.pipeline.prepare.process_batch` does (the same
compiled rules, and the transforms where a derived feature rejects: ``on_invalid:
reject``), so the verdict counts what the load would reject, row for row.

Pure: nothing here writes. The measure is vectorised (Arrow ``value_counts``, no row
objects); the verdict's arithmetic is exact (rates compared as fractions, so a load at
exactly its limit passes).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.schema.model import Gate
from features.sources.base import SourceBatch
from features.sources.names import as_fields
from features.validation import validate

if TYPE_CHECKING:
    from features.kernels import TransformProgram

__all__ = ["DEFAULT_WINDOW_MIN_RECORDS", "DEFAULT_WINDOW_RECORDS", "GateCounts", "GateResult", "GateVerdict",
           "GateWindow", "WindowCheck", "evaluate", "measure", "measure_batch", "window_sizes"]

#: The sliding window of the stream's breaker and the HTTP ingest: the last this many
#: records (``quality: window_records``).
DEFAULT_WINDOW_RECORDS = 1000
#: The fewest records the window holds before a rate gate may trip (``quality:
#: window_min_records``; capped at the window): 1 bad record of 2 trips nothing.
DEFAULT_WINDOW_MIN_RECORDS = 100


@dataclass
class GateCounts:
    """What a load's input holds: rows ``read``, rows ``rejected`` (each once, whatever the
    number of rules it failed) and, per rule id, the rows that rule rejected."""

    read: int = 0
    rejected: int = 0
    by_rule: Counter[str] = field(default_factory=Counter)

    def add(self, other: GateCounts) -> None:
        self.read += other.read
        self.rejected += other.rejected
        self.by_rule.update(other.by_rule)


def rejects_transforms(compiled: CompiledSchema) -> bool:
    """Whether a derived feature of ``compiled`` rejects rows (``on_invalid: reject``): only
    then does the measure run the transforms."""
    return any(f.on_invalid == "reject" for f in compiled.schema.features)


def measure_batch(sb: SourceBatch, compiled: CompiledSchema, program: TransformProgram | None,
                  reference_time: dt.datetime) -> GateCounts:
    """The counts of one source batch: validated as the load validates it, and transformed
    when ``program`` is given (pass it only where :func:`rejects_transforms`: the transforms
    reject nothing otherwise)."""
    result = validate(as_fields(sb.batch, compiled.schema), compiled, json_text=sb.json_text)
    counts = GateCounts(read=result.input_rows, rejected=result.rejected_rows,
                        by_rule=Counter(result.counts.by_rule))
    if program is not None and result.valid.num_rows:
        out = program.run(result.valid, reference_time=reference_time)
        if out.rejects.num_rows:
            # transform rejects are rows the validator passed: disjoint from its rejects
            counts.rejected += len(np.unique(out.rejects.column("row").to_numpy()))
            for entry in pc.value_counts(out.rejects.column("rule").combine_chunks()).to_pylist():
                counts.by_rule[str(entry["values"])] += int(entry["counts"])
    return counts


def measure(batches: Iterable[SourceBatch], compiled: CompiledSchema, program: TransformProgram | None,
            reference_time: dt.datetime) -> GateCounts:
    """:func:`measure_batch` summed over ``batches`` (a whole load's input)."""
    total = GateCounts()
    use = program if rejects_transforms(compiled) else None
    for sb in batches:
        total.add(measure_batch(sb, compiled, use, reference_time))
    return total


@dataclass(frozen=True)
class GateResult:
    """One gate judged: ``measured`` is the rate (rows / rows read) of a rate gate, the
    rows read of ``min_rows``; ``rows`` the rows behind it (rejected rows, the rule's
    rows, rows read); ``breached`` whether it is past its limit."""

    gate: Gate
    measured: float | int
    rows: int
    breached: bool

    def describe(self, read: int) -> str:
        """``max_reject_rate: 2,000 of 10,000 rows rejected = 20% > limit 5%``."""
        g = self.gate
        if g.kind == "min_rows":
            op = "<" if self.breached else ">="
            return f"{g.name}: {self.rows:,} rows read {op} minimum {int(g.limit):,}"
        what = "rejected" if g.kind == "max_reject_rate" else f"rejected by {g.rule}"
        op = ">" if self.breached else "<="
        return (f"{g.name}: {self.rows:,} of {read:,} rows {what} = {_percent(float(self.measured))} {op} "
                f"limit {_percent(float(g.limit))}")

    def as_dict(self) -> dict[str, Any]:
        g = self.gate
        return {"gate": g.name, "kind": g.kind, "rule": g.rule, "limit": g.limit, "on_breach": g.on_breach,
                "measured": self.measured, "rows": self.rows, "breached": self.breached}


def _percent(rate: float) -> str:
    """A rate as a percentage, 4 significant digits (``20%``, ``1.235%``, ``0.001%``)."""
    return f"{rate * 100:.4g}%"


@dataclass(frozen=True)
class GateVerdict:
    """The gates of one load judged against its counts (:func:`evaluate`): every gate's
    :class:`GateResult` in schema order, the counts, the owner of the data."""

    schema: str
    counts: GateCounts
    results: tuple[GateResult, ...]
    owner: str | None = None

    @property
    def breaches(self) -> tuple[GateResult, ...]:
        return tuple(r for r in self.results if r.breached)

    @property
    def failed(self) -> tuple[GateResult, ...]:
        """The breached ``fail`` gates: any one refuses the load."""
        return tuple(r for r in self.breaches if r.gate.on_breach == "fail")

    @property
    def warned(self) -> tuple[GateResult, ...]:
        """The breached ``warn`` gates: the load is stored, and says so."""
        return tuple(r for r in self.breaches if r.gate.on_breach == "warn")

    def top_reasons(self, n: int = 5) -> list[tuple[str, int]]:
        """The ``n`` rules that rejected the most rows, with their counts (ties by rule id)."""
        return sorted(self.counts.by_rule.items(), key=lambda kv: (-kv[1], kv[0]))[:n]

    def lines(self) -> list[str]:
        """The verdict as text: one line per gate (``BREACHED (fail)``, ``breached (warn)``
        or ``ok``), then the top reasons."""
        c = self.counts
        out = [f"quality gates of {self.schema}: read {c.read:,}, rejected {c.rejected:,}"
               + (f" (owner {self.owner})" if self.owner else "")]
        for r in self.results:
            state = "ok" if not r.breached else "BREACHED (fail)" if r.gate.on_breach == "fail" \
                else "breached (warn)"
            out.append(f"  {state:<15}  {r.describe(c.read)}")
        if not self.results:
            out.append("  (the schema has no load gates)")
        if c.by_rule:
            out.append("  top reasons: " + ", ".join(f"{rule} {n:,}" for rule, n in self.top_reasons()))
        return out

    def as_rows(self, *, refused: bool | None = None) -> list[dict[str, Any]]:
        """The verdict as the rows of ``featureline_gate_verdicts`` (one per gate judged,
        :meth:`features.sinks.postgres.PostgresSink.record_gate_verdict`). ``refused``: the
        run stored nothing because of it (None: any ``fail`` gate breached, a batch load's
        rule); a stream's or an HTTP worker's breaker passes False: the run's earlier
        records are stored, its tripped micro-batch or request is not."""
        no = bool(self.failed) if refused is None else refused
        return [{"gate": r.gate.name, "kind": r.gate.kind, "rule": r.gate.rule, "measured": float(r.measured),
                 "rows": r.rows, "limit": float(r.gate.limit), "on_breach": r.gate.on_breach,
                 "breached": r.breached, "refused": no, "read": self.counts.read,
                 "rejected": self.counts.rejected}
                for r in self.results]

    def as_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "owner": self.owner, "read": self.counts.read,
                "rejected": self.counts.rejected, "passed": not self.failed,
                "gates": [r.as_dict() for r in self.results],
                "breached": [r.gate.name for r in self.breaches],
                "top_reasons": [{"rule": rule, "count": n} for rule, n in self.top_reasons(10)]}


def _limit(g: Gate) -> Fraction:
    """A rate gate's limit as written (0.29 is 29/100, not the float just below it)."""
    return Fraction(repr(float(g.limit)))


def evaluate(compiled: CompiledSchema, counts: GateCounts, *, rates_only: bool = False) -> GateVerdict:
    """Judge ``counts`` against every gate of ``compiled`` (none: a verdict that passes).

    A rate gate is breached when its rows / rows read is above its limit (exactly, as
    fractions: at the limit passes; no rows read: rate 0); ``min_rows`` when fewer rows
    were read than its limit. ``rates_only``: the rate gates alone (a sliding window,
    which has no ``min_rows``: :class:`GateWindow`)."""
    read = counts.read
    results = []
    for g in compiled.gates:
        if g.kind == "min_rows" and rates_only:
            continue
        if g.kind == "min_rows":
            results.append(GateResult(g, read, read, read < int(g.limit)))
            continue
        rows = counts.rejected if g.kind == "max_reject_rate" else counts.by_rule.get(g.rule or "", 0)
        rate = Fraction(rows, read) if read else Fraction(0)
        results.append(GateResult(g, float(rate), rows, rate > _limit(g)))
    q = compiled.schema.quality
    return GateVerdict(compiled.name, counts, tuple(results), None if q is None else q.owner)



# --------------------------------------------------------------------------- the sliding window


def window_sizes(compiled: CompiledSchema) -> tuple[int, int]:
    """``(window_records, window_min_records)`` of ``compiled``'s ``quality:`` section, the
    defaults where unset (the minimum capped at the window)."""
    q = compiled.schema.quality
    size = (q.window_records if q is not None else None) or DEFAULT_WINDOW_RECORDS
    least = (q.window_min_records if q is not None else None) or DEFAULT_WINDOW_MIN_RECORDS
    return size, min(least, size)


@dataclass(frozen=True)
class WindowCheck:
    """A micro-batch judged by :meth:`GateWindow.observe`.

    ``position``: the record of the micro-batch (0-based) at whose window ``verdict`` was
    taken: the first record where a ``fail`` gate is breached when ``tripped``, else the
    first where any gate is breached, else the last record. ``verdict`` is None while the
    window holds fewer than its minimum of records there (no gate may trip yet)."""

    verdict: GateVerdict | None
    position: int | None
    tripped: bool
    #: the records the window held at ``position``
    window: int = 0

    @property
    def breached(self) -> bool:
        return self.verdict is not None and bool(self.verdict.breaches)


class GateWindow:
    """The rate gates of ``compiled`` over a sliding window of the last N records: the
    stream's breaker and the HTTP ingest's window (docs/operations.md, "Quality gates").

    After each micro-batch (:meth:`observe`) every record of it is judged with the window
    that ends at it: the last ``window_records`` records read up to and including it
    (fewer at the start), once the window holds at least ``window_min_records``. So which
    record trips a gate depends on the records alone, never on how they were cut into
    micro-batches: the micro-batch holding that record is the one refused. The verdict at
    that record is :func:`evaluate`'s over the window's :class:`GateCounts` (rejected
    records and, per rule, the records it rejected); the scan that finds the record is the
    same comparison over every record at once (cumulative sums, exact integer arithmetic).

    A tripped micro-batch is not added to the window (it is not stored: a restart reads it
    again). The window lives in memory, per process (per Flink subtask): it starts empty
    when a job starts."""

    def __init__(self, compiled: CompiledSchema) -> None:
        self.compiled = compiled
        self.gates = tuple(g for g in compiled.gates if g.kind != "min_rows")
        self.size, self.least = window_sizes(compiled)
        #: records read so far (the next record's sequence number)
        self.seen = 0
        #: per record of the window (the last ``min(seen, size)``): 1 when it was rejected
        self._rejected = np.zeros(0, dtype=np.int8)
        #: one entry per (record, rule that rejected it) of the window: sequence number, rule id
        self._seq = np.zeros(0, dtype=np.int64)
        self._rules = pa.array([], pa.string())

    @property
    def active(self) -> bool:
        """Whether the schema has a rate gate to watch."""
        return bool(self.gates)

    def observe(self, rejected: npt.NDArray[np.bool_], rows: npt.NDArray[np.int64],
                rules: pa.Array) -> WindowCheck:
        """Judge one micro-batch: ``rejected`` per record (in read order), and one entry per
        failed rule: ``rows`` (the record's position in the micro-batch) and ``rules`` (the
        rule id). Adds the micro-batch to the window unless it trips a ``fail`` gate."""
        n = len(rejected)
        h = len(self._rejected)
        base = self.seen - h                    # the sequence number of flags[0]
        flags = np.concatenate([self._rejected, np.asarray(rejected, dtype=np.int8)])
        seq = np.concatenate([self._seq, np.asarray(rows, dtype=np.int64) + self.seen])
        rule_ids = pa.concat_arrays([self._rules, pa.array(rules, pa.string())])
        end = np.arange(h + 1, h + n + 1, dtype=np.int64)   # each new record's window: [lo, end)
        lo = np.maximum(end - self.size, 0)
        size = end - lo
        eligible = size >= self.least
        firsts: dict[Gate, int] = {}
        cum_rejected = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
        for g in self.gates:
            if g.kind == "max_reject_rate":
                cum = cum_rejected
            else:
                mine = np.asarray(pc.equal(rule_ids, g.rule).fill_null(False).to_numpy(zero_copy_only=False),
                                  dtype=np.bool_)
                hits = np.bincount(seq[mine] - base, minlength=h + n)
                cum = np.concatenate([[0], np.cumsum(hits, dtype=np.int64)])
            first = _first_breach(cum[end] - cum[lo], size, eligible, _limit(g))
            if first is not None:
                firsts[g] = first
        fails = [i for g, i in firsts.items() if g.on_breach == "fail"]
        tripped = bool(fails)
        if n == 0:
            return WindowCheck(None, None, False)
        position = min(fails) if fails else min(firsts.values()) if firsts else n - 1
        verdict = None
        if eligible[position]:
            e, start = int(end[position]), int(lo[position])
            inside = (seq >= base + start) & (seq < base + e)
            by_rule: Counter[str] = Counter()
            if inside.any():
                for entry in pc.value_counts(rule_ids.filter(pa.array(inside))).to_pylist():
                    by_rule[str(entry["values"])] += int(entry["counts"])
            counts = GateCounts(read=e - start, rejected=int(cum_rejected[e] - cum_rejected[start]),
                                by_rule=by_rule)
            verdict = evaluate(self.compiled, counts, rates_only=True)
            # the scan and the verdict are one comparison: they cannot disagree
            assert not tripped or verdict.failed, "the window scan and evaluate disagree"
        if not tripped:
            self.seen += n
            self._rejected = flags[-self.size:]
            keep = seq >= self.seen - len(self._rejected)
            self._seq = seq[keep]
            self._rules = rule_ids.filter(pa.array(keep))
        return WindowCheck(verdict, position, tripped, int(size[position]))


def _first_breach(rows: npt.NDArray[np.int64], read: npt.NDArray[np.int64], eligible: npt.NDArray[np.bool_],
                  limit: Fraction) -> int | None:
    """The first index where ``rows / read > limit`` (exactly) and ``eligible``; None if none."""
    p, q = limit.numerator, limit.denominator
    if q * (int(read.max(initial=0)) + 1) < 2**62 and p * (int(read.max(initial=0)) + 1) < 2**62:
        over = rows * q > read * p
    else:  # a limit with a long decimal expansion: Python integers
        over = np.array([int(r) * q > int(n) * p for r, n in zip(rows, read, strict=True)], dtype=np.bool_)
    hit = np.flatnonzero(over & eligible)
    return int(hit[0]) if len(hit) else None
