"""The batch backfill of windowed aggregations (``features load`` on a schema with them).

While the loader validates and writes the history, :class:`Collector` keeps, from each
batch's valid rows (input order), only what the aggregations read. After the last
batch, :func:`backfill` reads back the events earlier loads stored in the windows these
events touch, computes every changed value with the vectorised engine and writes them
in chunks (``AggregateWriter``), then rewrites the Redis tiles of request-time windows
that hold one of the load's events (``features.aggregate.tiles``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate.engine import (
    AggSpec,
    Computed,
    Inputs,
    compute,
    digest_ranks,
    extract,
    finalize,
    group_codes,
    raw_schema,
)
from features.aggregate.tiles import build as build_tiles
from features.aggregate.writer import AggregateCounts, AggregateWriter
from features.compile.arrow import arrow_schema
from features.lineage import DIGEST, RunContext

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
        return Inputs.concat(self.parts)


def _empty(spec: AggSpec) -> pa.Table:
    schema = arrow_schema(spec.schema)
    return pa.table({**{f.name: pa.array([], f.type) for f in schema}, "_source": pa.array([], pa.string()),
                     DIGEST: pa.array([], pa.string())})


def backfill(spec: AggSpec, inputs: Inputs, writer: AggregateWriter, ctx: RunContext,
             progress: Any = None, *, read_own: bool = False) -> AggregateCounts:
    """Compute and write every aggregation value this load's events change; returns the counts.

    The history table is the source of truth: for each entity of ``inputs`` (this load's
    valid rows, input order) with event times ``[lo, hi]``, the values of its events in
    ``[lo, hi + longest window)`` are recomputed over its history in ``[lo - horizon, hi +
    longest)`` (horizon: allowed lateness + longest window): the events earlier loads
    stored (read back) and this load's. So loading
    January then February gives the values of one load of both, in either order, and the
    order of files and rows changes nothing. Two different events at one (entity, event
    time) are both kept and counted; an exact copy (same content digest) is one event.

    The events this run stored are not read back (``inputs`` holds them), unless
    ``read_own``: a run that stored other events before this load (``FeatureStore.write``
    of several tables under one run id) reads its whole history back.
    """
    t0 = time.perf_counter()
    counts = AggregateCounts(events=len(inputs))
    if len(inputs) == 0:
        return counts
    entity = inputs.entity
    if pa.types.is_dictionary(entity.type):
        entity = entity.cast(entity.type.value_type)
        inputs = dataclasses.replace(inputs, entity=entity)
    codes = group_codes(entity)
    k = int(codes.max()) + 1
    lo = np.full(k, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(k, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(lo, codes, inputs.time_us)
    np.maximum.at(hi, codes, inputs.time_us)
    firsts = np.unique(codes, return_index=True)[1]  # each entity's first row (codes are 0..k-1)
    longest = spec.longest_us
    # from a horizon (lateness + longest window) before: every event a read of the tiles
    # this load writes can reach (tiles.build), besides the longest window the values need
    stored = writer.stored_inputs(spec, entity.take(pa.array(firsts)), lo - spec.horizon_us, hi + longest,
                                  exclude_run=None if read_own else ctx.run_id)
    counts.from_history = len(stored)
    merged = Inputs.concat([stored, inputs])
    m = len(stored)
    mcodes = group_codes(merged.entity) if m else codes
    kk = int(mcodes.max()) + 1
    # the events whose windows this load changed: at or after their entity's first new
    # event (the read range ends a whole window after its last one)
    own = np.full(kk, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(own, mcodes[m:], inputs.time_us)
    # Whole entities in groups of about WRITE_CHUNK events: windows never cross entities,
    # so each group is computed on its own, and written while the next one is computed.
    per = np.bincount(mcodes, minlength=kk)
    group_of = (np.cumsum(per) - per) // WRITE_CHUNK
    ev_group = group_of[mcodes]
    order = np.argsort(ev_group, kind="stable")  # grouped, input order kept within a group
    bounds = np.searchsorted(ev_group[order], np.arange(int(group_of.max()) + 2))
    # Two writers (two Postgres sessions, so that the server's COPY work runs on two cores)
    # when there is more than one group; at most one group in flight per writer.
    writers = [writer]
    if len(bounds) > 2:
        writers.append(writer.clone())
        writers[1].open()
    pending: deque[Future[AggregateCounts]] = deque()
    written = submitted = 0
    # the online state of request-time windows: the Redis tiles this load changed, built and
    # written in a thread of their own while the values are computed and upserted
    tspec = writer.tile_spec
    tiles_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aggregates-tiles") if tspec else None
    tiles: Future[int] | None = None
    if tiles_pool is not None and tspec is not None:
        fresh = np.arange(len(merged)) >= m
        tiles = tiles_pool.submit(lambda: writer.write_tiles(build_tiles(tspec, merged, fresh)))

    def account(done: AggregateCounts) -> None:
        counts.rows_written += done.rows_written
        counts.hot_written += done.hot_written
        counts.hot_restored += done.hot_restored
        if progress is not None:
            progress.update(written, 0)

    try:
        with ThreadPoolExecutor(max_workers=len(writers), thread_name_prefix="aggregates-write") as pool:
            for g in range(len(bounds) - 1):
                idx_g = order[bounds[g]:bounds[g + 1]]
                if len(idx_g) == 0:
                    continue
                sub = merged.take(idx_g)
                result = compute(spec, sub)
                counts.duplicates += _duplicates_of_the_load(sub, result, idx_g >= m)
                at = idx_g[result.accepted]
                sel = np.flatnonzero(merged.time_us[at] >= own[mcodes[at]])
                rows = at[sel]
                values = finalize(spec, pa.table(result.raw, schema=raw_schema(spec)).take(pa.array(sel)))
                while len(pending) >= len(writers):
                    account(pending.popleft().result())
                written += len(rows)
                part = pa.array(rows)
                # nothing read back: no other run stored these entities' events in range, so
                # no aggregation row of these keys exists yet (a COPY without a lookup)
                write = writers[submitted % len(writers)].write  # free: its last group was waited for
                submitted += 1
                pending.append(pool.submit(write, spec, ctx, merged.entity.take(part), merged.time_us[rows],
                                           merged.source.take(part), values, new=m == 0))
            while pending:
                account(pending.popleft().result())
        if tiles is not None:
            counts.tiles_written = tiles.result()
    finally:
        if tiles_pool is not None:
            tiles_pool.shutdown(wait=True)
        for w in writers[1:]:
            w.close()
    counts.accepted = counts.events - counts.duplicates
    counts.seconds = time.perf_counter() - t0
    return counts


def _duplicates_of_the_load(events: Inputs, result: Computed, of_load: npt.NDArray[np.bool_]) -> int:
    """How many of the load's events (``of_load``) the history holds another record for:
    exact copies (same entity, event time and digest) whose first record has another
    ``_source`` (the same record loaded again, e.g. by a re-run, is not a duplicate)."""
    dup = result.duplicate[of_load[result.duplicate]]
    if len(dup) == 0:
        return 0
    key = pd.DataFrame({"k": group_codes(events.entity), "t": events.time_us,
                        "d": digest_ranks(events.digest)})
    group = key.groupby(["k", "t", "d"], sort=False).ngroup().to_numpy()
    holder = np.zeros(int(group.max()) + 1, dtype=np.int64)
    holder[group[result.accepted]] = result.accepted
    same = pc.equal(events.source.take(pa.array(dup)), events.source.take(pa.array(holder[group[dup]])))
    return len(dup) - int(pc.sum(same).as_py() or 0)


__all__ = ["WRITE_CHUNK", "Collector", "backfill"]
