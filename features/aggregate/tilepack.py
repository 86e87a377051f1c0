"""The binary layout of request-time window tiles (``features.aggregate.tiles``): how a
tile's summary and its events are packed into Redis hash values, and unpacked with one
``numpy.frombuffer`` each (no text parsing on the read path).

Both are little-endian, described by a :class:`Layout` made once per tile spec:

- a **summary** (one tile's raw parts): the ``W`` fixed parts (every part but
  ``last_k``'s list and ``count_distinct``'s distinct values) as 8-byte numbers (int64,
  or float64 for a float field's min/max/first/last), then ``W`` validity bytes (1: a
  value, 0: null), then the variable parts as text (``last_k``'s values joined by
  ``\\x1d``, ``count_distinct``'s escaped distinct texts joined by ``\\x1d``; parts joined
  by ``\\x1f``; absent when there is none). Between the validity bytes and the text,
  each sketch's state (``approx_count_distinct``, ``approx_percentile``:
  :mod:`features.aggregate.sketch_tiles`) as a uint32 byte length and its bytes. The
  summaries of an entity's kept tiles are one value (:func:`pack_summary_set`: the
  count, the starts, the lengths, the summaries), whose fixed blocks are one
  ``(tiles, W)`` int64 matrix;
- the **events** of a tile, sorted as the engine sorts them (time, then digest: the
  newer of two events at one instant last): one ``R``-byte header row (the event count
  in its first 8 bytes), then one ``R``-byte row per event (row-major, so the rows of all
  tiles are one matrix sliced per tile when written): the time after the tile's start
  (int64), one 8-byte value per distinct numeric field read (the field's int64 /
  unscaled decimal / float64 value, 0 for null; for ``approx_count_distinct``, per field
  it reads, the value's 64-bit sketch hash), one byte per distinct contribution mask
  (``of`` not null and ``where`` matched; an aggregation that counts every event has
  none); then, when ``count_distinct`` is held, per distinct field read its events'
  escaped texts joined by ``\\x1d`` (``\\x1f`` between fields). A read takes strided
  NumPy views of the columns without copying and binary-searches the times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate.engine import AggSpec

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
FIELD_SEP, ITEM_SEP = "\x1f", "\x1d"
#: the layout's version: part of the tiles' signature (a hash in an older layout is rewritten);
#: 4: every kept tile's summary in one field (:func:`pack_summary_set`), no field per summary
VERSION = 4
#: the tiles hash's field holding every kept tile's summary (:func:`pack_summary_set`)
SUMMARIES_FIELD = "s"
#: summary parts that hold a sketch's binary state (features.aggregate.sketch_tiles)
SKETCH_SUFFIXES = (".hll", ".pct")


@dataclass(frozen=True)
class Layout:
    """Where each part and each event column sits (see the module docstring)."""

    fixed: tuple[str, ...]             # summary parts held as 8-byte numbers, in order
    floats: tuple[bool, ...]           # per fixed part: float64 (else int64)
    variable: tuple[str, ...]          # list / set parts, as text after the numbers
    values: tuple[str, ...]            # per 8-byte event value column: the aggregation it comes from
    value_floats: tuple[bool, ...]
    masks: tuple[str, ...]             # per event mask column: the aggregation it comes from
    keys: tuple[str, ...]              # per key text column: the count_distinct it comes from
    value_of: dict[str, int]           # aggregation -> its value column
    mask_of: dict[str, int]            # aggregation -> its mask column (-1: every event counts)
    key_of: dict[str, int]             # count_distinct -> its key column
    sketches: tuple[str, ...] = ()     # sketch state parts (binary), after the validity bytes
    hashed: tuple[str, ...] = ()       # value columns (by owner) holding approx_count_distinct's hashes

    @property
    def fixed_bytes(self) -> int:
        return 9 * len(self.fixed)

    @property
    def row_bytes(self) -> int:
        return 8 * (1 + len(self.values)) + len(self.masks)

    @classmethod
    def of(cls, spec: AggSpec, parts: tuple[str, ...], raw: pa.Schema) -> Layout:
        sketches = tuple(p for p in parts if p.endswith(SKETCH_SUFFIXES))
        fixed = tuple(p for p in parts if not p.endswith((".set", *SKETCH_SUFFIXES))
                      and not pa.types.is_list(raw.field(p).type))
        floats = tuple(pa.types.is_floating(raw.field(p).type) for p in fixed)
        variable = tuple(p for p in parts if p not in fixed and p not in sketches)
        values: dict[tuple[Any, ...], str] = {}
        masks: dict[tuple[Any, ...], str] = {}
        keys: dict[tuple[Any, ...], str] = {}
        value_of, mask_of, key_of = {}, {}, {}
        value_floats = []
        for agg in spec.windowed:
            kind = "hash" if agg.function == "approx_count_distinct" else spec.value_kind(agg)
            mkey = (agg.of, repr(agg.where))
            if agg.of is None and not agg.where:
                mask_of[agg.name] = -1
            else:
                mask_of[agg.name] = list(masks).index(mkey) if mkey in masks else len(masks)
                masks.setdefault(mkey, agg.name)
            if kind in ("int", "float", "hash"):
                vkey = (agg.of, kind)
                if vkey not in values:
                    values[vkey] = agg.name
                    value_floats.append(kind == "float")
                value_of[agg.name] = list(values).index(vkey)
            elif kind == "key":
                kkey = (agg.of,)
                key_of[agg.name] = list(keys).index(kkey) if kkey in keys else len(keys)
                keys.setdefault(kkey, agg.name)
        hashed = tuple(name for (_, kind), name in values.items() if kind == "hash")
        return cls(fixed, floats, variable, tuple(values.values()), tuple(value_floats),
                   tuple(masks.values()), tuple(keys.values()), value_of, mask_of, key_of, sketches, hashed)


def _text(arr: pa.Array) -> pa.Array:
    """Numbers or lists of numbers/texts as text (lists joined by ``\\x1d``; null: empty)."""
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        if not pa.types.is_string(arr.type.value_type):
            arr = arr.cast(pa.list_(pa.string()))
        return pc.fill_null(pc.binary_join(arr, ITEM_SEP), "")
    return pc.fill_null(pc.cast(arr, pa.string()), "")


def _join(fixed: U8, tails: list[pa.Array], sections: list[pa.Array] | None = None) -> pa.Array:
    """One binary value per row of ``fixed`` (bytes), followed by the ``sections``
    (binary: each as its uint32 length and its bytes), then the ``tails`` (texts, joined
    by ``\\x1f``)."""
    n, w = fixed.shape
    block = pa.FixedSizeBinaryArray.from_buffers(pa.binary(w), n, [None, pa.py_buffer(fixed.tobytes())]) \
        if w else pa.array([b""] * n, pa.binary())
    out = block.cast(pa.large_binary())
    empty = pa.scalar(b"", pa.large_binary())
    for sec in sections or []:
        sec = sec.cast(pa.large_binary())
        lengths = np.diff(np.frombuffer(sec.buffers()[1], np.int64, len(sec) + 1, sec.offset * 8))
        size = pa.FixedSizeBinaryArray.from_buffers(pa.binary(4), n, [
            None, pa.py_buffer(np.ascontiguousarray(lengths, "<u4").tobytes())])
        out = pc.binary_join_element_wise(out, size.cast(pa.large_binary()), sec, empty)
    if not tails:
        return out
    tail = tails[0] if len(tails) == 1 else pc.binary_join_element_wise(*tails, FIELD_SEP)
    return pc.binary_join_element_wise(out, tail.cast(pa.large_binary()), pa.scalar(b"", pa.large_binary()))


def _le_bytes(col: npt.NDArray[Any], dtype: str) -> U8:
    return np.ascontiguousarray(col, dtype=dtype).view(np.uint8).reshape(len(col), 8)


def pack_summaries(layout: Layout, table: pa.Table) -> pa.Array:
    """The summary of each row of ``table`` (one row per tile: the raw parts of
    :func:`features.aggregate.tiles.group_raw`)."""
    n = table.num_rows
    cols: list[U8] = []
    valid: list[U8] = []
    for part, is_float in zip(layout.fixed, layout.floats, strict=True):
        col = table.column(part).combine_chunks()
        valid.append(np.asarray(col.is_valid(), dtype=np.uint8).reshape(n, 1))
        filled = np.asarray(pc.fill_null(col, 0.0 if is_float else 0).to_numpy(zero_copy_only=False))
        cols.append(_le_bytes(filled, "<f8" if is_float else "<i8"))
    fixed = np.concatenate([*cols, *valid], axis=1) if cols else np.zeros((n, 0), np.uint8)
    return _join(fixed, [_text(table.column(p).combine_chunks()) for p in layout.variable],
                 [table.column(p).combine_chunks() for p in layout.sketches])


def pack_events(layout: Layout, offsets: I64, dt_us: I64, contrib: dict[str, npt.NDArray[np.bool_]],
                values: dict[str, Any], key_texts: dict[str, pa.Array]) -> pa.Array:
    """The events of each tile: tile ``i`` holds the events ``offsets[i]:offsets[i + 1]``
    (sorted), ``dt_us`` their times after their tile's start, ``contrib``/``values`` the
    engine's inputs per aggregation, ``key_texts`` per count_distinct its escaped texts."""
    n = len(dt_us)
    tiles = len(offsets) - 1
    cols = [_le_bytes(dt_us, "<i8")]
    for name, is_float in zip(layout.values, layout.value_floats, strict=True):
        cols.append(_le_bytes(values[name], "<f8" if is_float else "<i8"))
    cols += [np.asarray(contrib[name], dtype=np.uint8).reshape(n, 1) for name in layout.masks]
    rows = np.concatenate(cols, axis=1)
    counts = np.diff(offsets)
    head = np.zeros((tiles, layout.row_bytes), np.uint8)
    head[:, :8] = _le_bytes(counts, "<i8")
    rows = np.insert(rows, offsets[:-1], head, axis=0)
    width = (counts + 1) * layout.row_bytes
    starts = np.r_[0, np.cumsum(width)].astype(np.int64)
    out = pa.Array.from_buffers(pa.large_binary(), tiles, [None, pa.py_buffer(starts.tobytes()),
                                                           pa.py_buffer(rows.tobytes())])
    if not layout.keys:
        return out
    tails = []
    for name in layout.keys:
        texts = pc.fill_null(key_texts[name], "")
        lists = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), texts)
        tails.append(pc.binary_join(lists, ITEM_SEP))
    tail = tails[0] if len(tails) == 1 else pc.binary_join_element_wise(*tails, FIELD_SEP)
    return pc.binary_join_element_wise(out, tail.cast(pa.large_binary()), pa.scalar(b"", pa.large_binary()))


