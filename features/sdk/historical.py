"""The point-in-time read's checks of the entity frame's times, and its staging table."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from features.compile import CompiledSchema
from features.errors import ConfigError
from features.schema.model import TypeKind
from features.sdk.columns import entity_pg_type


def as_of_times(c: CompiledSchema, ts: Any, column: str) -> Any:
    """``historical``'s ``entity_df`` times, checked against the schema's event time:
    zoned times (any unit, any zone) always; naive ones only when the event time is a
    naive timestamp, whose values are UTC wall-clock times (docs/types.md, "Naive
    timestamps"): a naive time then reads as UTC too. Where the event time has a zone
    (or is a date) a naive time is refused, as the validator refuses a naive value for
    a zoned field: nothing says which zone it is in. Returns the times, naive ones
    labelled UTC (the same instants); raises ConfigError. A static schema (``event_time:
    none``) has no event time to compare with: any timestamp is taken (naive ones as UTC);
    its read ignores them (``features.sdk.static``)."""
    if c.schema.event_time is None:
        if not pa.types.is_timestamp(ts.type):
            raise ConfigError(f"entity_df column {column!r} is {ts.type}; expected a timestamp",
                              key="entity_df")
        return ts if ts.type.tz is not None else ts.cast(pa.timestamp(ts.type.unit, "UTC"))
    event_time = str(c.schema.event_time)
    declared = c.schema.field(event_time).type
    naive = declared.kind is TypeKind.TIMESTAMP and declared.tz is None
    if not pa.types.is_timestamp(ts.type):
        want = "a timestamp (naive: UTC, or with a time zone)" if naive else "a timestamp with a time zone"
        raise ConfigError(f"entity_df column {column!r} is {ts.type}; expected {want}", key="entity_df")
    if ts.type.tz is not None:
        return ts
    if naive:
        return ts.cast(pa.timestamp(ts.type.unit, "UTC"))  # naive = UTC: the same numbers
    raise ConfigError(f"entity_df column {column!r} is {ts.type} (no time zone), but schema {c.name!r} has "
                      f"event time {event_time} of type {declared}: give the times with a zone (pandas: "
                      "Series.dt.tz_localize(...); pyarrow: cast to timestamp(unit, 'UTC') when they are "
                      "UTC). A naive time is read as UTC only against a naive event time", key="entity_df")


def stage_table(c: CompiledSchema) -> tuple[str, str]:
    """The session's temporary table ``historical`` stages entity rows in, one per entity
    column type (a connection serves schemas of several), and that type."""
    t = entity_pg_type(c)
    return f"_featureline_asof_{t}", t

