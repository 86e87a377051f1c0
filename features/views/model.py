"""The view model: an immutable picture of one ``views/*.yaml`` file.

A *view* is what a model reads at one request: request *keys* (each joined to the
entity of one or more schemas), request-time input *fields* (validated like schema
fields), the stored features it fetches from each *source* schema (as of the request,
optionally no older than ``max_age``), and request-time *derived features* computed
from all of those with the schema step vocabulary. Like ``features.schema.model`` it
knows nothing of Arrow or the stores; ``features.views.compile`` builds the artefacts.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as _field
from typing import Final

from features.schema.model import (
    INTEGER_KINDS,
    Constraints,
    Feature,
    Field,
    FieldType,
    ListItems,
    Schema,
    TypeKind,
)
from features.schema.steps import OPERAND_ARGS

#: the request field ``time_since`` measures up to in a view (docs/views.md)
REQUEST_TIME: Final = "request_time"


@dataclass(frozen=True)
class ViewSource:
    """One schema a view reads: ``features`` (stored columns of that schema, by their
    names in it) of the entity ``entity`` joined to the request key ``key``.

    ``alias`` is unique within the view (default: the schema name); ``prefix`` starts
    each output column (``""`` unless ``prefix:`` or ``alias:`` is given: an alias
    alone gives ``<alias>__``). ``max_age_seconds``: a fetched row older than this
    (before the request time) counts as not found; None: no limit.
    """

    schema: str
    alias: str
    features: tuple[str, ...]
    entity: str
    key: str
    max_age_seconds: int | None = None
    prefix: str = ""
    line: int | None = None

    def column(self, feature: str) -> str:
        """The output column of ``feature``: ``prefix + feature``."""
        return self.prefix + feature

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.column(f) for f in self.features)


@dataclass(frozen=True)
class View:
    """One view file, parsed and checked against the schemas. Build with ``parse_view``.

    ``keys`` and ``request_fields`` are Fields (a key is a required string or integer
    field); ``features`` are the request-time derived features (``store`` empty: they
    are computed per request, never stored), in declared order.
    """

    name: str
    version: tuple[int, int, int]
    keys: tuple[Field, ...]
    request_fields: tuple[Field, ...]
    sources: tuple[ViewSource, ...]
    features: tuple[Feature, ...] = ()
    description: str = ""
    path: str | None = None
    #: the YAML text this view was parsed from (None when built in code); not in the fingerprint
    text: str | None = _field(default=None, repr=False, compare=False)

    @property
    def version_str(self) -> str:
        return ".".join(str(p) for p in self.version)

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.keys)

    @property
    def request_field_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.request_fields)

    def source(self, alias: str) -> ViewSource:
        for s in self.sources:
            if s.alias == alias:
                return s
        raise KeyError(alias)


def key_field(name: str, ftype: FieldType, line: int | None = None) -> Field:
    """A request key: a required field of the entity's type."""
    return Field(name=name, type=ftype, constraints=Constraints(required=True, nullable=False), line=line)


def is_entity_type(ftype: FieldType) -> bool:
    """Whether ``ftype`` can be an entity's (and so a request key's) type."""
    return ftype.kind is TypeKind.STRING or ftype.kind in INTEGER_KINDS


def aggregation_type(schema: Schema, name: str) -> FieldType:
    """The declared type of aggregation ``name`` of ``schema`` (as ``AggSpec.output_type``
    stores it): count/count_distinct int64, mean/ratio/variance/stddev float64, sum int64,
    decimal(38, scale) or (a float field's) float64, min/max/last/first the field's type,
    last_k list(type, max=k), approx_count_distinct int64, approx_percentile float64 (one
    quantile) or list(float64, max=len(q))."""
    assert schema.aggregations is not None
    agg = next(a for a in schema.aggregations.features if a.name == name)
    if agg.function in ("count", "count_distinct", "approx_count_distinct"):
        return FieldType(TypeKind.INT64)
    if agg.function == "approx_percentile":
        if isinstance(agg.q, tuple):
            element = FieldType(TypeKind.FLOAT64)
            return FieldType(TypeKind.LIST, items=ListItems(element, max_length=len(agg.q)))
        return FieldType(TypeKind.FLOAT64)
    if agg.function in ("mean", "ratio", "variance", "stddev", "variance_sample", "stddev_sample") \
            or (agg.function == "sum" and agg.scale is not None):
        return FieldType(TypeKind.FLOAT64)
    assert agg.of is not None
    ft = schema.field(agg.of).type
    if agg.function == "sum":
        return FieldType(TypeKind.INT64) if ft.kind in INTEGER_KINDS else FieldType(
            TypeKind.DECIMAL, precision=38, scale=ft.scale or 0)
    if agg.function == "last_k":
        return FieldType(TypeKind.LIST, items=ListItems(ft, max_length=agg.k))
    return ft


def stored_columns(schema: Schema) -> dict[str, tuple[Field, frozenset[str]]]:
    """Every stored column of ``schema`` a view may name: ``{name: (a Field of its
    declared type, the stores it is in)}``, in schema order: stored fields, derived
    feature columns (one_hot: each indicator column), aggregations."""
    out: dict[str, tuple[Field, frozenset[str]]] = {}
    for f in schema.fields:
        if f.store:
            out[f.name] = (Field(f.name, f.type, values=f.values), frozenset(f.store))
    for feature in schema.features:
        for col in schema.feature_columns(feature):
            out[col] = (Field(col, feature.dtype), frozenset(feature.store))
    if schema.aggregations is not None:
        for agg in schema.aggregations.features:
            out[agg.name] = (Field(agg.name, aggregation_type(schema, agg.name)), frozenset(agg.store))
    return out


def feature_dependencies(feature: Feature) -> set[str]:
    """The columns a feature reads: its ``from`` and each step's other column (``ratio``
    denominator, ``difference``/``product`` other)."""
    out = {feature.source}
    for step in feature.steps:
        arg = OPERAND_ARGS.get(step.op)
        if arg is not None:
            value = step.arg(arg)
            if isinstance(value, str):
                out.add(value)
    return out


def fetched_fields(source: ViewSource, schema: Schema) -> tuple[Field, ...]:
    """The fetched output columns of ``source`` as Fields (named ``source.column(f)``,
    of the declared type, nullable: a source may find nothing)."""
    stored = stored_columns(schema)
    out = []
    for f in source.features:
        base = stored[f][0]
        out.append(Field(source.column(f), base.type, values=base.values))
    return tuple(out)


__all__ = [
    "REQUEST_TIME",
    "View",
    "ViewSource",
    "aggregation_type",
    "feature_dependencies",
    "fetched_fields",
    "is_entity_type",
    "key_field",
    "stored_columns",
]
