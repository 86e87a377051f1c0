"""Stable hashing of strings: FNV-1a 64 over UTF-8 bytes, vectorised with NumPy.

``hash_bucket(n)`` must give the same bucket for the same string in every run,
process and machine (and in any other language), so it cannot use Python's salted
``hash`` nor an Arrow kernel whose output is not specified. The spec, complete enough
to reimplement elsewhere::

    h = 0xcbf29ce484222325                   # FNV-1a 64 offset basis
    for each byte b of the UTF-8 encoding of the string (no normalisation):
        h = h XOR b
        h = (h * 0x100000001b3) mod 2**64    # FNV 64-bit prime
    bucket = h mod n                         # h read as an unsigned 64-bit integer

Known values: ``""`` -> ``0xcbf29ce484222325``, ``"a"`` -> ``0xaf63dc4c8601ec8c``,
``"foobar"`` -> ``0x85944171f73967e8`` (the published FNV test vectors).

The loop runs over byte *positions*, not rows: rows are ordered by length, so at
position ``j`` one NumPy operation updates every row longer than ``j``. The cost is
``max_length`` NumPy passes over a shrinking prefix, about ``sum(lengths)`` byte
updates in all, fetched 8 bytes at a time. Repeated values (categoricals) are hashed
once: the column is dictionary-encoded first and only its distinct values are hashed;
a column whose sample rows are mostly distinct (ids) is hashed row by row instead, as
encoding it would cost more than the hashing it saves.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

FNV_OFFSET_BASIS: Final = 0xCBF29CE484222325
FNV_PRIME: Final = 0x100000001B3

U64Array = npt.NDArray[np.uint64]


I64Array = npt.NDArray[np.int64]


def _string_buffers(arr: pa.Array) -> tuple[I64Array, I64Array, npt.NDArray[np.uint8]]:
    """(starts, lengths, data) of a string/large_string array, honouring its slice offset."""
    offset_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    buffers = arr.buffers()
    raw = np.frombuffer(buffers[1], dtype=offset_type)[arr.offset: arr.offset + len(arr) + 1]
    offsets: I64Array = raw.astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets[:-1], np.diff(offsets), data


#: rows hashed together, so that their running hashes stay in the CPU's cache
_BLOCK: Final = 16_384


def _fnv_sorted(h: U64Array, starts: I64Array, lengths: I64Array, words: npt.NDArray[np.uint64]) -> None:
    """FNV-1a 64 of rows sorted by length (descending), into ``h`` (the offset basis).

    ``words[i]`` are the 8 bytes of the data from byte ``i`` on (an unaligned view): one
    gather fetches 8 bytes of every row longer than ``j``, then byte ``j + b`` of the
    rows longer than ``j + b`` is folded in with two NumPy passes over a prefix."""
    max_len = int(lengths[0])
    # active[j]: how many rows are longer than j (a prefix, lengths being sorted descending)
    active = np.searchsorted(-lengths, -np.arange(max_len + 1), side="left")
    prime = np.uint64(FNV_PRIME)
    for j in range(0, max_len, 8):
        k = int(active[j])
        chunk = words[starts[:k] + j].view(np.uint8).reshape(k, 8)  # little-endian: byte b at [:, b]
        for b in range(min(8, max_len - j)):
            head = h[:int(active[j + b])]
            np.bitwise_xor(head, chunk[:len(head), b], out=head)
            np.multiply(head, prime, out=head)  # uint64 arrays wrap modulo 2**64 without warning


def fnv1a64_distinct(arr: pa.Array) -> U64Array:
    """FNV-1a 64 of every value of a ``string``/``large_string`` array (nulls hash as "").

    One entry per row, in row order; every row is hashed (the caller passes distinct
    values when it has them). No per-row Python: see the module docstring.
    """
    n = len(arr)
    h = np.full(n, FNV_OFFSET_BASIS, dtype=np.uint64)
    if n == 0:
        return h
    starts, lengths, data = _string_buffers(arr)
    if arr.null_count:
        lengths = np.where(np.asarray(arr.is_null()), 0, lengths)
    max_len = int(lengths.max())
    if max_len == 0:
        return h
    lo = int(starts.min())
    # the bytes in use, then 8 zero bytes, so that every word read stays inside
    padded = np.zeros(int((starts + lengths).max()) - lo + 8, dtype=np.uint8)
    padded[:len(padded) - 8] = data[lo:lo + len(padded) - 8]
    words: npt.NDArray[np.uint64] = np.ndarray((len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    if int(lengths.min()) == max_len:
        order = None  # one length (ids, codes): no sort
        sorted_starts, sorted_lengths = starts - lo, lengths
    else:
        # a stable radix sort when the lengths fit 16 bits
        key = (max_len - lengths).astype(np.uint16 if max_len < 2**16 else np.int64)
        order = np.argsort(key, kind="stable")
        sorted_starts, sorted_lengths = starts[order] - lo, lengths[order]
    hs = h if order is None else np.full(n, FNV_OFFSET_BASIS, dtype=np.uint64)
    for at in range(0, n, _BLOCK):
        block = slice(at, at + _BLOCK)
        if sorted_lengths[at] > 0:
            _fnv_sorted(hs[block], sorted_starts[block], sorted_lengths[block], words)
    if order is not None:
        h[order] = hs
    return h


def _encode(values: pa.Array | pa.ChunkedArray) -> pa.DictionaryArray:
    """``values`` dictionary-encoded (unchanged if it already is). TypeError for non-strings."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        encoded = values
    elif pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        encoded = pc.dictionary_encode(values)
    else:
        raise TypeError(f"fnv1a64 needs strings, got {values.type}")
    if pa.types.is_dictionary(encoded.dictionary.type):  # pragma: no cover - not produced by Arrow
        raise TypeError("nested dictionary arrays are not supported")
    return encoded


