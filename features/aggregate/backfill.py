"""The batch backfill of windowed aggregations (``features load`` on a schema with them).

While the loader validates and writes the history, :class:`Collector` keeps, from each
batch's valid rows (arrival order = file order), only what the aggregations read.
After the last batch, :func:`backfill` computes every value as of each event's time
with the vectorised engine and writes them in chunks (``AggregateWriter``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from features.aggregate.engine import AggSpec, Inputs, compute, extract, finalize, raw_schema
from features.aggregate.writer import AggregateCounts, AggregateWriter, late_rejects
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
        p = self.parts
        values: dict[str, Any] = {}
        for name in p[0].values:
            vs = [x.values[name] for x in p]
            values[name] = pa.concat_arrays(vs) if isinstance(vs[0], pa.Array) else np.concatenate(vs)
        return Inputs(pa.concat_arrays([x.entity for x in p]), np.concatenate([x.time_us for x in p]),
                      pa.concat_arrays([x.source for x in p]),
                      {k: np.concatenate([x.contrib[k] for x in p]) for k in p[0].contrib}, values)


def _empty(spec: AggSpec) -> pa.Table:
    from features.compile.arrow import arrow_schema

    schema = arrow_schema(spec.schema)
    return pa.table({**{f.name: pa.array([], f.type) for f in schema}, "_source": pa.array([], pa.string())})


def backfill(spec: AggSpec, inputs: Inputs, writer: AggregateWriter, ctx: RunContext,
             progress: Any = None) -> AggregateCounts:
    """Compute and write every aggregation value of ``inputs``; returns the counts."""
    t0 = time.perf_counter()
    result = compute(spec, inputs)
    counts = AggregateCounts(events=len(inputs), accepted=len(result.accepted), late=len(result.late),
                             duplicates=len(result.duplicate))
    raw = pa.table(result.raw, schema=raw_schema(spec))
    idx = result.accepted
    for start in range(0, len(idx), WRITE_CHUNK):
        part = pa.array(idx[start:start + WRITE_CHUNK])
        values = finalize(spec, raw.slice(start, WRITE_CHUNK))
        done = writer.write(spec, ctx, inputs.entity.take(part),
                            inputs.time_us[idx[start:start + WRITE_CHUNK]], inputs.source.take(part), values)
        counts.rows_written += done.rows_written
        counts.hot_written += done.hot_written
        if progress is not None:
            progress.update(min(start + WRITE_CHUNK, len(idx)), 0)
    if len(result.late):
        late = pa.array(result.late)
        rejects = late_rejects(spec, ctx, inputs.entity.take(late), inputs.time_us[result.late],
                               inputs.source.take(late), result.previous_newest_us)
        counts.late_rejects_stored = writer.write(spec, ctx, inputs.entity.slice(0, 0),
                                                  inputs.time_us[:0], inputs.source.slice(0, 0), {},
                                                  late=rejects).late_rejects_stored
    counts.seconds = time.perf_counter() - t0
    return counts


__all__ = ["WRITE_CHUNK", "Collector", "backfill"]
