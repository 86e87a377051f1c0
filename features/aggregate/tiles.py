"""The online state of request-time windows: per-entity tiles (issue 49 step b).

A window read at request time ``T`` has the one definition of
:mod:`features.aggregate.request_time` (sliding ``(T - size, T]``, tumbling ``[floor(T /
size) * size, T]``, exact). Exactness at any ``T`` needs every event of the window that
can still fall out of it, so the state keeps the entity's events of the last ``longest
window + allowed lateness``; what keeps a read cheap is how they are kept:

- time is cut into epoch-aligned **tiles** ``[s, s + h)`` (:func:`tile_size_us`: about
  64 tiles over the longest window, a size from a fixed ladder);
- per (entity, tile) two texts: the tile's **summary** (the engine's raw accumulators of
  every aggregation over the tile's events, plus ``count_distinct``'s distinct values) and
  its **events** (time after the tile's start, digest, each aggregation's value where the
  event counts);
- a window at ``T`` is the tiles wholly inside it (their summaries) plus at most two
  edge tiles (the one holding its start, the one holding ``T``), whose events inside the
  window are summarised at read time. A read costs ``O(tiles + events of the edge
  tiles)``, never the window's events.

Summaries are the raw parts of :func:`features.aggregate.engine.window_raw` over a group
of events (:func:`group_raw`), merged exactly (integer sums, min/max, the oldest/newest
non-empty tile for first/last, the newest tiles' values for ``last_k``, the union of
distinct values) into the raw parts of the whole window, which the engine's
:func:`~features.aggregate.engine.finalize` turns into values: the same functions as the
backfill, the stream and ``historical(..., windows="request_time")``.

Texts (Redis hash fields, ``features.sinks.redis_tiles``): fields joined by ``\\x1f``,
events by ``\\x1e``, list items by ``\\x1d``; numbers as their shortest round-trip text
(exact), a null as the empty text; distinct values and ``count_distinct`` values as
their Redis text (``features.compile.layout.encode_column``) with ``\\``, ``\\x1d``,
``\\x1e`` and ``\\x1f`` escaped.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from functools import cached_property
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
from features.aggregate.moments import SS_SHIFT
from features.aggregate.request_time import sub_spec
from features.compile.layout import encode_column
from features.schema.model import Window

I64 = npt.NDArray[np.int64]
_US = 1_000_000
#: tile sizes (seconds): the smallest one giving at most TILES_PER_WINDOW tiles over the
#: longest window (whole days beyond the ladder); each divides the next and a day
LADDER_S = (1, 5, 15, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400)
TILES_PER_WINDOW = 64
FIELD_SEP, EVENT_SEP, ITEM_SEP = "\x1f", "\x1e", "\x1d"
#: functions the tiles do not hold yet (their mergeable states exist: features.aggregate.sketches)
SKETCHES = ("approx_count_distinct", "approx_percentile")
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
    unbounded: AggSpec     # the same with every window unbounded (a group's raw parts)
    size_us: int           # tile size
    retention_us: int      # longest window + allowed lateness: tiles kept before the newest event
    parts: tuple[str, ...]  # the summary's fields, in order
    signature: str         # the layout's fingerprint (parts, tile size): a reader checks it

    @classmethod
    def of(cls, spec: AggSpec | None) -> TileSpec | None:
        if spec is None:
            return None
        by_name = {a.name: a for a in spec.aggregations.features}

        def held(a: Any) -> bool:  # the sketches' tile states are not held yet
            inputs = [by_name[x] for x in (a.numerator, a.denominator) if x] if a.function == "ratio" \
                else [a]
            return all(x.function not in SKETCHES for x in inputs)

        hot = [a.name for a in spec.stored("hot") if held(a)]
        if not hot:
            return None
        sub = sub_spec(spec, hot)
        if not sub.windowed:
            return None
        aggs = tuple(dataclasses.replace(a, window=Window(_UNBOUNDED_S, "sliding")) if a.window else a
                     for a in sub.aggregations.features)
        unbounded = AggSpec.of(dataclasses.replace(
            sub.schema, aggregations=dataclasses.replace(sub.aggregations, features=aggs)))
        assert unbounded is not None
        size = tile_size_us(sub.longest_us)
        parts = (*sub.raw_names(), *(f"{a.name}.set" for a in sub.windowed if a.function == "count_distinct"))
        sig = hashlib.sha256(repr((parts, size, [(a.name, a.function, a.of, a.where, a.k, a.scale)
                                                  for a in sub.windowed])).encode()).hexdigest()[:16]
        return cls(sub, unbounded, size, sub.longest_us + sub.lateness_us, parts, sig)

    @cached_property
    def raw(self) -> pa.Schema:
        """The raw parts' schema (:func:`~features.aggregate.engine.raw_schema`), made once."""
        return raw_schema(self.spec)

    @cached_property
    def kinds(self) -> tuple[str, ...]:
        """:meth:`part_kind` of each of :attr:`parts`, made once (a read parses with them)."""
        return tuple(self.part_kind(p) for p in self.parts)

    def part_kind(self, part: str) -> str:
        """How a summary field is written: ``int``, ``float``, ``list_int``, ``list_float``,
        ``set`` (escaped texts)."""
        if part.endswith(".set"):
            return "set"
        t = self.raw.field(part).type
        if pa.types.is_list(t):
            return "list_float" if pa.types.is_floating(t.value_type) else "list_int"
        return "float" if pa.types.is_floating(t) else "int"


