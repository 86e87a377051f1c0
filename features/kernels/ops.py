"""Transform ops: their exact semantics, and the plan a schema's features compile to.

Every derived feature (``features:`` in the schema) is its source field pushed through
its ``steps`` in order, then converted to its declared ``dtype``. Both backends (the
fused CuPy kernel and the NumPy program) implement the semantics below with the same
float64 operations in the same order, so they agree bit for bit (see
``docs/kernels.md``).

Values are float64 inside the program; null travels as a status, never as a value
(an input NaN cannot happen: the validator rejects NaN). Per row and feature the
status is *ok*, *null*, or *invalid at step k*. Once null or invalid, later steps
leave the row alone, except ``fill_null`` which turns null (from the input, a null
denominator or ``on_zero: null``) into its value; invalid is final.

============  ==============================================================  ==========================
op            result (x: the value entering the step)                         invalid when
============  ==============================================================  ==========================
fill_null v   v where null                                                    never
clip lo hi    lo if x < lo; hi if x > hi; else x (either bound optional)      never
log1p         ln(1 + x), portable algorithm (numpy_backend.log1p)             x <= -1
zscore m s    (x - m) / s                                                     result not finite
minmax lo hi  (x - lo) / (hi - lo), no clipping; hi - lo computed once        result not finite
bucketize bs  number of boundaries b with b <= x (0 .. len(bs))               never
ratio d z     x / d[row]; z where d == 0 (null if z is null); null if d null  result not finite
difference o  x - o[row]; null if x or o is null, or v with ``on_null: v``    result not finite
product o     x * o[row]; null if x or o is null, or v with ``on_null: v``    result not finite
time_since u  (reference - source) in unit u (ms s minutes hours days weeks)  never
hash_bucket   FNV-1a 64 of the UTF-8 string, mod n (hashing.py), on the host  never
one_hot       one 0/1 column per enum value ``<feature>__<value>``, host      never
cast t        int t: round half to even (-0 -> 0), then range check;        int: out of t's range;
              float32: round to nearest float32; bool: x != 0; float64: x     float32: overflow to inf
============  ==============================================================  ==========================

Every feature ends with an implicit ``cast`` to its declared dtype (reported as
``cast`` when it fails). ``time_since`` measures ``reference - source``: the
reference is the row's ``event_time`` when the schema declares one, otherwise the
``reference_time`` given to ``TransformProgram.run``; naive timestamps count as UTC,
dates as midnight UTC. Inputs: ints, floats and bools become float64 (ints beyond
2**53 round to the nearest float64), decimals the nearest float64.

Why one module of this size: the ops' semantics and the builder that lowers a schema's
features to a :class:`ProgramPlan` are the one contract both backends implement bit for
bit, kept side by side so a change to one is read with the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from itertools import pairwise
from typing import Final, Literal

from features.errors import CompileError
from features.schema.model import (
    FLOAT_KINDS,
    INTEGER_KINDS,
    NUMERIC_KINDS,
    Feature,
    Field,
    FieldType,
    Schema,
    Step,
    TypeKind,
)

#: Longest step list a feature may have (the status of a row is an int8: 2 + step).
MAX_STEPS: Final = 100
#: time_since units, in microseconds.
TIME_UNITS_US: Final[dict[str, float]] = {
    "ms": 1e3,
    "s": 1e6,
    "minutes": 6e7,
    "hours": 3.6e9,
    "days": 8.64e10,
    "weeks": 6.048e11,
}
OUTPUT_KINDS: Final = INTEGER_KINDS | FLOAT_KINDS | {TypeKind.BOOL}
#: Inclusive-exclusive range [lo, hi) of each integer dtype, as exact float64 powers of two.
INT_BOUNDS: Final[dict[TypeKind, tuple[float, float]]] = {
    TypeKind.INT8: (-(2.0**7), 2.0**7),
    TypeKind.INT16: (-(2.0**15), 2.0**15),
    TypeKind.INT32: (-(2.0**31), 2.0**31),
    TypeKind.INT64: (-(2.0**63), 2.0**63),
}
#: Row status codes: OK, NULL, then INVALID_BASE + step index.
OK: Final = 0
NULL: Final = 1
INVALID_BASE: Final = 2

ValueClass = Literal["number", "bool", "string", "enum", "temporal"]


def value_class(kind: TypeKind) -> ValueClass:
    """The class of values a field of ``kind`` feeds into the steps."""
    if kind in NUMERIC_KINDS:
        return "number"
    if kind in (TypeKind.DATE, TypeKind.TIMESTAMP):
        return "temporal"
    if kind is TypeKind.BOOL:
        return "bool"
    if kind is TypeKind.ENUM:
        return "enum"
    return "string"


# --- kernel inputs ----------------------------------------------------------------


@dataclass(frozen=True)
class NumberSlot:
    """A numeric or bool field as float64 (bool: 1.0/0.0)."""

    field: str


@dataclass(frozen=True)
class TimeSlot:
    """``reference - field`` in microseconds (float64); ``reference_field`` None means
    the run's ``reference_time``."""

    field: str
    reference_field: str | None


