"""Windowed aggregations: one definition, one vectorised engine for the backfill and the stream.

Semantics (``docs/aggregations.md`` has the long form). Per entity, on the event time:

- the **history** holds every distinct event: one per (entity, event time, content
  digest) (``features.kernels.digest``); an exact copy is a *duplicate*. Two different
  events at one instant are both counted;
- every instant of the history gets one value per aggregation *as of its own time*,
  over the entity's events in its window (sliding ``(t - size, t]``; tumbling
  ``[floor(t / size) * size, t]``), every event at ``t`` included, counting only the
  events that match ``where`` and (with ``of``) have a non-null value. Among events at
  one instant the one with the greater digest is the newer (``last``, ``first``,
  ``last_k``). The order in which events arrive changes nothing.

A batch backfill (:func:`compute`) computes exactly this over the whole history. The
stream decides in **arrival order** (a Kafka partition, records keyed by entity): an
event more than ``allowed_lateness`` older than the newest event of its entity seen
before it is **late** (stored in the history, reported as a reject with rule
``aggregation.lateness``, updating no aggregation); every other event's value is
updated as out-of-order events within the lateness arrive. Where no event is late the
stream's values equal the backfill's; a backfill of the affected range repairs the
values a late event would have changed.

One vectorised engine serves both paths: :func:`compute` gives exact raw accumulators
(integers for counts, for integer/decimal sums and for a float field's fixed-point
sums; ``n``, ``Σx`` and ``Σx²`` for variance/stddev, see ``features.aggregate.moments``;
min, max, first and last are values, never arithmetic) and :func:`finalize` turns them
into the stored columns (the mean's division, the variance's one rounding, a ratio's
``on_zero``): the backfill (``features.aggregate.backfill``) runs it
over the loaded events and the windows around them, the stream
(``features.aggregate.stream``) over each micro-batch and the state it holds.

Why one module of this size: :func:`compute`'s raw accumulators and :func:`finalize`
must agree function by function (the backfill, the stream, the tiles and the request-time
reads all go through this pair), so each function's two halves sit side by side here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate import sketches
from features.aggregate.moments import PARTS as MOMENT_PARTS
from features.aggregate.moments import fixed_point, variance, window_squares
from features.compile.layout import MOMENT_FUNCTIONS, aggregation_type, event_time_micros
from features.lineage import DIGEST
from features.schema.model import FLOAT_KINDS, Aggregation, Aggregations, FieldType, Schema, TypeKind

I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]

#: raw accumulator components per function (each an int64 or float64 column, nullable)
RAW_PARTS: dict[str, tuple[str, ...]] = {
    "count": ("n",), "sum": ("s",), "mean": ("s", "n"), "min": ("v",), "max": ("v",), "last": ("v",),
    "count_distinct": ("d",),
    # moments (features.aggregate.moments): n, s = Σx, ss = Σx² = ss_hi * 2^62 + ss_lo
    **dict.fromkeys(("variance", "stddev", "variance_sample", "stddev_sample"), MOMENT_PARTS),
    "first": ("v",),
    "last_k": ("v",),  # a list<int64> / list<float64> column: the window's k newest values, newest first
    # sketches (features.aggregate.sketches): the window's distinct hashes d and its HyperLogLog
    # registers as two exact integers (nz registers above 0, w = sum of 2^(63-p-M)); the
    # bucket key per quantile
    "approx_count_distinct": ("d", "nz", "w"),
    "approx_percentile": ("b",),  # a list<int64> column, one bucket key per quantile; null: empty
}
_MOMENTS = MOMENT_FUNCTIONS
LATE_RULE = "aggregation.lateness"
_US = 1_000_000


# --------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class AggSpec:
    """The compiled aggregations of one schema: what both engines need."""

    schema: Schema
    aggregations: Aggregations
    windowed: tuple[Aggregation, ...]        # everything but ratios, in declaration order
    lateness_us: int
    horizon_us: int                          # lateness + the longest window: state kept per entity
    longest_us: int                          # the longest window
    plan: tuple[tuple[str, int, bool], ...]  # per windowed aggregation: function, size us, sliding?

    @classmethod
    def of(cls, schema: Schema) -> AggSpec | None:
        aggs = schema.aggregations
        if aggs is None:
            return None
        windowed = tuple(a for a in aggs.features if a.function != "ratio")
        lateness = aggs.allowed_lateness_s * _US
        plan = tuple((a.function, a.window.size_s * _US, a.window.kind == "sliding")
                     for a in windowed if a.window is not None)
        longest = aggs.max_window_s * _US
        return cls(schema, aggs, windowed, lateness, lateness + longest, longest, plan)

    def value_kind(self, agg: Aggregation) -> str:
        """How a contribution is carried: ``int`` (integers, scaled decimals), ``float``,
        ``key`` (count_distinct: the value itself) or ``one`` (count of events)."""
        if agg.of is None:
            return "one"
        if agg.function in ("count_distinct", "approx_count_distinct"):
            return "key"
        kind = self.schema.field(agg.of).type.kind
        if agg.function == "count":
            return "one"
        return "float" if kind in FLOAT_KINDS else "int"

    def raw_names(self) -> list[str]:
        return [f"{a.name}.{p}" for a in self.windowed for p in RAW_PARTS[a.function]]

    def output_type(self, agg: Aggregation) -> pa.DataType:
        """The Arrow type of a stored aggregation column
        (:func:`features.compile.layout.aggregation_type`)."""
        return aggregation_type(self.schema, agg)

    def stored(self, target: str) -> tuple[Aggregation, ...]:
        return tuple(a for a in self.aggregations.features if target in a.store)


# --------------------------------------------------------------------------- inputs


@dataclass
class Inputs:
    """The events, in arrival order, reduced to what the aggregations read."""

    entity: pa.Array                       # the entity key column
    time_us: I64                           # event time, microseconds since the epoch (UTC)
    source: pa.Array                       # lineage URI per event
    digest: pa.Array                       # content digest per event (16 hex digits)
    contrib: dict[str, Mask]               # per windowed aggregation: does the event count?
    values: dict[str, Any]                 # per aggregation with a value: int64/float64 array,
    #                                        or an Arrow array (count_distinct)

    def __len__(self) -> int:
        return len(self.time_us)

    def take(self, idx: I64) -> Inputs:
        """The events at ``idx``, in that order."""
        at = pa.array(idx, pa.int64())
        return Inputs(self.entity.take(at), self.time_us[idx], self.source.take(at), self.digest.take(at),
                      {k: v[idx] for k, v in self.contrib.items()},
                      {k: v.take(at) if isinstance(v, pa.Array) else v[idx] for k, v in self.values.items()})

    @staticmethod
    def concat(parts: list[Inputs]) -> Inputs:
        """Inputs one after the other (Arrow columns cast to the last part's types);
        empty parts are skipped, and a single part comes back as it is."""
        parts = [p for p in parts if len(p)] or parts[-1:]
        if len(parts) == 1:
            return parts[0]
        entity_type = parts[-1].entity.type
        values: dict[str, Any] = {}
        for name in parts[-1].values:
            vs = [x.values[name] for x in parts]
            values[name] = (pa.concat_arrays([v.cast(vs[-1].type) for v in vs]) if isinstance(vs[0], pa.Array)
                            else np.concatenate(vs))
        return Inputs(pa.concat_arrays([x.entity.cast(entity_type) for x in parts]),
                      np.concatenate([x.time_us for x in parts]), pa.concat_arrays([x.source for x in parts]),
                      pa.concat_arrays([x.digest for x in parts]),
                      {k: np.concatenate([x.contrib[k] for x in parts]) for k in parts[-1].contrib}, values)


def _scaled_decimal(arr: pa.Array) -> I64:
    """decimal128 values as int64 unscaled integers (exact; nulls become 0)."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64)[2 * arr.offset: 2 * (arr.offset + len(arr))]
    low, high = words[0::2], words[1::2]
    valid = np.asarray(arr.is_valid(), dtype=np.bool_)
    if np.any((high != (low >> 63)) & valid):
        raise OverflowError("a decimal value does not fit in 64 bits: cannot aggregate it exactly")
    return np.where(valid, low, 0)


def _numeric(arr: pa.Array, kind: TypeKind) -> npt.NDArray[Any]:
    if kind is TypeKind.DECIMAL:
        return _scaled_decimal(arr)
    if kind in FLOAT_KINDS:
        return np.asarray(pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False))
    return np.asarray(pc.fill_null(arr.cast(pa.int64()), 0).to_numpy(zero_copy_only=False))