@dataclass
class Summaries:
    """Summaries unpacked: the fixed parts of every tile as one matrix."""

    ints: I64                       # (tiles, W) the 8-byte parts as int64 (a float part: its bits)
    valid: npt.NDArray[np.bool_]    # (tiles, W)
    tails: list[bytes]              # per tile, the variable parts' text (empty without any)


def unpack_summaries(layout: Layout, blobs: list[bytes]) -> Summaries:
    """The summaries ``blobs``, one ``frombuffer``."""
    w, f = len(layout.fixed), layout.fixed_bytes
    if layout.variable or layout.sketches:
        fixed = b"".join(b[:f] for b in blobs)
        tails = [b[f:] for b in blobs]
    else:
        fixed, tails = b"".join(blobs), []
    block = np.frombuffer(fixed, np.uint8).reshape(len(blobs), f)
    ints = block[:, :8 * w].copy().view("<i8").astype(np.int64, copy=False)
    return Summaries(ints, block[:, 8 * w:] != 0, tails)


def pack_summary_set(starts: list[int], blobs: list[bytes]) -> bytes:
    """Tile summaries ``blobs`` (of the tiles starting at ``starts``) as the one value of the
    tiles hash's :data:`SUMMARIES_FIELD`, ascending by start: the count (uint32), the
    starts (int64 each), the summaries' byte lengths (uint32 each), then the summaries.
    The write script (``features.sinks.redis_tiles.TILES_WRITE``) makes the same bytes
    in Lua; this twin is what the tests compare it with. Empty: ``b""``."""
    if not starts:
        return b""
    order = sorted(range(len(starts)), key=starts.__getitem__)
    n = len(order)
    head = np.asarray([starts[i] for i in order], "<i8").tobytes()
    lens = np.asarray([len(blobs[i]) for i in order], "<u4").tobytes()
    return n.to_bytes(4, "little") + head + lens + b"".join(blobs[i] for i in order)