@dataclass(frozen=True)
class HashSlot:
    """``fnv1a64(fill_null(field, fill)) mod n`` as float64 (exact: n <= 2**53)."""

    field: str
    n: int
    fill: str | None = None


Slot = NumberSlot | TimeSlot | HashSlot


# --- kernel ops ---------------------------------------------------------------------


@dataclass(frozen=True)
class FillNull:
    step: int
    value: float


@dataclass(frozen=True)
class Clip:
    step: int
    lo: float | None
    hi: float | None


@dataclass(frozen=True)
class Log1p:
    step: int


@dataclass(frozen=True)
class ZScore:
    step: int
    mean: float
    std: float


@dataclass(frozen=True)
class MinMax:
    step: int
    lo: float
    span: float
    """``hi - lo``, rounded once in float64 when the plan is built."""


@dataclass(frozen=True)
class Bucketize:
    step: int
    boundaries: tuple[float, ...]


@dataclass(frozen=True)
class Ratio:
    step: int
    slot: int
    """Input slot of the denominator field."""
    on_zero: float | None


@dataclass(frozen=True)
class Combine:
    """``difference`` (``x - o``) or ``product`` (``x * o``) with the other column ``o``
    of the row: null where either is null, unless ``on_null`` (then that value, OK)."""

    step: int
    slot: int
    """Input slot of the other field."""
    op: Literal["difference", "product"]
    on_null: float | None


@dataclass(frozen=True)
class TimeSince:
    step: int
    divisor: float
    """Microseconds per unit; the slot already holds ``reference - source`` in µs."""
    unit: str


@dataclass(frozen=True)
class Cast:
    step: int
    kind: TypeKind
    implicit: bool = False
    """True for the conversion to the declared dtype that ends every feature."""
    exact: bool = False
    """True when the plan proves every value entering the cast is already an integer in
    range (bucketize, hash_bucket, int fields...): the cast changes nothing, so both
    backends skip it."""


KernelOp = FillNull | Clip | Log1p | ZScore | MinMax | Bucketize | Ratio | Combine | TimeSince | Cast

#: Ops that can make a row invalid (the others never do).
CAN_FAIL: Final = (Log1p, ZScore, MinMax, Ratio, Combine, Cast)


@dataclass(frozen=True)
class OneHot:
    """``one_hot`` of an enum field (after an optional string ``fill_null``)."""

    field: str
    values: tuple[str, ...]
    fill: str | None = None


@dataclass(frozen=True)
class OutputColumn:
    name: str
    dtype: FieldType


@dataclass(frozen=True)
class FeaturePlan:
    """How one feature is computed: a kernel input ``slot`` and ``ops`` (ending with
    the implicit cast), or a host-side ``one_hot``."""

    feature: Feature
    columns: tuple[OutputColumn, ...]
    slot: int | None = None
    ops: tuple[KernelOp, ...] = ()
    one_hot: OneHot | None = None

    @property
    def name(self) -> str:
        return self.feature.name

    @property
    def dtype(self) -> FieldType:
        return self.feature.dtype

    def op_at(self, step: int) -> KernelOp:
        """The kernel op of user step ``step`` (``len(steps)``: the implicit cast)."""
        for op in self.ops:
            if op.step == step:
                return op
        raise KeyError(step)


