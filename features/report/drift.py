"""Drift of the report's data against a reference (``--reference-parquet`` / ``--reference-table``).

Both inputs are streamed in batches; per field, the values *as converted to the
declared type* by the validator's conversion (the same values as the field
statistics: every row, including rows rejected by other rules; nulls, NaN and
values that fail conversion are left out and only counted) are kept as:

- numeric fields (int, float, decimal; decimals as float64): a uniform random
  sample of at most ``sample_size`` values (default :data:`SAMPLE_SIZE`), by
  bottom-k sampling: each value gets a key from a seeded generator
  (``numpy.random.default_rng([seed, field index])``, the same for both sides) and
  the values with the ``sample_size`` smallest keys are kept. Deterministic for the
  same input in the same batch order; memory ``2 * 8 * sample_size`` bytes per field
  and side. While a side has at most ``sample_size`` values its sample is all of
  them (``sampled`` false) and every figure below is exact;
- categorical fields (string, enum, bool): exact counts per category, up to
  :data:`MAX_CATEGORIES` distinct values per side; beyond that the field is skipped
  (an identifier, not a category).

The entity key and date / timestamp fields are not compared (event times of two
periods always differ).

Definitions (``p_i``: reference share of bin or category ``i``, ``q_i``: data share):

- ``ks``: the two-sample Kolmogorov-Smirnov statistic ``max_x |F_ref(x) - F_data(x)|``
  over the empirical CDFs of the two samples (evaluated at every sample value).
  Sampling error: about ``1.36 * sqrt(2 / sample_size)`` (0.006 at 100k) at 95%;
- ``psi``: population stability index ``sum_i (q_i - p_i) * ln(q_i / p_i)``, with both
  shares floored at :data:`EPSILON` (1e-4) so that empty bins stay finite. Numeric
  bins: the reference sample's deciles (``numpy.quantile``, linear method, at 0.1 ..
  0.9; repeated edges merged) as right-closed bins ``(-inf, e1], (e1, e2] .. (e9, inf)``.
  Categorical bins: the union of categories of both sides;
- ``tvd`` (categorical): total variation distance ``0.5 * sum_i |q_i - p_i|``.

Thresholds: a field *fails* when ``psi > psi_fail`` or (numeric) ``ks > ks_fail``, and
*warns* when ``psi > psi_warn``; a failing field makes the report's verdict FAIL.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.report.core import Chunk
from features.schema.model import NUMERIC_KINDS, Field, TypeKind
from features.validation.convert import convert

F64 = npt.NDArray[np.float64]

#: Values sampled per numeric field and side.
SAMPLE_SIZE = 100_000
#: Distinct categories counted per field and side before the field is skipped.
MAX_CATEGORIES = 1_000
#: Floor of a share in the PSI.
EPSILON = 1e-4
#: PSI quantile bins taken from the reference.
PSI_BINS = 10
#: Bins of the histograms drawn in the page (equal width over both samples' range).
CHART_BINS = 24
#: Categories listed per field (by the larger of the two shares).
TOP_CATEGORIES = 12
SEED = 0


@dataclass(frozen=True)
class Thresholds:
    psi_warn: float = 0.1
    psi_fail: float = 0.25
    ks_fail: float = 0.2

    def as_json(self) -> dict[str, float]:
        return {"psi_warn": self.psi_warn, "psi_fail": self.psi_fail, "ks_fail": self.ks_fail}


CATEGORICAL_KINDS = frozenset({TypeKind.STRING, TypeKind.ENUM, TypeKind.BOOL})


def field_kind(field: Field, entity: str | None) -> str | None:
    """``numeric``, ``categorical`` or None (not compared)."""
    if field.name == entity:
        return None
    if field.type.kind in NUMERIC_KINDS:
        return "numeric"
    if field.type.kind in CATEGORICAL_KINDS:
        return "categorical"
    return None


class Sample:
    """A bottom-k uniform sample of float values (see the module docstring)."""

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


class Categories:
    """Exact counts per category, up to ``limit`` distinct (then ``overflow``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: Counter[str] = Counter()
        self.overflow = False

    def add(self, values: pa.Array) -> None:
        if self.overflow or not len(values):
            return
        vc = pc.value_counts(values)
        for v, c in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist(), strict=True):
            key = ("true" if v else "false") if isinstance(v, bool) else str(v)
            self.counts[key] += int(c)
        if len(self.counts) > self.limit:
            self.overflow = True
            self.counts.clear()


@dataclass
class FieldSide:
    rows: int = 0
    nulls: int = 0
    values: int = 0


