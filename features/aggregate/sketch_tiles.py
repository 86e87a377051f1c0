"""The sketches in the request-time window tiles (issue 49): ``approx_count_distinct``'s
and ``approx_percentile``'s mergeable states (:mod:`features.aggregate.sketches`) as a
tile's summary holds them, packed compactly, and their merge at a read into the raw
parts the engine's :func:`~features.aggregate.engine.finalize` turns into values.

A window at ``T`` is its full tiles' states merged with the states of its edge tiles'
events inside the window (:func:`piece_state`, from the events' 64-bit hashes or values
that the tile's events hold). Merging gives the state of all the window's events, so the
value equals the engine's (``historical(..., windows="request_time")``, the backfill's):

- **approx_count_distinct**: a state is its distinct hashes while it has at most ``2^p /
  8`` of them (the exact-while-small list), else its registers. Merged: the union of the
  lists and the maximum of the registers (a list's registers computed from its hashes);
  the window is exact (``d``) only when no state has registers and the union has at most
  ``2^p / 8`` hashes: a state with registers has more distinct hashes than that alone, so
  the union has too (the engine's switch, whatever the cut into tiles);
- **approx_percentile**: a state is its buckets' keys and counts; merged by adding the
  counts of equal keys; the bucket of rank ``floor(q (n - 1))`` per quantile.

Packed (little-endian), one binary value per tile and sketch (in the summary after its
fixed parts, :mod:`features.aggregate.tilepack`):

- HyperLogLog: one mode byte, then mode 0 (the exact list): the sorted distinct hashes,
  8 bytes each; mode 1 (sparse registers, when fewer than ``2^p / 4`` registers are set):
  one uint32 ``register << 6 | rho`` per set register, ascending; mode 2 (dense): the
  ``2^p`` one-byte registers. So a tile costs ``1 + 8 d`` bytes while exact (at most
  ``2^p`` bytes: ``d <= 2^p / 8``), then at most ``2^p`` bytes;
- percentile: per non-empty bucket an int32 code (``sign * (k + 2^21)``, ``k`` the
  bucket's index; 0 for the zero bucket: codes order as keys do) and an int32 count: 8
  bytes per bucket.

Building is vectorised over every tile of a load (sorts and scatters, no loop per tile);
a read decodes each state it merges (``O(tiles)`` per entity and sketch).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.aggregate.engine import AggSpec
from features.aggregate.sketches import (
    KEY_OFFSET,
    as_float64,
    bucket_keys,
    hash64,
    rank_of,
    registers,
    sparse_max,
)
from features.schema.model import Aggregation, TypeKind

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
U8 = npt.NDArray[np.uint8]
Mask = npt.NDArray[np.bool_]

#: the functions whose tiles hold a sketch state
SKETCH_FUNCTIONS: Final = ("approx_count_distinct", "approx_percentile")
#: a percentile bucket's code: ``sign * (k + CODE_OFFSET)`` (|k| < 2^20 for every finite
#: double at every accuracy the schema allows: |e| <= 1074, B <= 500)
CODE_OFFSET: Final = 2**21
_EXACT, _SPARSE, _DENSE = 0, 1, 2

#: one decoded state: HyperLogLog ``(hashes, registers)`` (one of them None), or a
#: percentile's ``(keys, counts)``
State = tuple[Any, Any]


def state_part(agg: Aggregation) -> str:
    """The summary part holding ``agg``'s state: ``<name>.hll`` or ``<name>.pct``."""
    return f"{agg.name}.hll" if agg.function == "approx_count_distinct" else f"{agg.name}.pct"


def is_sketch(agg: Aggregation) -> bool:
    return agg.function in SKETCH_FUNCTIONS


def event_hashes(values: pa.Array | pa.ChunkedArray) -> I64:
    """The 64-bit hash of each value (:func:`~features.aggregate.sketches.hash64`) as the
    int64 an event row holds (a null's: arbitrary, masked out)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    out: I64 = hash64(values).view(np.int64)
    return out


def percentile_input(spec: AggSpec, agg: Aggregation, values: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    """An event column's values (int64 integers or unscaled decimals, float64) as the
    engine's float64 (:func:`~features.aggregate.sketches.as_float64`)."""
    assert agg.of is not None
    ft = spec.schema.field(agg.of).type
    return as_float64(values, int(ft.scale or 0) if ft.kind is TypeKind.DECIMAL else None)


# --------------------------------------------------------------------------- building


