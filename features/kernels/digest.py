"""The content digest of an event: what tells two events of one (entity, event time) apart.

Two *different* events of one entity at one event time are both real (issue 48). Every
stored event carries a digest of its content, ``_digest``; the history table is keyed by
(entity, event time, digest), so every distinct event is kept and an exact copy (same
content, same digest) is one event. Among events at one instant, **the newest is the one
with the greatest digest** (Redis newest-wins, the SDK's fallback): a function of the
set of events, never of the order they arrived in.

Definition (version 1; ``docs/schema.md`` "Events at one instant" states it too). The
content is every field the schema declares (its input, after validation and defaults:
not the derived features, not the lineage), by field name in the order of the names'
UTF-8 bytes. Each value becomes an unsigned 64-bit word ``v``:

- null (a list element): the constant ``0x6e756c6c00000000``;
- ``bool``: 0 or 1; integers: the value (two's complement); ``float32``/``float64``: the
  IEEE 754 bits of the value as a float64 (``-0.0`` as ``0.0``);
- ``decimal(p, s)``: ``mix(low 64 bits) XOR mix(high 64 bits + 1)`` of the unscaled
  128-bit integer;
- ``date``: days since 1970-01-01; ``timestamp``: the count of its declared unit since
  the epoch (UTC);
- ``string``/``enum``: FNV-1a 64 of its UTF-8 bytes (:mod:`features.kernels.hashing`);
- ``list``: ``mix(S XOR length)`` where ``S`` is the sum (mod 2**64) over its elements
  at positions ``i = 0, 1, ...`` of ``mix(v_i + (i + 1) * 0x9e3779b97f4a7c15)``.

Then ``h = 0``, and for each field whose value is neither null nor the field's declared
default ``h = mix(h XOR fnv1a64(name) XOR v)`` (a field added later, null or defaulted
in the events stored before, changes no digest; so does widening an integer or float
type; changing a decimal's scale does), where
``mix`` is the SplitMix64 finaliser (``z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31``, all mod 2**64). The digest is
``h`` as 16 lower-case hex digits (so text order is numeric order: Postgres compares it
``COLLATE "C"``, Redis's Lua byte by byte).

Everything is NumPy over whole columns: no Python loop over rows (strings are hashed
once per distinct value, or row by row 8 bytes at a time when they are mostly distinct,
:mod:`features.kernels.hashing`; mixing runs in cache-sized blocks, in place). The values
are frozen: ``tests/unit/test_digest_golden.py`` holds those of the first implementation.
Two distinct events of one (entity, event time) share a digest with probability about
2**-64.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.kernels.hashing import fnv1a64
from features.lineage import DIGEST
from features.schema.model import Schema

#: Hex digits of a digest.
DIGEST_CHARS: Final = 16

U64 = npt.NDArray[np.uint64]

_NULL: Final = np.uint64(0x6E756C6C00000000)
_GOLDEN: Final = np.uint64(0x9E3779B97F4A7C15)
_M1: Final = np.uint64(0xBF58476D1CE4E5B9)
_M2: Final = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
#: rows mixed together (32 KiB of words per pass)
_BLOCK: Final = 4096
#: each byte's two lower-case hex digits, as one little-endian uint16 (its text in memory)
_HEX2: Final = np.frombuffer(b"".join(f"{b:02x}".encode() for b in range(256)), dtype="<u2")


def mix(z: U64) -> U64:
    """The SplitMix64 finaliser of every word (a new array; uint64 arithmetic wraps)."""
    out: U64 = z.astype(np.uint64, copy=True)
    _mix_in_place(out, np.empty_like(out))
    return out


def _mix_in_place(z: U64, scratch: U64) -> None:
    """:func:`mix` of ``z`` in ``z`` itself (``scratch``: a buffer of its size), a block
    of rows at a time so that the eight passes stay in the CPU's cache."""
    for at in range(0, len(z), _BLOCK):
        block, tmp = z[at:at + _BLOCK], scratch[at:at + _BLOCK]
        for shift, factor in ((_S30, _M1), (_S27, _M2)):
            np.right_shift(block, shift, out=tmp)
            np.bitwise_xor(block, tmp, out=block)
            np.multiply(block, factor, out=block)
        np.right_shift(block, _S31, out=tmp)
        np.bitwise_xor(block, tmp, out=block)


