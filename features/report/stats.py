"""Per-field statistics over a stream of batches, in bounded memory.

For each declared field, over the values *as converted to the declared type* by the
validator's own conversion (:func:`features.validation.convert.convert`):

- ``rows``: rows seen; ``null_count``: nulls (after ``empty_as_null`` and the field's
  ``null_values`` markers, before defaults are filled; a column absent from a batch
  counts all its rows as null);
- ``nan_count`` (float fields): NaN values; ``type_failures``: values that do not
  convert exactly (the validator's ``type`` rejects), left out of every other figure;
- ``min`` / ``max``: over non-null, non-NaN values, in the field's own type;
- ``distinct_count``: distinct non-null, non-NaN values. Each distinct value of a batch
  is hashed (FNV-1a 64 of its Arrow text rendering, then a 64-bit finaliser) and the
  hashes are merged across batches: exact (up to 64-bit hash collisions, about
  ``n**2 / 2**65``: 3e-8 for a million values) while at most ``exact_limit`` distinct
  hashes are held (8 bytes each), then a HyperLogLog sketch (2**14 one-byte
  registers, standard error about 0.8%), ``distinct_exact`` false.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile.listtext import list_text
from features.kernels.hashing import fnv1a64_distinct
from features.schema.model import FLOAT_KINDS, Field

U64 = npt.NDArray[np.uint64]

#: Distinct hashes held exactly per field before switching to HyperLogLog.
EXACT_DISTINCT_LIMIT = 1_000_000
HLL_PRECISION = 14


def _mix(h: U64) -> U64:
    """MurmurHash3's 64-bit finaliser: spreads FNV's bits evenly (HLL reads the top ones)."""
    h = h.copy()
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


def value_hashes(values: pa.Array) -> U64:
    """64-bit hashes of the distinct non-null values of ``values`` (one per value)."""
    unique = pc.unique(values.drop_null())
    if len(unique) == 0:
        return np.zeros(0, dtype=np.uint64)
    text = unique if pa.types.is_string(unique.type) else pc.cast(unique, pa.string())
    return _mix(fnv1a64_distinct(text))


class DistinctCounter:
    """Distinct values over many batches: exact hash set, then HyperLogLog (see module doc)."""

    def __init__(self, *, exact_limit: int = EXACT_DISTINCT_LIMIT, precision: int = HLL_PRECISION) -> None:
        self.exact_limit = exact_limit
        self.precision = precision
        self._hashes: U64 | None = np.zeros(0, dtype=np.uint64)
        self._registers: npt.NDArray[np.uint8] | None = None

    @property
    def exact(self) -> bool:
        return self._hashes is not None

    def add_hashes(self, hashes: U64) -> None:
        if self._hashes is not None:
            merged: U64 = np.union1d(self._hashes, hashes)
            if len(merged) <= self.exact_limit:
                self._hashes = merged
                return
            self._hashes = None
            self._registers = np.zeros(1 << self.precision, dtype=np.uint8)
            hashes = merged
        self._sketch(hashes)

    def add(self, values: pa.Array) -> None:
        self.add_hashes(value_hashes(values))

    def _sketch(self, hashes: U64) -> None:
        assert self._registers is not None
        p = self.precision
        index = (hashes >> np.uint64(64 - p)).astype(np.int64)
        rest = hashes & np.uint64((1 << (64 - p)) - 1)
        # rank = position of the leftmost 1 in the (64 - p)-bit remainder, 1-based;
        # float64 holds every remainder below 2**53 exactly, so floor(log2) is exact.
        bits = 64 - p
        with np.errstate(divide="ignore"):
            top = np.floor(np.log2(rest.astype(np.float64)))
        rank = np.where(rest == 0, bits + 1, bits - top).astype(np.uint8)
        np.maximum.at(self._registers, index, rank)

    @property
    def count(self) -> int:
        if self._hashes is not None:
            return len(self._hashes)
        assert self._registers is not None
        m = len(self._registers)
        alpha = 0.7213 / (1 + 1.079 / m)
        estimate = alpha * m * m / float(np.sum(np.power(2.0, -self._registers.astype(np.float64))))
        zeros = int(np.count_nonzero(self._registers == 0))
        if estimate <= 2.5 * m and zeros:
            estimate = m * math.log(m / zeros)  # linear counting for small cardinalities
        return round(estimate)


@dataclass
class FieldStats:
    """Running statistics of one field (see the module docstring)."""

    field: Field
    rows: int = 0
    null_count: int = 0
    nan_count: int = 0
    type_failures: int = 0
    absent_rows: int = 0
    min: Any = None
    max: Any = None
    distinct: DistinctCounter = dataclasses.field(default_factory=DistinctCounter)

    def add(self, values: pa.Array | None, n: int, type_failures: int = 0) -> None:
        """Account one batch: ``values`` converted to the declared type (null where
        conversion failed), None when the column is absent from the batch."""
        self.rows += n
        if values is None:
            self.absent_rows += n
            self.null_count += n
            return
        self.type_failures += type_failures
        self.null_count += values.null_count - type_failures
        present = values.drop_null()
        if self.field.type.items is not None:
            self._add_lists(present)
            return
        if self.field.type.kind in FLOAT_KINDS and len(present):
            nan = pc.is_nan(present)
            self.nan_count += int(pc.sum(nan).as_py() or 0)
            present = present.filter(pc.invert(nan))
        if len(present) == 0:
            return
        mm = pc.min_max(present)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is not None and (self.min is None or lo < self.min):
            self.min = lo
        if hi is not None and (self.max is None or hi > self.max):
            self.max = hi
        self.distinct.add(present)

    def _add_lists(self, present: pa.Array) -> None:
        """A list field: ``nan_count`` counts lists with a NaN element, ``min``/``max`` are
        over the elements, distinct values are distinct lists (by their text)."""
        if len(present) == 0:
            return
        elements = present.flatten()
        if self.field.type.items is not None and self.field.type.items.element.kind in FLOAT_KINDS \
                and len(elements):
            nan = pc.fill_null(pc.is_nan(elements), False)
            rows = pc.list_parent_indices(present).filter(nan)
            self.nan_count += len(pc.unique(rows))
            elements = elements.filter(pc.invert(nan))
        if len(elements.drop_null()):
            mm = pc.min_max(elements)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is not None and (self.min is None or lo < self.min):
                self.min = lo
            if hi is not None and (self.max is None or hi > self.max):
                self.max = hi
        self.distinct.add(list_text(present))

    def as_json(self) -> dict[str, Any]:
        return {
            "field": self.field.name,
            "type": str(self.field.type),
            "rows": self.rows,
            "null_count": self.null_count,
            "nan_count": self.nan_count if self.field.type.kind in FLOAT_KINDS or (
                self.field.type.items is not None and self.field.type.items.element.kind in FLOAT_KINDS)
            else None,
            "type_failures": self.type_failures,
            "absent_rows": self.absent_rows,
            "min": jsonable(self.min),
            "max": jsonable(self.max),
            "distinct_count": self.distinct.count,
            "distinct_exact": self.distinct.exact,
        }


def jsonable(value: Any) -> Any:
    """``value`` as JSON: None, bool, int, finite float or text (decimals exactly as
    text, dates and times in ISO 8601, NaN/inf as text, anything else via ``str``)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value).replace("nan", "NaN")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return None if str(value) == "NaT" else value.isoformat()
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    try:  # pandas' NA / NaT and similar missing markers
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


__all__ = ["EXACT_DISTINCT_LIMIT", "DistinctCounter", "FieldStats", "jsonable", "value_hashes"]
