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
from features.aggregate.tiles import EntityTiles, TileSpec, read_fields, row_at, values_at, window_ranges
from features.compile import CompiledSchema
from features.compile.arrow import arrow_type
from features.compile.layout import tiles_key
from features.errors import ConfigError, SinkError
from features.sdk.online import OnlineRequest

#: what an online read's aggregation columns hold: as of the entity's newest event, or
#: evaluated at the request time (``historical``, ``online`` and the views alike)
WINDOWS = ("event", "request_time")
#: the default of every read (``online``, the views, HTTP, ``historical``, the CLI): a
#: window is evaluated at the time it is read, so that online, views and training rows
#: agree and a quiet entity decays (docs/aggregations.md, "Windows at request time")
DEFAULT_WINDOWS = "request_time"


def request_time_windows(windows: str, at: Any) -> bool:
    """Whether ``windows`` asks for request-time windows (ConfigError for a value other
    than :data:`WINDOWS`, or for ``at`` given without ``windows="request_time"``)."""
    if windows not in WINDOWS:
        raise ConfigError(f"windows must be one of {', '.join(map(repr, WINDOWS))}, not {windows!r}",
                          key="windows")
    if at is not None and windows != "request_time":
        raise ConfigError("at= is the request time of windows='request_time'", key="at")
    return windows == "request_time"


@dataclass(frozen=True)
class TileRead:
    """One request-time read's Redis part: the tiles hashes and the fields of each (the
    newest event time, the layout signature, the packed summaries, the edge tiles' events
    at ``edges``, last the time ``c`` the hash is complete from); ``names``: the requested
    aggregations the tiles hold; ``earliest_us``: where the earliest window starts (a
    hash complete only from after it is read from the history)."""

    tspec: TileSpec
    keys: list[str]
    fields: list[str]
    edges: list[int]
    t_us: int
    names: tuple[str, ...] = ()
    earliest_us: int = 0


def tile_spec(c: CompiledSchema) -> TileSpec | None:
    """The schema's tiles (None when none of its aggregations is stored hot); they hold
    every hot aggregation, the sketches included (features.aggregate.sketch_tiles)."""
    return TileSpec.of(AggSpec.of(c.schema))


def request_micros(c: CompiledSchema, at: Any, now_s: float) -> int:
    """``at`` (None: ``now_s``; a datetime, zoned, or naive for a schema whose event time
    is naive: its UTC wall clock) as microseconds since the epoch."""
    if at is None:
        return int(now_s * 1_000_000)
    if not isinstance(at, dt.datetime):
        raise ConfigError(f"at must be a datetime, not {type(at).__name__}", key="at")
    if at.tzinfo is None:
        et = c.schema.event_time
        t = arrow_type(c.schema.field(et).type) if et is not None else None
        if t is None or not pa.types.is_timestamp(t) or t.tz is not None:
            raise ConfigError(f"at={at.isoformat()} is naive, but schema {c.name!r}'s event time is zoned: "
                              "give a zoned datetime", key="at")
        at = at.replace(tzinfo=dt.UTC)
    delta: dt.timedelta = at - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def tile_read(tspec: TileSpec, c: CompiledSchema, ids: Sequence[str], t_us: int, key_prefix: str,
              names: Sequence[str] = ()) -> TileRead:
    """The tiles hashes of ``ids`` at ``t_us`` and their fields; ``names``: the requested
    aggregations the tiles hold (what a one-entity read computes, :func:`window_row`)."""
    _, edges, fields = read_fields(tspec, t_us)
    keys = [key_prefix + tiles_key(c.name, i) for i in ids]
    earliest = min(a for a, _ in window_ranges(tspec, t_us))
    return TileRead(tspec, keys, fields, edges, t_us, tuple(names), earliest)


def window_values(read: TileRead, replies: Sequence[Any], c: CompiledSchema) -> dict[str, pa.Array]:
    """The aggregations at ``read.t_us`` from the HMGET replies of ``read`` (one per key)."""
    return values_at(read.tspec, [_entity_tiles(read, key, reply, c) for key, reply in
                                  zip(read.keys, replies, strict=True)], read.t_us)