def extract(spec: AggSpec, rows: pa.Table | pa.RecordBatch) -> Inputs:
    """The aggregation inputs of ``rows`` (valid rows with their lineage, arrival order)."""

    schema = spec.schema
    assert schema.entity is not None and schema.event_time is not None
    if isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    n = rows.num_rows
    t = np.asarray(event_time_micros(rows.column(schema.event_time).combine_chunks()).to_numpy(
        zero_copy_only=False), dtype=np.int64)
    contrib: dict[str, Mask] = {}
    values: dict[str, Any] = {}
    for agg in spec.windowed:
        mask = np.ones(n, dtype=np.bool_)
        for name, allowed in agg.where:
            col = rows.column(name).combine_chunks()
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            hit = pc.is_in(col, value_set=pa.array(list(allowed), col.type))
            mask &= np.asarray(pc.fill_null(hit, False).to_numpy(zero_copy_only=False), dtype=np.bool_)
        if agg.of is not None:
            col = rows.column(agg.of).combine_chunks()
            mask &= np.asarray(col.is_valid(), dtype=np.bool_)
            kind = spec.value_kind(agg)
            if kind == "key":
                values[agg.name] = col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col
            elif kind != "one":
                values[agg.name] = _numeric(col, schema.field(agg.of).type.kind)
        contrib[agg.name] = mask
    return Inputs(rows.column(schema.entity).combine_chunks(), t, rows.column("_source").combine_chunks(),
                  rows.column(DIGEST).combine_chunks(), contrib, values)


