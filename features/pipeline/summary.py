"""What a run did: per-sink and per-run counts (``read == stored + rejected +
already_present``), and how the parts of one run (``features load --workers``) add up."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: example messages kept per rule
MAX_EXAMPLES = 3


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
    #: the quality gates' verdict (``features.pipeline.gates.GateVerdict.as_dict``) of a load
    #: that checked them (its breached ``warn`` gates under ``breached``), else None
    gates: dict[str, Any] | None = None

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
            **({"gates": self.gates} if self.gates is not None else {}),
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
            have.extend(examples[:max(0, MAX_EXAMPLES - len(have))])
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