class Side:
    """One side (reference or data): per compared field, its sample or categories."""

    def __init__(self, compiled: CompiledSchema, *, sample_size: int = SAMPLE_SIZE, seed: int = SEED) -> None:
        self.compiled = compiled
        self.rows = 0
        entity = compiled.schema.entity
        self.kinds = {f.name: field_kind(f, entity) for f in compiled.schema.fields}
        self.counts = {f.name: FieldSide() for f in compiled.schema.fields}
        self.samples = {f.name: Sample(sample_size, [seed, i]) for i, f in enumerate(compiled.schema.fields)
                        if self.kinds[f.name] == "numeric"}
        self.categories = {f.name: Categories(MAX_CATEGORIES) for f in compiled.schema.fields
                           if self.kinds[f.name] == "categorical"}

    def add_values(self, field: Field, values: pa.Array | None, n: int) -> None:
        """Account one batch of field values converted to the declared type (None: column absent)."""
        kind = self.kinds.get(field.name)
        if kind is None:
            return
        fs = self.counts[field.name]
        fs.rows += n
        if values is None:
            fs.nulls += n
            return
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        present = values.drop_null()
        if kind == "numeric":
            floats = pc.cast(present, pa.float64()) if present.type != pa.float64() else present
            arr = np.asarray(floats.to_numpy(zero_copy_only=False), dtype=np.float64)
            arr = arr[~np.isnan(arr)]
            fs.nulls += n - len(arr)
            fs.values += len(arr)
            self.samples[field.name].add(arr)
        else:
            fs.nulls += n - len(present)
            fs.values += len(present)
            self.categories[field.name].add(present)

    def add(self, chunk: Chunk) -> None:
        """Account one raw input batch (converted here with the validator's conversion)."""
        data = chunk.data
        n = data.num_rows
        if n == 0:
            return
        self.rows += n
        names = data.schema.names
        arrow_schema = self.compiled.arrow_schema
        for f in self.compiled.schema.fields:
            if self.kinds[f.name] is None:
                continue
            if f.name not in names:
                self.add_values(f, None, n)
                continue
            converted = convert(data.column(names.index(f.name)), f, arrow_schema.field(f.name).type)
            self.add_values(f, converted.values, n)


# --------------------------------------------------------------------------- statistics


def ks_statistic(reference: F64, data: F64) -> float:
    """``max |F_ref - F_data|`` of two samples (exact for the given values)."""
    a, b = np.sort(reference), np.sort(data)
    points = np.concatenate([a, b])
    fa = np.searchsorted(a, points, side="right") / len(a)
    fb = np.searchsorted(b, points, side="right") / len(b)
    return float(np.max(np.abs(fa - fb)))


def psi_from_shares(p: F64, q: F64) -> float:
    pe, qe = np.maximum(p, EPSILON), np.maximum(q, EPSILON)
    return float(np.sum((qe - pe) * np.log(qe / pe)))


def psi_bins(reference: F64, data: F64) -> tuple[F64, F64, F64]:
    """(inner edges, reference shares, data shares) of the reference's decile bins."""
    edges: F64 = np.unique(np.quantile(reference, np.linspace(0.1, 0.9, PSI_BINS - 1)))
    bins = len(edges) + 1
    p = np.bincount(np.searchsorted(edges, reference, side="left"), minlength=bins) / len(reference)
    q = np.bincount(np.searchsorted(edges, data, side="left"), minlength=bins) / len(data)
    return edges, p.astype(np.float64), q.astype(np.float64)


def histogram(reference: F64, data: F64, bins: int = CHART_BINS) -> dict[str, Any]:
    """Equal-width histograms (shares) of both samples over their joint range."""
    lo = float(min(reference.min(), data.min()))
    hi = float(max(reference.max(), data.max()))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return {"edges": [], "reference": [], "data": []}
    if hi <= lo:
        hi = lo + 1.0
        bins = 1
    edges = np.linspace(lo, hi, bins + 1)
    hr, _ = np.histogram(reference, bins=edges)
    hd, _ = np.histogram(data, bins=edges)
    return {"edges": [float(e) for e in edges],
            "reference": [float(x) for x in hr / len(reference)],
            "data": [float(x) for x in hd / len(data)]}


def _finite(values: Iterable[float]) -> list[float]:
    return [float(v) if math.isfinite(v) else 0.0 for v in values]


def _status(psi: float, ks: float | None, t: Thresholds) -> tuple[str, list[str]]:
    fail = []
    if psi > t.psi_fail:
        fail.append(f"PSI {psi:.3f} > {t.psi_fail:g}")
    if ks is not None and ks > t.ks_fail:
        fail.append(f"KS {ks:.3f} > {t.ks_fail:g}")
    if fail:
        return "fail", fail
    if psi > t.psi_warn:
        return "warn", [f"PSI {psi:.3f} > {t.psi_warn:g}"]
    return "ok", []