def window_row(read: TileRead, replies: Sequence[Any], c: CompiledSchema, names: Sequence[str]
               ) -> dict[str, Any] | None:
    """The aggregations ``names`` of :func:`window_values` of a read of one entity whose
    tiles hash was found, as Python values (``{name: value}``: the one row, without an
    Arrow array per aggregation: :func:`features.aggregate.tiles.row_at`); None for any
    other read (several keys, no tiles hash, or one of ``names`` other than a count, sum,
    mean, min/max, first or last: judged on ``names``, not on every aggregation the
    tiles hold)."""
    if len(replies) != 1 or (replies[0][0] is None and replies[0][1] is None):
        return None
    names = tuple(names)
    if read.tspec.one_for(names) is None:
        return None
    return row_at(read.tspec, _entity_tiles(read, read.keys[0], replies[0], c), read.t_us, names)


def _entity_tiles(read: TileRead, key: str, reply: Sequence[Any], c: CompiledSchema) -> EntityTiles:
    """One key's HMGET reply as :class:`EntityTiles`: SinkError for tiles of another
    layout, ConfigError for a request time past the allowed lateness before its newest event."""
    tspec = read.tspec
    ne = len(read.edges)
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
    events = {s: v for s, v in zip(read.edges, reply[3:3 + ne], strict=True) if v is not None}
    return EntityTiles(newest_us, reply[2], events)


@dataclass(frozen=True)
class WindowedRequest:
    """One online read with request-time windows: ``base`` reads the features as
    ``online`` reads them (none of the hot aggregations), ``tiles`` (None when no hot
    aggregation is asked for) the aggregations' tiles hashes at the request time, sent
    last in the same pipeline. ``lenient``: an entity whose newest event is more than the
    allowed lateness after the request time reads the empty window instead of raising
    (a view re-reads such rows as ``historical`` at that time). ``history``: the requested
    hot aggregations the tiles do not hold (none while they hold every hot aggregation,
    the sketches included), computed from the history table at ``t_us`` for the entities
    the read finds."""

    base: OnlineRequest
    tiles: TileRead | None
    columns: list[str]              # the requested features and aggregations, in result order
    lenient: bool = False
    history: tuple[str, ...] = ()
    t_us: int = 0                   # the request time, epoch microseconds
    #: the request time is the clock's (no ``at=``): an entity whose newest event is more
    #: than the allowed lateness after it (events stamped ahead of the clock) is read from
    #: the history, exactly, instead of raising (a default call never refuses)
    clocked: bool = False

    @property
    def ids(self) -> list[str]:
        return self.base.ids

    @property
    def reads(self) -> list[tuple[list[str], list[str] | None]]:
        if self.tiles is None:
            return self.base.reads
        return [*self.base.reads, (self.tiles.keys, self.tiles.fields)]

    def split(self, replies: list[Any]) -> tuple[list[Any], list[Any]]:
        """The pipeline's replies: the base read's, the tiles hashes'."""
        k = len(replies) - (len(self.tiles.keys) if self.tiles is not None else 0)
        return replies[:k], replies[k:]


def windowed_values(req: WindowedRequest, tile_replies: list[Any]) -> dict[str, pa.Array]:
    """The requested hot aggregations of ``req`` evaluated at the request time from
    ``tile_replies`` (none when it reads no tiles); a ``lenient`` request reads an entity
    whose newest event is past the allowed lateness after the request time as the empty
    window."""
    if req.tiles is None:
        return {}
    return window_values(req.tiles, _lenient(req, tile_replies), req.base.plan.c)


def windowed_row(req: WindowedRequest, tile_replies: list[Any]) -> dict[str, Any] | None:
    """:func:`windowed_values` of a one-entity request as Python values
    (:func:`window_row`), or None where that does not apply."""
    if req.tiles is None:
        return None
    return window_row(req.tiles, _lenient(req, tile_replies), req.base.plan.c, req.tiles.names)


def _lenient(req: WindowedRequest, tile_replies: list[Any]) -> list[Any]:
    """``tile_replies``, where ``req`` is lenient, with an entity whose newest event is
    past the allowed lateness after the request time read as having no tiles."""
    read = req.tiles
    if not req.lenient or read is None:
        return tile_replies
    late = read.t_us + read.tspec.spec.lateness_us
    return [[None] * len(read.fields) if r[0] is not None and int(r[0]) > late else r for r in tile_replies]


__all__ = ["DEFAULT_WINDOWS", "WINDOWS", "TileRead", "WindowedRequest", "request_micros",
           "request_time_windows", "tile_read", "tile_spec", "window_row", "window_values", "windowed_row",
           "windowed_values"]