# --------------------------------------------------------------------------- batch engine


@dataclass
class Computed:
    """The outcome for a batch of events (indices into the inputs, in input order)."""

    accepted: I64           # input indices of the first of each distinct event (entity, time,
    #                         digest), sorted by (entity, time, digest)
    duplicate: I64          # input indices of its exact copies (input order)
    raw: dict[str, pa.Array]  # "<aggregation>.<part>" -> one value per accepted event: its
    #                           instant's (every event at one (entity, time) has the same)


def group_codes(entity: pa.Array) -> I64:
    """Dense int64 codes of an array's values (nulls get a code of their own)."""
    enc = pc.dictionary_encode(entity, null_encoding="encode")
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def digest_ranks(digest: pa.Array) -> I64:
    """Each digest's rank among the distinct ones in ``digest``, in digest order (fixed-width
    lower-case hex: text order is numeric order)."""
    return np.asarray(pc.rank(digest, sort_keys="ascending", tiebreaker="dense").to_numpy(
        zero_copy_only=False), dtype=np.int64)


def first_of_each_key(codes: I64, t: I64, digest: I64) -> Mask:
    """True for the first event (input order) of each distinct event (entity, event time,
    digest rank): the history holds each once, its exact copies are duplicates."""
    dup: Mask = pd.DataFrame({"k": codes, "t": t, "d": digest}).duplicated(keep="first").to_numpy()
    return ~dup