def group_states(spec: AggSpec, agg: Aggregation, values: Any, at: I64, groups: I64, ids: I64) -> pa.Array:
    """The packed state of ``agg`` per group ``ids`` (ascending; one value each, in that
    order) over the values ``values[at[i]]`` (the events that count), ``groups[i]`` the
    group of each: ``values`` the engine's input column for ``agg`` (an Arrow array for
    ``approx_count_distinct``, a NumPy array for ``approx_percentile``)."""
    row = np.searchsorted(ids, groups).astype(np.int64)
    if agg.function == "approx_count_distinct":
        assert agg.precision is not None
        h = hash64(values.take(pa.array(at))) if len(at) else np.zeros(0, np.uint64)
        return hll_states(row, h, len(ids), agg.precision)
    assert agg.relative_accuracy is not None
    x = percentile_input(spec, agg, np.asarray(values)[at])
    return percentile_states(row, bucket_keys(x, agg.relative_accuracy), len(ids))


def hll_states(row: I64, h: U64, n: int, p: int) -> pa.Array:
    """The packed HyperLogLog state of each of ``n`` groups from the hashes ``h`` of
    their values (``row``: each value's group)."""
    m = 1 << p
    o = np.lexsort((h, row))
    row, h = row[o], h[o]
    if len(row):
        first = np.r_[True, (row[1:] != row[:-1]) | (h[1:] != h[:-1])]
        row, h = row[first], h[first]
    d = np.bincount(row, minlength=n)
    small = d <= sparse_max(p)
    exact = small[row]
    segments = [(row[exact], np.ascontiguousarray(h[exact], "<u8").view(np.uint8).reshape(-1, 8))]
    r2, h2 = row[~exact], h[~exact]
    reg, rho = registers(h2, p)
    o = np.lexsort((rho, reg, r2))
    r2, reg, rho = r2[o], reg[o], rho[o]
    if len(r2):  # each (group, register): its largest rho (the last one sorted)
        top = np.r_[(r2[1:] != r2[:-1]) | (reg[1:] != reg[:-1]), True]
        r2, reg, rho = r2[top], reg[top], rho[top]
    nz = np.bincount(r2, minlength=n)
    sparse = ~small & (4 * nz < m)
    sp = sparse[r2]
    codes = np.ascontiguousarray((reg[sp] << 6) | rho[sp], "<u4").view(np.uint8).reshape(-1, 4)
    segments.append((r2[sp], codes))
    dense = np.flatnonzero(~small & ~sparse)
    regs = np.zeros((len(dense), m), np.uint8)
    regs[np.searchsorted(dense, r2[~sp]), reg[~sp]] = rho[~sp]
    segments.append((dense.astype(np.int64), regs))
    mode = np.where(small, _EXACT, np.where(sparse, _SPARSE, _DENSE)).astype(np.uint8)
    return _assemble(n, mode, segments)


def percentile_states(row: I64, keys: I64, n: int) -> pa.Array:
    """The packed percentile state of each of ``n`` groups from the bucket ``keys`` of
    their values (``row``: each value's group)."""
    o = np.lexsort((keys, row))
    row, keys = row[o], keys[o]
    if len(row):
        head = np.flatnonzero(np.r_[True, (row[1:] != row[:-1]) | (keys[1:] != keys[:-1])])
        counts = np.diff(np.r_[head, len(row)])
        row, keys = row[head], keys[head]
    else:
        counts = np.zeros(0, np.int64)
    if len(counts) and int(counts.max()) >= 2**31:
        raise OverflowError("approx_percentile: a tile holds 2^31 or more values of one bucket")
    items = np.stack([key_codes(keys), counts]).T.astype("<i4")
    return _assemble(n, None, [(row, np.ascontiguousarray(items).view(np.uint8).reshape(-1, 8))])


def key_codes(keys: I64) -> I64:
    """Bucket keys (``sign * (k + 2^32)``) as their packed codes (``sign * (k + 2^21)``)."""
    out: I64 = np.sign(keys) * (np.abs(keys) - KEY_OFFSET + CODE_OFFSET)
    return out


def code_keys(codes: I64) -> I64:
    """:func:`key_codes` inverted."""
    out: I64 = np.sign(codes) * (np.abs(codes) - CODE_OFFSET + KEY_OFFSET)
    return out


def _assemble(n: int, head: U8 | None, segments: list[tuple[I64, U8]]) -> pa.Array:
    """``n`` binary values: value ``i`` is ``head[i]`` (a byte; none without ``head``)
    followed by the byte rows of the one segment holding rows for ``i``, in order
    (``segments``: (group of each row, ascending; the rows, ``(k, width)`` bytes))."""
    lengths = np.zeros(n, np.int64) + (0 if head is None else 1)
    for rows, items in segments:
        lengths += np.bincount(rows, minlength=n)[:n] * items.shape[1]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buf = np.zeros(int(offsets[-1]), np.uint8)
    base = offsets[:-1].copy()
    if head is not None:
        buf[base] = head
        base += 1
    for rows, items in segments:
        if len(rows) == 0:
            continue
        width = items.shape[1]
        pos = np.arange(len(rows)) - np.searchsorted(rows, rows)
        dest = base[rows] + pos * width
        buf[dest[:, None] + np.arange(width)] = items
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets.tobytes()),
                                                        pa.py_buffer(buf.tobytes())])


