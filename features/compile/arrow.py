"""Schema -> Arrow: the declared in-memory type of every validated batch.

The mapping (see ``docs/types.md``)::

    string            pa.string()
    enum              pa.string()            values checked by the ``enum`` rule
    bool              pa.bool_()
    int8..int64       pa.int8()..pa.int64()
    float32/float64   pa.float32()/pa.float64()
    decimal(p,s)      pa.decimal128(p, s)    (p <= 38)
    date              pa.date32()
    timestamp(u)      pa.timestamp(u)        naive: a wall-clock time in UTC (docs/types.md)
    timestamp(u, TZ)  pa.timestamp(u, tz=TZ) an instant, stored as UTC, shown in TZ
    list(T, n)        pa.list_(T, n)         fixed_size_list of n elements of T's type
    list(T, max=n)    pa.list_(T)            a list of 0..n elements (checked by the type rule)

A field is non-nullable in Arrow when it is ``required`` or ``nullable: false``.
The schema metadata carries the schema's name and version.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from features.errors import CompileError
from features.schema.model import Field, FieldType, Schema, TypeKind

#: Keys of the Arrow schema metadata (bytes, as Arrow stores them).
METADATA_NAME = b"featureline.schema"
METADATA_VERSION = b"featureline.version"
#: Field-level metadata key holding the declared YAML type (``decimal(18,2)``, ``enum``).
METADATA_TYPE = b"featureline.type"

_SIMPLE: dict[TypeKind, pa.DataType] = {
    TypeKind.STRING: pa.string(),
    TypeKind.ENUM: pa.string(),
    TypeKind.BOOL: pa.bool_(),
    TypeKind.INT8: pa.int8(),
    TypeKind.INT16: pa.int16(),
    TypeKind.INT32: pa.int32(),
    TypeKind.INT64: pa.int64(),
    TypeKind.FLOAT32: pa.float32(),
    TypeKind.FLOAT64: pa.float64(),
    TypeKind.DATE: pa.date32(),
}


def arrow_type(t: FieldType) -> pa.DataType:
    """The Arrow type of a declared field type.

    Raises CompileError for a type Arrow (or the stores) cannot hold exactly: a decimal
    without precision/scale or with precision > 38, a timestamp in ``ns`` (PostgreSQL
    keeps microseconds) or without a unit, or a zone Arrow does not know.
    """
    simple = _SIMPLE.get(t.kind)
    if simple is not None:
        return simple
    if t.items is not None:
        element = arrow_type(t.items.element)
        if t.items.length is not None:
            return pa.list_(element, t.items.length)
        return pa.list_(element)
    if t.kind is TypeKind.DECIMAL:
        p, s = t.precision, t.scale
        if p is None or s is None or not 1 <= p <= 38 or not 0 <= s <= p:
            raise CompileError(
                f"decimal({p},{s}) has no Arrow decimal128 type (need 1 <= p <= 38, 0 <= s <= p)"
            )
        return pa.decimal128(p, s)
    if t.kind is TypeKind.TIMESTAMP:
        if t.unit not in ("s", "ms", "us"):
            raise CompileError(f"{t}: timestamp unit must be s, ms or us")
        if t.tz is None:
            return pa.timestamp(t.unit)
        _check_zone(t.tz)
        return pa.timestamp(t.unit, tz=t.tz)
    raise CompileError(f"no Arrow type for {t}")  # pragma: no cover - TypeKind is closed


def _check_zone(tz: str) -> None:
    """Raise CompileError unless Arrow can convert values to/from ``tz``."""
    try:
        pc.cast(pa.array([0], pa.int64()).cast(pa.timestamp("s", tz=tz)), pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise CompileError(f"unknown time zone {tz!r}: {exc}") from exc


def arrow_field(f: Field) -> pa.Field:
    """The Arrow field of ``f``: its type, nullability and declared YAML type as metadata."""
    c = f.constraints
    try:
        typ = arrow_type(f.type)
    except CompileError as exc:
        raise CompileError(str(exc), field=f.name) from exc
    nullable = c.nullable and not c.required
    return pa.field(f.name, typ, nullable=nullable, metadata={METADATA_TYPE: str(f.type).encode()})


def arrow_schema(schema: Schema) -> pa.Schema:
    """The declared Arrow schema of ``schema``'s input fields, in declared order.

    Metadata: ``featureline.schema`` (name) and ``featureline.version`` (``3.2.1``).
    Raises CompileError naming the field whose type has no Arrow equivalent.
    """
    fields = []
    for f in schema.fields:
        try:
            fields.append(arrow_field(f))
        except CompileError as exc:
            raise CompileError(str(exc), schema_name=schema.name, field=f.name) from exc
    return pa.schema(
        fields,
        metadata={METADATA_NAME: schema.name.encode(), METADATA_VERSION: schema.version_str.encode()},
    )


__all__ = ["arrow_field", "arrow_schema", "arrow_type"]