class _Positions:
    """Events sorted by (entity, time) (several at one time: ties): each event's key as one
    int64, ``code * span + (t - t0)``, so that a window's first position is one binary
    search (``span`` leaves a gap between entities; keys that would not fit in int64
    use time ranks instead)."""

    def __init__(self, codes: I64, t: I64, *, ranks: bool = False) -> None:
        self.codes, self.t = codes, t
        t0 = int(t.min()) if len(t) else 0
        span = (int(t.max()) - t0 + 2) if len(t) else 2
        self.exact = not ranks and (int(codes.max()) + 1 if len(codes) else 1) * span < 2**62
        if self.exact:
            self.t0, self.span = t0, span
            self.key = codes * span + (t - t0)
        else:  # astronomically spread times: ranks of the distinct times instead
            self.uniq = np.unique(t)
            self.span = len(self.uniq) + 1
            self.key = codes * self.span + np.searchsorted(self.uniq, t)

    def window_starts(self, agg: Aggregation) -> I64:
        """The first position of each event's window."""
        assert agg.window is not None
        size = agg.window.size_s * _US
        codes, t = self.codes, self.t
        sliding = agg.window.kind == "sliding"
        edge = t - size if sliding else np.floor_divide(t, size) * size
        if self.exact:
            # an offset before the entity's first event stays inside its own key range
            off = np.maximum(edge - self.t0, -1 if sliding else 0)
            bound = codes * self.span + off
        else:
            bound = codes * self.span + np.searchsorted(self.uniq, edge, side="right" if sliding else "left")
            sliding = False  # ranks: the searchsorted above already placed the bound
        lo: I64 = np.searchsorted(self.key, bound, side="right" if sliding else "left").astype(np.int64)
        return lo