# --------------------------------------------------------------------------- reading


def decode(agg: Aggregation, blob: bytes) -> State:
    """A packed state (:func:`group_states`) as ``(hashes, registers)`` (one of them None)
    or ``(keys, counts)``."""
    if agg.function == "approx_count_distinct":
        assert agg.precision is not None
        mode = blob[0] if blob else _EXACT
        if mode == _EXACT:
            return np.frombuffer(blob, "<u8", offset=1).astype(np.uint64), None
        if mode == _DENSE:
            return None, np.frombuffer(blob, np.uint8, offset=1)
        regs = np.zeros(1 << agg.precision, np.uint8)
        codes = np.frombuffer(blob, "<u4", offset=1).astype(np.int64)
        regs[codes >> 6] = codes & 63
        return None, regs
    items = np.frombuffer(blob, "<i4").reshape(-1, 2).astype(np.int64)
    return code_keys(items[:, 0]), items[:, 1]


def piece_state(spec: AggSpec, agg: Aggregation, column: npt.NDArray[Any], mask: Mask) -> State:
    """The state of an edge tile's events in a window: ``column`` their event column for
    ``agg`` (the int64 hashes; the values), ``mask`` which count."""
    if agg.function == "approx_count_distinct":
        return np.unique(np.asarray(column)[mask].view(np.uint64)), None
    assert agg.relative_accuracy is not None
    keys, counts = np.unique(bucket_keys(percentile_input(spec, agg, np.asarray(column)[mask]),
                                         agg.relative_accuracy), return_counts=True)
    return keys.astype(np.int64), counts.astype(np.int64)


def merged_raw(agg: Aggregation, states: list[list[State]]) -> dict[str, Any]:
    """The engine's raw parts of ``agg`` per entity from each entity's ``states`` (its
    window's full tiles and edge pieces): ``d``, ``nz``, ``w`` (approx_count_distinct)
    or ``b`` (approx_percentile), for :func:`~features.aggregate.engine.finalize`."""
    n = len(states)
    every = np.ones(n, np.bool_)
    if agg.function == "approx_count_distinct":
        assert agg.precision is not None
        got = np.asarray([hll_raw(s, agg.precision) for s in states], np.int64).reshape(n, 3)
        return {f"{agg.name}.{part}": (np.ascontiguousarray(got[:, i]), every)
                for i, part in enumerate(("d", "nz", "w"))}
    return {f"{agg.name}.b": pa.array([percentile_keys(s, agg.quantiles) for s in states],
                                      pa.list_(pa.int64()))}


def hll_raw(states: list[State], p: int) -> tuple[int, int, int]:
    """The window's ``(d, nz, w)`` (the engine's raw parts) from its states: ``d`` the
    distinct hashes (any number above ``2^p / 8`` once registers are needed), ``nz``,
    ``w`` from the merged registers (0, 0 while ``d <= 2^p / 8``: not read)."""
    lists = [s[0] for s in states if s[0] is not None]
    regs = [s[1] for s in states if s[1] is not None]
    uniq = np.unique(np.concatenate(lists)) if lists else np.zeros(0, np.uint64)
    if not regs and len(uniq) <= sparse_max(p):
        return len(uniq), 0, 0
    merged = np.zeros(1 << p, np.uint8)
    for r in regs:
        np.maximum(merged, r, out=merged)
    if len(uniq):
        reg, rho = registers(uniq, p)
        np.maximum.at(merged, reg, rho.astype(np.uint8))
    m = merged[merged > 0].astype(np.int64)
    w = int(np.sum(np.left_shift(np.int64(1), 63 - p - m))) if len(m) else 0
    return max(len(uniq), sparse_max(p) + 1), len(m), w


def percentile_keys(states: list[State], qs: tuple[float, ...]) -> list[int] | None:
    """The bucket key of rank ``floor(q (n - 1))`` per quantile of the merged states
    (None: no value)."""
    if not states:
        return None
    keys = np.concatenate([s[0] for s in states])
    counts = np.concatenate([s[1] for s in states])
    uniq, inv = np.unique(keys, return_inverse=True)
    total = np.zeros(len(uniq), np.int64)
    np.add.at(total, inv.reshape(-1), counts)
    n = int(total.sum())
    if n == 0:
        return None
    cum = np.cumsum(total)
    ranks = np.concatenate([rank_of(q, np.array([n], np.int64)) for q in qs])
    out: list[int] = uniq[np.searchsorted(cum, ranks, side="right")].tolist()
    return out


__all__ = ["CODE_OFFSET", "SKETCH_FUNCTIONS", "State", "code_keys", "decode", "event_hashes", "group_states",
           "hll_raw", "hll_states", "is_sketch", "key_codes", "merged_raw", "percentile_input",
           "percentile_keys", "percentile_states", "piece_state", "state_part"]