@dataclass(frozen=True)
class ProgramPlan:
    """Everything both backends need: input slots and one plan per feature.

    ``kernel`` lists the features computed by the fused kernel (all but one_hot), in
    declared order; kernel output row ``j`` belongs to ``features[kernel[j]]``.
    """

    schema_name: str
    schema_version: str
    slots: tuple[Slot, ...]
    features: tuple[FeaturePlan, ...]
    kernel: tuple[int, ...]

    @property
    def columns(self) -> tuple[OutputColumn, ...]:
        return tuple(c for f in self.features for c in f.columns)

    @property
    def source_fields(self) -> tuple[str, ...]:
        """Every input column the program reads, in first-use order."""
        names: list[str] = []
        for slot in self.slots:
            names.append(slot.field)
            if isinstance(slot, TimeSlot) and slot.reference_field is not None:
                names.append(slot.reference_field)
        for f in self.features:
            if f.one_hot is not None:
                names.append(f.one_hot.field)
        return tuple(dict.fromkeys(names))


# --- building the plan -----------------------------------------------------------------


class _Builder:
    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.fields = {f.name: f for f in schema.fields}
        self.slots: list[Slot] = []

    def error(self, feature: Feature, message: str) -> CompileError:
        return CompileError(f"feature {feature.name}: {message}", schema_name=self.schema.name,
                            field=feature.name)

    def slot(self, slot: Slot) -> int:
        if slot not in self.slots:
            self.slots.append(slot)
        return self.slots.index(slot)

    def number(self, feature: Feature, step: Step, name: str, *, allow_none: bool = False) -> float | None:
        try:
            raw = step.arg(name)
        except KeyError:
            if allow_none:
                return None
            raise self.error(feature, f"{step.op} needs argument {name!r}") from None
        if raw is None and allow_none:
            return None
        if isinstance(raw, bool) or not isinstance(raw, (int, float, Decimal)):
            raise self.error(feature, f"{step.op} {name} must be a number, got {raw!r}")
        value = float(raw)
        if not math.isfinite(value):
            raise self.error(feature, f"{step.op} {name} must be a finite float64, got {raw!r}")
        return value

    def feature(self, feature: Feature) -> FeaturePlan:
        if feature.dtype.kind not in OUTPUT_KINDS:
            raise self.error(feature, f"dtype must be an integer, float or bool type, got {feature.dtype}")
        if len(feature.steps) > MAX_STEPS:
            raise self.error(feature, f"at most {MAX_STEPS} steps are supported")
        if not feature.steps:
            raise self.error(feature, "needs at least one step")
        source = self.fields.get(feature.source)
        if source is None:
            raise self.error(feature, f"source field {feature.source!r} is not a field of the schema")
        cls: ValueClass = value_class(source.type.kind)
        fill: str | None = None
        slot: int | None = None
        ops: list[KernelOp] = []
        for k, step in enumerate(feature.steps):
            if step.op == "one_hot":
                if cls != "enum":
                    raise self.error(feature, f"one_hot needs an enum field, got {source.type}")
                if k != len(feature.steps) - 1:
                    raise self.error(feature, "one_hot must be the last step")
                names = self.schema.feature_columns(feature)
                columns = tuple(OutputColumn(name, feature.dtype) for name in names)
                return FeaturePlan(feature, columns, one_hot=OneHot(source.name, source.values, fill))
            if cls in ("string", "enum"):
                fill, slot = self._categorical_step(feature, source, step, fill)
                if slot is not None:
                    cls = "number"
                continue
            if cls == "temporal":
                if step.op != "time_since":
                    raise self.error(feature, f"{step.op} needs numeric input, got {source.type} "
                                              "(use time_since first)")
                unit = step.arg("unit")
                if not isinstance(unit, str) or unit not in TIME_UNITS_US:
                    raise self.error(feature, f"unknown time_since unit {unit!r} "
                                              f"(expected {', '.join(TIME_UNITS_US)})")
                ref = self.schema.event_time
                if ref is not None and value_class(self.fields[ref].type.kind) != "temporal":
                    raise self.error(feature, f"event_time {ref!r} is not a date or timestamp field")
                slot = self.slot(TimeSlot(source.name, ref))
                ops.append(TimeSince(k, TIME_UNITS_US[unit], unit))
                cls = "number"
                continue
            if slot is None:
                slot = self.slot(NumberSlot(source.name))
            ops.append(self._numeric_step(feature, step, k, cls))
            if step.op == "cast":
                cls = "bool" if ops[-1].kind is TypeKind.BOOL else "number"  # type: ignore[union-attr]
            elif step.op != "fill_null":
                cls = "number"
        if cls not in ("number", "bool") or slot is None:
            raise self.error(feature, f"the steps end with a {cls} value; add hash_bucket, one_hot or "
                                      "time_since")
        ops.append(Cast(len(feature.steps), feature.dtype.kind, implicit=True))
        ops = _mark_exact_casts(ops, self._known_range(self.slots[slot]))
        return FeaturePlan(feature, (OutputColumn(feature.name, feature.dtype),), slot=slot, ops=tuple(ops))

    def _known_range(self, slot: Slot) -> tuple[float, float] | None:
        """The integer range the slot's values are known to lie in, if any."""
        if isinstance(slot, HashSlot):
            return 0.0, float(slot.n - 1)
        if isinstance(slot, NumberSlot):
            kind = self.fields[slot.field].type.kind
            if kind is TypeKind.BOOL:
                return 0.0, 1.0
            if kind in INT_BOUNDS and kind is not TypeKind.INT64:  # int64 may round to 2**63
                lo, hi = INT_BOUNDS[kind]
                return lo, hi - 1.0
        return None

    def _categorical_step(
        self, feature: Feature, source: Field, step: Step, fill: str | None,
    ) -> tuple[str | None, int | None]:
        if step.op == "fill_null":
            value = step.arg("value")
            if not isinstance(value, str):
                raise self.error(feature, f"fill_null on {source.type} needs a string value, got {value!r}")
            if source.type.kind is TypeKind.ENUM and value not in source.values:
                raise self.error(feature, f"fill_null value {value!r} is not one of the enum values")
            return (value if fill is None else fill), None
        if step.op == "hash_bucket":
            n = step.arg("n")
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 2**53:
                raise self.error(feature, f"hash_bucket n must be an integer in [1, 2**53], got {n!r}")
            return fill, self.slot(HashSlot(source.name, n, fill))
        raise self.error(feature, f"{step.op} needs numeric input, got {source.type} "
                                  "(use hash_bucket or one_hot first)")

    def _numeric_step(self, feature: Feature, step: Step, k: int, cls: ValueClass) -> KernelOp:
        op = step.op
        if cls == "bool" and op not in ("fill_null", "cast"):
            raise self.error(feature, f"{op} needs numeric input, got bool (cast it first)")
        if op == "fill_null":
            value = step.arg("value")
            if isinstance(value, bool):
                return FillNull(k, 1.0 if value else 0.0)
            number = self.number(feature, step, "value")
            assert number is not None
            return FillNull(k, number)
        if op == "clip":
            lo = self.number(feature, step, "lo", allow_none=True)
            hi = self.number(feature, step, "hi", allow_none=True)
            if lo is None and hi is None:
                raise self.error(feature, "clip needs lo or hi")
            if lo is not None and hi is not None and lo > hi:
                raise self.error(feature, f"clip lo {lo!r} is greater than hi {hi!r}")
            return Clip(k, lo, hi)
        if op == "log1p":
            return Log1p(k)
        if op == "zscore":
            mean = self.number(feature, step, "mean")
            std = self.number(feature, step, "std")
            assert mean is not None and std is not None
            return ZScore(k, mean, std)
        if op == "minmax":
            lo = self.number(feature, step, "lo")
            hi = self.number(feature, step, "hi")
            assert lo is not None and hi is not None
            if not lo < hi:
                raise self.error(feature, f"minmax lo {lo!r} must be less than hi {hi!r}")
            return MinMax(k, lo, hi - lo)
        if op == "bucketize":
            raw = step.arg("boundaries")
            items = raw if isinstance(raw, tuple) else (raw,)
            bounds: list[float] = []
            for item in items:
                if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
                    raise self.error(feature, f"bucketize boundaries must be finite numbers, got {item!r}")
                bounds.append(float(item))
            if not bounds or any(b >= c for b, c in pairwise(bounds)):
                raise self.error(feature, "bucketize boundaries must be non-empty and strictly increasing")
            return Bucketize(k, tuple(bounds))
        if op == "ratio":
            den = step.arg("denominator")
            den_field = self.fields.get(den) if isinstance(den, str) else None
            if den_field is None or value_class(den_field.type.kind) not in ("number", "bool"):
                raise self.error(feature, f"ratio denominator {den!r} must be a numeric field of the schema")
            on_zero = self.number(feature, step, "on_zero", allow_none=True)
            return Ratio(k, self.slot(NumberSlot(den_field.name)), on_zero)
        if op in ("difference", "product"):
            other = step.arg("other")
            other_field = self.fields.get(other) if isinstance(other, str) else None
            if other_field is None or value_class(other_field.type.kind) not in ("number", "bool"):
                raise self.error(feature, f"{op} other {other!r} must be a numeric field of the schema")
            on_null = self.number(feature, step, "on_null", allow_none=True)
            return Combine(k, self.slot(NumberSlot(other_field.name)), op, on_null)
        if op == "cast":
            raw_kind = step.arg("dtype")  # the parser stores the dtype's text: "int32"
            try:
                target: TypeKind | None = TypeKind(str(raw_kind))
            except ValueError:
                target = None
            if target not in OUTPUT_KINDS:
                raise self.error(feature, f"cast needs an integer, float or bool dtype, got {raw_kind!r}")
            assert target is not None
            return Cast(k, target)
        raise self.error(feature, f"{op} needs string or enum input, got a {cls} value")


