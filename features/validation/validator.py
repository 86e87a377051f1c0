"""The compiled validator: ``validate(data, compiled) -> ValidationResult``.

It executes ``compiled.rules`` (the one rule list, see ``features.compile.rules``)
over a whole batch at once: every rule yields a failing mask, computed with
``pyarrow.compute`` or, for the commonest rules, with NumPy on the Arrow buffers
(``features.validation.masks``, held equal to the Arrow expressions by the tests); only
the failing rows (a few percent) are rendered into messages. No Python code runs per
row, except to read a list of dicts (which is Python objects already) or a column of
decoded JSON values of mixed kinds (:mod:`features.validation.values`). Large batches
are checked field by field on a small thread pool (Arrow and NumPy release the GIL).

Per field, in order:

1. **column**: looked up by name (extra input columns are ignored). A missing column
   is filled with the default; else, for a ``required`` field, every row gets a
   ``missing`` reject (``got no column, expected a column <name>``); else it is all null.
   (In a list of dicts a key absent from a record counts as a missing column for that
   record only; its ``missing`` reject says ``got no key, expected a key <name>``.)
2. **type**: exact conversion to the declared Arrow type (``features.validation.convert``),
   after the field's ``null_values`` markers (and, with ``empty_as_null``, empty strings)
   in string input are read as null. A value that does not convert is a ``type`` reject
   and is not checked further; text refused for want of ``accept_strings`` says so.
3. **default**: nulls (markers included) become the default.
4. **not_null**, **nan**, **min**, **max**, **min_length**, **max_length**, **pattern**,
   **enum**: each is evaluated on every remaining row; nulls pass every rule but
   ``not_null``; NaN passes every rule but ``nan``.

A row with several problems gets one reject row per problem; a row with any reject is
left out of ``valid``. Counts are conserved: ``valid.num_rows + rejected_rows == rows``.

Bounds are compared in the field's own type: a decimal bound with more digits than the
field's scale is rounded inward (``min`` up, ``max`` down), which decides the same rows
as the exact comparison; float fields compare in float64 with the bound rounded to the
nearest float64 (as PostgreSQL compares ``real``/``double precision`` with a numeric
literal); date/timestamp bounds are ISO strings (a naive bound on a zoned field is read
in the field's zone).

Why one module of this size: the one validation pass (conversion, every compiled rule,
the reject rows and their counts) over a batch; its stages share the row index that keeps
``valid + rejected == rows``, so they stay in one place.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Context, Decimal
from typing import Any, Literal, TypeAlias
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.compile.rejects import REJECT_SCHEMA
from features.compile.rules import ReasonCode, Rule
from features.errors import CompileError, SourceError
from features.schema.model import FLOAT_KINDS, INTEGER_KINDS, Field, TypeKind
from features.validation.convert import ABSENT, INT_RANGES, Converted, convert, convert_pylist, render
from features.validation.masks import (
    compile_fixed_width,
    decimal_words,
    filter_rows,
    fixed_values,
    fixed_width_pattern,
    string_lengths,
    valid_mask,
)
from features.validation.result import ValidationResult
from features.validation.values import is_json_values, json_values

Index = npt.NDArray[np.int64]
BoolMask = npt.NDArray[np.bool_]
Data: TypeAlias = pa.RecordBatch | pa.Table | Sequence[Mapping[str, Any]]

_UNITS_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000}
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_WIDE = Context(prec=100)


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class _Chunk:
    """Reject rows of one rule: input rows, messages and rendered values."""

    order: int
    rule: Rule
    rows: Index
    message: pa.Array
    value: pa.Array


Evaluate = Callable[[pa.Array], pa.Array | BoolMask | None]
Describe = Callable[[pa.Array], tuple[pa.Array, pa.Array]]


@dataclass(frozen=True)
class _Check:
    """One value rule, ready to run: ``evaluate(values)`` is a boolean Arrow array
    or NumPy mask whose true entries fail (null entries pass), or None when nothing
    can fail; ``describe(failing_values)`` gives (messages, rendered values)."""

    rule: Rule
    order: int
    evaluate: Evaluate
    describe: Describe


@dataclass(frozen=True)
class _FieldPlan:
    field: Field
    target: pa.DataType
    type_order: int
    type_rule: Rule
    missing: tuple[int, Rule] | None
    default: pa.Array | None
    checks: tuple[_Check, ...]


@dataclass(frozen=True)
class _Plan:
    arrow_schema: pa.Schema
    fields: tuple[_FieldPlan, ...]
    heavy_first: tuple[int, ...]
    """Field indexes, most expensive to check first (regex, enum, other strings)."""


def _check_cost(fp: _FieldPlan) -> int:
    cost = 1
    for check in fp.checks:
        if check.rule.kind is ReasonCode.PATTERN:
            cost += 10 if compile_fixed_width(str(check.rule.value)) is not None else 40
        elif check.rule.kind is ReasonCode.ENUM:
            cost += 10
    if pa.types.is_string(fp.target):
        cost += 2
    return cost


def _copy_cost(t: pa.DataType) -> int:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return 3
    return 2 if pa.types.is_decimal(t) else 1


_PLANS: weakref.WeakKeyDictionary[CompiledSchema, _Plan] = weakref.WeakKeyDictionary()


def _plan(compiled: CompiledSchema) -> _Plan:
    plan = _PLANS.get(compiled)
    if plan is None:
        plan = _build_plan(compiled)
        _PLANS[compiled] = plan
    return plan


def _build_plan(compiled: CompiledSchema) -> _Plan:
    schema = compiled.schema
    arrow_schema = compiled.arrow_schema
    by_field: dict[str, list[tuple[int, Rule]]] = {}
    for order, rule in enumerate(compiled.rules):
        by_field.setdefault(rule.field, []).append((order, rule))
    plans = []
    for f in schema.fields:
        target = arrow_schema.field(f.name).type
        rules = by_field.get(f.name, [])
        missing = next(((o, r) for o, r in rules if r.kind is ReasonCode.MISSING), None)
        type_order, type_rule = next(
            ((o, r) for o, r in rules if r.kind is ReasonCode.TYPE),
            (-1, Rule(f.name, ReasonCode.TYPE, str(f.type))),
        )
        checks = tuple(
            _make_check(f, target, order, rule)
            for order, rule in rules
            if rule.kind not in (ReasonCode.MISSING, ReasonCode.TYPE)
        )
        default = _default_array(f, target) if f.constraints.has_default else None
        plans.append(_FieldPlan(f, target, type_order, type_rule, missing, default, checks))
    heavy_first = tuple(sorted(range(len(plans)), key=lambda i: -_check_cost(plans[i])))
    return _Plan(arrow_schema, tuple(plans), heavy_first)


def _default_array(f: Field, target: pa.DataType) -> pa.Array | None:
    value = f.constraints.default
    if value is None:
        return None
    c = convert_pylist([value], f, target, accept_strings=True)
    if c.failed or c.values.null_count:
        raise CompileError(f"default {value!r} is not a valid {f.type}", field=f.name)
    return c.values


# --------------------------------------------------------------------------- checks


def _prefix(f: Field, kind: ReasonCode) -> str:
    return f"field {f.name} violates constraint {kind.value}: "


def _join(prefix: str, shown: pa.Array, suffix: str) -> pa.Array:
    return pc.binary_join_element_wise(prefix, shown, suffix, "")


def _constant(n: int, text: str | None) -> pa.Array:
    if text is None:
        return pa.nulls(n, pa.string())
    return pc.fill_null(pa.nulls(n, pa.string()), text)


def _make_check(f: Field, target: pa.DataType, order: int, rule: Rule) -> _Check:
    kind = rule.kind
    prefix = _prefix(f, kind)
    if kind is ReasonCode.NOT_NULL:
        msg = prefix + "got null, expected a value"

        def evaluate_not_null(v: pa.Array) -> BoolMask | None:
            return ~valid_mask(v) if v.null_count else None

        return _Check(rule, order, evaluate_not_null,
                      lambda v: (_constant(len(v), msg), _constant(len(v), None)))
    if kind is ReasonCode.NAN and f.type.items is not None:
        return _list_nan_check(f, order, rule)
    if kind is ReasonCode.NAN:
        msg = prefix + "got NaN, expected a number"
        return _Check(rule, order, pc.is_nan, lambda v: (_constant(len(v), msg), _constant(len(v), "NaN")))
    if kind in (ReasonCode.MIN, ReasonCode.MAX):
        return _bound_check(f, target, order, rule)
    if kind in (ReasonCode.MIN_LENGTH, ReasonCode.MAX_LENGTH):
        limit = int(rule.value)  # type: ignore[arg-type]
        compare = pc.less if kind is ReasonCode.MIN_LENGTH else pc.greater
        op = ">=" if kind is ReasonCode.MIN_LENGTH else "<="

        def describe_length(v: pa.Array) -> tuple[pa.Array, pa.Array]:
            lengths = pc.cast(pc.utf8_length(v), pa.string())
            return _join(prefix + "got length ", lengths, f", expected {op} {limit}"), v

        np_compare = np.less if kind is ReasonCode.MIN_LENGTH else np.greater

        def evaluate_length(v: pa.Array) -> pa.Array | BoolMask:
            lengths = string_lengths(v)
            if lengths is None:
                return compare(pc.utf8_length(v), limit)
            fail = np_compare(lengths, limit)
            return fail & valid_mask(v) if v.null_count else fail

        return _Check(rule, order, evaluate_length, describe_length)
    if kind is ReasonCode.PATTERN:
        regex = f"^(?:{rule.value})$"
        suffix = f", expected a full match of {rule.value}"
        runs = compile_fixed_width(str(rule.value))

        def evaluate_pattern(v: pa.Array) -> pa.Array | BoolMask:
            if runs is not None:
                fast = fixed_width_pattern(v, runs)
                if fast is not None:
                    return fast
            return pc.invert(pc.match_substring_regex(v, regex))

        return _Check(rule, order, evaluate_pattern, lambda v: _describe_value(v, prefix + "got ", suffix))
    if kind is ReasonCode.ENUM:
        values = tuple(rule.value or ())  # type: ignore[arg-type]
        value_set = pa.array(values, pa.string())
        suffix = ", expected one of " + ", ".join(values)

        def evaluate_enum(v: pa.Array) -> pa.Array:
            fail = pc.invert(pc.is_in(v, value_set=value_set))
            return pc.and_(fail, pc.is_valid(v)) if v.null_count else fail

        return _Check(rule, order, evaluate_enum, lambda v: _describe_value(v, prefix + "got ", suffix))
    raise CompileError(f"rule {rule.id}: the validator has no check for {kind.value!r}", field=f.name)


def _list_nan_check(f: Field, order: int, rule: Rule) -> _Check:
    """``nan`` of a list of floats: a row fails when any element is NaN (one ``is_nan``
    over the flattened elements, summed per row by the list offsets)."""
    prefix = _prefix(f, ReasonCode.NAN) + "got "

    def evaluate(v: pa.Array) -> BoolMask | None:
        lst = v if pa.types.is_list(v.type) else v.cast(pa.list_(v.type.value_type))
        elements = lst.flatten()
        if not len(elements):
            return None
        nan = np.asarray(pc.fill_null(pc.is_nan(elements), False).to_numpy(zero_copy_only=False))
        if not nan.any():
            return None
        lengths = np.asarray(pc.fill_null(pc.list_value_length(lst), 0).to_numpy(zero_copy_only=False))
        lengths = np.where(valid_mask(lst), lengths, 0)
        counts = np.add.reduceat(np.concatenate([nan, [False]]).astype(np.int64),
                                 np.concatenate([[0], np.cumsum(lengths)[:-1]]))
        return (counts > 0) & (lengths > 0)

    def describe(v: pa.Array) -> tuple[pa.Array, pa.Array]:
        return _describe_value(v, prefix, " (a NaN element), expected numbers")

    return _Check(rule, order, evaluate, describe)


def _describe_value(v: pa.Array, prefix: str, suffix: str) -> tuple[pa.Array, pa.Array]:
    plain, shown = render(v)
    return _join(prefix, shown, suffix), plain


def _bound_check(f: Field, target: pa.DataType, order: int, rule: Rule) -> _Check:
    is_min = rule.kind is ReasonCode.MIN
    op = ">=" if is_min else "<="
    suffix = f", expected {op} {_bound_text(rule.value)}"
    prefix = _prefix(f, rule.kind) + "got "
    bound, trivial = _bound_scalar(f, target, rule.value, is_min)

    def describe(v: pa.Array) -> tuple[pa.Array, pa.Array]:
        return _describe_value(v, prefix, suffix)

    if trivial == "none":
        return _Check(rule, order, lambda v: None, describe)
    if trivial == "all":
        return _Check(rule, order, pc.is_valid, describe)
    compare = pc.less if is_min else pc.greater
    if f.type.kind is TypeKind.DECIMAL:
        assert bound is not None
        unscaled = int(bound.as_py().scaleb(target.scale))
        np_compare = np.less if is_min else np.greater

        def evaluate_decimal(v: pa.Array) -> pa.Array | BoolMask:
            words = decimal_words(v)
            if words is None:
                return compare(v, bound)
            fail = np_compare(words, unscaled)
            return fail & valid_mask(v) if v.null_count else fail

        return _Check(rule, order, evaluate_decimal, describe)
    assert bound is not None
    np_bound = _numpy_bound(f, bound)
    np_less_or_greater = np.less if is_min else np.greater

    def evaluate_bound(v: pa.Array) -> pa.Array | BoolMask:
        values = fixed_values(v) if np_bound is not None else None
        if values is None or np_bound is None:
            if f.type.kind is TypeKind.FLOAT32:
                return compare(pc.cast(v, pa.float64()), bound)
            return compare(v, bound)
        fail = np_less_or_greater(values, np_bound)  # NaN compares False: only the nan rule fails it
        return fail & valid_mask(v) if v.null_count else fail

    return _Check(rule, order, evaluate_bound, describe)


def _numpy_bound(f: Field, bound: pa.Scalar) -> np.generic | None:
    """The bound as a NumPy scalar of a type that compares exactly with the column's
    storage (float32 columns compare in float64, like the Arrow expression)."""
    kind = f.type.kind
    if kind in INTEGER_KINDS:
        return np.int64(bound.as_py())
    if kind in FLOAT_KINDS:
        return np.float64(bound.as_py())
    if kind is TypeKind.DATE:
        return np.int32(bound.cast(pa.int32()).as_py())
    if kind is TypeKind.TIMESTAMP:
        return np.int64(bound.cast(pa.int64()).as_py())
    return None


def _bound_text(value: object) -> str:
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _bound_scalar(
    f: Field, target: pa.DataType, value: object, is_min: bool
) -> tuple[pa.Scalar | None, Literal["all", "none"] | None]:
    """The scalar to compare against, or which rows trivially fail (``all`` non-null
    rows, or ``none``) when the bound lies outside the type's range."""
    kind = f.type.kind

    def outside(below: bool) -> tuple[None, Literal["all", "none"]]:
        # a min below the type's range (or a max above it) passes everything
        return None, ("none" if below == is_min else "all")

    try:
        if kind in INTEGER_KINDS:
            lo, hi = INT_RANGES[kind]
            exact = Decimal(value)  # type: ignore[arg-type]
            b = int(exact.to_integral_value(ROUND_CEILING if is_min else ROUND_FLOOR))
            if b < lo:
                return outside(below=True)
            if b > hi:
                return outside(below=False)
            return pa.scalar(b, target), None
        if kind in FLOAT_KINDS:
            return pa.scalar(float(value), pa.float64()), None  # type: ignore[arg-type]
        if kind is TypeKind.DECIMAL:
            p, s = target.precision, target.scale
            q = Decimal(value).quantize(  # type: ignore[arg-type]
                Decimal(1).scaleb(-s), rounding=ROUND_CEILING if is_min else ROUND_FLOOR,
                context=_WIDE,  # the default 28 digits cannot hold a decimal(38, s) bound
            )
            limit = Decimal(10) ** (p - s)
            if q <= -limit:
                return outside(below=True)
            if q >= limit:
                return outside(below=False)
            return pa.scalar(q, target), None
        if kind is TypeKind.DATE:
            d = value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
            if isinstance(d, dt.datetime):
                d = d.date()
            return pa.scalar(d, pa.date32()), None
        if kind is TypeKind.TIMESTAMP:
            return _timestamp_bound(f, target, value, is_min), None
        if kind in (TypeKind.STRING, TypeKind.ENUM):
            return pa.scalar(str(value), pa.string()), None
    except (ValueError, TypeError, ArithmeticError, pa.ArrowInvalid) as exc:
        raise CompileError(f"bound {value!r} is not a valid {f.type}: {exc}", field=f.name) from exc
    raise CompileError(f"{f.type} fields have no min/max", field=f.name)