def _gather(
    encoded: pa.DictionaryArray, per_value: npt.NDArray[Any], null_value: np.generic,
) -> npt.NDArray[Any]:
    """``per_value[index]`` for each row of ``encoded``; ``null_value`` for null rows."""
    table = np.append(per_value, null_value)  # the extra last entry stands for null rows
    indices = encoded.indices
    if indices.null_count:
        indices = indices.fill_null(len(per_value))
    gathered: npt.NDArray[Any] = table[indices.to_numpy(zero_copy_only=False)]
    return gathered


def fnv1a64(values: pa.Array | pa.ChunkedArray) -> U64Array:
    """FNV-1a 64 (module docstring) of each value of a string column, in row order.

    Accepts ``string``, ``large_string`` and dictionary-encoded strings. Nulls hash as
    the empty string; callers mask them. Distinct values are hashed once.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if _mostly_distinct(values):
        return fnv1a64_distinct(values)  # ids: encoding would cost more than it saves
    encoded = _encode(values)
    return _gather(encoded, fnv1a64_distinct(encoded.dictionary), np.uint64(FNV_OFFSET_BASIS))


#: rows looked at to tell an id-like column from a categorical one
_SAMPLE: Final = 512


def _mostly_distinct(values: pa.Array) -> bool:
    """Whether a plain string column looks mostly distinct (ids): then hashing every row
    costs less than dictionary-encoding it first. Judged on evenly spaced sample rows;
    either way the hashes are the same, only the time differs."""
    n = len(values)
    if n < 4 * _SAMPLE or not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return False
    sample = values.take(pa.array(np.linspace(0, n - 1, _SAMPLE).astype(np.int64)))
    distinct = pc.count_distinct(sample, mode="all").as_py()
    return bool(distinct > _SAMPLE // 2)


def hash_buckets(values: pa.Array | pa.ChunkedArray, n: int) -> npt.NDArray[np.signedinteger[Any]]:
    """``fnv1a64(value) mod n`` for each row, in ``[0, n)``: int32 when ``n <= 2**31``,
    else int64; nulls hash as "" (callers mask them). Distinct values are hashed and
    reduced once, then gathered. Raises ValueError when ``n`` is not in ``[1, 2**53]``."""
    if not 1 <= n <= 2**53:
        raise ValueError(f"hash_bucket n must be in [1, 2**53], got {n}")
    dtype = np.int32 if n <= 2**31 else np.int64
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if _mostly_distinct(values):
        return np.remainder(fnv1a64_distinct(values), np.uint64(n)).astype(dtype)
    encoded = _encode(values)
    buckets = np.remainder(fnv1a64_distinct(encoded.dictionary), np.uint64(n)).astype(dtype)
    return _gather(encoded, buckets, dtype(FNV_OFFSET_BASIS % n))


def fnv1a64_reference(text: str) -> int:
    """The spec written as a plain loop (for tests and other languages to compare)."""
    h = FNV_OFFSET_BASIS
    for b in text.encode("utf-8"):
        h ^= b
        h = (h * FNV_PRIME) % 2**64
    return h


__all__ = ["FNV_OFFSET_BASIS", "FNV_PRIME", "fnv1a64", "fnv1a64_reference", "hash_buckets"]
