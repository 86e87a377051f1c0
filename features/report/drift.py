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
*warns* when ``psi > psi_warn``; a failing field makes the report's verdict FAIL. A
statistic counts against a threshold only when it is also above its *sampling noise*,
what two samples of the same distribution reach by chance once in a hundred (so that a
small sample does not flag drift it cannot show):

- ``ks_noise``: the two-sample KS critical value at 1%,
  ``sqrt(-ln(0.005) / 2) * sqrt((n + m) / (n * m))`` (n, m: the values compared);
- ``psi_noise``: under no drift PSI is about ``(1/n + 1/m) * chi2(k - 1)`` for k bins or
  categories (PSI is the symmetrised Kullback-Leibler divergence, whose scaled
  estimate is chi-square distributed), so its 99th percentile,
  ``(1/n + 1/m) * chi2_0.99(k - 1)`` (Wilson-Hilferty's approximation of the chi-square
  quantile).

A statistic above its threshold but within the noise is reported (``status`` ok, a
``note`` saying so), not flagged.

Fields not compared (``status`` skipped, with a ``reason``): the entity key, dates and
timestamps, fields named in ``exclude`` (``--drift-exclude``), and *high-cardinality*
string fields: more than :data:`HIGH_CARDINALITY` of a side's values distinct (an
identifier such as a postal code or a city, whose categories are nearly one per row)
or more than :data:`MAX_CATEGORIES` distinct values.
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
from features.report.stats import Sample, as_floats
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
#: A string field with more than this share of a side's values distinct is an identifier.
HIGH_CARDINALITY = 0.5
#: The chance of a same-distribution pair exceeding the sampling noise.
NOISE_ALPHA = 0.01
_Z_99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True)
class Thresholds:
    psi_warn: float = 0.1
    psi_fail: float = 0.25
    ks_fail: float = 0.2

    def as_json(self) -> dict[str, float]:
        return {"psi_warn": self.psi_warn, "psi_fail": self.psi_fail, "ks_fail": self.ks_fail}


CATEGORICAL_KINDS = frozenset({TypeKind.STRING, TypeKind.ENUM, TypeKind.BOOL})


def field_kind(field: Field, entity: str | None, exclude: frozenset[str] = frozenset()) -> str | None:
    """``numeric``, ``categorical`` or None (not compared)."""
    if field.name == entity or field.name in exclude:
        return None
    if field.type.kind in NUMERIC_KINDS:
        return "numeric"
    if field.type.kind in CATEGORICAL_KINDS:
        return "categorical"
    return None


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

    def __init__(self, compiled: CompiledSchema, *, sample_size: int = SAMPLE_SIZE, seed: int = SEED,
                 exclude: frozenset[str] = frozenset()) -> None:
        self.compiled = compiled
        self.rows = 0
        entity = compiled.schema.entity
        self.exclude = exclude
        self.kinds = {f.name: field_kind(f, entity, exclude) for f in compiled.schema.fields}
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
            arr = as_floats(present)
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


def ks_noise(n: int, m: int, alpha: float = NOISE_ALPHA) -> float:
    """The two-sample KS critical value at ``alpha`` for samples of ``n`` and ``m`` values."""
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def chi2_99(df: int) -> float:
    """The chi-square distribution's 99th percentile (Wilson-Hilferty; within 1% from df 3)."""
    if df <= 0:
        return 0.0
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + _Z_99 * math.sqrt(h)) ** 3


def psi_noise(bins: int, n: int, m: int) -> float:
    """The PSI that samples of ``n`` and ``m`` values of one distribution reach by chance
    once in a hundred over ``bins`` bins (see the module docstring)."""
    return (1.0 / n + 1.0 / m) * chi2_99(bins - 1)


def _status(psi: float, ks: float | None, t: Thresholds, noise_psi: float, noise_ks: float | None,
            sizes: str) -> tuple[str, list[str], str | None]:
    """(status, reasons, note): flagged only above both the threshold and the noise."""
    fail: list[str] = []
    quiet: list[str] = []
    for name, value, limit, noise in (("PSI", psi, t.psi_fail, noise_psi), ("KS", ks, t.ks_fail, noise_ks)):
        if value is None or noise is None or value <= limit:
            continue
        (fail if value > noise else quiet).append(f"{name} {value:.3f} > {limit:g}")
    if not fail and not quiet and t.psi_warn < psi <= noise_psi:
        quiet.append(f"PSI {psi:.3f} > {t.psi_warn:g}")
    note = None
    if quiet:
        note = (f"{'; '.join(quiet)} but within the sampling noise of {sizes} "
                f"(PSI {noise_psi:.3f}" + (f", KS {noise_ks:.3f}" if noise_ks is not None else "")
                + " at 99%): not flagged")
    if fail:
        return "fail", fail, note
    if psi > t.psi_warn and psi > noise_psi:
        return "warn", [f"PSI {psi:.3f} > {t.psi_warn:g}"], note
    return "ok", [], note