def _prefix(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out = np.zeros(len(x) + 1, dtype=x.dtype)
    np.cumsum(x, out=out[1:])
    return out


def _range_extreme(v: npt.NDArray[Any], lo: I64, op: Any, fill: Any) -> npt.NDArray[Any]:
    """op.reduce over v[lo[i]..i] for every i (a sparse table: O(n log n), vectorised)."""
    n = len(v)
    table = [v]
    k = 1
    while 2 * k <= n:
        prev = table[-1]
        table.append(op(prev[:-k], prev[k:]) if len(prev) > k else prev[:0])
        k *= 2
    idx = np.arange(n)
    length = idx - lo + 1
    out = np.full(n, fill, dtype=v.dtype)
    level = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    for j, row in enumerate(table):
        sel = level == j
        if not sel.any():
            continue
        a = lo[sel]
        b = idx[sel] - (1 << j) + 1
        out[sel] = op(row[a], row[b])
    return out


def _distinct_counts(codes: I64, vcodes: I64, mask: Mask, lo: I64) -> I64:
    """Distinct ``vcodes`` among contributing events in each window [lo[i], i], in
    O(n log n) whatever the windows' lengths.

    With ``prev[j]`` the previous contributing event of ``j``'s entity with the same value
    (-1: none), window ``i`` holds ``D[i] = #{j in [lo[i], i]: prev[j] < lo[i]}`` distinct
    values (each counted at its first event in the window). Since ``j < lo[i]`` implies
    ``prev[j] < lo[i]``, ``D[i] = cnt[i+1] - cnt[lo[i]] - C[i]`` with ``cnt`` the prefix
    count of contributing events and ``C[i] = #{j <= i: prev[j] >= lo[i]}``. The window
    starts never decrease (events sorted by entity then time, each window inside its
    entity), so the ``i`` that a given ``j`` counts in ``C`` are one run, ``j <= i < Q[j]``
    with ``Q[j]`` the first ``i`` whose window starts after ``prev[j]``: ``C`` is a
    difference array's prefix sum."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if len(lo) > 1 and bool((np.diff(lo) < 0).any()):
        raise AssertionError("window starts must not decrease")
    prev_same = np.full(n, -1, dtype=np.int64)
    m = np.flatnonzero(mask)
    if len(m):
        order = np.lexsort((m, vcodes[m], codes[m]))
        sm = m[order]
        same = (codes[sm][1:] == codes[sm][:-1]) & (vcodes[sm][1:] == vcodes[sm][:-1])
        prev_same[sm[1:][same]] = sm[:-1][same]
    cnt = _prefix(mask.astype(np.int64))
    j = np.flatnonzero(prev_same >= 0)
    q = np.searchsorted(lo, prev_same[j], side="right")
    runs = q > j
    diff = np.bincount(j[runs], minlength=n + 1) - np.bincount(q[runs], minlength=n + 1)
    within = np.cumsum(diff[:n])
    pos = np.arange(n)
    out: I64 = cnt[pos + 1] - cnt[lo] - within
    return out


def _last_k(v: npt.NDArray[Any], mask: Mask, lo: I64, k: int) -> pa.Array:
    """For every window [lo[i], i]: the values of its ``k`` newest contributing events,
    newest first, as one list per event (shorter when the window holds fewer). With
    ``m`` the contributing positions in order and ``cnt`` their prefix count, the j-th
    newest of window i is ``m[cnt[i+1] - 1 - j]`` for ``j < cnt[i+1] - cnt[lo[i]]``:
    an (n, k) gather, no loop over events."""
    n = len(v)
    m = np.flatnonzero(mask)
    cnt = _prefix(mask.astype(np.int64))
    pos = np.arange(n)
    lengths = np.minimum(cnt[pos + 1] - cnt[lo], k)
    rank = cnt[pos + 1][:, None] - 1 - np.arange(k, dtype=np.int64)[None, :]
    keep = np.arange(k, dtype=np.int64)[None, :] < lengths[:, None]
    picked = m[rank[keep]] if len(m) else np.zeros(0, dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(v[picked]))


def compute(spec: AggSpec, inputs: Inputs) -> Computed:
    """The batch engine: every event's outcome and, for accepted ones, raw accumulators."""
    n = len(inputs)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return Computed(empty, empty, {k: pa.array([], _raw_type(spec, k)) for k in spec.raw_names()})
    codes = group_codes(inputs.entity)
    t = inputs.time_us
    ranks = digest_ranks(inputs.digest)
    first = first_of_each_key(codes, t, ranks)
    acc = np.flatnonzero(first)
    order = acc[np.lexsort((ranks[acc], t[acc], codes[acc]))]
    return Computed(order, np.flatnonzero(~first), window_raw(spec, inputs, order, codes[order], t[order]))


def window_raw(spec: AggSpec, inputs: Inputs, order: I64, c: I64, ts: I64) -> dict[str, pa.Array]:
    """Raw accumulators of every windowed aggregation for the rows ``order`` of
    ``inputs``, sorted by (entity code ``c``, time ``ts``): row ``i``'s window is the rows
    ``[lo[i], i]`` of that order whose time is in its window (sliding ``(ts[i] - size,
    ts[i]]``, tumbling ``[floor(ts[i] / size) * size, ts[i]]``), and every row at one
    (entity, time) takes the value of the last one there (its instant's: ties all count
    and all agree). A row that does not contribute (``inputs.contrib`` false) still gets
    its window's value: the request-time reads (``features.aggregate.request_time``) put
    their request times in as such rows, after the events at their time."""
    pos = np.arange(len(order))
    # each event's value is its instant's: the window up to the last event at its (entity,
    # time) (the greatest digest), so events at one instant all count and all agree
    same_next = np.r_[(c[1:] == c[:-1]) & (ts[1:] == ts[:-1]), False]
    ends = np.flatnonzero(~same_next)
    instant_end = ends[np.searchsorted(ends, pos)] if len(pos) else pos
    raw: dict[str, pa.Array] = {}
    positions = _Positions(c, ts)
    starts: dict[tuple[int, bool], I64] = {}
    for agg in spec.windowed:
        assert agg.window is not None
        shape = (agg.window.size_s, agg.window.kind == "sliding")
        if shape not in starts:
            starts[shape] = positions.window_starts(agg)
        lo = starts[shape]
        mask = inputs.contrib[agg.name][order]
        cnt = _prefix(mask.astype(np.int64))
        n_in = cnt[pos + 1] - cnt[lo]
        f = agg.function
        if f == "count":
            raw[f"{agg.name}.n"] = pa.array(n_in, pa.int64())
            continue
        if f == "count_distinct":
            vcodes = group_codes(inputs.values[agg.name].take(pa.array(order)))
            raw[f"{agg.name}.d"] = pa.array(_distinct_counts(c, vcodes, mask, lo), pa.int64())
            continue
        if f == "approx_count_distinct":
            assert agg.precision is not None
            h = sketches.hash64(inputs.values[agg.name].take(pa.array(order)))
            d = _distinct_counts(c, h.view(np.int64), mask, lo)
            raw[f"{agg.name}.d"] = pa.array(d, pa.int64())
            if len(d) and int(d.max()) > sketches.sparse_max(agg.precision):
                nz, w = sketches.hll_windows(c, h, mask, lo, agg.precision)
            else:  # every window is counted exactly (d): the registers are not read
                nz = w = np.zeros(len(d), dtype=np.int64)
            raw[f"{agg.name}.nz"] = pa.array(nz, pa.int64())
            raw[f"{agg.name}.w"] = pa.array(w, pa.int64())
            continue
        v = inputs.values[agg.name][order]
        if f == "approx_percentile":
            assert agg.relative_accuracy is not None and agg.of is not None
            ft = spec.schema.field(agg.of).type
            x = sketches.as_float64(v, int(ft.scale or 0) if ft.kind is TypeKind.DECIMAL else None)
            raw[f"{agg.name}.b"] = sketches.percentile_windows(x, mask, lo, agg.quantiles,
                                                               agg.relative_accuracy)
            continue
        if f == "last_k":
            assert agg.k is not None
            raw[f"{agg.name}.v"] = _last_k(v, mask, lo, agg.k)
            continue
        if f in ("sum", "mean") or f in _MOMENTS:
            if agg.scale is not None:  # a float field: fixed point, 10^-scale units
                vv = fixed_point(v, mask, agg.scale, f"aggregation {agg.name} ({f} of {agg.of})")
            else:
                vv = np.where(mask, v, 0).astype(np.int64)
            # window sums within 2^62 (prefix sums may wrap: their differences stay exact)
            if len(vv) and int(np.abs(vv).max()) * int(n_in.max()) >= 2**62:
                hint = "; declare a smaller scale on the aggregation" if agg.scale is not None else ""
                raise OverflowError(f"aggregation {agg.name}: the sums could overflow 64-bit integers{hint}")
            ps = _prefix(vv)
            raw[f"{agg.name}.s"] = pa.array(ps[pos + 1] - ps[lo], pa.int64())
            if f != "sum":
                raw[f"{agg.name}.n"] = pa.array(n_in, pa.int64())
            if f in _MOMENTS:
                ss_hi, ss_lo = window_squares(vv, lo, int(n_in.max()))
                raw[f"{agg.name}.ss_hi"] = pa.array(ss_hi, pa.int64())
                raw[f"{agg.name}.ss_lo"] = pa.array(ss_lo, pa.int64())
            continue
        empty = n_in == 0
        if f == "last":
            last = np.maximum.accumulate(np.where(mask, pos, -1)) if len(pos) else pos
            out = v[np.maximum(last, 0)]
        elif f == "first":  # the oldest counted event at or after the window's start
            nxt = np.minimum.accumulate(np.where(mask, pos, len(pos))[::-1])[::-1] if len(pos) else pos
            out = v[np.minimum(nxt[lo], len(pos) - 1)]
        else:
            is_float = v.dtype.kind == "f"
            if f == "min":
                fill = np.inf if is_float else np.iinfo(np.int64).max
                out = _range_extreme(np.where(mask, v, fill), lo, np.minimum, fill)
            else:
                fill = -np.inf if is_float else np.iinfo(np.int64).min
                out = _range_extreme(np.where(mask, v, fill), lo, np.maximum, fill)
        raw[f"{agg.name}.v"] = pa.array(out, mask=empty)
    if len(ends) < len(pos):  # ties: every event takes its instant's value
        at = pa.array(instant_end, pa.int64())
        raw = {k: v.take(at) for k, v in raw.items()}
    return raw


def _raw_type(spec: AggSpec, name: str) -> pa.DataType:
    agg_name, part = name.rsplit(".", 1)
    agg = next(a for a in spec.windowed if a.name == agg_name)
    if agg.function == "last_k":
        return pa.list_(pa.float64() if spec.value_kind(agg) == "float" else pa.int64())
    if agg.function == "approx_percentile":
        return pa.list_(pa.int64())
    if part == "v" and spec.value_kind(agg) == "float":
        return pa.float64()
    return pa.int64()


def raw_schema(spec: AggSpec) -> pa.Schema:
    return pa.schema([pa.field(n, _raw_type(spec, n)) for n in spec.raw_names()])


# --------------------------------------------------------------------------- finalize


def _decimal_from_scaled(v: I64, valid: Mask, scale: int, precision: int = 38) -> pa.Array:
    words = np.empty(2 * len(v), dtype=np.int64)
    words[0::2] = v
    words[1::2] = v >> 63
    validity = pa.array(valid).buffers()[1] if not valid.all() else None
    return pa.Array.from_buffers(pa.decimal128(precision, scale), len(v),
                                 [validity, pa.py_buffer(words.tobytes())])


#: raw parts as ``finalize`` reads them: a table, or per part an Arrow array or NumPy
#: ``(values, valid)`` (a one-row read skips building Arrow arrays only to convert them back)
RawParts: TypeAlias = "pa.Table | dict[str, Any]"


def _column(raw: RawParts, name: str) -> Any:
    return raw.column(name) if isinstance(raw, pa.Table) else raw[name]


def _arrow(col: Any) -> pa.Array:
    if isinstance(col, tuple):
        v, valid = col
        return pa.array(v, mask=None if valid.all() else ~valid)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _cast(arr: pa.Array, target: pa.DataType) -> pa.Array:
    return arr if arr.type == target else arr.cast(target)


def _np(arr: Any, dtype: Any, fill: Any) -> tuple[npt.NDArray[Any], Mask]:
    if isinstance(arr, tuple):
        v, ok = arr
        return np.asarray(v if ok.all() else np.where(ok, v, fill), dtype=dtype), ok
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    valid = np.asarray(arr.is_valid(), dtype=np.bool_)
    return np.asarray(pc.fill_null(arr, fill).to_numpy(zero_copy_only=False), dtype=dtype), valid


def value_scale(spec: AggSpec, agg: Aggregation) -> tuple[FieldType, int]:
    """The type of the field ``agg`` aggregates (``of``) and the decimal scale of its raw
    sums: the field's scale for a decimal, the fixed point (``agg.scale``) of a float
    field's sums, else 0. :func:`finalize` and ``one_row.finalize_row`` both use it."""
    assert agg.of is not None
    ft = spec.schema.field(agg.of).type
    scale = int(ft.scale or 0) if ft.kind is TypeKind.DECIMAL else 0
    if agg.scale is not None:  # a float field's fixed point
        scale = agg.scale
    return ft, scale


def finalize(spec: AggSpec, raw: RawParts) -> dict[str, pa.Array]:
    """Raw accumulators -> every aggregation column, typed as stored. Vectorised; the
    one place where floating-point arithmetic happens, shared by both engines (``raw``:
    :data:`RawParts`)."""
    out: dict[str, pa.Array] = {}
    if isinstance(raw, pa.Table):
        n = raw.num_rows
    else:
        first = next(iter(raw.values()), None)
        n = 0 if first is None else len(first[0]) if isinstance(first, tuple) else len(first)
    for agg in spec.aggregations.features:
        f = agg.function
        if f == "ratio":
            continue
        if f in ("count", "count_distinct"):
            out[agg.name] = _cast(_arrow(_column(raw, f"{agg.name}.{RAW_PARTS[f][0]}")), pa.int64())
            continue
        if f == "approx_count_distinct":
            assert agg.precision is not None
            d, nz, w = (_np(_column(raw, f"{agg.name}.{part}"), np.int64, 0)[0]
                        for part in ("d", "nz", "w"))
            out[agg.name] = pa.array(sketches.hll_estimate(d, nz, w, agg.precision), pa.int64())
            continue
        if f == "approx_percentile":
            assert agg.relative_accuracy is not None
            buckets = _arrow(_column(raw, f"{agg.name}.b"))
            out[agg.name] = sketches.percentile_values(buckets, agg.relative_accuracy,
                                                       listed=isinstance(agg.q, tuple))
            continue
        ft, scale = value_scale(spec, agg)
        if f in _MOMENTS:
            n_, s_, hi, lo = (_np(_column(raw, f"{agg.name}.{p}"), np.int64, 0)[0] for p in MOMENT_PARTS)
            var, null = variance(n_, s_, hi, lo, scale, sample=f.endswith("_sample"))
            out[agg.name] = pa.array(np.sqrt(var) if f.startswith("stddev") else var, pa.float64(), mask=null)
            continue
        if f == "sum" and agg.scale is not None:
            s, _ = _np(_column(raw, f"{agg.name}.s"), np.int64, 0)
            out[agg.name] = pa.array(s.astype(np.float64) / np.float64(10 ** scale), pa.float64())
            continue
        if f == "mean":
            s, _ = _np(_column(raw, f"{agg.name}.s"), np.int64, 0)
            c, _ = _np(_column(raw, f"{agg.name}.n"), np.int64, 0)
            empty = c == 0  # null; divided nowhere (no errstate: it costs more than a one-row read)
            mean = np.divide(s.astype(np.float64), c.astype(np.float64), out=np.zeros(len(c)), where=~empty)
            if scale:
                mean = mean / np.float64(10 ** scale)
            out[agg.name] = pa.array(mean, pa.float64(), mask=empty)
            continue
        col = _column(raw, f"{agg.name}.{RAW_PARTS[f][0]}")
        target = spec.output_type(agg)
        if f == "last_k":  # the field's own type (float64 -> float32 and int64 -> int32 are exact here)
            out[agg.name] = _cast(_arrow(col), target)
            continue
        if ft.kind is TypeKind.DECIMAL:
            v, valid = _np(col, np.int64, 0)
            if f == "sum":
                valid = np.ones(n, dtype=np.bool_)
            precision = 38 if f == "sum" else int(ft.precision or 38)
            out[agg.name] = _decimal_from_scaled(v, valid, scale, precision)
        elif f == "sum":
            out[agg.name] = pc.fill_null(_arrow(col), 0).cast(pa.int64())
        else:
            out[agg.name] = _cast(_arrow(col), target)
    for agg in spec.aggregations.features:
        if agg.function != "ratio":
            continue
        assert agg.numerator is not None and agg.denominator is not None
        num, num_ok = _np(out[agg.numerator].cast(pa.float64()), np.float64, 0.0)
        den, den_ok = _np(out[agg.denominator].cast(pa.float64()), np.float64, 0.0)
        zero = ~den_ok | (den == 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(zero, np.float64(agg.on_zero or 0.0), num / np.where(zero, 1.0, den))
        out[agg.name] = pa.array(ratio, pa.float64(), mask=~num_ok & ~zero)
    return {a.name: out[a.name] for a in spec.aggregations.features}


__all__ = [
    "LATE_RULE",
    "RAW_PARTS",
    "AggSpec",
    "Computed",
    "Inputs",
    "RawParts",
    "compute",
    "extract",
    "finalize",
    "raw_schema",
    "window_raw",
]
