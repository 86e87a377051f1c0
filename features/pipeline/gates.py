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
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.schema.model import Gate
from features.sources.base import SourceBatch
from features.sources.names import as_fields
from features.validation import validate

if TYPE_CHECKING:
    from features.kernels import TransformProgram

__all__ = ["GateCounts", "GateResult", "GateVerdict", "evaluate", "measure", "measure_batch"]


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

    def as_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "owner": self.owner, "read": self.counts.read,
                "rejected": self.counts.rejected, "passed": not self.failed,
                "gates": [r.as_dict() for r in self.results],
                "breached": [r.gate.name for r in self.breaches],
                "top_reasons": [{"rule": rule, "count": n} for rule, n in self.top_reasons(10)]}


def evaluate(compiled: CompiledSchema, counts: GateCounts) -> GateVerdict:
    """Judge ``counts`` against every gate of ``compiled`` (none: a verdict that passes).

    A rate gate is breached when its rows / rows read is above its limit (exactly, as
    fractions: at the limit passes; no rows read: rate 0); ``min_rows`` when fewer rows
    were read than its limit."""
    read = counts.read
    results = []
    for g in compiled.gates:
        if g.kind == "min_rows":
            results.append(GateResult(g, read, read, read < int(g.limit)))
            continue
        rows = counts.rejected if g.kind == "max_reject_rate" else counts.by_rule.get(g.rule or "", 0)
        rate = Fraction(rows, read) if read else Fraction(0)
        # the limit as written (0.29 is 29/100, not the float just below it)
        results.append(GateResult(g, float(rate), rows, rate > Fraction(repr(float(g.limit)))))
    q = compiled.schema.quality
    return GateVerdict(compiled.name, counts, tuple(results), None if q is None else q.owner)