def compare(reference: Side, data: Side, thresholds: Thresholds, reference_lineage: dict[str, Any],
            *, sample_size: int = SAMPLE_SIZE, seed: int = SEED) -> dict[str, Any]:
    """The report's ``drift`` section."""
    fields: list[dict[str, Any]] = []
    for f in data.compiled.schema.fields:
        kind = data.kinds.get(f.name)
        entry: dict[str, Any] = {"field": f.name, "type": str(f.type), "kind": kind or "not compared"}
        if kind is None:
            skip_why = ("the entity key" if f.name == data.compiled.schema.entity
                        else "dates and times are not compared")
            entry.update({"status": "skipped", "reason": skip_why})
            fields.append(entry)
            continue
        r = reference.counts.get(f.name, FieldSide())
        d = data.counts[f.name]
        entry.update({
            "reference_rows": r.rows, "data_rows": d.rows,
            "reference_values": r.values, "data_values": d.values,
            "reference_null_share": r.nulls / r.rows if r.rows else None,
            "data_null_share": d.nulls / d.rows if d.rows else None,
        })
        if r.values == 0 or d.values == 0:
            entry.update({"status": "skipped", "reason": "no values on "
                          + ("either side" if r.values == d.values == 0
                             else "the reference side" if r.values == 0 else "the data side")})
            fields.append(entry)
            continue
        if kind == "numeric":
            rs, ds = reference.samples[f.name], data.samples[f.name]
            ks = ks_statistic(rs.values, ds.values)
            edges, p, q = psi_bins(rs.values, ds.values)
            psi = psi_from_shares(p, q)
            status, why = _status(psi, ks, thresholds)
            entry.update({
                "status": status, "reasons": why, "ks": ks, "psi": psi,
                "sampled": rs.sampled or ds.sampled,
                "reference_sample": len(rs.values), "data_sample": len(ds.values),
                "reference_mean": float(np.mean(rs.values)), "data_mean": float(np.mean(ds.values)),
                "psi_bins": {"edges": _finite(edges), "reference": _finite(p), "data": _finite(q)},
                "histogram": histogram(rs.values, ds.values),
            })
        else:
            rc, dc = reference.categories[f.name], data.categories[f.name]
            if rc.overflow or dc.overflow:
                entry.update({"status": "skipped",
                              "reason": f"more than {MAX_CATEGORIES:,} distinct values (not categorical)"})
                fields.append(entry)
                continue
            cats = sorted(set(rc.counts) | set(dc.counts))
            rn, dn = sum(rc.counts.values()), sum(dc.counts.values())
            p = np.array([rc.counts.get(c, 0) / rn for c in cats], dtype=np.float64)
            q = np.array([dc.counts.get(c, 0) / dn for c in cats], dtype=np.float64)
            psi = psi_from_shares(p, q)
            tvd = float(0.5 * np.sum(np.abs(p - q)))
            status, why = _status(psi, None, thresholds)
            order = sorted(range(len(cats)), key=lambda i: (-max(p[i], q[i]), cats[i]))
            entry.update({
                "status": status, "reasons": why, "psi": psi, "tvd": tvd, "categories_count": len(cats),
                "categories": [{"value": cats[i], "reference_count": rc.counts.get(cats[i], 0),
                                "data_count": dc.counts.get(cats[i], 0), "reference_share": float(p[i]),
                                "data_share": float(q[i])} for i in order[:TOP_CATEGORIES]],
            })
        fields.append(entry)
    return {
        "reference": reference_lineage,
        "reference_rows": reference.rows,
        "data_rows": data.rows,
        "thresholds": thresholds.as_json(),
        "sample_size": sample_size,
        "seed": seed,
        "epsilon": EPSILON,
        "psi_bins": PSI_BINS,
        "method": {
            "ks": "two-sample Kolmogorov-Smirnov statistic max|F_ref - F_data| over the samples",
            "psi": "sum (q - p) ln(q / p), shares floored at epsilon; numeric bins: reference deciles "
                   "(right-closed), categorical bins: categories",
            "tvd": "0.5 sum |q - p| over categories",
            "sample": f"bottom-k uniform sample of at most {sample_size:,} values per numeric field and side "
                      "(exact while a side has no more values); categorical counts exact",
            "status": "fail: psi > psi_fail or ks > ks_fail; warn: psi > psi_warn",
        },
        "failed": [e["field"] for e in fields if e["status"] == "fail"],
        "warned": [e["field"] for e in fields if e["status"] == "warn"],
        "fields": fields,
    }


def verdict_reason(drift: dict[str, Any]) -> str | None:
    """One line naming every field whose drift is above a fail threshold, or None."""
    failed = [e for e in drift["fields"] if e["status"] == "fail"]
    if not failed:
        return None
    parts = [f"{e['field']} ({', '.join(e['reasons'])})" for e in failed]
    return f"drift above the fail thresholds in {len(failed)} field(s): " + "; ".join(parts)


@dataclass(frozen=True)
class DriftOptions:
    """What to compare the data with: Parquet ``paths`` or (``table``) the cold table at ``dsn``."""

    paths: tuple[str, ...] = ()
    table: bool = False
    dsn: str | None = None
    thresholds: Thresholds = Thresholds()
    sample_size: int = SAMPLE_SIZE
    batch_rows: int = 131_072


__all__ = ["SAMPLE_SIZE", "DriftOptions", "Side", "Thresholds", "compare", "histogram", "ks_statistic",
           "psi_bins", "psi_from_shares", "verdict_reason"]