def _words(values: npt.NDArray[Any]) -> U64:
    """int64/uint64-compatible values reinterpreted as uint64 words."""
    out: U64 = np.ascontiguousarray(values.astype(np.int64, copy=False)).view(np.uint64)
    return out


def _numpy(arr: pa.Array, fill: Any) -> npt.NDArray[Any]:
    return np.asarray(pc.fill_null(arr, fill).to_numpy(zero_copy_only=False))


def value_words(arr: pa.Array | pa.ChunkedArray) -> U64:
    """One column's values as 64-bit words, one per row (see the module docstring)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    n = len(arr)
    if pa.types.is_dictionary(t):
        value_type = t.value_type
        if not (pa.types.is_string(value_type) or pa.types.is_large_string(value_type)):
            return value_words(arr.cast(value_type))
    elif pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return value_words(arr.cast(pa.list_(t.value_type)))
    if pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        words = fnv1a64(arr)
    elif pa.types.is_boolean(t):
        words = _numpy(arr, False).astype(np.uint64)
    elif pa.types.is_integer(t):
        words = _words(_numpy(arr.cast(pa.int64()), 0))
    elif pa.types.is_floating(t):
        f = _numpy(arr.cast(pa.float64()), 0.0).astype(np.float64) + 0.0  # -0.0 + 0.0 is 0.0
        words = np.ascontiguousarray(f).view(np.uint64).copy()
    elif pa.types.is_decimal(t):
        words = _decimal_words(_decimal_halves(arr))
    elif pa.types.is_date32(t):
        words = _words(_numpy(arr.cast(pa.int32()), 0))
    elif pa.types.is_date64(t):
        words = _words(_numpy(arr.cast(pa.int64()), 0) // 86_400_000)
    elif pa.types.is_timestamp(t):
        words = _words(_numpy(arr.cast(pa.int64()), 0))
    elif pa.types.is_list(t):
        words = _list_words(arr)
    else:
        raise TypeError(f"no content digest for Arrow type {t}")
    if arr.null_count:
        words = np.where(np.asarray(arr.is_null()), _NULL, words)
    assert len(words) == n
    return words


def _decimal_halves(arr: pa.Array) -> U64:
    """A decimal128 column's unscaled values as (n, 2) uint64 words (low, high); nulls 0."""
    arr = arr.cast(pa.decimal128(38, arr.type.scale)) if not isinstance(arr.type, pa.Decimal128Type) else arr
    data = arr.buffers()[1]
    assert data is not None
    words = np.frombuffer(data, dtype="<u8")[2 * arr.offset: 2 * (arr.offset + len(arr))]
    halves: U64 = words.reshape(-1, 2).astype(np.uint64)
    if arr.null_count:
        halves[np.asarray(arr.is_null())] = 0
    return halves


def _decimal_words(halves: U64) -> U64:
    """``mix(low) XOR mix(high + 1)`` of (n, 2) decimal words. When every high word is
    the low word's sign (precision up to 18, the common case), ``high + 1`` is 1 or 0 and
    its mix one of two constants (``mix(0) == 0``): one mix per row instead of two."""
    low, high = halves[:, 0], halves[:, 1]
    sign = (low.view(np.int64) >> np.int64(63)).view(np.uint64)
    words = mix(low)
    if np.array_equal(high, sign):
        words[sign == 0] ^= mix(np.ones(1, np.uint64))[0]
        return words
    words ^= mix(high + np.uint64(1))
    return words


def _list_words(arr: pa.ListArray) -> U64:
    lengths = _numpy(pc.list_value_length(arr), 0).astype(np.int64)
    lengths[np.asarray(arr.is_null())] = 0  # flatten() skips a null row's child slots
    elements = value_words(arr.flatten())
    n = len(arr)
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    position = (np.arange(len(elements), dtype=np.int64) - starts[row] + 1).astype(np.uint64)
    mixed = mix(elements + position * _GOLDEN)
    total = np.zeros(n, dtype=np.uint64)
    np.add.at(total, row, mixed)  # uint64: wraps modulo 2**64
    return mix(total ^ lengths.astype(np.uint64))


def digest_fields(names: list[str] | tuple[str, ...]) -> list[str]:
    """The content fields in digest order: by the UTF-8 bytes of their names."""
    return sorted(names, key=lambda n: n.encode())


