"""The online read of request-time windows: the tiles hash of each entity, read with the
entity hashes in one round trip, merged into the window values at ``T``
(:mod:`features.aggregate.tiles`; docs/aggregations.md, "Windows at request time")."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from features.aggregate.engine import AggSpec
from features.aggregate.tiles import EntityTiles, TileSpec, read_fields, values_at
from features.compile import CompiledSchema
from features.compile.layout import tiles_key
from features.errors import ConfigError, SinkError


@dataclass(frozen=True)
class TileRead:
    """One request-time read's Redis part: the tiles hashes and the fields of each."""

    tspec: TileSpec
    keys: list[str]
    fields: list[str]
    starts: list[int]
    edges: list[int]
    t_us: int


def tile_spec(c: CompiledSchema) -> TileSpec:
    """The schema's tiles (ConfigError when it has no hot windowed aggregation)."""
    tspec = TileSpec.of(AggSpec.of(c.schema))
    if tspec is None:
        raise ConfigError(f"schema {c.name!r} has no aggregation stored hot: windows='request_time' reads "
                          "the hot aggregations' tiles", key="windows")
    return tspec


def request_micros(c: CompiledSchema, at: Any, now_s: float) -> int:
    """``at`` (None: ``now_s``; a datetime, zoned, or naive for a schema whose event time
    is naive: its UTC wall clock) as microseconds since the epoch."""
    if at is None:
        return int(now_s * 1_000_000)
    if not isinstance(at, dt.datetime):
        raise ConfigError(f"at must be a datetime, not {type(at).__name__}", key="at")
    if at.tzinfo is None:
        from features.compile.arrow import arrow_type

        et = c.schema.event_time
        t = arrow_type(c.schema.field(et).type) if et is not None else None
        if t is None or not pa.types.is_timestamp(t) or t.tz is not None:
            raise ConfigError(f"at={at.isoformat()} is naive, but schema {c.name!r}'s event time is zoned: "
                              "give a zoned datetime", key="at")
        at = at.replace(tzinfo=dt.UTC)
    delta: dt.timedelta = at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def tile_read(tspec: TileSpec, c: CompiledSchema, ids: Sequence[str], t_us: int, key_prefix: str) -> TileRead:
    starts, edges, fields = read_fields(tspec, t_us)
    return TileRead(tspec, [key_prefix + tiles_key(c.name, i) for i in ids], fields, starts, edges, t_us)


def window_values(read: TileRead, replies: Sequence[Any], c: CompiledSchema) -> dict[str, pa.Array]:
    """The aggregations at ``read.t_us`` from the HMGET replies of ``read`` (one per key)."""
    tspec = read.tspec
    ns, ne = len(read.starts), len(read.edges)
    entities = []
    for key, reply in zip(read.keys, replies, strict=True):
        newest, sig = reply[0], reply[1]
        if sig is not None and sig.decode() != tspec.signature:
            raise SinkError(f"Redis holds request-time tiles of {c.name} in another layout ({key}): load the "
                            "schema's history again (features load) to rewrite them", store="redis")
        newest_us = int(newest) if newest is not None else None
        if newest_us is not None and read.t_us < newest_us - tspec.spec.lateness_us:
            raise ConfigError(
                f"at is more than the allowed lateness ({tspec.spec.aggregations.allowed_lateness_s}s) "
                "before "
                f"the newest event of {key}: the online state keeps the windows from there on; read earlier "
                "times with historical(..., windows='request_time')", key="at")
        summaries = {s: v for s, v in zip(read.starts, reply[2:2 + ns], strict=True)
                     if v is not None}
        events = {s: v for s, v in zip(read.edges, reply[2 + ns:2 + ns + ne], strict=True)
                  if v is not None}
        entities.append(EntityTiles(newest_us, summaries, events))
    return values_at(tspec, entities, read.t_us)


__all__ = ["TileRead", "request_micros", "tile_read", "tile_spec", "window_values"]
