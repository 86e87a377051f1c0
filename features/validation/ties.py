"""Exact copies and distinct events at one instant, counted in an input (issue 48).

A loadable schema keeps every distinct event, keyed by (entity, event time, content
digest: :mod:`features.kernels.digest`); a static schema by (entity, digest). Two valid
rows with the same key are one event (an *exact copy*: stored once); two rows with the
same entity and event time but different content are two *tied* events, both stored
(the greater digest is the newest). ``features validate`` and the report count both
over all their input, so ``valid = distinct events + exact copies``, as a load counts
``read = stored + rejected + duplicate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from features.kernels.digest import digest_words, field_defaults

if TYPE_CHECKING:
    from features.compile import CompiledSchema

_DIGEST = "digest"


@dataclass(frozen=True)
class TieCounts:
    """``events``: distinct events among the valid rows; ``exact_copies``: the other valid
    rows (copies of one of them); ``tied_events``: events that share their entity and
    event time with another, different event; ``tied_instants``: those (entity, time)s."""

    events: int = 0
    exact_copies: int = 0
    tied_events: int = 0
    tied_instants: int = 0

    def as_json(self) -> dict[str, int]:
        return {"events": self.events, "exact_copies": self.exact_copies,
                "tied_events": self.tied_events, "tied_instants": self.tied_instants}


class TieCounter:
    """Keys of every valid row seen (entity, event time, digest), counted at the end."""

    def __init__(self, compiled: CompiledSchema) -> None:
        schema = compiled.schema
        self.schema = schema
        self.active = schema.loadable
        self.instant = [c for c in (schema.entity, None if schema.static else schema.event_time) if c]
        self.defaults = field_defaults(schema)
        self.parts: list[pa.Table] = []

    def add(self, valid: pa.RecordBatch | pa.Table) -> None:
        """Account the valid rows of one batch (a column per declared field)."""
        if not self.active or not valid.num_rows:
            return
        columns = {f.name: valid.column(f.name) for f in self.schema.fields}
        words = digest_words(columns, valid.num_rows, self.defaults)
        keys: dict[str, Any] = {name: valid.column(name) for name in self.instant}
        keys[_DIGEST] = pa.array(words, pa.uint64())
        self.parts.append(pa.table(keys))

    def counts(self) -> TieCounts:
        if not self.parts:
            return TieCounts()
        keys = pa.concat_tables(self.parts)
        events = keys.group_by([*self.instant, _DIGEST]).aggregate([])
        per_instant = events.group_by(self.instant).aggregate([([], "count_all")])
        sizes = per_instant.column("count_all")
        tied = pc.greater(sizes, 1)
        return TieCounts(events=events.num_rows, exact_copies=keys.num_rows - events.num_rows,
                         tied_events=int(pc.sum(pc.filter(sizes, tied)).as_py() or 0),
                         tied_instants=int(pc.sum(tied.cast(pa.int64())).as_py() or 0))


def tie_line(t: TieCounts) -> str:
    """The counts as one line of text (``features validate``)."""
    line = (f"valid rows as stored: {t.events:,} events + {t.exact_copies:,} exact copies "
            f"(same entity, event time and content: stored once)")
    if t.tied_events:
        line += (f"; {t.tied_events:,} distinct events share an entity and event time with another "
                 f"({t.tied_instants:,} instants: all stored, the greatest digest the newest)")
    return line


__all__ = ["TieCounter", "TieCounts", "tie_line"]
