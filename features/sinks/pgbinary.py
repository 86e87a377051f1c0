"""Arrow tables as PostgreSQL binary ``COPY`` data, built with Arrow and NumPy kernels.

Postgres parses binary ``COPY`` rows with less work than CSV (no number, date or
timestamp text to read): for the shipped applicant rows the server spends ~9 µs per row
instead of ~13 µs (``bench/RESULTS.md``). The format (PostgreSQL docs, "COPY", *Binary
Format*): a header, then per row an int16 field count and per field an int32 byte length
(``-1`` for NULL) and the value in the type's ``send`` format, big-endian; an int16
``-1`` ends the data.

:func:`copy_binary` encodes a table whose columns it can encode exactly and returns
``None`` otherwise, so the caller uses CSV instead; that keeps every type and value the
CSV path accepts (and every error Postgres raises for the ones it refuses) working:

========================================  ==========================================
Postgres column type                      Arrow column
========================================  ==========================================
``text``, ``character varying``           string, large string, dictionary of strings
``boolean``                               bool
``smallint`` / ``integer`` / ``bigint``   integers whose values fit (checked)
``real``                                  float32
``double precision``                      float32, float64
``numeric``                               decimal128 with precision <= 18
``date``                                  date32, date64
``timestamp with[out] time zone``         timestamp (s, ms, us; with or without zone)
========================================  ==========================================

Zoned timestamps are sent as their UTC instant, naive ones as their wall clock: the
same values the CSV path sends to a session with ``TimeZone=UTC``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.sinks.base import binary_rows, laid_end_to_end

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"  # signature, flags, extension
TRAILER = b"\xff\xff"
_NULL = pa.scalar(b"\xff\xff\xff\xff", pa.binary())
_EMPTY = pa.scalar(b"", pa.binary())
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
_PG_EPOCH_DAYS = 10_957             # 2000-01-01 in Unix days
_INT_TYPES: dict[str, np.dtype[Any]] = {"smallint": np.dtype(">i2"), "integer": np.dtype(">i4"),
                                        "bigint": np.dtype(">i8")}
_ARROW_INT = {"smallint": pa.int16(), "integer": pa.int32(), "bigint": pa.int64()}
_TEXT = ("text", "character varying")
_ROWS_PER_JOIN = 65_536


@dataclass
class _Fixed:
    """A column of fixed-width values without nulls (big-endian NumPy values, one row
    per entry): :func:`copy_binary` lays all of them out in one record per row."""

    values: npt.NDArray[np.generic]

    @property
    def width(self) -> int:
        return int(self.values.dtype.itemsize * np.prod(self.values.shape[1:], dtype=np.int64))


def _fixed(values: npt.NDArray[np.generic], arr: pa.Array) -> _Fixed | list[pa.Array | pa.Scalar]:
    """Fixed-width fields: kept as :class:`_Fixed` when ``arr`` has no nulls, else a
    binary array of the int32 length and the value, or the NULL marker."""
    if not arr.null_count:
        return _Fixed(values)
    n = len(values)
    width = _Fixed(values).width
    rec = np.empty(n, dtype=[("len", ">i4"), ("v", values.dtype, values.shape[1:])])
    valid = np.asarray(arr.is_valid())
    rec["len"] = np.where(valid, width, -1)
    rec["v"] = values
    # Row-major boolean selection keeps the whole record of a value, only the length of a NULL.
    keep = np.ones((n, 4 + width), dtype=bool)
    keep[~valid, 4:] = False
    data = rec.view(np.uint8).reshape(n, 4 + width)[keep]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(valid, 4 + width, 4), out=offsets[1:])
    return [pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])]


def _numbers(arr: pa.Array, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """The values of a primitive array as ``dtype`` (null slots hold zeros)."""
    zero = pa.scalar(False if pa.types.is_boolean(arr.type) else 0, arr.type)
    return np.asarray(pc.fill_null(arr, zero).to_numpy(zero_copy_only=False)).astype(dtype)


def _text(arr: pa.Array) -> list[pa.Array | pa.Scalar]:
    """Text fields as two join inputs: the lengths (``-1`` for NULL) and the bytes.
    A column holding one value (the run's lineage) becomes one constant."""
    data = arr.cast(pa.binary())
    n = len(arr)
    if n > 1 and not arr.null_count and pc.all(pc.equal(data, data[0])).as_py():
        value = data[0].as_py()
        return [pa.scalar(len(value).to_bytes(4, "big") + value, pa.binary())]
    lengths = pc.binary_length(data).to_numpy(zero_copy_only=False)
    if arr.null_count:
        lengths = np.where(np.asarray(arr.is_valid()), lengths, -1)
        data = pc.fill_null(data, _EMPTY)
    return [binary_rows(np.asarray(lengths, dtype=">i4")), data]


def _numeric(arr: pa.Array) -> _Fixed | list[pa.Array | pa.Scalar] | None:
    """decimal128(p <= 18, s) in ``numeric_send`` format: ndigits, weight, sign, dscale and
    base-10000 digits (a fixed count per column; Postgres strips the zero ones)."""
    t = arr.type
    if not pa.types.is_decimal128(t) or t.precision > 18:
        return None
    n, s = len(arr), t.scale
    words = np.frombuffer(arr.buffers()[1], dtype="<i8").reshape(-1, 2)[arr.offset:arr.offset + n, 0]
    unscaled = words.astype(np.int64)       # |value| < 10^18 fits the low word
    a = np.abs(unscaled)
    gi, gf = -(-(t.precision - s) // 4), -(-s // 4)
    pad = 4 * gf - s
    digits = np.empty((n, gi + gf), dtype=np.int64)
    if n and (pad == 0 or int(a.max()) < 10 ** (18 - pad)):
        rest = a * np.int64(10) ** pad      # the fraction padded to whole groups: fits int64
        for j in range(gi + gf - 1, -1, -1):
            rest, digits[:, j] = np.divmod(rest, np.int64(10_000))
    else:
        whole, frac = np.divmod(a, np.int64(10) ** s)
        for j in range(gi):                 # integer part, most significant group first
            digits[:, j] = (whole // np.int64(10_000) ** (gi - 1 - j)) % 10_000
        for j in range(gf):                 # fraction: group j holds digits 4j+1..4j+4 after the point
            shift = s - 4 * (j + 1)
            if shift >= 0:
                digits[:, gi + j] = (frac // np.int64(10) ** shift) % 10_000
            else:
                digits[:, gi + j] = (frac % np.int64(10) ** (s - 4 * j)) * np.int64(10) ** (-shift)
    head = np.empty((n, 4), dtype=">i2")
    head[:, 0] = gi + gf
    head[:, 1] = gi - 1
    head[:, 2] = np.where(unscaled < 0, 0x4000, 0)
    head[:, 3] = s
    values = np.concatenate([head, digits], axis=1).astype(">i2")  # concatenate returns native order
    return _fixed(values, arr)


def _micros(arr: pa.Array) -> npt.NDArray[np.int64] | None:
    """Timestamps as Postgres microseconds since 2000-01-01 (None if any would overflow)."""
    t = arr.type
    us = arr.cast(pa.timestamp("us", t.tz)).cast(pa.int64())
    lo = pc.min(us).as_py()
    if lo is not None and lo < np.iinfo(np.int64).min + _PG_EPOCH_US:
        return None
    return _numbers(us, np.dtype(np.int64)) - _PG_EPOCH_US


def encode_field(arr: pa.Array, pg_type: str) -> _Fixed | list[pa.Array | pa.Scalar] | None:
    """One column's fields (int32 length + value, or the NULL marker) as inputs of a
    binary join (arrays or constants, to be laid end to end), or None when this Arrow
    type cannot go to ``pg_type`` exactly in binary."""
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    try:
        if pg_type in _TEXT:
            return _text(arr) if (pa.types.is_string(t) or pa.types.is_large_string(t)) else None
        if pg_type == "boolean":
            return _fixed(_numbers(arr, np.dtype(np.uint8)), arr) if pa.types.is_boolean(t) else None
        if pg_type in _INT_TYPES:
            if not pa.types.is_integer(t):
                return None
            checked = arr.cast(_ARROW_INT[pg_type])  # safe cast: raises on a value that does not fit
            return _fixed(_numbers(checked, _INT_TYPES[pg_type]), arr)
        if pg_type == "real":
            return _fixed(_numbers(arr, np.dtype(">f4")), arr) if pa.types.is_float32(t) else None
        if pg_type == "double precision":
            ok = pa.types.is_float32(t) or pa.types.is_float64(t)
            return _fixed(_numbers(arr, np.dtype(">f8")), arr) if ok else None
        if pg_type == "numeric":
            return _numeric(arr)
        if pg_type == "date":
            if not pa.types.is_date(t):
                return None
            days = _numbers(arr.cast(pa.date32()).cast(pa.int32()), np.dtype(np.int64)) - _PG_EPOCH_DAYS
            if len(days) and days.min() < np.iinfo(np.int32).min:
                return None
            return _fixed(days.astype(">i4"), arr)
        if pg_type in ("timestamp with time zone", "timestamp without time zone"):
            if not pa.types.is_timestamp(t) or t.unit == "ns":
                return None
            micros = _micros(arr)
            return None if micros is None else _fixed(micros.astype(">i8"), arr)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return None


Encoded = tuple[list[bytes | memoryview], list[int]]


def copy_binary(table: pa.Table, pg_types: Sequence[str]) -> Encoded | None:
    """``table`` as ``COPY ... FROM STDIN (FORMAT binary)`` data for columns of the given
    Postgres types (``pg_attribute.atttypid::regtype`` names, in column order), or None
    when a column cannot be encoded exactly (then send CSV).

    Returns the data (in pieces, to be sent one after the other) and the order in which
    it holds the columns (indices into ``table``), which the ``COPY`` column list must
    follow: fixed-width columns without
    nulls come first, laid out in one NumPy record per row, then columns holding one
    value (the run's lineage) as one constant, then the rest, so the row join has few
    inputs.
    """
    if table.num_columns != len(pg_types) or table.num_columns > 32767:
        return None
    fixed: list[tuple[int, _Fixed]] = []
    constant: list[tuple[int, bytes]] = []
    varying: list[tuple[int, list[pa.Array | pa.Scalar]]] = []
    for i, (col, pg_type) in enumerate(zip(table.columns, pg_types, strict=True)):
        field = encode_field(col.combine_chunks(), pg_type)
        if field is None:
            return None
        if isinstance(field, _Fixed):
            fixed.append((i, field))
        elif len(field) == 1 and isinstance(field[0], pa.Scalar):
            constant.append((i, field[0].as_py()))
        else:
            varying.append((i, field))
    n = table.num_rows
    count = table.num_columns.to_bytes(2, "big")
    head: list[pa.Array | pa.Scalar] = []
    if fixed:
        layout: list[Any] = [("count", ">i2")]
        for i, f in fixed:
            layout += [(f"l{i}", ">i4"), (f"v{i}", f.values.dtype, f.values.shape[1:])]
        rec = np.empty(n, dtype=layout)
        rec["count"] = table.num_columns
        for i, f in fixed:
            rec[f"l{i}"] = f.width
            rec[f"v{i}"] = f.values
        head.append(binary_rows(rec))
        count = b""
    head.append(pa.scalar(count + b"".join(v for _, v in constant), pa.binary()))
    inputs = [*head, *(x for _, parts in varying for x in parts)]
    parts: list[bytes | memoryview] = [HEADER]
    for start in range(0, n, _ROWS_PER_JOIN):  # int32 offsets: keep each join small
        rows = pc.binary_join_element_wise(
            *(x if isinstance(x, pa.Scalar) else x.slice(start, _ROWS_PER_JOIN) for x in inputs), _EMPTY)
        parts.append(laid_end_to_end(rows))
    parts.append(TRAILER)
    return parts, [i for i, _ in fixed] + [i for i, _ in constant] + [i for i, _ in varying]


__all__ = ["HEADER", "TRAILER", "copy_binary", "encode_field"]
