"""The online state of request-time windows: per-entity tiles (issue 49 step b).

A window read at request time ``T`` has the one definition of
:mod:`features.aggregate.request_time` (sliding ``(T - size, T]``, tumbling ``[floor(T /
size) * size, T]``, exact). Exactness at any ``T`` needs every event of the window that
can still fall out of it, so the state keeps the entity's events of the last ``longest
window + allowed lateness``; what keeps a read cheap is how they are kept:

- time is cut into epoch-aligned **tiles** ``[s, s + h)`` (:func:`tile_size_us`: about
  64 tiles over the longest window, a size from a fixed ladder);
- per (entity, tile) two packed values (:mod:`features.aggregate.tilepack`): the tile's
  **summary** (the engine's raw accumulators of every aggregation over the tile's
  events, plus ``count_distinct``'s distinct values and the sketches' mergeable states,
  :mod:`features.aggregate.sketch_tiles`), held with the entity's other summaries in one
  field (:func:`~features.aggregate.tilepack.pack_summary_set`), and its **events**
  (sorted; time after the tile's start, each field's value or sketch hash, each
  contribution mask), one field per tile;
- a window at ``T`` is the tiles wholly inside it (their summaries, one NumPy matrix)
  plus at most two edge tiles (the one holding its start, the one holding ``T``), whose
  events inside the window are found by binary search and summarised with NumPy
  reductions at read time. A read costs ``O(tiles)`` plus the slices of the edge tiles,
  never the window's events.

Summaries are the raw parts of :func:`features.aggregate.engine.window_raw` over a group
of events (:func:`group_raw`, when tiles are built), merged exactly per entity with
``ufunc.at`` (integer sums, min/max, the oldest/newest non-empty piece for first/last,
the newest pieces' values for ``last_k``, the union of distinct values, the sketches'
states merged by :func:`features.aggregate.sketch_tiles.merged_raw`) into the raw
parts of the whole window, which the engine's :func:`~features.aggregate.engine.finalize`
turns into values: the same function as the backfill, the stream and
``historical(..., windows="request_time")``.

Distinct values travel as their Redis text (``features.compile.layout.encode_column``)
with ``\\``, ``\\x1d``, ``\\x1e`` and ``\\x1f`` escaped.

Why one module of this size: building the tiles and merging them at a read share one
piece layout (which tiles a window holds whole, its two edge tiles, the parts each
function keeps); kept together so the write and the read cannot drift apart
(the binary packing itself is ``features.aggregate.tilepack``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from bisect import bisect_left
from dataclasses import dataclass
from functools import cached_property
from itertools import compress
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate.engine import (
    RAW_PARTS,
    AggSpec,
    Inputs,
    digest_ranks,
    finalize,
    first_of_each_key,
    group_codes,
    raw_schema,
    window_raw,
)
from features.aggregate.moments import fixed_point, window_squares
from features.aggregate.one_row import RawRow, finalize_row
from features.aggregate.request_time import sub_spec
from features.aggregate.sketch_tiles import (
    State,
    decode,
    event_hashes,
    group_states,
    is_sketch,
    merged_raw,
    piece_state,
    state_part,
)
from features.aggregate.tilepack import (
    SUMMARIES_FIELD,
    VERSION,
    Events,
    Layout,
    Summaries,
    pack_events,
    pack_summaries,
    sketch_parts,
    unpack_events,
    unpack_summary_set,
    variable_parts,
)
from features.compile.layout import MOMENT_FUNCTIONS, TILES_WHOLE_US, encode_column
from features.schema.model import Window

I64 = npt.NDArray[np.int64]
_US = 1_000_000
#: tile sizes (seconds): the smallest one giving at most TILES_PER_WINDOW tiles over the
#: longest window (whole days beyond the ladder); each divides the next and a day
LADDER_S = (1, 5, 15, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)
TILES_PER_WINDOW = 64
FIELD_SEP, EVENT_SEP, ITEM_SEP = "\x1f", "\x1e", "\x1d"
#: a window no event escapes: a group's raw parts are the window of its last event
_UNBOUNDED_S = 10**12


def tile_size_us(longest_us: int) -> int:
    """The tile size for a longest window of ``longest_us``."""
    want = -(-max(longest_us, 1) // TILES_PER_WINDOW)
    for s in LADDER_S:
        if s * _US >= want:
            return s * _US
    day = 86400 * _US
    return -(-want // day) * day


@dataclass(frozen=True)
class TileSpec:
    """What one schema's tiles hold: the aggregations the online store serves (those
    stored ``hot``) and the ones their ratios read, the tile size and the retention."""

    spec: AggSpec          # the aggregations tiles hold
    unbounded: AggSpec     # the same but sketches, every window unbounded (a group's raw parts)
    size_us: int           # tile size
    retention_us: int      # longest window + allowed lateness: tiles kept before the newest event
    parts: tuple[str, ...]  # the summary's fields, in order
    signature: str         # the layout's fingerprint (parts, tile size): a reader checks it

    @classmethod
    def of(cls, spec: AggSpec | None) -> TileSpec | None:
        if spec is None:
            return None
        hot = [a.name for a in spec.stored("hot")]
        if not hot:
            return None
        sub = sub_spec(spec, hot)
        if not sub.windowed:
            return None
        # the sketches' states are built apart (sketch_tiles.group_states); ratios are finalize's
        aggs = tuple(dataclasses.replace(a, window=Window(_UNBOUNDED_S, "sliding"))
                     for a in sub.windowed if not is_sketch(a))
        unbounded = AggSpec.of(dataclasses.replace(
            sub.schema, aggregations=dataclasses.replace(sub.aggregations, features=aggs)))
        assert unbounded is not None
        size = tile_size_us(sub.longest_us)
        parts = (*unbounded.raw_names(),
                 *(f"{a.name}.set" for a in sub.windowed if a.function == "count_distinct"),
                 *(state_part(a) for a in sub.windowed if is_sketch(a)))
        sig = hashlib.sha256(repr((VERSION, parts, size, [(a.name, a.function, a.of, a.where, a.k, a.scale,
                                                           a.precision, a.relative_accuracy, a.q)
                                                          for a in sub.windowed])).encode()).hexdigest()[:16]
        return cls(sub, unbounded, size, sub.longest_us + sub.lateness_us, parts, sig)

    @cached_property
    def raw(self) -> pa.Schema:
        """The raw parts' schema (:func:`~features.aggregate.engine.raw_schema`), made once."""
        return raw_schema(self.spec)

    @cached_property
    def layout(self) -> Layout:
        """Where each part and event column sits in the packed values (made once)."""
        return Layout.of(self.spec, self.parts, self.raw)

    @cached_property
    def simple(self) -> bool:
        """Every aggregation is a count, sum, mean, min, max, first or last: a one-entity
        read takes :func:`_one`'s contiguous sums."""
        return all(a.function in ("count", "sum", "mean", "min", "max", "first", "last")
                   for a in self.spec.windowed)

    @cached_property
    def windows(self) -> tuple[tuple[int, bool], ...]:
        """Per windowed aggregation, its window's size (us) and whether it slides."""
        out = []
        for agg in self.spec.windowed:
            assert agg.window is not None  # a tiled aggregation has a window (TileSpec.of)
            out.append((agg.window.size_s * _US, agg.window.kind == "sliding"))
        return tuple(out)

    @cached_property
    def one_plan(self) -> OnePlan:
        """How a one-entity read (:func:`_one`) gets each fixed summary part from an edge
        tile's events (made once; for the aggregations :meth:`one_for` accepts)."""
        return OnePlan.of(self)

    @cached_property
    def one_cache(self) -> dict[tuple[str, ...] | None, Any]:
        """:meth:`one_for` by the aggregations named (bounded: cleared at 256)."""
        return {}

    def one_for(self, names: tuple[str, ...] | None
                ) -> tuple[list[int], tuple[tuple[tuple[str, int], ...], ...], AggSpec] | None:
        """How a one-entity read of the aggregations ``names`` (None: all) takes
        :func:`_one`'s contiguous sums: their positions among :attr:`spec`'s windowed
        aggregations, their :attr:`OnePlan.outputs` and the spec that finalizes them; None
        when one of them is not a count, sum, mean, min, max, first or last (a sketch, a
        ``last_k``, a ratio, a moment: the general read). Judged on the aggregations read,
        not the whole schema: a schema holding a sketch still reads its counts this way."""
        cache = self.one_cache
        if names in cache:
            got: tuple[list[int], tuple[tuple[tuple[str, int], ...], ...], AggSpec] | None = cache[names]
            return got
        if len(cache) >= 256:
            cache.clear()
        windowed = [a.name for a in self.spec.windowed]
        wanted = windowed if names is None else list(names)
        simple = ("count", "sum", "mean", "min", "max", "first", "last")
        at = [windowed.index(x) for x in wanted if x in windowed]
        if len(at) != len(wanted) or any(self.spec.windowed[i].function not in simple for i in at):
            cache[names] = None
            return None
        sub = self.spec if names is None else sub_spec(self.spec, wanted)
        got = cache[names] = (at, tuple(self.one_plan.outputs[i] for i in at), sub)
        return got

    @cached_property
    def read_cache(self) -> dict[tuple[Any, ...], tuple[list[int], list[int], list[str]]]:
        """:func:`read_fields` by the shape of the windows (bounded: cleared at 64)."""
        return {}

    @cached_property
    def fixed_index(self) -> dict[str, int]:
        """Each fixed summary part's column in :attr:`layout`."""
        return {p: i for i, p in enumerate(self.layout.fixed)}