def _is_integer(value: float) -> bool:
    """An integral float that is not -0.0 (an int cast would turn -0.0 into 0.0)."""
    return value.is_integer() and not (value == 0.0 and math.copysign(1.0, value) < 0)


def _mark_exact_casts(ops: list[KernelOp], known: tuple[float, float] | None) -> list[KernelOp]:
    """Mark the casts that cannot change a value (``Cast.exact``), following the range
    of integers the values are known to lie in (None: unknown) through the ops."""
    out: list[KernelOp] = []
    for op in ops:
        if isinstance(op, FillNull):
            known = None if known is None or not _is_integer(op.value) else (
                min(known[0], op.value), max(known[1], op.value))
        elif isinstance(op, Clip):
            bounds_ok = all(b is None or _is_integer(b) for b in (op.lo, op.hi))
            if known is not None and bounds_ok:
                def clamp(v: float, lo: float | None = op.lo, hi: float | None = op.hi) -> float:
                    v = v if lo is None else max(v, lo)
                    return v if hi is None else min(v, hi)
                known = (clamp(known[0]), clamp(known[1]))
            else:
                known = None
        elif isinstance(op, Bucketize):
            known = (0.0, float(len(op.boundaries)))
        elif isinstance(op, Cast):
            exact = False
            if op.kind in INT_BOUNDS:
                lo, hi = INT_BOUNDS[op.kind]
                exact = known is not None and lo <= known[0] and known[1] < hi
                known = (lo, hi - 1.0) if known is None else (max(known[0], lo), min(known[1], hi - 1.0))
            elif op.kind is TypeKind.BOOL:
                exact = known is not None and 0.0 <= known[0] and known[1] <= 1.0
                known = (0.0, 1.0)
            elif op.kind is TypeKind.FLOAT32:
                exact = known is not None and -(2.0**24) <= known[0] and known[1] <= 2.0**24
                known = known if exact else None
            else:
                exact = True  # float64: nothing to do
            if exact:
                op = Cast(op.step, op.kind, op.implicit, exact=True)
        else:
            known = None
        out.append(op)
    return out


