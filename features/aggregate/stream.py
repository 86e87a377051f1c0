"""Windowed aggregations in the stream's micro-batch: vectorised, state in the stores.

The stream job computes aggregations where it validates and writes: in the micro-batch
(``features.stream.core.StreamProcessor``), :meth:`StreamAggregator.plan` takes the
batch's valid rows in arrival order while their history rows are written, and
:meth:`StreamAggregator.commit` writes after them:

1. **state**: keeps, per entity, the events it accepted in the last ``horizon``
   (allowed lateness + longest window) before the entity's newest accepted event, in
   columnar arrays. An entity this process has not seen (or evicted) is read back from
   Postgres (:meth:`StreamAggregator.learn`, per chunk of the micro-batch, before its
   history rows are written): the history rows that hold an aggregation row
   (events an earlier stream run accepted, or a backfill computed) within the horizon of
   its newest one. So a stream continues a backfill, or itself after a restart, exactly;
   nothing is kept in Flink state;
2. **classifies** each event in arrival order. A record at or before the highest Kafka
   offset of its entity already applied (the sources of the events read back, or
   accepted here) may be a replay after a restart: it keeps the verdict the first pass
   stored, whatever the state holds (see Replays below). Any other record comes after
   everything held, and is: *late* (more than ``allowed_lateness`` behind the newest
   event of its entity seen before it); a *duplicate* (an exact copy: its (entity, event
   time, content digest) already accepted); else *accepted* (another event at an instant
   already accepted included: the instant's values are computed again over both);
3. **computes** with the batch engine (:func:`features.aggregate.engine.compute`) over
   the touched entities' held events and the accepted ones, and writes the values of
   every event from each entity's earliest new event on (Postgres upsert, Redis newest
   wins) and a reject per late event, in the micro-batch;
4. **rewrites the request-time window tiles** (:func:`features.aggregate.tiles.build`,
   the backfill's code) holding an accepted or replayed event, complete, from the held
   events: a tile it rewrites holds only events at or after ``newest - lateness - tile
   size`` (an accepted event is at most the lateness behind its entity's newest), and
   the state holds every accepted event of the last ``horizon = lateness + longest
   window`` (the tile size is below the longest window), so nothing is read back for
   them. A replayed event older than that is in a tile the state may hold only part
   of: that tile is not rewritten (the first pass wrote it complete; no window a read
   may ask for, at most the lateness before the newest event, reaches it);
5. **forgets** events older than their entity's horizon, and whole entities quiet for a
   horizon of event time (they are read back if they return: exactness does not depend
   on what is held).

Replays. After a restart the job replays records the first pass applied, and the state
read back holds only the horizon before each entity's newest event: an entity that
jumped beyond it after a replayed record holds none of the events that record was judged
against. So a replay is not judged by the state: the writer stores a micro-batch's late
rejects before its aggregation rows, so an aggregation row stored says every record of
its entity up to the row's source has its verdict stored. A record up to that offset is
looked up (one indexed query per micro-batch, only while replaying): a late reject
stored for its source, late again; else it was accepted (or a duplicate): held with its
source, a *replay*, whose values are written again from no earlier than the lateness
before its entity's newest event (those windows the state holds whole: this restores a
Redis that lost them); not held (older than the horizon), nothing to do (its rows are
stored). A record after it was never applied, or applied in a micro-batch whose rows
did not commit, or applied as late with nothing accepted after it: the state, which
then holds the entity's newest applied event, gives it the first pass's verdict.
Replays are idempotent: a micro-batch applied twice writes the same rows (upserts that
change nothing), the same rejects (unique per source record) and the same tiles
(complete, never deltas), however the replay is cut into micro-batches. Every entity's records
must come from one Kafka partition (producers key records by entity): an entity seen on
two partitions would be aggregated by two processes at once, and is refused with an
error that says so.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate.engine import AggSpec, Inputs, compute, extract, finalize, raw_schema
from features.aggregate.tiles import TileRows, TileSpec
from features.aggregate.tiles import build as build_tiles
from features.aggregate.writer import AggregateCounts, AggregateWriter, late_rejects
from features.errors import ConfigError
from features.lineage import RunContext

I64 = npt.NDArray[np.int64]
NONE = np.iinfo(np.int64).min  # "no accepted event yet"


class KeyingError(ConfigError):
    """An entity's records arrive on more than one Kafka partition."""