def compare(reference: Side, data: Side, thresholds: Thresholds, reference_lineage: dict[str, Any],
            *, sample_size: int = SAMPLE_SIZE, seed: int = SEED) -> dict[str, Any]:
    """The report's ``drift`` section (see the module docstring)."""
    fields: list[dict[str, Any]] = []
    for f in data.compiled.schema.fields:
        kind = data.kinds.get(f.name)
        entry: dict[str, Any] = {"field": f.name, "type": str(f.type), "kind": kind or "not compared"}
        if kind is None:
            skip_why = ("the entity key" if f.name == data.compiled.schema.entity
                        else "excluded (--drift-exclude)" if f.name in data.exclude
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
            n, m = len(rs.values), len(ds.values)
            ks = ks_statistic(rs.values, ds.values)
            edges, p, q = psi_bins(rs.values, ds.values)
            psi = psi_from_shares(p, q)
            noise_psi, noise_ks = psi_noise(len(p), n, m), ks_noise(n, m)
            status, why, note = _status(psi, ks, thresholds, noise_psi, noise_ks, f"{n:,} vs {m:,} values")
            entry.update({
                "status": status, "reasons": why, "note": note, "ks": ks, "psi": psi,
                "ks_noise": noise_ks, "psi_noise": noise_psi,
                "sampled": rs.sampled or ds.sampled,
                "reference_sample": n, "data_sample": m,
                "reference_mean": float(np.mean(rs.values)), "data_mean": float(np.mean(ds.values)),
                "psi_bins": {"edges": _finite(edges), "reference": _finite(p), "data": _finite(q)},
                "histogram": histogram(rs.values, ds.values),
            })
        else:
            rc, dc = reference.categories[f.name], data.categories[f.name]
            identifier = _high_cardinality(f, rc, r.values, dc, d.values)
            if identifier is not None:
                entry.update({"status": "skipped", "reason": identifier})
                fields.append(entry)
                continue
            cats = sorted(set(rc.counts) | set(dc.counts))
            rn, dn = sum(rc.counts.values()), sum(dc.counts.values())
            p = np.array([rc.counts.get(c, 0) / rn for c in cats], dtype=np.float64)
            q = np.array([dc.counts.get(c, 0) / dn for c in cats], dtype=np.float64)
            psi = psi_from_shares(p, q)
            tvd = float(0.5 * np.sum(np.abs(p - q)))
            noise_psi = psi_noise(len(cats), rn, dn)
            status, why, note = _status(psi, None, thresholds, noise_psi, None, f"{rn:,} vs {dn:,} values")
            order = sorted(range(len(cats)), key=lambda i: (-max(p[i], q[i]), cats[i]))
            entry.update({
                "status": status, "reasons": why, "note": note, "psi": psi, "tvd": tvd,
                "psi_noise": noise_psi, "categories_count": len(cats),
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
        "excluded": sorted(data.exclude),
        "high_cardinality": HIGH_CARDINALITY,
        "method": {
            "ks": "two-sample Kolmogorov-Smirnov statistic max|F_ref - F_data| over the samples",
            "psi": "sum (q - p) ln(q / p), shares floored at epsilon; numeric bins: reference deciles "
                   "(right-closed), categorical bins: categories",
            "tvd": "0.5 sum |q - p| over categories",
            "sample": f"bottom-k uniform sample of at most {sample_size:,} values per numeric field and side "
                      "(exact while a side has no more values); categorical counts exact",
            "noise": "ks_noise: the two-sample KS critical value at 1%; psi_noise: "
                     "(1/n + 1/m) chi2_0.99(k - 1) for k bins or categories; a statistic within its noise "
                     "is not flagged",
            "status": "fail: psi > psi_fail or ks > ks_fail, and above its noise; warn: psi > psi_warn, "
                      "and above its noise",
            "skipped": "the entity key, dates and times, --drift-exclude fields, string fields with more "
                       f"than {HIGH_CARDINALITY:.0%} of a side's values distinct or over "
                       f"{MAX_CATEGORIES:,} distinct",
        },
        "failed": [e["field"] for e in fields if e["status"] == "fail"],
        "warned": [e["field"] for e in fields if e["status"] == "warn"],
        "fields": fields,
    }


def _high_cardinality(field: Field, reference: Categories, reference_values: int, data: Categories,
                      data_values: int) -> str | None:
    """Why a categorical field is an identifier rather than a category (None: it is not)."""
    for side, cats, values in (("data", data, data_values), ("reference", reference, reference_values)):
        if cats.overflow:
            return (f"high cardinality: more than {MAX_CATEGORIES:,} distinct of {values:,} values "
                    f"({side})")
    if field.type.kind != TypeKind.STRING:
        return None  # an enum or a bool has its declared categories, however few the rows
    for side, cats, values in (("data", data, data_values), ("reference", reference, reference_values)):
        if len(cats.counts) > HIGH_CARDINALITY * values:
            return f"high cardinality: {len(cats.counts):,} distinct of {values:,} values ({side})"
    return None


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
    #: fields left out of the comparison (``--drift-exclude``)
    exclude: frozenset[str] = frozenset()


__all__ = ["HIGH_CARDINALITY", "SAMPLE_SIZE", "DriftOptions", "Side", "Thresholds", "chi2_99", "compare",
           "histogram", "ks_noise", "ks_statistic", "psi_bins", "psi_from_shares", "psi_noise",
           "verdict_reason"]
