"""CompiledSchema -> Great Expectations 1.x suite (``expectations/<schema>.json``), and
a runner that checks a batch with it.

The suite is a translation of the rule program (:mod:`features.compile.rules`): one
expectation per rule that GX can express, each tagged ``meta.rule = "<field>.<kind>"``
so its unexpected count can be compared with the validator's count for the same rule
(``ValidationResult.counts.by_rule``). :func:`run_suite` runs it over a batch and
returns those counts; the agreement tests hold them equal.

Rule -> expectation (GX, like the validator, skips nulls in value checks):

==========  ===================================================================
missing     ``expect_column_to_exist``; its count is the batch's row count when the
            column is absent, else 0 (every row of such a batch is rejected)
type        float fields: ``expect_column_values_to_be_between`` of +-max float64
            over non-NaN values, since in typed data the only float type failure
            left is +-inf (the validator refuses infinities as "not a number");
            other types: not expressible, GX is given typed data (conversion is the
            validator's job); listed in ``meta.featureline.not_expressible``
not_null    ``expect_column_values_to_not_be_null``
nan         ``expect_column_pair_values_to_be_equal`` of the column with itself:
            NaN is the only value not equal to itself (nulls are ignored)
min / max   ``expect_column_values_to_be_between`` with only ``min_value`` /
            ``max_value`` (inclusive); for float fields with a row condition
            ``-max <= col <= max`` that keeps finite numbers only, since NaN is
            judged by the ``nan`` rule alone and +-inf by the ``type`` rule
min_length  ``expect_column_value_lengths_to_be_between`` (characters)
max_length
pattern     ``expect_column_values_to_match_regex`` with the pattern rewritten for
            Python ``re`` so it accepts exactly RE2's full matches
            (:func:`features.compile.patterns.python_full_match`)
enum        ``expect_column_values_to_be_in_set``
==========  ===================================================================

A list field (``list(float32, 384)``): ``type`` is its length,
``expect_column_values_to_be_between`` (``n..n``, or ``0..max``) of the column
``<field>__length`` that :func:`run_suite` adds (the list's lengths; a null or
infinite element, the rest of the type rule, is the validator's); its ``nan`` rule (a
NaN element) is not expressible: GX compares whole lists.

NaN and null. GX's pandas engine treats NaN as null when a float column is a NumPy
``float64``; then the ``nan`` and ``not_null`` rules could not be told apart. So
:func:`run_suite` hands float columns to GX as pandas' nullable ``Float64`` (null is
``<NA>``, NaN stays a number; float32 is widened exactly, so bounds are compared in
float64 as by the validator and Postgres): ``not_null`` counts nulls only, and the
pair expectation above counts NaN only.

GX catches an exception raised while computing a metric (a warning turned into an
error, say) and reports the expectation as merely failed, without counts;
:func:`run_suite` raises CompileError instead of returning such a result.

Exact bounds. GX coerces ``min_value``/``max_value`` to float64 (its ``Comparable``
type). For a float field that is what the validator and PostgreSQL compare against
too. An integer field's bound is written only when float64 holds it exactly (|b| <=
2**53). A decimal column is handed to GX as float64 (correctly rounded, through its
text), and its bound as the nearest float64; that is exact (rounding is monotonic)
as long as the bound and the nearest grid value on its failing side (``b - 10**-scale``
for a ``min`` on the grid) stay distinct floats, which :func:`render_suite` checks. A bound that fails
either check becomes a ``not_expressible`` rule rather than an approximate one.

Date and timestamp bounds are ISO strings in the JSON; :func:`run_suite` passes them
to GX as ``date`` / timezone-aware ``datetime`` objects, compared exactly.

Raises CompileError where a rule cannot be translated at all (a min/max on a string).

The stored aggregates. :func:`render_aggregates_suite` is a second suite, of the
``<schema>__aggregates`` table (``expectations/<schema>__aggregates.json``), and
:func:`run_aggregates_suite` runs it over rows read from that table; see
``docs/aggregations.md`` ("Where the values go").

Why one module of this size: two Great Expectations suites (the schema's and its
aggregates'), rendered and run with one translation of rules into expectations; splitting
them would copy that translation.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import TYPE_CHECKING, Any

from features.compile.patterns import python_full_match
from features.compile.rules import ReasonCode, Rule
from features.errors import CompileError, SourceError
from features.schema.model import FLOAT_KINDS, INTEGER_KINDS, Field, ScalarValue, TypeKind

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from features.compile import CompiledSchema

#: Largest integer magnitude float64 represents exactly.
_FLOAT_EXACT_INT = 2**53
#: Largest finite float64 (JSON has no infinity, so "finite" is written with it).
_FLOAT_MAX = sys.float_info.max

#: ``meta`` key holding featureline's own notes in the suite.
META_KEY = "featureline"

_NOT_EXPRESSIBLE_TYPE = (
    "GX is given data already converted to the declared type; type conversion "
    "(and int8/int16 range) is checked by the validator only"
)


class _NotExpressible(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


# --- rendering --------------------------------------------------------------------


#: suffix of the column of a list field's lengths (:func:`length_column`)
LENGTH_SUFFIX = "__length"


def _as_decimal(value: ScalarValue, what: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal, str)):
        raise CompileError(f"{what}: {value!r} is not a number")
    d = Decimal(str(value)) if isinstance(value, float) else Decimal(value)
    if not d.is_finite():
        raise CompileError(f"{what}: {value!r} is not a finite number")
    return d


def _number_bound(f: Field, kind: ReasonCode, value: ScalarValue) -> float | int:
    """The JSON number GX gets for a numeric bound (see "Exact bounds" above)."""
    what = f"field {f.name} constraint {kind.value}"
    d = _as_decimal(value, what)
    if f.type.kind in FLOAT_KINDS:
        return float(d)
    if f.type.kind in INTEGER_KINDS:
        if d != d.to_integral_value():
            raise CompileError(f"{what}: {value!r} is not an integer", field=f.name)
        if abs(d) > _FLOAT_EXACT_INT:
            raise _NotExpressible(
                f"bound {d} is beyond 2**53: GX compares bounds as float64, which cannot hold it exactly"
            )
        return int(d)
    # decimal: values lie on the grid 10**-scale. The grid value nearest the bound on
    # its failing side must stay a different float64 than the bound.
    step = Decimal(1).scaleb(-(f.type.scale or 0))
    if kind is ReasonCode.MIN:
        neighbour = (d / step).to_integral_value(ROUND_CEILING) * step - step
    else:
        neighbour = (d / step).to_integral_value(ROUND_FLOOR) * step + step
    if float(neighbour) == float(d):
        raise _NotExpressible(
            f"bound {d} and its neighbour {neighbour} are the same float64; GX compares "
            "decimals as float64 and could not tell them apart"
        )
    return float(d)


def _compare(col: str, op: str, value: float) -> dict[str, Any]:
    return {"type": "comparison", "column": {"name": col}, "operator": op, "parameter": value}


def _or(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"type": "or", "conditions": list(conditions)}


def _and(*conditions: dict[str, Any]) -> dict[str, Any]:
    return {"type": "and", "conditions": list(conditions)}


def _expectation(f: Field, rule: Rule) -> tuple[str, dict[str, Any]]:
    """(GX expectation type, kwargs) for ``rule`` on ``f``; raises _NotExpressible."""
    col = f.name
    kind = rule.kind
    if kind is ReasonCode.MISSING:
        return "expect_column_to_exist", {"column": col}
    if f.type.items is not None:
        return _list_expectation(f, rule)
    if kind is ReasonCode.TYPE:
        if f.type.kind in FLOAT_KINDS:
            # In typed float data the only type failure left is +-inf (not a number).
            return "expect_column_values_to_be_between", {
                "column": col, "min_value": -_FLOAT_MAX, "max_value": _FLOAT_MAX,
                "row_condition": _or(_compare(col, "<=", 0), _compare(col, ">", 0)),
            }
        raise _NotExpressible(_NOT_EXPRESSIBLE_TYPE)
    if kind is ReasonCode.NOT_NULL:
        return "expect_column_values_to_not_be_null", {"column": col}
    if kind is ReasonCode.NAN:
        return "expect_column_pair_values_to_be_equal", {
            "column_A": col, "column_B": col, "ignore_row_if": "both_values_are_missing",
        }
    if kind in (ReasonCode.MIN, ReasonCode.MAX):
        key = "min_value" if kind is ReasonCode.MIN else "max_value"
        k = f.type.kind
        bound: Any
        if k in (TypeKind.DATE, TypeKind.TIMESTAMP):
            bound = str(rule.value)
        elif k in FLOAT_KINDS | INTEGER_KINDS | {TypeKind.DECIMAL} and not isinstance(rule.value, tuple):
            bound = _number_bound(f, kind, rule.value)
        else:
            raise CompileError(f"field {f.name}: {kind.value} is not defined for type {f.type}", field=col)
        kwargs: dict[str, Any] = {"column": col, key: bound}
        if k in FLOAT_KINDS:
            # Only finite numbers: NaN is the `nan` rule's, +-inf the `type` rule's.
            kwargs["row_condition"] = _and(
                _compare(col, ">=", -_FLOAT_MAX), _compare(col, "<=", _FLOAT_MAX)
            )
        return "expect_column_values_to_be_between", kwargs
    if kind in (ReasonCode.MIN_LENGTH, ReasonCode.MAX_LENGTH):
        key = "min_value" if kind is ReasonCode.MIN_LENGTH else "max_value"
        return "expect_column_value_lengths_to_be_between", {"column": col, key: int(str(rule.value))}
    if kind is ReasonCode.PATTERN:
        try:
            regex = python_full_match(str(rule.value))
        except CompileError as exc:
            raise CompileError(f"field {f.name}: {exc}", field=col) from exc
        return "expect_column_values_to_match_regex", {"column": col, "regex": regex}
    if kind is ReasonCode.ENUM:
        values = list(rule.value) if isinstance(rule.value, tuple) else []
        return "expect_column_values_to_be_in_set", {"column": col, "value_set": values}
    raise _NotExpressible(f"no expectation for rule kind {kind.value}")  # pragma: no cover


def _list_expectation(f: Field, rule: Rule) -> tuple[str, dict[str, Any]]:
    """A list field: ``type`` as its length (the part of the type typed data can still
    break: a ``list(T, max=n)`` column holds lists of any length); ``not_null`` as for any
    column; ``nan`` (an element) GX cannot see: a list equals itself, NaN inside or not."""
    items = f.type.items
    assert items is not None
    if rule.kind is ReasonCode.TYPE:
        lo = items.length if items.length is not None else 0
        hi = items.length if items.length is not None else items.max_length
        return "expect_column_values_to_be_between", {"column": length_column(f.name), "min_value": lo,
                                                       "max_value": hi}
    if rule.kind is ReasonCode.NOT_NULL:
        return "expect_column_values_to_not_be_null", {"column": f.name}
    if rule.kind is ReasonCode.MISSING:
        return "expect_column_to_exist", {"column": f.name}
    raise _NotExpressible("a NaN element of a list: GX compares whole lists")


def _provenance(compiled: CompiledSchema) -> dict[str, str]:
    """The ``meta.featureline`` entries naming the schema a suite was generated from."""
    schema = compiled.schema
    return {
        "schema": schema.name,
        "version": schema.version_str,
        "fingerprint": compiled.fingerprint,
        "generated_by": "features compile; do not edit",
    }


def render_suite(compiled: CompiledSchema) -> dict[str, Any]:
    """The GX 1.x ExpectationSuite of ``compiled`` as a JSON-able dict (the shape of
    ``ExpectationSuite.to_json_dict()``, loadable with ``ExpectationSuite(**suite)``).

    ``name`` is the schema name; each expectation has ``type``, ``kwargs`` and
    ``meta.rule`` (the rule id); rules in declared order. ``meta.featureline`` records
    the schema version and fingerprint, the rules GX cannot express
    (``not_expressible``: ``[{"rule", "reason"}]``) and the data preparation
    :func:`run_suite` applies before the expectations. Deterministic.
    """
    schema = compiled.schema
    fields = {f.name: f for f in schema.fields}
    expectations: list[dict[str, Any]] = []
    not_expressible: list[dict[str, str]] = []
    for rule in compiled.rules:
        try:
            etype, kwargs = _expectation(fields[rule.field], rule)
        except _NotExpressible as exc:
            not_expressible.append({"rule": rule.id, "reason": exc.reason})
            continue
        expectations.append({"type": etype, "kwargs": kwargs, "meta": {"rule": rule.id}})
    return {
        "name": schema.name,
        "expectations": expectations,
        "meta": {
            META_KEY: {
                **_provenance(compiled),
                "not_expressible": not_expressible,
                "data_preparation": (
                    "run with features.compile.expectations.run_suite: columns converted to the "
                    "declared types, empty strings nulled where empty_as_null, null_values "
                    "markers nulled in string columns, defaults filled, "
                    "floats as nullable Float64 (NaN is not null), decimals as float64"
                    + (", a list field's lengths added as <field>__length"
                       if any(f.type.items is not None for f in schema.fields) else "")
                ),
            }
        },
    }


# --- running ----------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result: the rule it checks and what GX found."""

    rule: str
    type: str
    success: bool
    unexpected_count: int
    element_count: int | None
    partial_unexpected_list: tuple[Any, ...]