def _absent(arr: pa.Array | pa.ChunkedArray, default: Any) -> npt.NDArray[np.bool_] | None:
    """Where a value adds nothing to the digest: null, or the field's default (None: nowhere)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    out = np.asarray(arr.is_null()) if arr.null_count else None
    t = arr.type
    if default is None or not (pa.types.is_primitive(t) or pa.types.is_decimal(t) or pa.types.is_string(t)
                               or pa.types.is_large_string(t)):
        return out
    value = _default_scalar(default, t)
    if value is None:
        return out
    same = np.asarray(pc.fill_null(pc.equal(arr, value), False))
    return same if out is None else out | same


def _default_scalar(default: Any, t: pa.DataType) -> pa.Scalar | None:
    """A field's declared default in the column's type: the YAML value itself, else its
    text parsed by Arrow (a default written as a string, ``"5"`` for an int); None when
    neither holds it (the default then counts like any other value)."""
    try:
        return pa.scalar(default, type=t)
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError, ValueError):
        pass
    try:
        return pa.scalar(str(default)).cast(t)
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def digest_words(columns: dict[str, pa.Array | pa.ChunkedArray], num_rows: int,
                 defaults: dict[str, Any] | None = None) -> U64:
    """Every row's digest as a uint64 word, over ``columns`` (field name -> values); a
    null value, or one equal to its field's entry in ``defaults``, is left out (so a field
    added later, null or defaulted in the events stored before, changes no digest)."""
    h = np.zeros(num_rows, dtype=np.uint64)
    scratch = np.empty(num_rows, dtype=np.uint64)
    names = digest_fields(list(columns))
    name_words = fnv1a64(pa.array(names, pa.string())) if names else np.zeros(0, np.uint64)
    for name, word in zip(names, name_words, strict=True):
        arr = columns[name]
        step = np.bitwise_xor(value_words(arr), word)  # a new array: mixed in place below
        np.bitwise_xor(step, h, out=step)
        _mix_in_place(step, scratch)
        absent = _absent(arr, (defaults or {}).get(name))
        if absent is None:
            h = step
        else:
            np.copyto(h, step, where=~absent)
    return h


def hex_digits(words: U64) -> pa.Array:
    """uint64 words as fixed-width lower-case hex strings (big-endian: text order is numeric)."""
    raw = np.ascontiguousarray(words.astype(">u8")).view(np.uint8).reshape(-1, 8)
    chars = np.ascontiguousarray(_HEX2[raw])  # (n, 8) pairs of digits: 16 bytes per row
    n = len(words)
    if DIGEST_CHARS * n < 2**31:  # the string array straight from its buffers
        offsets = np.arange(0, DIGEST_CHARS * (n + 1), DIGEST_CHARS, dtype=np.int32)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(chars)])
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(DIGEST_CHARS), n, [None, pa.py_buffer(chars)])
    return fixed.cast(pa.binary()).cast(pa.string())


def content_digests(columns: dict[str, pa.Array | pa.ChunkedArray], num_rows: int,
                    defaults: dict[str, Any] | None = None) -> pa.Array:
    """The digest (16 hex digits, a string array) of each of ``num_rows`` rows whose
    content fields are ``columns`` (field name -> values; see :func:`digest_words`)."""
    return hex_digits(digest_words(columns, num_rows, defaults))


def digests(rows: pa.Table | pa.RecordBatch, schema: Schema) -> pa.Array:
    """The digest (16 hex digits, a string array) of every row of ``rows`` (the valid
    rows of ``schema``: a column per declared field, in its declared type)."""
    missing = [f.name for f in schema.fields if f.name not in rows.column_names]
    if missing:
        raise ValueError(f"digest: rows lack the content fields {missing}")
    return content_digests({f.name: rows.column(f.name) for f in schema.fields}, rows.num_rows,
                           field_defaults(schema))


def field_defaults(schema: Schema) -> dict[str, Any]:
    """Each declared field's default value, for the fields that declare a non-null one."""
    return {f.name: f.constraints.default for f in schema.fields
            if f.constraints.has_default and f.constraints.default is not None}


__all__ = ["DIGEST", "DIGEST_CHARS", "content_digests", "digest_fields", "digest_words", "digests",
           "field_defaults", "hex_digits", "mix", "value_words"]