def _timestamp_bound(f: Field, target: pa.DataType, value: object, is_min: bool) -> pa.Scalar:
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, dt.date):
        moment = dt.datetime(value.year, value.month, value.day)
    else:
        moment = dt.datetime.fromisoformat(str(value))
    if target.tz is not None:
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=ZoneInfo(target.tz))
        micros = (moment - _EPOCH_UTC) // dt.timedelta(microseconds=1)
    else:
        if moment.tzinfo is not None:
            raise ValueError("a zoned bound on a naive timestamp field")
        micros = (moment - _EPOCH_NAIVE) // dt.timedelta(microseconds=1)
    per = 1_000_000 // _UNITS_PER_SECOND[target.unit]
    units = -((-micros) // per) if is_min else micros // per
    return pa.scalar(units, target)


# --------------------------------------------------------------------------- input


_TEMPORAL_KINDS = frozenset({TypeKind.DATE, TypeKind.TIMESTAMP})


class _Input:
    """Columns of the input by name: Arrow arrays, or Python values of a list of dicts."""

    def __init__(self, data: Data, *, json_text: bool = False) -> None:
        #: columns read from JSON (``validate(..., json_text=True)``): ISO text is what a
        #: date or timestamp is there, as in a list of dicts
        self.json_text = json_text
        #: decoded JSON objects (a list of dicts, or a batch of them read from JSON): a
        #: field's absent input is a key, not a column
        self.records = json_text or not isinstance(data, pa.RecordBatch | pa.Table)
        self.table: pa.RecordBatch | pa.Table | None = None
        self.rows: Sequence[Mapping[str, Any]] | None = None
        if isinstance(data, pa.RecordBatch | pa.Table):
            self.table = data
            self.num_rows = data.num_rows
            names = data.schema.names
            self.index = {name: i for i, name in enumerate(names)}
            dupes = {name for name in names if names.count(name) > 1}
            self.duplicates = frozenset(dupes)
        elif isinstance(data, Sequence) and not isinstance(data, str | bytes):
            for i, row in enumerate(data):
                if not isinstance(row, Mapping):
                    raise TypeError(f"validate: row {i} is a {type(row).__name__}, not a mapping")
            self.rows = data
            self.num_rows = len(data)
        else:
            raise TypeError(
                "validate: expected a pyarrow RecordBatch, Table or a list of dicts, "
                f"got {type(data).__name__}"
            )

    def column(self, fp: _FieldPlan) -> tuple[Converted | None, Index | None]:
        """(converted column or None when absent, rows where the key is absent)."""
        name = fp.field.name
        if self.table is not None:
            if name in self.duplicates:
                raise SourceError(f"input has several columns named {name!r}", field=name)
            i = self.index.get(name)
            if i is None:
                return None, None
            col = self.table.column(i)
            if isinstance(col, pa.ChunkedArray):
                col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            text_ok = True if self.json_text and fp.field.type.kind in _TEMPORAL_KINDS else None
            if is_json_values(self.table.schema.field(i)):  # decoded JSON values of mixed kinds
                values, absent = json_values(col)
                return convert_pylist(values, fp.field, fp.target, accept_strings=text_ok), absent
            return convert(col, fp.field, fp.target, accept_strings=text_ok), None
        assert self.rows is not None
        values = [row.get(name, ABSENT) for row in self.rows]
        absent = np.flatnonzero(np.fromiter((v is ABSENT for v in values), np.bool_, len(values)))
        if len(absent) == len(values) and len(values) > 0:
            return None, None
        if len(absent):
            for i in absent:
                values[i] = None
        # JSON has no date or time type: in decoded objects those are ISO 8601 text.
        text_ok = True if fp.field.type.kind in _TEMPORAL_KINDS else None
        return convert_pylist(values, fp.field, fp.target, accept_strings=text_ok), absent.astype(np.int64)


# --------------------------------------------------------------------------- validate


#: Batches smaller than this are validated on the calling thread only.
PARALLEL_MIN_ROWS = 65_536

_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_executor_pid = 0


def _pool() -> ThreadPoolExecutor | None:
    """A shared pool of ``pa.cpu_count()`` threads (None on one CPU). Arrow compute and
    NumPy release the GIL, so fields are checked, and columns filtered, in parallel.
    A forked child (whose copy of the pool has no threads) gets a pool of its own."""
    global _executor, _executor_pid
    if pa.cpu_count() <= 1:
        return None
    with _executor_lock:
        if _executor is None or _executor_pid != os.getpid():
            _executor = ThreadPoolExecutor(pa.cpu_count(), thread_name_prefix="featureline-validate")
            _executor_pid = os.getpid()
        return _executor


def validate(data: Data, compiled: CompiledSchema, *, json_text: bool = False) -> ValidationResult:
    """Validate ``data`` against ``compiled``; never raises for bad rows.

    ``data``: a ``pa.RecordBatch``, a ``pa.Table`` or a list of dicts (decoded JSON).
    Columns are matched by name; extra columns are ignored; a column of JSON texts
    (:mod:`features.validation.values`) is converted like a list of dicts' values.
    ``json_text``: the table's rows are JSON records (the stream's and HTTP ingest's
    decodes), so ISO text is taken for date and timestamp fields whatever their
    ``accept_strings`` and a field's absent input is a key (``got no key``), as for a list
    of dicts. Returns a
    :class:`ValidationResult` whose ``valid`` batch has exactly
    ``compiled.arrow_schema``. Raises TypeError for another kind of ``data`` and
    SourceError when two input columns share a declared field's name.

    Thread-safe. Batches of at least :data:`PARALLEL_MIN_ROWS` rows are checked on
    a shared thread pool of ``pyarrow.cpu_count()`` threads (set it with
    ``pyarrow.set_cpu_count``; 1 keeps everything on the calling thread).
    """
    plan = _plan(compiled)
    source = _Input(data, json_text=json_text)
    n = source.num_rows
    pool = _pool() if n >= PARALLEL_MIN_ROWS and source.table is not None else None
    if pool is None:
        outcomes = [_validate_field(fp, source, n) for fp in plan.fields]
    else:
        # longest tasks first, so the threads finish together (the order of results is kept)
        futures = {i: pool.submit(_validate_field, plan.fields[i], source, n) for i in plan.heavy_first}
        outcomes = [futures[i].result() for i in range(len(plan.fields))]
    rejected = np.zeros(n, dtype=np.bool_)
    chunks: list[_Chunk] = []
    for _, field_chunks in outcomes:
        for chunk in field_chunks:
            rejected[chunk.rows] = True
        chunks += field_chunks
    columns = [values for values, _ in outcomes]
    if chunks:
        keep = ~rejected
        mask = pa.array(keep)
        if pool is None:
            columns = [filter_rows(c, keep, mask) for c in columns]
        else:
            order = sorted(range(len(columns)), key=lambda i: -_copy_cost(columns[i].type))
            done = {i: pool.submit(filter_rows, columns[i], keep, mask) for i in order}
            columns = [done[i].result() for i in range(len(columns))]
        index = np.flatnonzero(keep).astype(np.int64)
    else:
        index = np.arange(n, dtype=np.int64)
    valid = pa.RecordBatch.from_arrays(columns, schema=plan.arrow_schema)
    return ValidationResult(
        valid=valid, rejects=_rejects_table(chunks), valid_row_index=pa.array(index, pa.int64()),
        input_rows=n,
    )


def _validate_field(fp: _FieldPlan, source: _Input, n: int) -> tuple[pa.Array, list[_Chunk]]:
    f = fp.field
    chunks: list[_Chunk] = []
    converted, absent = source.column(fp)
    excluded: npt.NDArray[np.bool_] | None = None
    if converted is None:  # the column is missing
        if fp.default is not None:
            values = fp.default.take(pa.array(np.zeros(n, dtype=np.int64)))
        elif fp.missing is not None:
            chunks.append(_missing_chunk(fp, np.arange(n, dtype=np.int64), records=source.records))
            return pa.nulls(n, fp.target), chunks
        else:
            values = pa.nulls(n, fp.target)
    else:
        values = converted.values
        if converted.failed:
            excluded = np.zeros(n, dtype=np.bool_)
            excluded[converted.fail_rows] = True
            shown = converted.fail_shown
            message = _join(_prefix(f, ReasonCode.TYPE) + "got ", shown, f", expected {f.type}")
            if converted.fail_hints is not None:  # e.g. TEXT_HINT: text where accept_strings is off
                message = pc.binary_join_element_wise(message, pc.fill_null(converted.fail_hints, ""), "")
            chunks.append(
                _Chunk(fp.type_order, fp.type_rule, converted.fail_rows, message,
                       converted.fail_values)
            )
        if absent is not None and len(absent) and fp.default is None and fp.missing is not None:
            if excluded is None:
                excluded = np.zeros(n, dtype=np.bool_)
            excluded[absent] = True
            chunks.append(_missing_chunk(fp, absent, records=True))
        if fp.default is not None and values.null_count:
            filled = pc.fill_null(values, fp.default[0])
            values = filled if excluded is None else pc.if_else(pa.array(excluded), values, filled)
    for check in fp.checks:
        mask = check.evaluate(values)
        if mask is None:
            continue
        if isinstance(mask, np.ndarray):
            rows = np.flatnonzero(mask).astype(np.int64)
        else:
            rows = np.asarray(pc.indices_nonzero(mask).to_numpy(), dtype=np.int64)
        if excluded is not None and len(rows):
            rows = rows[~excluded[rows]]
        if len(rows) == 0:
            continue
        message, value = check.describe(values.take(pa.array(rows)))
        chunks.append(_Chunk(check.order, check.rule, rows, message, value))
    return values, chunks


def _missing_chunk(fp: _FieldPlan, rows: Index, *, records: bool) -> _Chunk:
    """The ``missing`` rejects of ``rows``: the input has no column of the field (an Arrow
    batch or table) or, ``records``, the decoded JSON objects of those rows have no key of
    it (the stream, the HTTP ingest, a list of dicts)."""
    assert fp.missing is not None
    order, rule = fp.missing
    name = fp.field.name
    what = "key" if records else "column"
    msg = f"{_prefix(fp.field, ReasonCode.MISSING)}got no {what}, expected a {what} {name}"
    return _Chunk(order, rule, rows, _constant(len(rows), msg), _constant(len(rows), None))


def _rejects_table(chunks: list[_Chunk]) -> pa.Table:
    """One table of every chunk's reject rows, sorted by input row, then rule order."""
    if not chunks:
        return REJECT_SCHEMA.empty_table()
    rows = np.concatenate([c.rows for c in chunks])
    which = np.concatenate([np.full(len(c.rows), i, dtype=np.int64) for i, c in enumerate(chunks)])
    orders = np.asarray([c.order for c in chunks], dtype=np.int64)[which]
    order = np.lexsort((orders, rows))
    take = pa.array(order)
    which_sorted = pa.array(which[order])
    fields = pa.array([c.rule.field for c in chunks], pa.string()).take(which_sorted)
    rule_ids = pa.array([c.rule.id for c in chunks], pa.string()).take(which_sorted)
    reasons = pa.array([c.rule.kind.value for c in chunks], pa.string()).take(which_sorted)
    messages = pa.concat_arrays([c.message for c in chunks]).take(take)
    values = pa.concat_arrays([c.value for c in chunks]).take(take)
    return pa.Table.from_arrays(
        [pa.array(rows[order], pa.int64()), fields, rule_ids, reasons, messages, values],
        schema=REJECT_SCHEMA,
    )


__all__ = ["validate"]