@dataclass(frozen=True)
class SuiteRun:
    """The result of :func:`run_suite_detailed`.

    ``counts``: unexpected count per expressible rule id (0 included), comparable with
    ``ValidationResult.counts.by_rule``. ``outcomes``: one per expectation, in suite
    order. ``not_expressible``: rule id -> why GX cannot check it. ``gx_result``: GX's
    own ``ExpectationSuiteValidationResult`` as a JSON-able dict.
    """

    counts: Mapping[str, int]
    outcomes: tuple[ExpectationOutcome, ...]
    not_expressible: Mapping[str, str]
    gx_result: dict[str, Any]


def _prepare(compiled: CompiledSchema, data: pa.Table | pa.RecordBatch | pd.DataFrame) -> tuple[
    pd.DataFrame, frozenset[str], int
]:
    """The batch as the validator sees it, as a DataFrame GX reads faithfully.

    Returns (frame, names of declared columns absent from ``data``, row count).
    As in the validator, an absent column is filled with its default, else it is left
    out when the field is required (``missing`` counts every row, its other
    expectations are skipped), else it is all null.
    """
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(data, pd.DataFrame):
        table = pa.Table.from_pandas(data, preserve_index=False)
    elif isinstance(data, pa.RecordBatch):
        table = pa.Table.from_batches([data])
    else:
        table = data
    n = table.num_rows
    declared = compiled.arrow_schema
    columns: dict[str, pa.ChunkedArray | pa.Array] = {}
    missing: set[str] = set()
    for f in compiled.schema.fields:
        target = declared.field(f.name).type
        c = f.constraints
        if f.name not in table.column_names:
            missing.add(f.name)
            if c.required and not (c.has_default and c.default is not None):
                continue  # every row is a `missing` reject; no other rule looks at it
            col: pa.ChunkedArray | pa.Array = pa.nulls(n, target)
        else:
            col = table.column(f.name)
            if col.type != target:
                try:
                    col = pc.cast(col, target, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SourceError(
                        f"column {f.name} of type {col.type} does not convert exactly to {target}: "
                        "validate the data first (run_suite checks typed data)"
                    ) from exc
        if c.empty_as_null and pa.types.is_string(target):
            col = pc.if_else(pc.equal(col, ""), pa.scalar(None, target), col)
        if f.null_values and pa.types.is_string(target):  # the validator reads them as null
            col = pc.if_else(pc.is_in(col, value_set=pa.array(f.null_values, pa.string())),
                             pa.scalar(None, target), col)
        if c.has_default and c.default is not None:
            col = pc.fill_null(col, _default_scalar(f, c.default, target))
        if pa.types.is_decimal(target):
            # Correctly rounded float64, through the decimal's text (see module doc).
            col = pc.cast(pc.cast(col, pa.string()), pa.float64())
        elif pa.types.is_float32(target):
            # Exact widening: bounds are compared in float64, as by the validator and
            # Postgres (pandas would compare a float32 column in float32).
            col = pc.cast(col, pa.float64())
        columns[f.name] = col
    prepared = pa.table(columns) if columns else pa.table({"__empty__": pa.nulls(n)})
    mapper = {
        pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(), pa.float32(): pd.Float32Dtype(), pa.float64(): pd.Float64Dtype(),
        pa.bool_(): pd.BooleanDtype(),
    }
    frame = prepared.to_pandas(types_mapper=mapper.get)
    for f in compiled.schema.fields:  # a list's length, as its own column (GX measures str(value))
        if f.type.items is not None and f.name in columns:
            listed = columns[f.name]
            listed = listed.combine_chunks() if isinstance(listed, pa.ChunkedArray) else listed
            lengths = pc.list_value_length(listed)
            frame[length_column(f.name)] = pd.Series(lengths.to_numpy(zero_copy_only=False), dtype="Int64")
    return frame, frozenset(missing), n


def length_column(name: str) -> str:
    """The column :func:`run_suite` adds for list field ``name``: its lengths."""
    return f"{name}{LENGTH_SUFFIX}"


def _default_scalar(f: Field, value: ScalarValue, target: pa.DataType) -> pa.Scalar:
    import pyarrow as pa

    if f.type.kind is TypeKind.DATE and isinstance(value, str):
        return pa.scalar(dt.date.fromisoformat(value), target)
    if f.type.kind is TypeKind.TIMESTAMP and isinstance(value, str):
        return pa.scalar(dt.datetime.fromisoformat(value), target)
    return pa.scalar(value, target)


def _runtime_bound(f: Field, value: Any) -> Any:
    """A JSON bound as the object GX must compare with (dates and datetimes)."""
    if f.type.kind is TypeKind.DATE:
        return dt.date.fromisoformat(str(value))
    if f.type.kind is TypeKind.TIMESTAMP:
        import pandas as pd

        moment = pd.Timestamp(dt.datetime.fromisoformat(str(value)))
        if f.type.tz is None:
            return moment
        # A naive bound on a zoned field is wall time in the field's zone (as in the DDL).
        return moment.tz_localize(f.type.tz) if moment.tzinfo is None else moment.tz_convert(f.type.tz)
    return value


def _context() -> Any:
    """An in-memory GX context: no files written, no analytics, no progress bars."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False),
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def _gx_failure(info: Any) -> str | None:
    """The message of an exception GX caught while computing an expectation, or None.

    ``exception_info`` is either one record or a dict of records keyed by metric."""
    if not isinstance(info, dict):
        return None
    records = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for record in records:
        if record.get("raised_exception"):
            return str(record.get("exception_message") or "an exception")
    return None


def run_suite_detailed(
    compiled: CompiledSchema, data: pa.Table | pa.RecordBatch | pd.DataFrame
) -> SuiteRun:
    """Run the suite of ``compiled`` over ``data`` with an ephemeral GX context.

    ``data`` should hold values of the declared types (the validator's ``valid``
    output, a table at rest, or test data): a column of another type is cast safely
    and SourceError is raised when that cast would lose information. Before the
    expectations run, the data is prepared as the validator prepares it (empty
    strings nulled where ``empty_as_null``, a string field's ``null_values`` markers
    nulled, defaults filled, absent columns added
    with the default or nulls unless required). A pandas float column of NumPy
    dtype cannot carry NaN apart from null (Arrow reads its NaN as null); pass Arrow
    data or nullable ``Float64`` to check the ``nan`` rule. Nothing is written to
    disk or sent anywhere.
    """
    import great_expectations as gx

    frame, missing, n = _prepare(compiled, data)
    suite_dict = render_suite(compiled)
    fields = {f.name: f for f in compiled.schema.fields}
    runnable: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for exp in suite_dict["expectations"]:
        kwargs = dict(exp["kwargs"])
        column = kwargs.get("column", kwargs.get("column_A"))
        if exp["type"] != "expect_column_to_exist" and column in missing and column not in frame:
            skipped[exp["meta"]["rule"]] = "column absent"
            continue
        if exp["type"] == "expect_column_values_to_be_between" and column in fields:
            for key in ("min_value", "max_value"):
                if key in kwargs:
                    kwargs[key] = _runtime_bound(fields[str(column)], kwargs[key])
        runnable.append({"type": exp["type"], "kwargs": kwargs, "meta": exp["meta"]})

    context = _context()
    batch = (
        context.data_sources.add_pandas("featureline")
        .add_dataframe_asset(compiled.name)
        .add_batch_definition_whole_dataframe("batch")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    suite = gx.ExpectationSuite(name=compiled.name, expectations=runnable)
    result = batch.validate(suite, result_format={"result_format": "SUMMARY"})

    counts: dict[str, int] = {}
    outcomes: list[ExpectationOutcome] = []
    for r in result.results:
        rule = r.expectation_config.meta["rule"]
        failure = _gx_failure(r.exception_info)
        res = r.result or {}
        if r.expectation_config.type == "expect_column_to_exist":
            unexpected = 0 if r.success else n
        elif failure is None and "unexpected_count" not in res:
            failure = "no unexpected_count in the result"
        else:
            unexpected = int(res.get("unexpected_count") or 0)
        if failure is not None:
            # GX records a metric that raised as a failed expectation; never report it
            # as a count.
            raise CompileError(f"the GX suite of {compiled.name} could not run {rule}: {failure}",
                               schema_name=compiled.name, field=rule.split(".")[0])
        counts[rule] = unexpected
        outcomes.append(ExpectationOutcome(
            rule=rule, type=r.expectation_config.type, success=bool(r.success),
            unexpected_count=unexpected, element_count=res.get("element_count"),
            partial_unexpected_list=tuple(res.get("partial_unexpected_list") or ()),
        ))
    for rule in skipped:
        counts[rule] = 0
    not_expressible = {
        d["rule"]: d["reason"] for d in suite_dict["meta"][META_KEY]["not_expressible"]
    }
    # GX returns results in its own order; report them in rule order.
    order = {r.id: i for i, r in enumerate(compiled.rules)}
    return SuiteRun(
        counts=dict(sorted(counts.items(), key=lambda kv: order[kv[0]])),
        outcomes=tuple(sorted(outcomes, key=lambda o: order[o.rule])),
        not_expressible=not_expressible,
        gx_result=result.to_json_dict(),
    )


def run_suite(compiled: CompiledSchema, data: pa.Table | pa.RecordBatch | pd.DataFrame) -> dict[str, int]:
    """Unexpected count per expressible rule id of ``compiled`` over ``data`` (0 included).

    See :func:`run_suite_detailed` for how ``data`` is prepared; raises SourceError
    for a column that does not convert to its declared type, CompileError when GX
    itself fails on an expectation.
    """
    return dict(run_suite_detailed(compiled, data).counts)


# --- the stored aggregates (``<schema>__aggregates``) ------------------------------

#: aggregation functions whose stored value is a count: an integer >= 0, never null
_COUNT_FUNCTIONS = frozenset({"count", "count_distinct", "approx_count_distinct"})


def _aggregate_expectations(compiled: CompiledSchema) -> list[dict[str, Any]]:
    """The expectations on the rows of ``<schema>__aggregates`` (see
    :func:`render_aggregates_suite`), each tagged ``meta.rule = "<column>.<check>"``."""
    schema = compiled.schema
    assert schema.aggregations is not None and schema.entity is not None and schema.event_time is not None
    out: list[dict[str, Any]] = []

    def add(rule: str, etype: str, **kwargs: Any) -> None:
        out.append({"type": etype, "kwargs": kwargs, "meta": {"rule": rule}})

    for key in (schema.entity, schema.event_time):
        add(f"{key}.missing", "expect_column_to_exist", column=key)
        add(f"{key}.not_null", "expect_column_values_to_not_be_null", column=key)
    for agg in schema.aggregations.features:
        if "cold" not in agg.store:
            continue
        add(f"{agg.name}.missing", "expect_column_to_exist", column=agg.name)
        if agg.function in _COUNT_FUNCTIONS:
            add(f"{agg.name}.not_null", "expect_column_values_to_not_be_null", column=agg.name)
            add(f"{agg.name}.min", "expect_column_values_to_be_between", column=agg.name, min_value=0)
        elif agg.function == "approx_percentile" and isinstance(agg.q, tuple):
            n = len(agg.q)
            add(f"{agg.name}.length", "expect_column_values_to_be_between",
                column=length_column(agg.name), min_value=n, max_value=n)
    return out


def render_aggregates_suite(compiled: CompiledSchema) -> dict[str, Any] | None:
    """The GX 1.x suite of the stored aggregates table (``expectations/<schema>__aggregates.json``)
    as a JSON-able dict, or None for a schema without aggregations (no such table).

    From the compiled model alone: the entity and event time exist and are not null;
    every cold aggregation column exists; a ``count``, ``count_distinct`` or
    ``approx_count_distinct`` value is not null and >= 0 (the column is ``bigint``, so
    an integer); a list ``approx_percentile`` (``q: [..]``) holds ``len(q)`` values (its
    lengths, added by :func:`run_aggregates_suite` as ``<name>__length``; a null list,
    an empty window, is skipped). The other values (a scalar percentile, sums, means,
    ratios, ...) are only checked to exist: a null is an empty window and a NaN is a
    value the functions can give. Deterministic.
    """
    schema = compiled.schema
    if schema.aggregations is None or schema.entity is None or schema.event_time is None:
        return None
    lists = [a.name for a in schema.aggregations.features
             if "cold" in a.store and a.function == "approx_percentile" and isinstance(a.q, tuple)]
    from features.schema.syntax import AGGREGATES_SUFFIX

    return {
        "name": schema.name + AGGREGATES_SUFFIX,
        "expectations": _aggregate_expectations(compiled),
        "meta": {
            META_KEY: {
                **_provenance(compiled),
                "table": "the stored aggregates table (<schema>__aggregates)",
                "data_preparation": (
                    "run with features.compile.expectations.run_aggregates_suite: the table's rows"
                    + (", a list approx_percentile's lengths added as <name>__length" if lists else "")
                ),
            }
        },
    }


def run_aggregates_suite(compiled: CompiledSchema, data: pa.Table | pd.DataFrame) -> dict[str, int]:
    """Run the aggregates suite of ``compiled`` over rows of its ``<schema>__aggregates``
    table (an Arrow table or DataFrame of the table's columns, as read from Postgres);
    returns the unexpected count per check id (``<column>.<check>``; an absent column's
    ``missing`` counts every row and its other checks are skipped). Raises CompileError
    for a schema without aggregations, or when GX itself fails on an expectation.
    """
    import great_expectations as gx
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    suite_dict = render_aggregates_suite(compiled)
    if suite_dict is None:
        raise CompileError(f"schema {compiled.name} has no aggregations", schema_name=compiled.name)
    table = pa.Table.from_pandas(data, preserve_index=False) if isinstance(data, pd.DataFrame) else data
    n = table.num_rows
    mapper = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.float64(): pd.Float64Dtype()}
    frame = table.to_pandas(types_mapper=mapper.get)
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            lengths = pc.list_value_length(col.combine_chunks())
            frame[length_column(name)] = pd.Series(lengths.to_numpy(zero_copy_only=False), dtype="Int64")
    runnable: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for exp in suite_dict["expectations"]:
        column = exp["kwargs"]["column"]
        if exp["type"] != "expect_column_to_exist" and column not in frame:
            counts[exp["meta"]["rule"]] = 0  # the column's `missing` check counts the rows
            continue
        runnable.append(exp)
    context = _context()
    batch = (
        context.data_sources.add_pandas("featureline")
        .add_dataframe_asset(str(suite_dict["name"]))
        .add_batch_definition_whole_dataframe("batch")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    result = batch.validate(gx.ExpectationSuite(name=suite_dict["name"], expectations=runnable),
                            result_format={"result_format": "SUMMARY"})
    for r in result.results:
        rule = r.expectation_config.meta["rule"]
        failure = _gx_failure(r.exception_info)
        res = r.result or {}
        if failure is not None:
            raise CompileError(f"the GX aggregates suite of {compiled.name} could not run {rule}: {failure}",
                               schema_name=compiled.name)
        if r.expectation_config.type == "expect_column_to_exist":
            counts[rule] = 0 if r.success else n
        else:
            counts[rule] = int(res.get("unexpected_count") or 0)
    order = {e["meta"]["rule"]: i for i, e in enumerate(suite_dict["expectations"])}
    return dict(sorted(counts.items(), key=lambda kv: order[kv[0]]))


__all__ = [
    "META_KEY", "ExpectationOutcome", "SuiteRun", "render_aggregates_suite", "render_suite",
    "run_aggregates_suite", "run_suite", "run_suite_detailed",
]
