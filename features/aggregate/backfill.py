"""The batch backfill of windowed aggregations (``features load`` on a schema with them).

While the loader validates and writes the history, :class:`Collector` keeps, from each
batch's valid rows (input order), only what the aggregations read. After the last
batch, :func:`backfill` reads back the events earlier loads stored in the windows these
events touch, computes every changed value with the vectorised engine and writes them
in chunks (``AggregateWriter``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate.engine import AggSpec, Inputs, compute, extract, finalize, group_codes, raw_schema
from features.aggregate.writer import AggregateCounts, AggregateWriter
from features.lineage import RunContext

#: rows per Postgres upsert / Redis round (bounds the size of one transaction)
WRITE_CHUNK = 100_000


@dataclass
class Collector:
    """Called with each prepared batch's valid rows, in order; keeps the inputs."""

    spec: AggSpec
    parts: list[Inputs] = field(default_factory=list)

    def __call__(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self.parts.append(extract(self.spec, rows))

    def inputs(self) -> Inputs:
        if not self.parts:
            return extract(self.spec, _empty(self.spec))
        return _concat(self.parts)


def _empty(spec: AggSpec) -> pa.Table:
    from features.compile.arrow import arrow_schema

    schema = arrow_schema(spec.schema)
    return pa.table({**{f.name: pa.array([], f.type) for f in schema}, "_source": pa.array([], pa.string())})


def backfill(spec: AggSpec, inputs: Inputs, writer: AggregateWriter, ctx: RunContext,
             progress: Any = None) -> AggregateCounts:
    """Compute and write every aggregation value this load's events change; returns the counts.

    The history table is the source of truth: for each entity of ``inputs`` (this load's
    valid rows, input order) with event times ``[lo, hi]``, the values of its events in
    ``[lo, hi + longest window)`` are recomputed over its history in ``[lo - longest, hi +
    longest)``: the events earlier loads stored (read back) and this load's. So loading
    January then February gives the values of one load of both, in either order, and the
    order of files and rows changes nothing. Of two events with one (entity, event time),
    the history keeps the first: an earlier load's, else the first in input order.
    """
    t0 = time.perf_counter()
    counts = AggregateCounts(events=len(inputs))
    if len(inputs) == 0:
        return counts
    entity = inputs.entity
    if pa.types.is_dictionary(entity.type):
        entity = entity.cast(entity.type.value_type)
        inputs = Inputs(entity, inputs.time_us, inputs.source, inputs.contrib, inputs.values)
    codes = group_codes(entity)
    k = int(codes.max()) + 1
    lo = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(k, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, codes, inputs.time_us)
    np.maximum.at(hi, codes, inputs.time_us)
    firsts = np.unique(codes, return_index=True)[1]  # each entity's first row (codes are 0..k-1)
    longest = spec.longest_us
    stored = writer.stored_inputs(spec, entity.take(pa.array(firsts)), lo - longest, hi + longest,
                                  exclude_run=ctx.run_id)
    counts.from_history = len(stored)
    merged = _concat([stored, inputs]) if len(stored) else inputs
    result = compute(spec, merged)
    m = len(stored)
    mcodes = group_codes(merged.entity) if m else codes
    # this load's duplicates: its events whose key the history holds from another record
    # (the same record loaded again, e.g. a re-run, is not a duplicate)
    dup = result.duplicate[result.duplicate >= m]
    if len(dup):
        key = pd.DataFrame({"k": mcodes, "t": merged.time_us})
        group = key.groupby(["k", "t"], sort=False).ngroup().to_numpy()
        holder = np.zeros(int(group.max()) + 1, dtype=np.int64)
        holder[group[result.accepted]] = result.accepted
        same = pc.equal(merged.source.take(pa.array(dup)), merged.source.take(pa.array(holder[group[dup]])))
        counts.duplicates = len(dup) - int(pc.sum(same).as_py() or 0)
    counts.accepted = counts.events - counts.duplicates
    # write the events whose windows this load changed: at or after their entity's first
    # new event (the read range ends a whole window after its last one)
    acc = result.accepted
    own = np.full(int(mcodes.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(own, mcodes[m:], inputs.time_us)
    sel = np.flatnonzero(merged.time_us[acc] >= own[mcodes[acc]])
    raw = pa.table(result.raw, schema=raw_schema(spec)).take(pa.array(sel))
    idx = acc[sel]
    for start in range(0, len(idx), WRITE_CHUNK):
        rows = idx[start:start + WRITE_CHUNK]
        part = pa.array(rows)
        values = finalize(spec, raw.slice(start, WRITE_CHUNK))
        done = writer.write(spec, ctx, merged.entity.take(part), merged.time_us[rows],
                            merged.source.take(part), values)
        counts.rows_written += done.rows_written
        counts.hot_written += done.hot_written
        if progress is not None:
            progress.update(min(start + WRITE_CHUNK, len(idx)), 0)
    counts.seconds = time.perf_counter() - t0
    return counts


def _concat(parts: list[Inputs]) -> Inputs:
    """Inputs one after the other (the entity arrays cast to the last part's type)."""
    entity_type = parts[-1].entity.type
    values: dict[str, Any] = {}
    for name in parts[-1].values:
        vs = [x.values[name] for x in parts]
        values[name] = (pa.concat_arrays([v.cast(vs[-1].type) for v in vs]) if isinstance(vs[0], pa.Array)
                        else np.concatenate(vs))
    return Inputs(pa.concat_arrays([x.entity.cast(entity_type) for x in parts]),
                  np.concatenate([x.time_us for x in parts]), pa.concat_arrays([x.source for x in parts]),
                  {k: np.concatenate([x.contrib[k] for x in parts]) for k in parts[-1].contrib}, values)


__all__ = ["WRITE_CHUNK", "Collector", "backfill"]