@dataclass(frozen=True)
class OnePlan:
    """Per fixed summary part of the counts, sums, means, min/max, first/last of a spec
    (:meth:`TileSpec.one_for`), what an edge piece of a one-entity read computes from the
    events: ``counts`` (part, mask column; -1: every event), ``sums`` (part, value column,
    mask column, a float field's fixed-point scale, the aggregation named in an
    overflow), ``picks`` (part, value column, mask column, min/max/first/last);
    ``outputs`` per aggregation its raw part names and columns (none for another
    function); ``width`` the number of fixed parts."""

    counts: tuple[tuple[int, int], ...]
    sums: tuple[tuple[int, int, int, int | None, str], ...]
    picks: tuple[tuple[int, int, int, str], ...]
    outputs: tuple[tuple[tuple[str, int], ...], ...]
    width: int
    mask_columns: tuple[int, ...] = ()   # the mask columns the counts, sums and picks read
    mask_base: int = 0                   # a mask column's byte offset in an event row, before its index

    @classmethod
    def of(cls, tspec: TileSpec) -> OnePlan:
        layout, index = tspec.layout, tspec.fixed_index
        counts, sums, picks, outputs = [], [], [], []
        for agg in tspec.spec.windowed:
            name, f = agg.name, agg.function
            mi = layout.mask_of[name]
            parts = RAW_PARTS[f] if f in RAW_PARTS else ()
            outputs.append(tuple((f"{name}.{p}", index[f"{name}.{p}"]) for p in parts
                                 if f"{name}.{p}" in index))
            if f not in ("count", "sum", "mean", "min", "max", "first", "last"):
                continue
            if f in ("count", "mean"):
                counts.append((index[f"{name}.n"], mi))
            if f in ("sum", "mean"):
                sums.append((index[f"{name}.s"], layout.value_of[name], mi, agg.scale,
                             f"aggregation {name} ({f} of {agg.of})"))
            if f in ("min", "max", "first", "last"):
                picks.append((index[f"{name}.v"], layout.value_of[name], mi, f))
        used = sorted({mi for _, mi in counts} | {x[2] for x in sums} | {x[2] for x in picks} - {-1})
        return cls(tuple(counts), tuple(sums), tuple(picks), tuple(outputs), len(layout.fixed),
                   tuple(mi for mi in used if mi >= 0), 8 * (1 + len(layout.values)))


