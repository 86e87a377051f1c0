"""Arrow columns -> kernel inputs, on the host: numbers, time differences, hashes, one-hot.

Each kernel input *slot* (``ops.Slot``) becomes a :class:`SlotValues`: one value per
row in a NumPy dtype the backends turn into float64, plus a null mask. Nothing here
loops over rows in Python; values are read from the Arrow buffers without copies
where the type allows.

Conversions (identical for both backends, since both start from these arrays):

- ints, floats: the values as they are (the kernel reads them as float64: ints beyond
  2**53 round to nearest);
- bool: 1 / 0;
- decimal128: the *nearest* float64 (``unscaled / 10**scale`` in one correctly rounded
  division when both are exact, i.e. ``|unscaled| <= 2**53`` and ``scale <= 22``;
  otherwise Arrow's decimal -> string -> float64, which is also correctly rounded;
  Arrow's own decimal -> float64 cast is not: it is off by one ulp for ~13 % of values);
- date/timestamp: int64 microseconds since the epoch (naive timestamps as UTC, dates
  at midnight), for ``time_since``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.errors import SourceError
from features.kernels.hashing import hash_buckets
from features.kernels.ops import HashSlot, NumberSlot, OneHot, ProgramPlan, Slot

BoolArray = npt.NDArray[np.bool_]

_US_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
_US_PER_DAY = 86_400_000_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class SlotValues:
    """One kernel input: ``values`` (any real NumPy dtype, arbitrary where null) and
    ``null`` (True where null; None when the column has no nulls)."""

    values: npt.NDArray[np.generic]
    null: BoolArray | None

    def take(self, rows: npt.NDArray[np.int64]) -> SlotValues:
        return SlotValues(self.values[rows], None if self.null is None else self.null[rows])


def null_mask(arr: pa.Array) -> BoolArray | None:
    """True where ``arr`` is null, or None when it has no nulls."""
    if arr.null_count == 0:
        return None
    mask: BoolArray = arr.is_null().to_numpy(zero_copy_only=False)
    return mask


def _fixed_width(arr: pa.Array, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
    """The values buffer of a fixed-width array as NumPy, without a copy (slice-aware)."""
    count = arr.offset + len(arr)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=count)[arr.offset:]


def decimal_to_float64(arr: pa.Array) -> npt.NDArray[np.float64]:
    """Each decimal as the nearest float64 (module docstring); nulls give arbitrary values."""
    n = len(arr)
    out = np.zeros(n, dtype=np.float64)
    if n == 0:
        return out
    scale = arr.type.scale
    slow = np.ones(n, dtype=np.bool_)
    if pa.types.is_decimal128(arr.type) and 0 <= scale <= 22:
        words = np.frombuffer(arr.buffers()[1], dtype="<i8", count=2 * (arr.offset + n))[2 * arr.offset:]
        lo, hi = words[0::2], words[1::2]
        np.copyto(out, lo, casting="unsafe")      # exact where |lo| < 2**53
        # Fast where the value is one int64 (hi is lo's sign extension) below 2**53 in
        # magnitude: then unscaled / 10**scale is one correctly rounded division.
        step = 1 << 16                            # in slices: small temporaries, in cache
        for start in range(0, n, step):
            sl = slice(start, start + step)
            fast = (np.abs(out[sl]) < 2.0**53) & (hi[sl] == (lo[sl] >> 63))
            np.logical_not(fast, out=slow[sl])
        np.divide(out, 10.0**scale, out=out)
    nulls = null_mask(arr)
    if nulls is not None:
        slow &= ~nulls
    if slow.any():
        rows = np.flatnonzero(slow)
        text = pc.cast(arr.take(pa.array(rows)), pa.string())
        out[rows] = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
    return out


def numeric_values(arr: pa.Array, name: str) -> SlotValues:
    """A numeric/bool column as a kernel input. Raises SourceError for other types."""
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        if pa.types.is_float16(t):
            arr = arr.cast(pa.float32())
            t = arr.type
        return SlotValues(_fixed_width(arr, t.to_pandas_dtype()), null_mask(arr))
    if pa.types.is_boolean(t):
        return SlotValues(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), null_mask(arr))
    if pa.types.is_decimal(t):
        return SlotValues(decimal_to_float64(arr), null_mask(arr))
    if pa.types.is_null(t):
        return SlotValues(np.zeros(len(arr)), np.ones(len(arr), dtype=np.bool_))
    raise SourceError(f"column {name} has type {t}; the transforms need a number or bool", field=name)


def temporal_us(arr: pa.Array, name: str) -> tuple[npt.NDArray[np.int64], BoolArray | None]:
    """A date/timestamp column as int64 microseconds since the epoch (UTC for naive
    values, midnight for dates; ns floors to µs). Raises SourceError for other types."""
    t = arr.type
    if pa.types.is_null(t):
        return np.zeros(len(arr), dtype=np.int64), np.ones(len(arr), dtype=np.bool_)
    if pa.types.is_timestamp(t):
        raw = _fixed_width(arr, np.int64).astype(np.int64, copy=False)
        if t.unit == "ns":
            us = np.floor_divide(raw, 1_000)
        elif t.unit == "us":
            us = raw                              # no copy: callers do not write to it
        else:
            us = raw * _US_PER_UNIT[t.unit]
    elif pa.types.is_date32(t):
        us = _fixed_width(arr, np.int32).astype(np.int64)
        us *= _US_PER_DAY
    elif pa.types.is_date64(t):
        us = _fixed_width(arr, np.int64).astype(np.int64)
        us *= 1_000
    else:
        raise SourceError(f"column {name} has type {t}; time_since needs a date or timestamp", field=name)
    return us, null_mask(arr)


def reference_us(reference_time: dt.datetime | dt.date) -> int:
    """``reference_time`` as microseconds since the epoch (naive = UTC, date = midnight)."""
    if not isinstance(reference_time, dt.datetime):
        reference_time = dt.datetime(reference_time.year, reference_time.month, reference_time.day)
    if reference_time.tzinfo is None:
        reference_time = reference_time.replace(tzinfo=dt.UTC)
    return (reference_time - _EPOCH) // dt.timedelta(microseconds=1)


def column(batch: pa.RecordBatch, name: str) -> pa.Array:
    """The column ``name`` of ``batch``; SourceError when it is absent."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise SourceError(f"the transform input has no column {name!r} (expected the validator's valid "
                          f"batch, with columns {', '.join(batch.schema.names)})", field=name)
    return batch.column(index)


