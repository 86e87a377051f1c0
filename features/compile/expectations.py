"""Running the Great Expectations 1.x suites over data: :func:`run_suite` (a batch, with
the schema's suite, rendered by :mod:`features.compile.suite`, which documents how each
rule becomes an expectation) and :func:`run_aggregates_suite` (rows of the stored
aggregates table).

NaN and null. GX's pandas engine treats NaN as null when a float column is a NumPy
``float64``; then the ``nan`` and ``not_null`` rules could not be told apart. So
:func:`run_suite` hands float columns to GX as pandas' nullable ``Float64`` (null is
``<NA>``, NaN stays a number; float32 is widened exactly, so bounds are compared in
float64 as by the validator and Postgres): ``not_null`` counts nulls only, and the
pair expectation counts NaN only.

GX catches an exception raised while computing a metric (a warning turned into an
error, say) and reports the expectation as merely failed, without counts;
:func:`run_suite` raises CompileError instead of returning such a result.

Date and timestamp bounds are ISO strings in the JSON; :func:`run_suite` passes them
to GX as ``date`` / timezone-aware ``datetime`` objects, compared exactly.

The suites' rendering (:func:`render_suite`, :func:`render_aggregates_suite`) lives in
:mod:`features.compile.suite` and is importable from here too.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.compile.suite import META_KEY, length_column, render_aggregates_suite, render_suite
from features.errors import CompileError, SourceError
from features.schema.model import Field, ScalarValue, TypeKind

if TYPE_CHECKING:
    from features.compile import CompiledSchema

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


def _default_scalar(f: Field, value: ScalarValue, target: pa.DataType) -> pa.Scalar:
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
        moment = pd.Timestamp(dt.datetime.fromisoformat(str(value)))
        if f.type.tz is None:
            return moment
        # A naive bound on a zoned field is wall time in the field's zone (as in the DDL).
        return moment.tz_localize(f.type.tz) if moment.tzinfo is None else moment.tz_convert(f.type.tz)
    return value


def _context() -> Any:
    """An in-memory GX context: no files written, no analytics, no progress bars."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    # great_expectations: ~3 s to import; only running a suite needs it
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
    # great_expectations: ~3 s to import; only running a suite needs it
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


def run_aggregates_suite(compiled: CompiledSchema, data: pa.Table | pd.DataFrame) -> dict[str, int]:
    """Run the aggregates suite of ``compiled`` over rows of its ``<schema>__aggregates``
    table (an Arrow table or DataFrame of the table's columns, as read from Postgres);
    returns the unexpected count per check id (``<column>.<check>``; an absent column's
    ``missing`` counts every row and its other checks are skipped). Raises CompileError
    for a schema without aggregations, or when GX itself fails on an expectation.
    """
    # great_expectations: ~3 s to import; only running a suite needs it
    import great_expectations as gx

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