# --------------------------------------------------------------------------- text helpers


def escape(text: pa.Array) -> pa.Array:
    """Redis texts made safe to join with the separators."""
    for a, b in (("\\", "\\\\"), (FIELD_SEP, "\\f"), (EVENT_SEP, "\\e"), (ITEM_SEP, "\\d")):
        text = pc.replace_substring(text, a, b)
    return text


def key_text(arr: pa.Array) -> pa.Array:
    """``count_distinct`` values as escaped text (equal values, equal texts; distinct, distinct)."""
    return escape(pc.cast(encode_column(arr), pa.string()))


# --------------------------------------------------------------------------- building


def group_raw(tspec: TileSpec, inputs: Inputs, groups: I64, *, keys_are_text: bool = False
              ) -> tuple[I64, pa.Table]:
    """The raw parts (and distinct-value sets) of each group of distinct events
    (``groups[i]``: event ``i``'s group): ``(group ids ascending, table)``, one row per
    group, over all of its events. ``keys_are_text``: ``count_distinct`` values are
    already escaped texts (events read back from tiles)."""
    order: I64 = np.lexsort((digest_ranks(inputs.digest), inputs.time_us, groups)).astype(np.int64)
    g, t = groups[order], inputs.time_us[order]
    raw = window_raw(tspec.unbounded, inputs, order, g, t)
    last = np.r_[np.flatnonzero(g[1:] != g[:-1]), len(g) - 1] if len(g) else np.zeros(0, np.int64)
    at = pa.array(last)
    cols: dict[str, pa.Array] = {k: raw[k].take(at) for k in tspec.unbounded.raw_names()}
    ids = g[last]
    for agg in tspec.spec.windowed:
        if is_sketch(agg):
            counted = inputs.contrib[agg.name][order]
            cols[state_part(agg)] = group_states(tspec.spec, agg, inputs.values[agg.name], order[counted],
                                                 g[counted], ids)
            continue
        if agg.function != "count_distinct":
            continue
        mask = inputs.contrib[agg.name][order]
        vals = inputs.values[agg.name].take(pa.array(order[mask]))
        text = vals if keys_are_text else key_text(vals)
        texts = np.asarray(text.to_numpy(zero_copy_only=False), dtype=object)
        frame = pd.DataFrame({"g": g[mask], "v": texts})
        frame = frame.drop_duplicates().sort_values(["g", "v"], kind="stable")
        offsets = np.searchsorted(frame["g"].to_numpy(), np.r_[ids, np.iinfo(np.int64).max]).astype(np.int32)
        items = pa.array(frame["v"].to_numpy(), pa.string()) if len(frame) else pa.array([], pa.string())
        cols[f"{agg.name}.set"] = pa.ListArray.from_arrays(pa.array(offsets), items)
    return ids, pa.table(cols) if cols else pa.table({"_": pa.nulls(len(ids))})


@dataclass
class TileRows:
    """The tiles a load rewrites: per (entity, tile), its texts; and each entity's newest event."""

    entity: pa.Array        # one per tile
    start_us: I64
    summary: pa.Array       # string
    events: pa.Array        # string
    newest_entity: pa.Array  # one per entity of the load
    newest_us: I64
    #: per entity (as ``newest_entity``): the time from which the tiles written, with the
    #: tiles the hash already holds, hold every event of the entity (:func:`build`)
    complete_from_us: I64

    def __len__(self) -> int:
        return len(self.start_us)


