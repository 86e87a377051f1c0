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
  registers, standard error about 0.8%), ``distinct_exact`` false;
- numeric fields (int, float, decimal; decimals as float64) and the derived features
  and aggregations (:class:`ColumnStats`): ``mean`` over every non-null, non-NaN value
  (a float64 running sum), and ``quantiles`` (p1, p5, p25, p50, p75, p95, p99,
  ``numpy.quantile``'s linear method) and ``histogram`` (:data:`HISTOGRAM_BINS`
  equal-width bins from the smallest to the largest value, shares of the values) over a
  seeded uniform sample of at most :data:`STATS_SAMPLE` values (:class:`Sample`; all
  values, ``sampled`` false, while there are no more than that).
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
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.compile.listtext import list_text
from features.kernels.hashing import fnv1a64_distinct
from features.schema.model import FLOAT_KINDS, NUMERIC_KINDS, Field

U64 = npt.NDArray[np.uint64]

F64 = npt.NDArray[np.float64]

#: Distinct hashes held exactly per field before switching to HyperLogLog.
EXACT_DISTINCT_LIMIT = 1_000_000
HLL_PRECISION = 14
#: Values sampled per numeric column for its quantiles and histogram.
STATS_SAMPLE = 100_000
#: Bins of a column's histogram.
HISTOGRAM_BINS = 20
#: The quantiles reported, as (name, probability).
QUANTILES = (("p1", 0.01), ("p5", 0.05), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p95", 0.95),
             ("p99", 0.99))


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


class Sample:
    """A bottom-k uniform sample of at most ``size`` float values: each value gets a key
    from a generator seeded with ``seed`` and the values with the smallest keys are kept.
    Deterministic for the same values in the same batch order; ``2 * 8 * size`` bytes."""

    def __init__(self, size: int, seed: list[int]) -> None:
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.values: F64 = np.empty(0, dtype=np.float64)
        self.keys: F64 = np.empty(0, dtype=np.float64)
        self.seen = 0

    def add(self, values: F64) -> None:
        if not len(values):
            return
        self.seen += len(values)
        keys = self.rng.random(len(values))
        v = np.concatenate([self.values, values])
        k = np.concatenate([self.keys, keys])
        if len(v) > self.size:
            keep = np.argpartition(k, self.size - 1)[: self.size]
            v, k = v[keep], k[keep]
        self.values, self.keys = v, k

    @property
    def sampled(self) -> bool:
        return self.seen > self.size


def as_floats(values: pa.Array | pa.ChunkedArray) -> F64:
    """The non-null, non-NaN values of a numeric Arrow array as float64 (decimals rounded
    to the nearest double)."""
    present = values.drop_null()
    floats = present if present.type == pa.float64() else pc.cast(present, pa.float64())
    arr: F64 = np.asarray(floats.to_numpy(zero_copy_only=False), dtype=np.float64)
    kept: F64 = arr[~np.isnan(arr)]
    return kept


class Numbers:
    """Mean (exact running sum), quantiles and a histogram (over a :class:`Sample`) of
    one numeric column."""

    def __init__(self, seed: list[int], size: int = STATS_SAMPLE) -> None:
        self.count = 0
        self.total = 0.0
        self.sample = Sample(size, seed)

    def add(self, values: F64) -> None:
        """Account finite-or-infinite float values (no NaN, no null)."""
        if not len(values):
            return
        self.count += len(values)
        self.total += float(np.sum(values))
        self.sample.add(values)

    def as_json(self) -> dict[str, Any]:
        v = self.sample.values
        if not self.count or not np.isfinite(v).all():
            return {"mean": jsonable(self.total / self.count) if self.count else None,
                    "quantiles": None, "histogram": None, "sampled": self.sample.sampled}
        q = np.quantile(v, [p for _, p in QUANTILES])
        lo, hi = float(v.min()), float(v.max())
        edges = np.linspace(lo, hi, HISTOGRAM_BINS + 1) if hi > lo else np.array([lo, lo + 1.0])
        counts, _ = np.histogram(v, bins=edges)
        return {
            "mean": jsonable(self.total / self.count),
            "quantiles": {name: float(x) for (name, _), x in zip(QUANTILES, q, strict=True)},
            "histogram": {"edges": [float(e) for e in edges], "shares": [float(c) / len(v) for c in counts]},
            "sampled": self.sample.sampled,
        }


@dataclass
class ColumnStats:
    """Running statistics of one numeric output column: a derived feature's (computed by
    the schema's transform program, or read from the cold table) or an aggregation's
    (read from the aggregates table). ``origin`` is ``feature`` or ``aggregation``."""

    name: str
    type: str
    origin: str
    seed: int
    rows: int = 0
    null_count: int = 0
    nan_count: int = 0
    min: float | None = None
    max: float | None = None
    numbers: Numbers | None = None

    def add(self, values: pa.Array | pa.ChunkedArray) -> None:
        """Account one batch of the column (any numeric Arrow type; nulls and NaN counted)."""
        if self.numbers is None:
            self.numbers = Numbers([self.seed, 1])
        self.rows += len(values)
        self.null_count += values.null_count
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        arr = as_floats(values)
        self.nan_count += len(values) - values.null_count - len(arr)
        if len(arr):
            lo, hi = float(arr.min()), float(arr.max())
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)
        self.numbers.add(arr)

    def as_json(self) -> dict[str, Any]:
        numbers = self.numbers.as_json() if self.numbers is not None else {
            "mean": None, "quantiles": None, "histogram": None, "sampled": False}
        return {"name": self.name, "type": self.type, "origin": self.origin, "rows": self.rows,
                "null_count": self.null_count, "nan_count": self.nan_count,
                "min": jsonable(self.min), "max": jsonable(self.max)} | numbers


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
    #: mean, quantiles and histogram: numeric (not list) fields only
    numbers: Numbers | None = None

    def __post_init__(self) -> None:
        if self.field.type.kind in NUMERIC_KINDS and self.field.type.items is None:
            self.numbers = Numbers([0, _seed(self.field.name)])

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
        self._widen(present)
        self.distinct.add(present)
        if self.numbers is not None:
            self.numbers.add(as_floats(present))

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
            self._widen(elements)
        self.distinct.add(list_text(present))

    def _widen(self, values: pa.Array) -> None:
        """``min``/``max`` widened to hold ``values`` (not all null)."""
        mm = pc.min_max(values)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is not None and (self.min is None or lo < self.min):
            self.min = lo
        if hi is not None and (self.max is None or hi > self.max):
            self.max = hi

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
        } | (self.numbers.as_json() if self.numbers is not None else {
            "mean": None, "quantiles": None, "histogram": None, "sampled": False})


def _seed(name: str) -> int:
    """A stable per-column seed (Python's ``hash`` of a str changes between runs)."""
    return int.from_bytes(name.encode("utf-8")[:8].ljust(8, b"\0"), "little") % (2**32)


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
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return str(value)


__all__ = ["EXACT_DISTINCT_LIMIT", "HISTOGRAM_BINS", "QUANTILES", "STATS_SAMPLE", "ColumnStats",
           "DistinctCounter", "FieldStats", "Numbers", "Sample", "as_floats", "jsonable", "value_hashes"]
