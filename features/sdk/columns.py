"""The columns of the SDK's results and the entity ids' forms: shared by its online
and historical reads (``features.sdk``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from features.compile import CompiledSchema
from features.compile.layout import aggregation_names, cold_columns, entity_values, hot_columns
from features.compile.postgres import pg_type, quote_ident
from features.errors import ConfigError
from features.lineage import INGESTED_AT
from features.schema.model import TypeKind
from features.schema.syntax import suggest

#: Columns every ``online`` result carries besides the entity and the features.
EVENT_TIME = "_event_time"
AGE = "_age_seconds"
FROM = "_from"            # "redis", "postgres" or null (found nowhere)
FOUND = "_found"
STALE = "_stale"          # a Redis value past hot.refresh_after, served while refreshed
#: The metrics' ``schema`` label of calls for a schema the store does not have (or
#: could not open): never a schema name, which is an identifier.
UNKNOWN_SCHEMA = "(unknown)"
#: Read with every hash and checked (encoding version, schema fingerprint).
CHECKED = ("_enc", "_schema_fingerprint")



def ts_utc() -> pa.DataType:
    return pa.timestamp("us", "UTC")


def event_time_type(c: CompiledSchema) -> pa.DataType:
    """The type of ``_event_time`` in ``online`` and ``historical`` results: naive
    ``timestamp[us]`` when the schema's event time is a naive timestamp (its values as
    stored, not labelled with a zone they do not have), else ``timestamp[us, UTC]`` (a
    zoned event time's instant, a date's midnight UTC). Naive times are UTC wall-clock
    times everywhere (docs/types.md, "Naive timestamps")."""
    event_time = c.schema.event_time
    if event_time is not None:
        t = c.schema.field(str(event_time)).type
        if t.kind is TypeKind.TIMESTAMP and t.tz is None:
            return pa.timestamp("us")
    return ts_utc()



def time_column(c: CompiledSchema) -> str:
    """The stored column that orders an entity's rows: the event time, or for a static
    schema (``event_time: none``) ``_ingested_at``, its row's load (served as
    ``_event_time``; docs/schema.md, "Tables without time")."""
    return INGESTED_AT if c.schema.event_time is None else c.schema.event_time


def requested_columns(c: CompiledSchema, features: Sequence[str] | None, store: str) -> list[str]:
    """The stored columns a call asks for (default: all of the ``store``'s features, then
    its aggregations, in schema order; ``store`` ``hot`` or ``cold``), checked by name:
    ConfigError naming the unknown ones (and the store that has a name this one lacks)."""
    schema = c.schema
    keys = {schema.entity, schema.event_time}
    columns = hot_columns(c) if store == "hot" else cold_columns(c)
    have = [n for n in columns if n not in keys] + aggregation_names(c, store)
    if features is None:
        return have
    unknown = [f for f in features if f not in have]
    if unknown:
        where = "the hot store (Redis)" if store == "hot" else "the cold store (Postgres)"
        other, reader = (("cold", "FeatureStore.historical") if store == "hot"
                         else ("hot", "FeatureStore.online"))
        elsewhere = set(hot_columns(c) if other == "hot" else cold_columns(c)) - keys | set(
            aggregation_names(c, other))
        named = ", ".join(f"{f!r} (only in the {other} store: {reader} reads it)" if f in elsewhere
                          else f"{f!r}{suggest(f, have)}" for f in unknown)
        raise ConfigError(f"schema {c.name!r} has no feature(s) {named} in {where}; it has: "
                          f"{', '.join(have)}", key="features")
    return list(features)


def entity_pg_type(c: CompiledSchema) -> str:
    """The entity column's Postgres type (``text``, ``smallint``, ``integer``, ``bigint``)."""
    return pg_type(c.schema.field(str(c.schema.entity)).type)


def entity_in(c: CompiledSchema) -> str:
    """``h.<entity> = ANY(%s::<its type>[])``: the parameter is :func:`entity_list`."""
    return f"h.{quote_ident(str(c.schema.entity))} = ANY(%s::{entity_pg_type(c)}[])"


def entity_list(c: CompiledSchema, ids: Sequence[Any]) -> list[Any]:
    """Caller ids as values of the entity's type (:func:`features.compile.layout.entity_values`),
    those that are no value of it left out (they match nothing)."""
    text = pa.array([entity_text(i) for i in ids], pa.string())
    values: list[Any] = entity_values(c, text).drop_null().to_pylist()
    return values


#: The lineage columns the fallback reads (``features.fallback.LINEAGE``), and the
#: aggregation row's event time (``__agg<event time>``: the event time's type).
#: Stands for a null id: a key no writer can create (a NUL character is a type reject).
NULL_ID = "\x00"


def entity_text(value: Any) -> str:
    if value is None:
        return NULL_ID
    return value if isinstance(value, str) else str(value)