def plan_program(schema: Schema) -> ProgramPlan:
    """Compile the ``features`` of ``schema`` into a :class:`ProgramPlan`.

    Pure and deterministic. Raises CompileError (``schema_name``, ``field`` = the
    feature) for a plan no backend can run: an unknown source field, an op on the
    wrong kind of value, non-finite constants, a ``hash_bucket`` n beyond 2**53, an
    output dtype that is not int/float/bool, or two output columns with one name.
    """
    builder = _Builder(schema)
    plans = tuple(builder.feature(f) for f in schema.features)
    seen: dict[str, str] = {}
    for plan in plans:
        for col in plan.columns:
            if col.name in seen:
                raise CompileError(f"feature {plan.name}: output column {col.name!r} is also produced by "
                                   f"feature {seen[col.name]}", schema_name=schema.name, field=plan.name)
            seen[col.name] = plan.name
    kernel = tuple(i for i, p in enumerate(plans) if p.slot is not None)
    return ProgramPlan(schema.name, schema.version_str, tuple(builder.slots), plans, kernel)


# --- reject messages ---------------------------------------------------------------------


def invalid_message(plan: FeaturePlan, op: KernelOp, got: float, denominator: float | None = None) -> str:
    """The field-level message for a row made invalid by ``op``.

    ``got`` is the value entering the op (printed with ``repr``); ratio also prints the
    denominator. Example: ``feature income_log violates transform log1p: got -2.0,
    expected a value > -1``.
    """
    head = f"feature {plan.name} violates transform"
    if isinstance(op, Log1p):
        return f"{head} log1p: got {got!r}, expected a value > -1"
    if isinstance(op, Ratio):
        return f"{head} ratio: got {got!r} / {denominator!r}, expected a finite ratio"
    if isinstance(op, Combine):
        sign = "-" if op.op == "difference" else "*"
        return f"{head} {op.op}: got {got!r} {sign} {denominator!r}, expected a finite result"
    if isinstance(op, Cast):
        name = op.kind.value
        if op.kind in INT_BOUNDS:
            lo, hi = INT_BOUNDS[op.kind]
            return (f"{head} cast: got {got!r}, expected a value that rounds into {name} range "
                    f"[{int(lo)}, {int(hi) - 1}]")
        return f"{head} cast: got {got!r}, expected a value within {name} range (|x| <= 3.4028235e+38)"
    name = "zscore" if isinstance(op, ZScore) else "minmax"
    return f"{head} {name}: got {got!r}, expected a finite result"


def op_name(op: KernelOp) -> str:
    """The YAML name of a kernel op."""
    if isinstance(op, Combine):
        return op.op
    return {
        FillNull: "fill_null", Clip: "clip", Log1p: "log1p", ZScore: "zscore", MinMax: "minmax",
        Bucketize: "bucketize", Ratio: "ratio", TimeSince: "time_since", Cast: "cast",
    }[type(op)]


__all__ = [
    "CAN_FAIL",
    "INT_BOUNDS",
    "INVALID_BASE",
    "MAX_STEPS",
    "NULL",
    "OK",
    "TIME_UNITS_US",
    "Bucketize",
    "Cast",
    "Clip",
    "Combine",
    "FeaturePlan",
    "FillNull",
    "HashSlot",
    "KernelOp",
    "Log1p",
    "MinMax",
    "NumberSlot",
    "OneHot",
    "OutputColumn",
    "ProgramPlan",
    "Ratio",
    "Slot",
    "TimeSince",
    "TimeSlot",
    "ZScore",
    "invalid_message",
    "op_name",
    "plan_program",
]