def _strings(batch: pa.RecordBatch, name: str, fill: str | None) -> pa.Array:
    arr = column(batch, name)
    t = arr.type
    if pa.types.is_dictionary(t) or pa.types.is_null(t):  # null type: a column of nulls only
        arr = arr.cast(pa.string() if pa.types.is_null(t) else t.value_type)
        t = arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise SourceError(f"column {name} has type {t}; hash_bucket and one_hot need strings", field=name)
    if fill is not None and arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(fill, t))
    return arr


def slot_values(
    slot: Slot, batch: pa.RecordBatch, reference_time: dt.datetime | dt.date | None,
) -> SlotValues:
    """The kernel input ``slot`` computed from ``batch`` (see the module docstring)."""
    if isinstance(slot, NumberSlot):
        return numeric_values(column(batch, slot.field), slot.field)
    if isinstance(slot, HashSlot):
        arr = _strings(batch, slot.field, slot.fill)
        return SlotValues(hash_buckets(arr, slot.n), null_mask(arr))
    src, src_null = temporal_us(column(batch, slot.field), slot.field)
    if slot.reference_field is not None:
        ref, ref_null = temporal_us(column(batch, slot.reference_field), slot.reference_field)
        null = src_null if ref_null is None else (ref_null if src_null is None else src_null | ref_null)
        return SlotValues(np.subtract(ref, src, dtype=np.int64), null)
    if reference_time is None:
        raise ValueError(f"time_since of {slot.field} needs reference_time: the schema declares no "
                         "event_time, so TransformProgram.run(..., reference_time=...) must give one")
    return SlotValues(np.subtract(reference_us(reference_time), src, dtype=np.int64), src_null)


def prepare_slots(
    plan: ProgramPlan, batch: pa.RecordBatch, reference_time: dt.datetime | dt.date | None,
) -> list[SlotValues]:
    """Every kernel input of ``plan`` for ``batch``, in slot order."""
    return [slot_values(slot, batch, reference_time) for slot in plan.slots]


def one_hot_values(
    spec: OneHot, batch: pa.RecordBatch, dtype: np.dtype[np.generic],
) -> tuple[list[npt.NDArray[np.generic]], BoolArray | None]:
    """One array per enum value (1 where the row holds it, else 0) in ``dtype``, and the
    null mask shared by all of them (null input, after ``fill``, stays null). A value
    outside the enum (the validator never lets one through) gives all zeros."""
    arr = _strings(batch, spec.field, spec.fill)
    codes = pc.index_in(arr, value_set=pa.array(spec.values, arr.type))
    code_np = codes.fill_null(-1).to_numpy(zero_copy_only=False)
    return [(code_np == k).astype(dtype) for k in range(len(spec.values))], null_mask(arr)


__all__ = [
    "SlotValues",
    "decimal_to_float64",
    "numeric_values",
    "one_hot_values",
    "prepare_slots",
    "reference_us",
    "temporal_us",
]