def unpack_summary_set(layout: Layout, packed: bytes | None) -> tuple[I64, Summaries]:
    """The value of :data:`SUMMARIES_FIELD` (None or empty: no tile) as the tiles' starts
    (ascending) and their summaries. A layout without variable parts or sketches (every
    summary its ``W`` numbers and validity bytes) is read as strided views of ``packed``,
    without a copy or a loop over tiles."""
    w, f = len(layout.fixed), layout.fixed_bytes
    if not packed:
        return np.zeros(0, np.int64), Summaries(np.zeros((0, w), np.int64), np.zeros((0, w), np.bool_), [])
    n = int.from_bytes(packed[:4], "little")
    starts = np.frombuffer(packed, "<i8", n, 4).astype(np.int64)
    body = 4 + 12 * n
    if not (layout.variable or layout.sketches):
        ints: I64 = np.ndarray((n, w), "<i8", buffer=packed, offset=body, strides=(f, 8))
        valid = np.ndarray((n, w), np.uint8, buffer=packed, offset=body + 8 * w, strides=(f, 1)) != 0
        return starts, Summaries(ints, valid, [])
    return starts, unpack_summaries(layout, summary_blobs(packed)[1])


def summary_blobs(packed: bytes | None) -> tuple[list[int], list[bytes]]:
    """The value of :data:`SUMMARIES_FIELD` as its tiles' starts and each tile's summary
    (:func:`pack_summary_set`'s inputs, ascending)."""
    if not packed:
        return [], []
    n = int.from_bytes(packed[:4], "little")
    body = 4 + 12 * n
    ends = (body + np.cumsum(np.frombuffer(packed, "<u4", n, 4 + 8 * n), dtype=np.int64)).tolist()
    starts: list[int] = np.frombuffer(packed, "<i8", n, 4).tolist()
    return starts, [packed[a:b] for a, b in zip([body, *ends[:-1]], ends, strict=True)]


