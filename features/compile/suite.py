"""CompiledSchema -> Great Expectations 1.x suite (``expectations/<schema>.json``): the
rendering, pure Python (no pandas, no GX), which ``CompiledSchema.expectations`` uses;
:mod:`features.compile.expectations` runs a suite over a batch.

The suite is a translation of the rule program (:mod:`features.compile.rules`): one
expectation per rule that GX can express, each tagged ``meta.rule = "<field>.<kind>"``
so its unexpected count can be compared with the validator's count for the same rule
(``ValidationResult.counts.by_rule``). :func:`features.compile.expectations.run_suite` runs it
over a batch and returns those counts; the agreement tests hold them equal.

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
``<field>__length`` that the runner adds (the list's lengths; a null or
infinite element, the rest of the type rule, is the validator's); its ``nan`` rule (a
NaN element) is not expressible: GX compares whole lists.

Exact bounds. GX coerces ``min_value``/``max_value`` to float64 (its ``Comparable``
type). For a float field that is what the validator and PostgreSQL compare against
too. An integer field's bound is written only when float64 holds it exactly (|b| <=
2**53). A decimal column is handed to GX as float64 (correctly rounded, through its
text), and its bound as the nearest float64; that is exact (rounding is monotonic)
as long as the bound and the nearest grid value on its failing side (``b - 10**-scale``
for a ``min`` on the grid) stay distinct floats, which :func:`render_suite` checks. A bound that fails
either check becomes a ``not_expressible`` rule rather than an approximate one.

Date and timestamp bounds are ISO strings in the JSON (the runner passes them to GX as
``date`` / timezone-aware ``datetime`` objects, compared exactly).

Raises CompileError where a rule cannot be translated at all (a min/max on a string).

The stored aggregates. :func:`render_aggregates_suite` is a second suite, of the
``<schema>__aggregates`` table (``expectations/<schema>__aggregates.json``), and
:func:`features.compile.expectations.run_aggregates_suite` runs it over rows read from
that table; see ``docs/aggregations.md`` ("Where the values go").
"""

from __future__ import annotations

import json
import sys
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import TYPE_CHECKING, Any

from features.compile.patterns import python_full_match
from features.compile.rules import ReasonCode, Rule
from features.errors import CompileError
from features.schema.model import FLOAT_KINDS, INTEGER_KINDS, Field, ScalarValue, TypeKind
from features.schema.syntax import AGGREGATES_SUFFIX

if TYPE_CHECKING:
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
    :func:`features.compile.expectations.run_suite` applies before the expectations. Deterministic.
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


def length_column(name: str) -> str:
    """The column :func:`features.compile.expectations.run_suite` adds for list field ``name``:
    its lengths."""
    return f"{name}{LENGTH_SUFFIX}"



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
    lengths, added by ``run_aggregates_suite`` as ``<name>__length``; a null list,
    an empty window, is skipped). The other values (a scalar percentile, sums, means,
    ratios, ...) are only checked to exist: a null is an empty window and a NaN is a
    value the functions can give. Deterministic.
    """
    schema = compiled.schema
    if schema.aggregations is None or schema.entity is None or schema.event_time is None:
        return None
    lists = [a.name for a in schema.aggregations.features
             if "cold" in a.store and a.function == "approx_percentile" and isinstance(a.q, tuple)]

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



def suite_json(suite: dict[str, Any]) -> str:
    """The bytes (as text) of ``expectations/<name>.json`` (what ``features compile`` writes,
    and the UI shows): sorted keys, indent 2, newline."""
    return json.dumps(suite, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


__all__ = ["LENGTH_SUFFIX", "META_KEY", "length_column", "render_aggregates_suite", "render_suite",
           "suite_json"]
