"""One row's :func:`~features.aggregate.engine.finalize` in Python values (issue 49): a
one-entity online read at request time turns its raw parts into the row it returns
without building an Arrow array per aggregation only to read its one value back.

The arithmetic is the vectorised finalize's, on the same IEEE doubles (a Python float is
one): a count or an integer sum is the integer; a decimal is its unscaled integer with
the field's scale (``Decimal("<int>e-<scale>")``: exact, whatever the decimal context); a
float field's fixed-point sum ``s / 10^scale``; a mean ``s / n`` (then ``/ 10^scale``),
null for an empty window; min/max/first/last the value in the field's type (a float32
field's value rounded to float32 as Arrow's cast does). Any other function (ratio,
moments, ``last_k``, sketches) goes through the vectorised finalize itself, so the row
is always ``finalize(...)``'s first row. ``tests/unit/test_one_row.py`` holds the two
equal on random raw parts of every supported function and field type.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np

from features.aggregate.engine import RAW_PARTS, AggSpec, finalize, value_scale
from features.schema.model import FLOAT_KINDS, TypeKind

#: the functions :func:`finalize_row` computes itself (any other: the vectorised finalize)
ROW_FUNCTIONS = frozenset({"count", "count_distinct", "sum", "mean", "min", "max", "first", "last"})

#: raw parts of one row: ``{"<aggregation>.<part>": (value, valid)}`` (an int, or a float
#: for a float field's min/max/first/last; ``valid`` False: null)
RawRow = dict[str, tuple[Any, bool]]


@dataclass(frozen=True)
class _Step:
    name: str
    kind: str              # "int", "float", "f32", "fixed" (a float field's scaled sum), "mean", "decimal"
    parts: tuple[str, ...]
    scale: int
    nullable: bool         # an invalid part reads as null (else as 0: a sum)


def _steps(spec: AggSpec) -> tuple[_Step, ...] | None:
    """Per aggregation, how :func:`finalize_row` computes it (None: a function it leaves
    to the vectorised finalize)."""
    steps = []
    for agg in spec.aggregations.features:
        f = agg.function
        if f not in ROW_FUNCTIONS:
            return None
        parts = tuple(f"{agg.name}.{p}" for p in RAW_PARTS[f])
        if f in ("count", "count_distinct"):
            steps.append(_Step(agg.name, "int", parts, 0, True))
            continue
        ft, scale = value_scale(spec, agg)
        if f == "sum" and agg.scale is not None:
            steps.append(_Step(agg.name, "fixed", parts, scale, False))
        elif f == "mean":
            steps.append(_Step(agg.name, "mean", parts, scale, False))
        elif ft.kind is TypeKind.DECIMAL:
            steps.append(_Step(agg.name, "decimal", parts, scale, f != "sum"))
        elif f == "sum":
            steps.append(_Step(agg.name, "int", parts, 0, False))
        elif ft.kind in FLOAT_KINDS:  # min/max/first/last of a float field
            steps.append(_Step(agg.name, "f32" if ft.kind is TypeKind.FLOAT32 else "float", parts, 0, True))
        else:  # min/max/first/last of an integer field
            steps.append(_Step(agg.name, "int", parts, 0, True))
    return tuple(steps)


_STEPS: dict[int, tuple[AggSpec, tuple[_Step, ...] | None]] = {}


def finalize_row(spec: AggSpec, raw: RawRow) -> dict[str, Any]:
    """The aggregations of ``spec`` from one row's raw parts ``raw``, as Python values:
    ``{name: value}`` (None: null), equal to ``finalize(spec, raw)[name][0].as_py()``.
    Never raises for an empty window (its parts: zeros, or invalid)."""
    held = _STEPS.get(id(spec))
    if held is None or held[0] is not spec:
        if len(_STEPS) > 256:
            _STEPS.clear()
        held = _STEPS[id(spec)] = (spec, _steps(spec))
    steps = held[1]
    if steps is None:
        arrays = {k: (np.asarray([v]), np.asarray([ok])) for k, (v, ok) in raw.items()}
        return {k: col[0].as_py() for k, col in finalize(spec, arrays).items()}
    out: dict[str, Any] = {}
    for step in steps:
        kind = step.kind
        v, ok = raw[step.parts[0]]
        if not ok:
            if step.nullable:
                out[step.name] = None
                continue
            v = 0
        if kind == "int":
            out[step.name] = int(v)
        elif kind == "float":
            out[step.name] = float(v)
        elif kind == "fixed":
            out[step.name] = float(v) / float(10 ** step.scale)
        elif kind == "mean":
            n, n_ok = raw[step.parts[1]]
            if not n_ok or n == 0:
                out[step.name] = None
                continue
            mean = float(v) / float(n)
            out[step.name] = mean / float(10 ** step.scale) if step.scale else mean
        elif kind == "decimal":
            out[step.name] = Decimal(f"{int(v)}e-{step.scale}")
        else:  # f32: the float64 raw value rounded to the field's float32, as Arrow's cast
            out[step.name] = float(np.float32(v))
    return out


__all__ = ["ROW_FUNCTIONS", "RawRow", "finalize_row"]