def variable_parts(layout: Layout, tail: bytes) -> dict[str, list[str]]:
    """A summary's variable parts as lists of texts (a ``.set``'s one empty text and an
    empty set are told apart by the caller, from its ``.d``)."""
    if layout.sketches:
        tail = sketch_parts(layout, tail)[1]
    texts = tail.decode().split(FIELD_SEP)
    return {p: t.split(ITEM_SEP) if t else [] for p, t in zip(layout.variable, texts, strict=True)}


def sketch_parts(layout: Layout, tail: bytes) -> tuple[dict[str, bytes], bytes]:
    """A summary's sketch states (each part's packed bytes) and the rest of its tail
    (the variable parts' text)."""
    out: dict[str, bytes] = {}
    at = 0
    for part in layout.sketches:
        size = int.from_bytes(tail[at:at + 4], "little")
        out[part] = tail[at + 4:at + 4 + size]
        at += 4 + size
    return out, tail[at:]


@dataclass
class Events:
    """One tile's events unpacked: NumPy views into its packed value (no copy)."""

    time_us: I64                          # absolute times, sorted
    values: list[npt.NDArray[Any]]        # per value column
    masks: list[npt.NDArray[np.bool_]]    # per mask column
    keys: list[list[str]]                 # per key column: its texts


def unpack_events(layout: Layout, start_us: int, blob: bytes) -> Events:
    r = layout.row_bytes
    n = int(np.frombuffer(blob, "<i8", 1)[0])

    def col(offset: int, dtype: str) -> npt.NDArray[Any]:
        return np.ndarray((n,), dtype=dtype, buffer=blob, offset=r + offset, strides=(r,))

    t = col(0, "<i8").astype(np.int64) + start_us
    values = [col(8 * (1 + i), "<f8" if fl else "<i8") for i, fl in enumerate(layout.value_floats)]
    base = 8 * (1 + len(layout.values))
    masks = [col(base + i, "u1").view(np.bool_) for i in range(len(layout.masks))]
    keys: list[list[str]] = []
    if layout.keys:
        texts = blob[(n + 1) * r:].decode().split(FIELD_SEP)
        keys = [t.split(ITEM_SEP) for t in texts]
    return Events(t, values, masks, keys)


__all__ = ["SKETCH_SUFFIXES", "SUMMARIES_FIELD", "VERSION", "Events", "Layout", "Summaries", "pack_events",
           "pack_summaries", "pack_summary_set", "sketch_parts", "summary_blobs", "unpack_events",
           "unpack_summaries", "unpack_summary_set", "variable_parts"]