def _offsets(sources: pa.Array) -> I64:
    """Kafka offset + 1 of each ``kafka://topic/partition/offset`` source (also followed by
    `` via http://...``, a record HTTP ingest produced); 0 for any other source (a
    backfill's file row: before every record of the stream)."""
    found = pc.extract_regex(sources, pattern=r"^kafka://[^ ]*/(?P<o>[0-9]+)(?: via .*)?$")
    text = pc.if_else(found.is_valid(), found.field("o"), pa.scalar("-1"))  # no match: "" in the field
    return np.asarray(pc.add(pc.cast(text, pa.int64()), 1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _lanes(sources: pa.Array) -> pa.Array:
    """``kafka://topic/partition/offset`` (with or without `` via http://...``) ->
    ``kafka://topic/partition``."""
    return pc.replace_substring_regex(sources, pattern=r"/[0-9]+(?: via .*)?$", replacement="")


@dataclass
class Plan:
    """One micro-batch's aggregation, computed and not yet written (:meth:`StreamAggregator.plan`)."""

    counts: AggregateCounts
    ctx: RunContext
    entity: pa.Array | None = None          # the rows to write: entity, event time, source, values
    time_us: I64 | None = None
    sources: pa.Array | None = None
    values: dict[str, pa.Array] = field(default_factory=dict)
    rejects: pa.Table | None = None         # one per late event
    new: Inputs | None = None               # the accepted events, for the state
    new_pos: I64 | None = None
    tiles: TileRows | None = None           # the request-time window tiles to rewrite


@dataclass
class StreamAggregator:
    """One process's aggregation state and its micro-batch step (see the module doc)."""

    spec: AggSpec
    writer: AggregateWriter
    #: entities with no event for this long (event time, after their newest) are forgotten
    evict_after_us: int | None = None
    counts: AggregateCounts = field(default_factory=AggregateCounts)
    _known: pa.Array | None = field(default=None, init=False, repr=False)   # entities held
    _newest: I64 = field(default_factory=lambda: np.zeros(0, np.int64), init=False, repr=False)
    _lane: I64 = field(default_factory=lambda: np.zeros(0, np.int64), init=False, repr=False)  # -1: unknown
    _lane_names: list[str] = field(default_factory=list, init=False, repr=False)
    #: per entity held: the highest Kafka offset + 1 of an event whose aggregation row was
    #: stored (read back, or accepted here): a record at or before it may be a replay
    _applied: I64 = field(default_factory=lambda: np.zeros(0, np.int64), init=False, repr=False)
    _events: Inputs | None = field(default=None, init=False, repr=False)  # accepted events held
    _event_pos: I64 = field(default_factory=lambda: np.zeros(0, np.int64), init=False, repr=False)
    _read_back: int = field(default=0, init=False, repr=False)  # events :meth:`learn` read back

    def __post_init__(self) -> None:
        if self.evict_after_us is None:
            self.evict_after_us = self.spec.horizon_us

    def plan(self, rows: pa.Table, ctx: RunContext) -> Plan:
        """Everything but the writes: read back the entities not held (the stream did, with
        :meth:`learn`, before it wrote their history rows), classify, compute. It does not
        need this micro-batch's history rows stored (a replayed event's history row was
        stored before its aggregation row), so the stream runs it while they are written;
        :meth:`commit` must come after them."""
        t0 = time.perf_counter()
        spec = self.spec
        inp = extract(spec, rows)
        n = len(inp)
        out = AggregateCounts(events=n)
        if n == 0:
            return Plan(out, ctx)
        inp, entity, lanes = self._take_in(inp)
        uniq = pc.unique(entity)
        first = lanes.take(pc.index_in(uniq, value_set=entity))
        out.from_history, self._read_back = self._read_back + self._learn(uniq, first), 0
        assert self._known is not None and self._events is not None
        pos = np.asarray(pc.index_in(entity, value_set=self._known).to_numpy(zero_copy_only=False),
                         dtype=np.int64)
        self._check_lanes(entity, pos, lanes)
        t = inp.time_us

        # the touched entities' held events
        mark = np.zeros(len(self._known), dtype=np.bool_)
        mark[pos] = True
        held_idx = np.flatnonzero(mark[self._event_pos])
        held = self._events.take(held_idx)
        held_pos = self._event_pos[held_idx]

        # classify, in arrival order
        # an event is held when its (entity, event time, digest) is: an exact copy
        stored = pd.DataFrame({"p": held_pos, "t": held.time_us,
                               "d": held.digest.to_numpy(zero_copy_only=False),
                               "s": held.source.to_numpy(zero_copy_only=False)})
        batch = pd.DataFrame({"p": pos, "t": t, "d": inp.digest.to_numpy(zero_copy_only=False),
                              "s": inp.source.to_numpy(zero_copy_only=False)})
        found = batch.merge(stored, on=["p", "t", "d"], how="left", suffixes=("", "_held"), indicator=True)
        in_state = (found["_merge"] == "both").to_numpy()
        # a record at or before its entity's highest applied offset was applied by an
        # earlier pass (the rejects of every record up to an aggregation row's source are
        # stored before it): it keeps that pass's verdict, looked up (module doc, Replays)
        maybe = _offsets(inp.source) <= self._applied[pos]
        stored_late = np.zeros(n, dtype=np.bool_)
        if maybe.any():
            again = np.flatnonzero(maybe)
            stored_late[again] = self.writer.stored_late(inp.source.take(pa.array(again, pa.int64())))
        replay = in_state & (found["s"].to_numpy() == found["s_held"].to_numpy()) & ~stored_late
        # a new record comes after every held event: the newest of its entity before it
        prior = self._newest[pos]
        before = pd.Series(t).groupby(pos).cummax().groupby(pos).shift(1)
        running = before.to_numpy(dtype=np.float64, na_value=np.nan)
        prev = np.where(np.isnan(running), prior, np.maximum(prior, np.nan_to_num(running).astype(np.int64)))
        late = np.where(maybe, stored_late, ~replay & (prev != NONE) & (t < prev - spec.lateness_us))
        # applied and not late, not held (older than the horizon the state holds): its rows
        # are stored, nothing to compute or write
        applied = maybe & ~late & ~in_state
        candidate = ~maybe & ~late & ~in_state
        first = np.zeros(n, dtype=np.bool_)
        cand = np.flatnonzero(candidate)
        first[cand] = ~batch.iloc[cand].duplicated(subset=["p", "t", "d"], keep="first").to_numpy()
        accepted = np.flatnonzero(first)
        out.late = int(late.sum())
        out.accepted = len(accepted) + int(replay.sum()) + int(applied.sum())
        out.duplicates = n - out.late - out.accepted

        # compute over the held events and the accepted ones; write from each entity's
        # earliest new (or replayed) event on
        new = inp.take(accepted)
        merged = Inputs.concat([held, new])
        merged_pos = np.concatenate([held_pos, pos[accepted]])
        result = compute(spec, merged)
        lower = np.full(len(self._known), np.iinfo(np.int64).max, dtype=np.int64)
        touched = np.flatnonzero(first | replay)
        # a replayed event's values are stored: what is written again (for Redis, the
        # tiles) starts no earlier than the lateness before the newest, whose windows the
        # state holds whole
        start = np.where(replay, np.maximum(t, self._newest[pos] - spec.lateness_us), t)
        np.minimum.at(lower, pos[touched], start[touched])
        acc = result.accepted
        sel = np.flatnonzero(merged.time_us[acc] >= lower[merged_pos[acc]])
        idx = acc[sel]
        values = finalize(spec, pa.table(result.raw, schema=raw_schema(spec)).take(pa.array(sel, pa.int64())))
        late_idx = np.flatnonzero(late)
        rejects = None
        if len(late_idx):
            at = pa.array(late_idx, pa.int64())
            said = prev[late_idx]  # a replay's stored reject stays; a newest for its text if none held
            rejects = late_rejects(spec, ctx, entity.take(at), t[late_idx], inp.source.take(at),
                                   np.where(said == NONE, t[late_idx], said))
        part = pa.array(idx, pa.int64())
        tspec = self.writer.tile_spec
        tiles = None
        if tspec is not None:
            replayed = np.flatnonzero(replay)
            tiles = self._tiles(tspec, held, new, inp.take(replayed), pos[replayed])
        out.seconds = time.perf_counter() - t0
        return Plan(out, ctx, merged.entity.take(part), merged.time_us[idx], merged.source.take(part), values,
                    rejects, new, pos[accepted], tiles)

    def learn(self, rows: pa.Table) -> None:
        """Read back the entities of ``rows`` (valid rows of a micro-batch) not held, before
        their history rows are written: the state must be what earlier micro-batches stored.
        Read after them, a record at an instant that already holds an aggregation row (a
        tie) would be read back as applied, its offset taken for the entity's applied one,
        and the records before it in the micro-batch skipped as replays."""
        inp = extract(self.spec, rows)
        if len(inp) == 0:
            return
        inp, entity, lanes = self._take_in(inp)
        uniq = pc.unique(entity)
        self._read_back += self._learn(uniq, lanes.take(pc.index_in(uniq, value_set=entity)))

    def _take_in(self, inp: Inputs) -> tuple[Inputs, pa.Array, pa.Array]:
        """``inp`` with a plain entity column, that column and each record's lane (the
        state made on the first call)."""
        entity = inp.entity
        if pa.types.is_dictionary(entity.type):
            entity = entity.cast(entity.type.value_type)
            inp = dataclasses.replace(inp, entity=entity)
        if self._known is None:
            self._known = entity.slice(0, 0)
            self._events = inp.take(np.zeros(0, np.int64))
        return inp, entity, _lanes(inp.source)

    def _tiles(self, tspec: TileSpec, held: Inputs, new: Inputs, replayed: Inputs, replayed_pos: I64
               ) -> TileRows:
        """The tiles holding an accepted (``new``) or a replayed event, complete, built
        from the touched entities' ``held`` events and the new ones (see the module doc,
        4.): a replayed event's tile is left out where it starts before the horizon the
        state holds whole."""
        h = tspec.size_us
        newest = self._newest[replayed_pos]
        whole = (newest == NONE) | (replayed.time_us // h * h >= newest - self.spec.horizon_us)
        events = Inputs.concat([held, new, replayed.take(np.flatnonzero(whole))])
        return build_tiles(tspec, events, np.arange(len(events)) >= len(held))

    def commit(self, plan: Plan) -> AggregateCounts:
        """Write what :meth:`plan` computed, then take its events into the state."""
        t0 = time.perf_counter()
        out = plan.counts
        if plan.new is None:
            return out
        assert plan.entity is not None and plan.time_us is not None and plan.sources is not None
        done = self.writer.write(self.spec, plan.ctx, plan.entity, plan.time_us, plan.sources, plan.values,
                                 late=plan.rejects, tiles=plan.tiles)
        out.rows_written, out.hot_written = done.rows_written, done.hot_written
        out.tiles_written = done.tiles_written
        out.late_rejects_stored = done.late_rejects_stored
        if len(plan.new):
            assert self._events is not None and plan.new_pos is not None
            np.maximum.at(self._newest, plan.new_pos, plan.new.time_us)
            np.maximum.at(self._applied, plan.new_pos, _offsets(plan.new.source))
            self._events = Inputs.concat([self._events, plan.new])
            self._event_pos = np.concatenate([self._event_pos, plan.new_pos])
        self._forget()
        out.seconds += time.perf_counter() - t0
        self.counts.add(out)
        return out

    # --- state ----------------------------------------------------------------------

    def _learn(self, entities: pa.Array, lanes: pa.Array) -> int:
        """Hold every entity of ``entities`` (each arriving on ``lanes[i]``): those not held
        are read back from Postgres; their highest applied offset is that of the events read
        back from the same topic partition. Returns how many events were read back."""
        assert self._known is not None and self._events is not None
        gone = pc.is_null(pc.index_in(entities, value_set=self._known))
        missing = entities.filter(gone)
        lanes = lanes.filter(gone)
        if len(missing) == 0:
            return 0
        events = self.writer.accepted_inputs(self.spec, missing)
        ent = events.entity.cast(self._known.type) if len(events) else events.entity
        base = len(self._known)
        self._known = pa.concat_arrays([self._known, missing.cast(self._known.type)])
        newest = np.full(len(missing), NONE, dtype=np.int64)
        applied = np.zeros(len(missing), dtype=np.int64)
        self._lane = np.concatenate([self._lane, np.full(len(missing), -1, dtype=np.int64)])
        if len(events):
            at = np.asarray(pc.index_in(ent, value_set=missing).to_numpy(zero_copy_only=False),
                            dtype=np.int64)
            np.maximum.at(newest, at, events.time_us)
            same = pc.equal(_lanes(events.source), lanes.take(pa.array(at, pa.int64())))
            offs = np.where(np.asarray(same.to_numpy(zero_copy_only=False), dtype=np.bool_),
                            _offsets(events.source), 0)
            np.maximum.at(applied, at, offs)
            self._events = Inputs.concat([self._events, dataclasses.replace(events, entity=ent)])
            self._event_pos = np.concatenate([self._event_pos, base + at])
        self._newest = np.concatenate([self._newest, newest])
        self._applied = np.concatenate([self._applied, applied])
        return len(events)

    def _check_lanes(self, entity: pa.Array, pos: I64, lanes: pa.Array) -> None:
        """Each entity on one partition: refuse one seen on two (in this batch or before)."""
        names = pc.unique(lanes)
        for name in names.to_pylist():  # a few partitions per micro-batch
            if name not in self._lane_names:
                self._lane_names.append(name)
        known = pa.array(self._lane_names, pa.string())
        codes = np.asarray(pc.index_in(lanes, value_set=known).to_numpy(zero_copy_only=False), dtype=np.int64)
        first = np.full(len(self._newest), -1, dtype=np.int64)
        uniq, at = np.unique(pos, return_index=True)
        first[uniq] = at  # each entity's first event in the batch
        mine = codes[first[pos]]
        held = self._lane[pos]
        bad = np.flatnonzero((codes != mine) | ((held >= 0) & (held != codes)))
        if len(bad):
            i = int(bad[0])
            other = self._lane_names[int(held[i])] if held[i] >= 0 and held[i] != codes[i] else \
                self._lane_names[int(mine[i])]
            raise KeyingError(
                f"windowed aggregations: {self.spec.schema.entity} {entity[i].as_py()!r} arrives on two "
                f"Kafka partitions ({other} and {self._lane_names[int(codes[i])]}); aggregations need each "
                f"entity's records on one partition: produce them with the entity as the record key "
                f"(docs/aggregations.md)", key="topic")
        self._lane[pos] = codes

    def _forget(self) -> None:
        """Drop held events older than their entity's horizon and entities quiet for
        ``evict_after_us`` of event time (they are read back if they return)."""
        assert self._known is not None and self._events is not None and self.evict_after_us is not None
        spec = self.spec
        keep = self._events.time_us >= self._newest[self._event_pos] - spec.horizon_us
        top = int(self._newest.max()) if len(self._newest) else NONE
        gone = (self._newest != NONE) & (self._newest < top - self.evict_after_us)
        gone |= self._newest == NONE  # nothing accepted: nothing to hold (lateness needs a newest)
        if gone.any():
            keep &= ~gone[self._event_pos]
            stay = np.flatnonzero(~gone)
            remap = np.full(len(self._newest), -1, dtype=np.int64)
            remap[stay] = np.arange(len(stay))
            self._known = self._known.take(pa.array(stay, pa.int64()))
            self._newest = self._newest[stay]
            self._applied = self._applied[stay]
            self._lane = self._lane[stay]
            self._event_pos = remap[self._event_pos]
        if not keep.all():
            idx = np.flatnonzero(keep)
            self._events = self._events.take(idx)
            self._event_pos = self._event_pos[idx]


__all__ = ["KeyingError", "Plan", "StreamAggregator"]