# --------------------------------------------------------------------------- text helpers


def escape(text: pa.Array) -> pa.Array:
    """Redis texts made safe to join with the separators."""
    for a, b in (("\\", "\\\\"), (FIELD_SEP, "\\f"), (EVENT_SEP, "\\e"), (ITEM_SEP, "\\d")):
        text = pc.replace_substring(text, a, b)
    return text


def key_text(arr: pa.Array) -> pa.Array:
    """``count_distinct`` values as escaped text (equal values, equal texts; distinct, distinct)."""
    return escape(pc.cast(encode_column(arr), pa.string()))


def _num_text(arr: pa.Array) -> pa.Array:
    return pc.fill_null(pc.cast(arr, pa.string()), "")


def _list_text(arr: pa.Array) -> pa.Array:
    if not pa.types.is_string(arr.type.value_type):
        arr = arr.cast(pa.list_(pa.string()))
    return pc.fill_null(pc.binary_join(arr, ITEM_SEP), "")


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
    cols: dict[str, pa.Array] = {k: raw[k].take(at) for k in tspec.spec.raw_names()}
    ids = g[last]
    for agg in tspec.spec.windowed:
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

    def __len__(self) -> int:
        return len(self.start_us)


def build(tspec: TileSpec, events: Inputs, fresh: npt.NDArray[np.bool_]) -> TileRows:
    """The complete tiles holding a ``fresh`` event of ``events`` (the load's events and
    the history around them: every event of those tiles, exact copies allowed), within
    the retention before each entity's newest event. Vectorised over events and tiles."""
    spec = tspec.spec
    h = tspec.size_us
    codes = group_codes(events.entity)
    k = int(codes.max()) + 1 if len(codes) else 0
    newest = np.full(k, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(newest, codes, events.time_us)
    firsts = np.unique(codes, return_index=True)[1]
    newest_entity, newest_us = events.entity.take(pa.array(firsts)), newest[codes[firsts]]
    # only the events within the retention before their entity's newest event
    tile = np.floor_divide(events.time_us, h)
    within = np.flatnonzero(tile >= np.floor_divide(newest - tspec.retention_us, h)[codes])
    events, codes, tile, fresh = events.take(within), codes[within], tile[within], fresh[within]
    # (entity, tile) pairs holding a fresh event (a copy of a stored one too: a reload rewrites)
    pair = pd.DataFrame({"c": codes, "t": tile}).groupby(["c", "t"], sort=True).ngroup().to_numpy()
    pair = pair.astype(np.int64)
    touched = np.zeros(int(pair.max()) + 1 if len(pair) else 0, dtype=np.bool_)
    touched[pair[fresh]] = True
    keep = np.flatnonzero(first_of_each_key(codes, events.time_us, digest_ranks(events.digest)))
    events, codes, tile, pair = events.take(keep), codes[keep], tile[keep], pair[keep]
    sel = np.flatnonzero(touched[pair])
    if len(sel) == 0:
        empty = pa.array([], pa.string())
        return TileRows(events.entity.slice(0, 0), np.zeros(0, np.int64), empty, empty, newest_entity,
                        newest_us)
    ev = events.take(sel)
    ids, table = group_raw(tspec, ev, pair[sel])
    # one event per (entity, time, digest), sorted as the engine sorts them
    order = np.lexsort((digest_ranks(ev.digest), ev.time_us, pair[sel])).astype(np.int64)
    ev = ev.take(order)
    p = pair[sel][order]
    summary = _summary_text(tspec, table)
    lines = _event_text(spec, ev, tile[sel][order] * h)
    offsets = np.searchsorted(p, np.r_[ids, np.iinfo(np.int64).max]).astype(np.int32)
    texts = pc.binary_join(pa.ListArray.from_arrays(pa.array(offsets), lines), EVENT_SEP)
    heads = np.searchsorted(p, ids)
    return TileRows(ev.entity.take(pa.array(heads)), tile[sel][order][heads] * h, summary, texts,
                    newest_entity, newest_us)


def _summary_text(tspec: TileSpec, table: pa.Table) -> pa.Array:
    cols = []
    for part in tspec.parts:
        col = table.column(part).combine_chunks()
        cols.append(_list_text(col) if pa.types.is_list(col.type) else _num_text(col))
    if len(cols) == 1:
        return cols[0]
    return pc.binary_join_element_wise(*cols, FIELD_SEP)


def _event_text(spec: AggSpec, ev: Inputs, start_us: I64) -> pa.Array:
    """One text per event: its time after its tile's start (us), its digest, then per
    windowed aggregation its value where the event counts (``1`` for a count), else empty."""
    cols: list[Any] = [_num_text(pa.array(ev.time_us - start_us)),
                       pc.fill_null(ev.digest.cast(pa.string()), "")]
    for agg in spec.windowed:
        mask = pa.array(ev.contrib[agg.name])
        kind = spec.value_kind(agg)
        if kind == "one":
            text = pa.array(np.where(ev.contrib[agg.name], "1", ""), pa.string())
        elif kind == "key":
            text = pc.if_else(mask, pc.fill_null(key_text(ev.values[agg.name]), ""), "")
        else:
            text = pc.if_else(mask, _num_text(pa.array(ev.values[agg.name])), "")
        cols.append(text)
    return pc.binary_join_element_wise(*cols, FIELD_SEP)


# --------------------------------------------------------------------------- reading


def window_ranges(tspec: TileSpec, t_us: int) -> list[tuple[int, int]]:
    """Per windowed aggregation, its window at ``t_us`` as an inclusive range ``[a, b]`` (us)."""
    out = []
    for agg in tspec.spec.windowed:
        assert agg.window is not None
        size = agg.window.size_s * _US
        a = t_us - size + 1 if agg.window.kind == "sliding" else t_us // size * size
        out.append((a, t_us))
    return out


def fields_to_read(tspec: TileSpec, t_us: int) -> tuple[list[int], list[int]]:
    """The tile starts whose summaries a read at ``t_us`` needs (ascending) and the edge
    tiles whose events it needs."""
    h = tspec.size_us
    ranges = window_ranges(tspec, t_us)
    lo = min(a for a, _ in ranges)
    starts = list(range(lo // h * h, t_us // h * h + h, h))
    edges = {s for a, b in ranges for s, _, _ in _edge_pieces(h, a, b)}
    return starts, sorted(edges)


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


def _parse_num(text: str, kind: str) -> Any:
    if text == "":
        return None
    return float(text) if kind == "float" else int(text)


def _parse_summary(tspec: TileSpec, text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part, kind, value in zip(tspec.parts, tspec.kinds, text.split(FIELD_SEP), strict=True):
        if kind == "set":
            out[part] = set(value.split(ITEM_SEP)) if value else set()
        elif kind.startswith("list_"):
            conv = float if kind == "list_float" else int
            out[part] = [conv(x) for x in value.split(ITEM_SEP)] if value else []
        else:
            out[part] = _parse_num(value, kind)
    return out


def _parse_events(tspec: TileSpec, start_us: int, text: str) -> tuple[I64, pa.Array, list[pa.Array]]:
    """An edge tile's events (vectorised: Arrow string kernels): times, digests, and per
    windowed aggregation its value texts (empty: the event does not count)."""
    width = 2 + len(tspec.spec.windowed)
    lines = pc.split_pattern(pa.array([text], pa.string()), EVENT_SEP).flatten()
    parts = pc.split_pattern(lines, FIELD_SEP).flatten()
    n = len(parts) // width
    cols = [parts.take(pa.array(np.arange(i, n * width, width, dtype=np.int64))) for i in range(width)]
    t = np.asarray(pc.cast(cols[0], pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64) + start_us
    return t, cols[1], cols[2:]


def _inputs_of(tspec: TileSpec, t: I64, digests: pa.Array, cols: list[pa.Array]) -> Inputs:
    spec = tspec.spec
    n = len(t)
    contrib, values = {}, {}
    for agg, col in zip(spec.windowed, cols, strict=True):
        counts = pc.not_equal(col, "")
        contrib[agg.name] = np.asarray(counts.to_numpy(zero_copy_only=False), dtype=np.bool_)
        kind = spec.value_kind(agg)
        if kind == "key":
            values[agg.name] = col
        elif kind in ("float", "int"):
            num = pc.cast(pc.if_else(counts, col, "0"), pa.float64() if kind == "float" else pa.int64())
            values[agg.name] = np.asarray(num.to_numpy(zero_copy_only=False),
                                          dtype=np.float64 if kind == "float" else np.int64)
    return Inputs(pa.nulls(n, pa.string()), t, pa.nulls(n, pa.string()), digests, contrib, values)


@dataclass
class EntityTiles:
    """One entity's tiles as read back: summaries by tile start, edge tiles' events."""

    newest_us: int | None
    summaries: dict[int, str]
    events: dict[int, str]


def values_at(tspec: TileSpec, entities: list[EntityTiles], t_us: int) -> dict[str, pa.Array]:
    """Every aggregation of ``tspec.spec`` at ``t_us`` for each entity (no state: the
    empty window's values), finalized: ``{name: column}``, one value per entity."""
    h = tspec.size_us
    ranges = window_ranges(tspec, t_us)
    # the partial pieces: (entity, tile, a, b) -> events of that tile within [a, b]
    partial_ids: dict[tuple[int, int, int, int], int] = {}
    parsed: _Parsed = {}
    plans: list[list[list[tuple[str, Any]]]] = []  # per entity, per aggregation: pieces
    for e, et in enumerate(entities):
        per_agg = []
        for a, b in ranges:
            edges = _edge_pieces(h, a, b)
            full = [("tile", x) for x in _full_tiles(h, a, b) if x in et.summaries]
            pieces: list[tuple[str, Any]] = []  # ascending: edge tile of a, full tiles, edge tile of b
            for s, lo, hi in edges:
                if s > a:  # the edge tile holding b: after the full tiles
                    pieces.extend(full)
                if s in et.events:
                    key = (e, s, lo, hi)
                    if key not in partial_ids:
                        partial_ids[key] = len(partial_ids)
                        if (e, s) not in parsed:
                            parsed[(e, s)] = _parse_events(tspec, s, et.events[s])
                    pieces.append(("part", partial_ids[key]))
            if not edges or edges[-1][0] <= a:
                pieces.extend(full)
            per_agg.append(pieces)
        plans.append(per_agg)
    partial = _partials(tspec, partial_ids, parsed)
    summaries: dict[tuple[int, int], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for e, per_agg in enumerate(plans):
        row: dict[str, Any] = {}
        for agg, pieces in zip(tspec.spec.windowed, per_agg, strict=True):
            states = []
            for what, ref in pieces:
                if what == "tile":
                    got = summaries.get((e, ref))
                    if got is None:
                        got = summaries[(e, ref)] = _parse_summary(tspec, entities[e].summaries[ref])
                    states.append(got)
                elif ref in partial:
                    states.append(partial[ref])
            row.update(_merge(tspec, agg, states))
        rows.append(row)
    schema = tspec.raw
    table = pa.table({f.name: pa.array([r[f.name] for r in rows], f.type) for f in schema}, schema=schema)
    return finalize(tspec.spec, table)


_Parsed = dict[tuple[int, int], tuple[I64, pa.Array, list[pa.Array]]]


def _partials(tspec: TileSpec, ids: dict[tuple[int, int, int, int], int], parsed: _Parsed
              ) -> dict[int, dict[str, Any]]:
    """The summaries of the partial pieces (events of one tile within a range), one
    vectorised :func:`group_raw` over all of them."""
    parts: list[Inputs] = []
    groups: list[I64] = []
    for (e, s, a, b), pid in ids.items():
        t, digests, cols = parsed[(e, s)]
        inside = np.flatnonzero((t >= a) & (t <= b))
        if len(inside) == 0:
            continue
        at = pa.array(inside)
        parts.append(_inputs_of(tspec, t[inside], digests.take(at), [c.take(at) for c in cols]))
        groups.append(np.full(len(inside), pid, dtype=np.int64))
    if not parts:
        return {}
    ids_out, table = group_raw(tspec, Inputs.concat(parts), np.concatenate(groups), keys_are_text=True)
    out: dict[int, dict[str, Any]] = {}
    got = {name: table.column(name).to_pylist() for name in tspec.parts}
    for i, pid in enumerate(ids_out.tolist()):
        out[pid] = {name: set(got[name][i]) if name.endswith(".set") else got[name][i]
                    for name in tspec.parts}
    return out


def _merge(tspec: TileSpec, agg: Any, states: list[dict[str, Any]]) -> dict[str, Any]:
    """The raw parts of ``agg`` over the union of ``states`` (disjoint, oldest first)."""
    f, name = agg.function, agg.name
    parts = RAW_PARTS[f]
    if f == "count_distinct":
        union: set[str] = set()
        for st in states:
            union |= st[f"{name}.set"]
        return {f"{name}.d": len(union)}
    if f == "last_k":
        out: list[Any] = []
        for st in reversed(states):
            out.extend(st[f"{name}.v"])
            if len(out) >= agg.k:
                break
        return {f"{name}.v": out[:agg.k]}
    if f in ("min", "max", "first", "last"):
        vals = [st[f"{name}.v"] for st in states if st[f"{name}.v"] is not None]
        if not vals:
            return {f"{name}.v": None}
        ends = {"first": vals[0], "last": vals[-1]}
        return {f"{name}.v": min(vals) if f == "min" else max(vals) if f == "max" else ends[f]}
    if "ss_hi" in parts:
        ss = sum((int(st[f"{name}.ss_hi"] or 0) << SS_SHIFT) + int(st[f"{name}.ss_lo"] or 0) for st in states)
        return {f"{name}.n": sum(int(st[f"{name}.n"] or 0) for st in states),
                f"{name}.s": sum(int(st[f"{name}.s"] or 0) for st in states),
                f"{name}.ss_hi": ss >> SS_SHIFT, f"{name}.ss_lo": ss & ((1 << SS_SHIFT) - 1)}
    return {f"{name}.{p}": sum(int(st[f"{name}.{p}"] or 0) for st in states) for p in parts}


__all__ = ["EntityTiles", "TileRows", "TileSpec", "build", "fields_to_read", "group_raw", "tile_size_us",
           "values_at", "window_ranges"]
