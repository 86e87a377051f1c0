"""Which columns a compiled schema stores where (Redis, Postgres), and their declared
Arrow types: what the SDK reads back and what its fill writes (``features.store``,
``features.fallback``)."""

from __future__ import annotations

import pyarrow as pa

from features.compile import CompiledSchema


def hot_columns(c: CompiledSchema) -> list[str]:
    """The fields and derived feature columns kept in Redis, in schema order."""
    s = c.schema
    return [f.name for f in s.fields if "hot" in f.store] + list(s.stored_features("hot"))


def cold_columns(c: CompiledSchema) -> list[str]:
    """The fields and derived feature columns kept in Postgres, in schema order."""
    s = c.schema
    return [f.name for f in s.fields if "cold" in f.store] + list(s.stored_features("cold"))


def aggregation_names(c: CompiledSchema, store: str) -> list[str]:
    """The schema's aggregations stored in ``store`` (``hot``/``cold``), in schema order."""
    aggs = c.schema.aggregations
    return [a.name for a in aggs.features if store in a.store] if aggs is not None else []


def declared_type(c: CompiledSchema, name: str) -> pa.DataType:
    """The declared Arrow type of stored column ``name``: a feature column's dtype, an
    aggregation's output type, else the field's type."""
    from features.compile.arrow import arrow_type

    for feature in c.schema.features:
        if name in c.schema.feature_columns(feature):
            return arrow_type(feature.dtype)
    aggs = c.schema.aggregations
    for agg in aggs.features if aggs is not None else ():
        if agg.name == name:
            from features.aggregate.engine import AggSpec

            spec = AggSpec.of(c.schema)
            assert spec is not None
            return spec.output_type(agg)
    return c.arrow_schema.field(name).type


__all__ = ["aggregation_names", "cold_columns", "declared_type", "hot_columns"]