def build(tspec: TileSpec, events: Inputs, fresh: npt.NDArray[np.bool_]) -> TileRows:
    """The complete tiles holding a ``fresh`` event of ``events`` (the load's events and
    the history around them: every event of those tiles, exact copies allowed), within
    the retention before each entity's newest event. Vectorised over events and tiles.

    ``events`` must hold every event of each entity from a horizon (allowed lateness +
    longest window) before its first fresh one: what any read the tiles serve can reach.
    Each entity's ``complete_from_us``: the end of the last tile holding one of its events
    that is not written (an event read back in a tile with no fresh event), else
    :data:`~features.compile.layout.TILES_WHOLE_US`. A writer that makes the entity's
    tiles hash (it was absent: Redis lost it) records it as ``c``; a read whose windows
    reach before ``c`` computes them from the history instead
    (:data:`~features.sinks.redis_tiles.TILES_WRITE`)."""
    h = tspec.size_us
    codes = group_codes(events.entity)
    k = int(codes.max()) + 1 if len(codes) else 0
    newest = np.full(k, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(newest, codes, events.time_us)
    firsts = np.unique(codes, return_index=True)[1]
    ent_codes = codes[firsts]
    newest_entity, newest_us = events.entity.take(pa.array(firsts)), newest[ent_codes]
    # only the events within the retention before their entity's newest event
    tile = np.floor_divide(events.time_us, h)
    within = np.flatnonzero(tile >= np.floor_divide(newest - tspec.retention_us, h)[codes])
    events, codes, tile, fresh = events.take(within), codes[within], tile[within], fresh[within]
    # (entity, tile) pairs holding a fresh event (a copy of a stored one too: a reload rewrites)
    pair = pd.DataFrame({"c": codes, "t": tile}).groupby(["c", "t"], sort=True).ngroup().to_numpy()
    pair = pair.astype(np.int64)
    touched = np.zeros(int(pair.max()) + 1 if len(pair) else 0, dtype=np.bool_)
    touched[pair[fresh]] = True
    # complete from: after the last tile holding an event that is not written
    unwritten = np.flatnonzero(~touched[pair])
    after = np.full(k, TILES_WHOLE_US, dtype=np.int64)
    np.maximum.at(after, codes[unwritten], (tile[unwritten] + 1) * h)
    complete_from = after[ent_codes]
    keep = np.flatnonzero(first_of_each_key(codes, events.time_us, digest_ranks(events.digest)))
    events, codes, tile, pair = events.take(keep), codes[keep], tile[keep], pair[keep]
    sel = np.flatnonzero(touched[pair])
    if len(sel) == 0:
        empty = pa.array([], pa.string())
        return TileRows(events.entity.slice(0, 0), np.zeros(0, np.int64), empty, empty, newest_entity,
                        newest_us, complete_from)
    ev = events.take(sel)
    ids, table = group_raw(tspec, ev, pair[sel])
    # one event per (entity, time, digest), sorted as the engine sorts them
    order = np.lexsort((digest_ranks(ev.digest), ev.time_us, pair[sel])).astype(np.int64)
    ev = ev.take(order)
    p = pair[sel][order]
    heads = np.searchsorted(p, ids)
    offsets = np.r_[heads, len(p)].astype(np.int64)
    starts = tile[sel][order] * h
    layout = tspec.layout
    keys = {name: key_text(ev.values[name]) for name in layout.keys}
    values = {**ev.values, **{name: event_hashes(ev.values[name]) for name in layout.hashed}}
    blobs = pack_events(layout, offsets, ev.time_us - starts, ev.contrib, values, keys)
    return TileRows(ev.entity.take(pa.array(heads)), starts[heads], pack_summaries(layout, table), blobs,
                    newest_entity, newest_us, complete_from)


# --------------------------------------------------------------------------- reading


def window_ranges(tspec: TileSpec, t_us: int) -> list[tuple[int, int]]:
    """Per windowed aggregation, its window at ``t_us`` as an inclusive range ``[a, b]`` (us)."""
    return [(t_us - size + 1 if sliding else t_us // size * size, t_us) for size, sliding in tspec.windows]


def fields_to_read(tspec: TileSpec, t_us: int) -> tuple[list[int], list[int]]:
    """The tile starts whose summaries a read at ``t_us`` needs (ascending: the tiles
    wholly inside a window) and the edge tiles whose events it needs."""
    return _fields_to_read(tspec, t_us)[:2]


def read_fields(tspec: TileSpec, t_us: int) -> tuple[list[int], list[int], list[str]]:
    """:func:`fields_to_read` and the hash fields to HMGET (``n``, ``v``, the packed
    summaries ``s``, ``e:<start>`` of each edge tile, ``c``), made once per shape of the
    windows at ``t_us`` (their tiles move only when ``t_us`` crosses a tile boundary)."""
    return _fields_to_read(tspec, t_us)


def _fields_to_read(tspec: TileSpec, t_us: int) -> tuple[list[int], list[int], list[str]]:
    h = tspec.size_us
    ranges = window_ranges(tspec, t_us)
    key = tuple((a // h, a % h == 0, b // h, (b + 1) % h == 0) for a, b in ranges)
    cache = tspec.read_cache
    got = cache.get(key)
    if got is not None:
        return got
    if len(cache) >= 64:
        cache.clear()
    full: set[int] = set()
    for a, b in ranges:
        full.update(_full_tiles(h, a, b))
    edges = sorted({s for a, b in ranges for s, _, _ in _edge_pieces(h, a, b)})
    starts = sorted(full)
    got = cache[key] = (starts, edges, ["n", "v", SUMMARIES_FIELD, *(f"e:{s}" for s in edges), "c"])
    return got


def _edge_pieces(h: int, a: int, b: int) -> list[tuple[int, int, int]]:
    """The tiles of size ``h`` that the range ``[a, b]`` holds only part of, as ``(tile
    start, lo, hi)`` (the part ``[lo, hi]``), ascending: at most two."""
    ta, tb = a // h * h, b // h * h
    out = []
    if a != ta or b < ta + h - 1:
        out.append((ta, a, min(b, ta + h - 1)))
    if tb != ta and b != tb + h - 1:
        out.append((tb, tb, b))
    return out


def _full_tiles(h: int, a: int, b: int) -> range:
    """The starts of the tiles of size ``h`` wholly inside ``[a, b]``, ascending."""
    return range(-(-a // h) * h, (b + 1) // h * h, h)


@dataclass
class EntityTiles:
    """One entity's tiles as read back: the packed value of its summaries (the tiles
    hash's :data:`~features.aggregate.tilepack.SUMMARIES_FIELD`, None: no tile) and its
    edge tiles' events by tile start."""

    newest_us: int | None
    summaries: bytes | None
    events: dict[int, bytes]

    def unpacked(self, layout: Layout) -> tuple[I64, Summaries]:
        """Its tiles' starts (ascending) and summaries (:func:`~features.aggregate.tilepack.
        unpack_summary_set`)."""
        return unpack_summary_set(layout, self.summaries)


@dataclass
class _Rows:
    """The pieces a read merges, one row each: every entity's full-tile summaries, then
    the edge pieces (an edge tile's events within a range, summarised at read time)."""

    entity: I64
    start: I64                      # the tile's start (orders an entity's pieces)
    ints: I64                       # (rows, W) the fixed parts (a float part: its bits)
    valid: npt.NDArray[np.bool_]    # (rows, W)
    summaries: int                  # rows before this are summaries (their variable parts: tails)
    tails: list[bytes]
    pieces: list[dict[str, Any]]    # per edge piece, its variable parts

    def variable(self, layout: Layout, row: int, part: str) -> Any:
        """A variable part of ``row``: last_k's list of values, count_distinct's set."""
        if row >= self.summaries:
            return self.pieces[row - self.summaries][part]
        texts = variable_parts(layout, self.tails[row])[part]
        if part.endswith(".set"):
            d = int(self.ints[row, layout.fixed.index(part[:-4] + ".d")])
            return set(texts) if d == len(texts) else {""}  # one empty text: d 1, no items
        return texts

    def state(self, layout: Layout, row: int, agg: Any) -> State:
        """A sketch's state in ``row``: an edge piece's, or a summary's decoded."""
        part = state_part(agg)
        if row >= self.summaries:
            got: State = self.pieces[row - self.summaries][part]
            return got
        return decode(agg, sketch_parts(layout, self.tails[row])[0][part])


def values_at(tspec: TileSpec, entities: list[EntityTiles], t_us: int) -> dict[str, pa.Array]:
    """Every aggregation of ``tspec.spec`` at ``t_us`` for each entity (no state: the
    empty window's values), finalized: ``{name: column}``, one value per entity.

    The full tiles of every entity are one matrix (:func:`~features.aggregate.tilepack.
    unpack_summaries`); each window's edge pieces are summarised from the edge tiles'
    events by binary search and NumPy reductions over the slice; each aggregation then
    reduces its rows per entity with ``ufunc.at`` (sums, min/max; first/last by position)."""
    layout = tspec.layout
    h = tspec.size_us
    n_ent = len(entities)
    ranges = window_ranges(tspec, t_us)
    if n_ent == 1 and tspec.simple:
        one = _one(tspec, entities[0], ranges, tspec.one_plan.outputs)
        return finalize(tspec.spec, {k: (np.asarray([v]), np.asarray([ok])) for k, (v, ok) in one.items()})
    held = [et.unpacked(layout) for et in entities]
    ent = [e for e, (st, _) in enumerate(held) for _ in range(len(st))]
    start = [int(x) for st, _ in held for x in st.tolist()]
    w = len(layout.fixed)
    summ = Summaries(np.concatenate([x.ints for _, x in held]) if held else np.zeros((0, w), np.int64),
                     np.concatenate([x.valid for _, x in held]) if held else np.zeros((0, w), np.bool_),
                     [t for _, x in held for t in x.tails])
    n_summ = len(start)
    # the edge pieces: (entity, tile, lo, hi) -> row; per aggregation, its pieces' rows
    piece_of: dict[tuple[int, int, int, int], int] = {}
    p_ints: list[I64] = []
    p_valid: list[npt.NDArray[np.bool_]] = []
    p_var: list[dict[str, Any]] = []
    agg_rows: list[list[int]] = []
    unpacked: dict[tuple[int, int], Events] = {}
    for a, b in ranges:
        mine = []
        for s, lo, hi in _edge_pieces(h, a, b):
            for e, et in enumerate(entities):
                blob = et.events.get(s)
                if blob is None:
                    continue
                key = (e, s, lo, hi)
                if key not in piece_of:
                    ev = unpacked.get((e, s))
                    if ev is None:
                        ev = unpacked[(e, s)] = unpack_events(layout, s, blob)
                    got = _piece(tspec, ev, lo, hi)
                    piece_of[key] = -1
                    if got is not None:
                        piece_of[key] = n_summ + len(p_var)
                        p_ints.append(got[0])
                        p_valid.append(got[1])
                        p_var.append(got[2])
                        ent.append(e)
                        start.append(s)
                if piece_of[key] >= 0:
                    mine.append(piece_of[key])
        agg_rows.append(mine)
    rows = _Rows(np.asarray(ent, np.int64), np.asarray(start, np.int64),
                 np.concatenate([summ.ints, np.asarray(p_ints, np.int64).reshape(len(p_ints), -1)])
                 if p_ints else summ.ints,
                 np.concatenate([summ.valid, np.asarray(p_valid, np.bool_).reshape(len(p_valid), -1)])
                 if p_valid else summ.valid,
                 n_summ, summ.tails, p_var)
    order = np.lexsort((rows.start, rows.entity)) if n_ent > 1 else np.argsort(rows.start, kind="stable")
    is_summary = order < rows.summaries
    starts = rows.start[order]
    cols: dict[str, Any] = {}
    chosen: dict[tuple[int, int], I64] = {}  # per window range: its rows (aggregations share them)
    for agg, (a, b), pieces in zip(tspec.spec.windowed, ranges, agg_rows, strict=True):
        idx = chosen.get((a, b))
        if idx is None:
            full = _full_tiles(h, a, b)
            sel = is_summary & (starts >= full.start) & (starts < full.stop)
            if pieces:
                hit = np.zeros(len(order), np.bool_)
                hit[pieces] = True
                sel |= hit[order]
            idx = chosen[(a, b)] = order[sel]
        cols.update(_reduce(tspec, agg, rows, idx, n_ent))
    return finalize(tspec.spec, cols)


def _one(tspec: TileSpec, et: EntityTiles, ranges: list[tuple[int, int]],
         outputs: tuple[tuple[tuple[str, int], ...], ...]) -> RawRow:
    """:func:`values_at`'s raw parts for one entity, as Python values
    (:data:`~features.aggregate.one_row.RawRow`), of the aggregations whose parts
    ``outputs`` names (counts, sums, means, min/max, first/last: :attr:`OnePlan.outputs`,
    one per window of ``ranges``): per distinct window range (:func:`_one_range`), its full
    tiles are a contiguous run of the summaries (sorted by start), summed in one NumPy
    call over every part, and its at most two edge pieces are added (:func:`_one_piece`)."""
    starts_a, summ = et.unpacked(tspec.layout)
    starts = starts_a.tolist()
    merged: dict[tuple[int, int], tuple[list[Any], list[bool]]] = {}
    out: RawRow = {}
    for parts, (a, b) in zip(outputs, ranges, strict=True):
        got = merged.get((a, b))
        if got is None:
            got = merged[(a, b)] = _one_range(tspec, et, summ, starts, a, b)
        vals, ok = got
        for part, k in parts:
            out[part] = (vals[k], ok[k])
    return out


def _one_range(tspec: TileSpec, et: EntityTiles, summ: Summaries, starts: list[int], a: int, b: int
               ) -> tuple[list[Any], list[bool]]:
    """Every fixed part over the range ``[a, b]`` for :func:`_one`: its values (ints; a
    float part's min/max/first/last as a float) and validity. Sums add in int64 (as the
    engine's); a pick reduces its candidates in window order (the edge piece before the
    full tiles, their valid values, the piece after), as :func:`_reduce` does."""
    layout, h, plan = tspec.layout, tspec.size_us, tspec.one_plan
    full = _full_tiles(h, a, b)
    i0, i1 = bisect_left(starts, full.start), bisect_left(starts, full.stop)
    block, valid = summ.ints[i0:i1], summ.valid[i0:i1]
    tot = block.sum(axis=0)
    pre: list[Any] | None = None    # the edge piece before the full tiles: its picks
    post: list[Any] | None = None   # the one after them
    for s, lo, hi in _edge_pieces(h, a, b):
        blob = et.events.get(s)
        if blob is None:
            continue
        piece = _one_piece(plan, layout, s, blob, lo, hi)
        if piece is not None:
            tot += piece[0]
            if s > a:
                post = piece[1]
            else:
                pre = piece[1]
    vals: list[Any] = tot.tolist()
    ok = [True] * len(vals)
    n_full = i1 - i0
    for k, _, _, f in plan.picks:
        col = block[:, k]
        if layout.floats[k]:
            col = col.view(np.float64)
        cands = []  # in window order: the piece before, the full tiles' pick, the piece after
        if pre is not None and pre[k] is not None:
            cands.append(pre[k])
        if n_full:
            has = valid[:, k]
            if f in ("first", "last"):
                at = np.flatnonzero(has)
                if len(at):
                    cands.append(col[at[0] if f == "first" else at[-1]].item())
            elif has.any():
                pick = _pick_where(col, has, f)
                cands.append(pick)
        if post is not None and post[k] is not None:
            cands.append(post[k])
        if not cands:
            vals[k], ok[k] = 0, False
            continue
        if f in ("first", "last"):
            vals[k] = cands[0] if f == "first" else cands[-1]
        elif len(cands) == 1:
            vals[k] = cands[0]
        else:  # NumPy's min/max over the candidates (a NaN wins, as in one reduction)
            got = np.asarray(cands, np.float64 if layout.floats[k] else np.int64)
            vals[k] = (np.minimum.reduce(got) if f == "min" else np.maximum.reduce(got)).item()
    return vals, ok


def _pick_where(col: npt.NDArray[Any], where: npt.NDArray[np.bool_], f: str) -> Any:
    """The min (``f`` "min") or max of ``col`` where ``where`` (at least one), as a Python value."""
    init = (np.inf if f == "min" else -np.inf) if col.dtype.kind == "f" else \
        (_I64_MAX if f == "min" else _I64_MIN)
    op = np.minimum if f == "min" else np.maximum
    return op.reduce(col, where=where, initial=init).item()


_I64_MAX, _I64_MIN = int(np.iinfo(np.int64).max), int(np.iinfo(np.int64).min)


def _one_piece(plan: OnePlan, layout: Layout, start: int, blob: bytes, lo: int, hi: int
               ) -> tuple[I64, list[Any]] | None:
    """An edge piece for :func:`_one_range`: the events in ``[lo, hi]`` of the tile
    starting at ``start`` (``blob``: its packed events, :func:`~features.aggregate.
    tilepack.pack_events`) as a vector of every fixed part's sum (zeros elsewhere) and per
    fixed part its pick's value (None: none counted, or not a pick); None when no event is
    there. Reads the packed rows in place (strided views of the slice's columns only, a
    binary search of the times), no copy of the tile."""
    r = layout.row_bytes
    n = int.from_bytes(blob[:8], "little")
    times: I64 = np.ndarray((n,), "<i8", buffer=blob, offset=r, strides=(r,))
    i, j = times.searchsorted((lo - start, hi + 1 - start)).tolist()
    if i == j:
        return None
    m = j - i
    at = r * (1 + i)

    def column(offset: int, dtype: str) -> npt.NDArray[Any]:
        return np.ndarray((m,), dtype, buffer=blob, offset=at + offset, strides=(r,))

    masks = {mi: column(plan.mask_base + mi, "u1").view(np.bool_) for mi in plan.mask_columns}
    counts = {mi: int(np.count_nonzero(x)) for mi, x in masks.items()}
    counts[-1] = m
    sums = np.zeros(plan.width, np.int64)
    for k, mi in plan.counts:
        sums[k] = counts[mi]
    done: dict[tuple[int, int, int | None], Any] = {}
    for k, vi, mi, scale, what in plan.sums:
        got = done.get((vi, mi, scale))
        if got is None:
            v = column(8 * (1 + vi), "<f8" if layout.value_floats[vi] else "<i8")
            if scale is not None:  # a float field: fixed point, as the engine
                got = fixed_point(np.asarray(v, np.float64), masks[mi] if mi >= 0 else np.ones(m, np.bool_),
                                  scale, what).sum()
            else:
                got = v.sum() if mi < 0 else v.sum(where=masks[mi])
            done[(vi, mi, scale)] = got
        sums[k] = got
    picks: list[Any] = [None] * plan.width
    for k, vi, mi, f in plan.picks:
        if counts[mi] == 0:
            continue
        v = column(8 * (1 + vi), "<f8" if layout.value_floats[vi] else "<i8")
        if f in ("first", "last"):
            if mi < 0:
                picks[k] = v[0 if f == "first" else -1].item()
            else:
                where = np.flatnonzero(masks[mi])
                picks[k] = v[where[0] if f == "first" else where[-1]].item()
        else:
            picks[k] = _pick_where(v, masks[mi], f) if mi >= 0 else \
                (np.minimum.reduce(v) if f == "min" else np.maximum.reduce(v)).item()
    return sums, picks


def row_at(tspec: TileSpec, et: EntityTiles, t_us: int, names: tuple[str, ...] | None = None
           ) -> dict[str, Any] | None:
    """One entity's aggregations ``names`` (None: all of ``tspec``) at ``t_us`` as Python
    values (:func:`~features.aggregate.one_row.finalize_row`: ``values_at(tspec, [et],
    t_us)``'s one row, those columns), or None when one of them is not a count, sum,
    mean, min/max, first or last (:meth:`TileSpec.one_for`; then :func:`values_at`). The
    other aggregations of ``tspec`` (a sketch, a ``last_k``) are not computed."""
    one = tspec.one_for(names)
    if one is None:
        return None
    at, outputs, sub = one
    ranges = window_ranges(tspec, t_us)
    return finalize_row(sub, _one(tspec, et, [ranges[i] for i in at], outputs))


def _piece(tspec: TileSpec, ev: Events, lo: int, hi: int
           ) -> tuple[I64, npt.NDArray[np.bool_], dict[str, Any]] | None:
    """The raw parts of every aggregation over the events of ``ev`` in ``[lo, hi]``
    (None: no event there): the fixed parts, their validity, the variable parts."""
    i = int(np.searchsorted(ev.time_us, lo, side="left"))
    j = int(np.searchsorted(ev.time_us, hi, side="right"))
    if i == j:
        return None
    layout, spec = tspec.layout, tspec.spec
    index = tspec.fixed_index
    ints = np.zeros(len(layout.fixed), np.int64)
    valid = np.ones(len(layout.fixed), np.bool_)
    var: dict[str, Any] = {}
    every = np.ones(j - i, np.bool_)
    counts: dict[int, int] = {}    # per mask column: events that count
    sums: dict[tuple[int, int, int | None], I64] = {}  # per (value, mask, scale): the summed integers
    for agg in spec.windowed:
        name, f = agg.name, agg.function
        mi = layout.mask_of[name]
        m = ev.masks[mi][i:j] if mi >= 0 else every
        if mi not in counts:
            counts[mi] = int(np.count_nonzero(m))
        n = counts[mi]
        if f == "count":
            ints[index[f"{name}.n"]] = n
            continue
        if f == "count_distinct":
            texts = ev.keys[layout.key_of[name]][i:j]
            got = set(compress(texts, m.tolist()))
            ints[index[f"{name}.d"]] = len(got)
            var[f"{name}.set"] = got
            continue
        vi = layout.value_of[name]
        v = ev.values[vi][i:j]
        if is_sketch(agg):
            var[state_part(agg)] = piece_state(spec, agg, v, m)
            continue
        if f in ("sum", "mean") or f in MOMENT_FUNCTIONS:
            vv = sums.get((vi, mi, agg.scale))
            if vv is None:
                if agg.scale is not None:  # a float field: fixed point, as the engine
                    what = f"aggregation {name} ({f} of {agg.of})"
                    vv = fixed_point(np.asarray(v, np.float64), m, agg.scale, what)
                else:
                    vv = np.where(m, v, 0).astype(np.int64)
                sums[(vi, mi, agg.scale)] = vv
            ints[index[f"{name}.s"]] = vv.sum()
            if f != "sum":
                ints[index[f"{name}.n"]] = n
            if f in MOMENT_FUNCTIONS:
                ss_hi, ss_lo = window_squares(vv, np.zeros(len(vv), np.int64), n)
                ints[index[f"{name}.ss_hi"]] = ss_hi[-1]
                ints[index[f"{name}.ss_lo"]] = ss_lo[-1]
            continue
        x = v[m]
        if f == "last_k":
            assert agg.k is not None
            var[f"{name}.v"] = x[::-1][:agg.k].tolist()
            continue
        k = index[f"{name}.v"]
        if len(x) == 0:
            valid[k] = False
            continue
        got_v = x[0] if f == "first" else x[-1] if f == "last" else \
            np.minimum.reduce(x) if f == "min" else np.maximum.reduce(x)
        ints[k] = np.asarray([got_v], x.dtype).view(np.int64)[0]
    return ints, valid, var


def _reduce(tspec: TileSpec, agg: Any, rows: _Rows, idx: I64, n_ent: int) -> dict[str, Any]:
    """The raw parts of ``agg`` per entity over the rows ``idx`` (in (entity, start) order)."""
    f, name = agg.function, agg.name
    layout, index = tspec.layout, tspec.fixed_index
    e = rows.entity[idx]
    raw = tspec.raw

    def total(part: str) -> I64:
        vals = rows.ints[idx, index[f"{name}.{part}"]]
        if n_ent == 1:  # one entity: a plain sum (int64, exact as the engine's)
            return np.asarray([vals.sum()], np.int64)
        out = np.zeros(n_ent, np.int64)
        np.add.at(out, e, vals)
        return out

    if is_sketch(agg):
        states: list[list[State]] = [[] for _ in range(n_ent)]
        for r, ee in zip(idx.tolist(), e.tolist(), strict=True):
            states[ee].append(rows.state(layout, r, agg))
        return merged_raw(agg, states)
    if f == "count_distinct":
        sets: list[set[Any]] = [set() for _ in range(n_ent)]
        for r, ee in zip(idx.tolist(), e.tolist(), strict=True):
            sets[ee] |= rows.variable(layout, r, f"{name}.set")
        return {f"{name}.d": (np.asarray([len(x) for x in sets], np.int64), np.ones(n_ent, np.bool_))}
    if f == "last_k":
        assert agg.k is not None
        typ = raw.field(f"{name}.v").type
        conv = float if pa.types.is_floating(typ.value_type) else int
        lists: list[list[Any]] = [[] for _ in range(n_ent)]
        for r, ee in zip(idx[::-1].tolist(), e[::-1].tolist(), strict=True):
            if len(lists[ee]) < agg.k:
                lists[ee].extend(conv(x) for x in rows.variable(layout, r, f"{name}.v"))
        return {f"{name}.v": pa.array([x[:agg.k] for x in lists], typ)}
    parts = RAW_PARTS[f]
    if "ss_hi" in parts:  # ss = Σ ss_hi * 2^62 + Σ ss_lo, carried in 31-bit limbs (exact)
        lo = rows.ints[idx, index[f"{name}.ss_lo"]]
        s_lo, s_mid = np.zeros(n_ent, np.int64), np.zeros(n_ent, np.int64)
        np.add.at(s_lo, e, lo & _MASK31)
        np.add.at(s_mid, e, lo >> 31)
        s_mid += s_lo >> 31
        hi = total("ss_hi") + (s_mid >> 31)
        ss_lo = ((s_mid & _MASK31) << 31) | (s_lo & _MASK31)
        every = np.ones(n_ent, np.bool_)
        return {f"{name}.n": (total("n"), every), f"{name}.s": (total("s"), every),
                f"{name}.ss_hi": (hi, every), f"{name}.ss_lo": (ss_lo, every)}
    if f in ("min", "max", "first", "last"):
        k = index[f"{name}.v"]
        ok = rows.valid[idx, k]
        typ = raw.field(f"{name}.v").type
        vals = rows.ints[idx, k]
        if pa.types.is_floating(typ):
            vals = vals.view(np.float64)
        ev, vals = e[ok], vals[ok]
        if n_ent == 1:  # one entity: plain reductions
            one = len(vals) > 0
            pick = (vals[0] if f == "first" else vals[-1] if f == "last" else
                    np.minimum.reduce(vals) if f == "min" else np.maximum.reduce(vals)) if one else 0
            return {f"{name}.v": (np.asarray([pick], vals.dtype), np.asarray([one]))}
        has = np.bincount(ev, minlength=n_ent).astype(np.bool_)
        if f in ("first", "last"):
            pos = np.arange(len(ev))
            at = np.full(n_ent, len(ev) if f == "first" else -1, np.int64)
            (np.minimum if f == "first" else np.maximum).at(at, ev, pos)
            out = vals[np.clip(at, 0, max(len(ev) - 1, 0))] if len(ev) else np.zeros(n_ent, vals.dtype)
        else:
            op = np.minimum if f == "min" else np.maximum
            fill = (np.inf if f == "min" else -np.inf) if vals.dtype.kind == "f" else \
                (np.iinfo(np.int64).max if f == "min" else np.iinfo(np.int64).min)
            out = np.full(n_ent, fill, vals.dtype)
            op.at(out, ev, vals)
        return {f"{name}.v": (out, has)}
    return {f"{name}.{p}": (total(p), np.ones(n_ent, np.bool_)) for p in parts}


_MASK31 = (1 << 31) - 1


__all__ = ["EntityTiles", "TileRows", "TileSpec", "build", "fields_to_read", "group_raw",
           "read_fields", "row_at", "tile_size_us", "values_at", "window_ranges"]
