"""Writing aggregation results: Postgres (``<schema>__aggregates``), Redis, late rejects.

The batch backfill and the stream job both end here. Writes are idempotent: Postgres
upserts one row per (entity, event time) and changes it only when a value differs;
Redis keeps each entity's newest event (an equal event time replaces, so an update by
a late event lands, but not a hash holding the same values: a re-run rewrites nothing and
the lineage keeps naming the run that wrote them); a late event's reject is unique per
source record.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from features.aggregate.engine import LATE_RULE, AggSpec, Inputs, extract, group_codes
from features.aggregate.tiles import TileRows, TileSpec
from features.compile import CompiledSchema
from features.compile.arrow import arrow_type
from features.compile.rejects import REJECTED_ROWS_SCHEMA
from features.lineage import DIGEST, RunContext
from features.schema.model import TypeKind

I64 = npt.NDArray[np.int64]


@dataclass
class AggregateCounts:
    """What the aggregation stage did: ``events == accepted + late + duplicates``."""

    events: int = 0
    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    rows_written: int = 0       # Postgres rows inserted or changed
    hot_written: int = 0        # Redis entities updated
    #: of ``hot_written``, those of writes whose Postgres rows were all there already (no
    #: row written or changed): Redis had lost them (a FLUSHDB) and got them back
    hot_restored: int = 0
    late_rejects_stored: int = 0
    tiles_written: int = 0      # request-time window tiles written to Redis (features.aggregate.tiles)
    from_history: int = 0       # a backfill: events earlier loads stored, read back for the windows
    seconds: float = 0.0

    @property
    def adds_up(self) -> bool:
        return self.events == self.accepted + self.late + self.duplicates

    def add(self, other: AggregateCounts) -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "seconds": round(self.seconds, 3), "adds_up": self.adds_up}


def event_time_array(spec: AggSpec, time_us: I64) -> pa.Array:
    """Microseconds since the epoch -> the schema's event time type."""
    assert spec.schema.event_time is not None
    target = arrow_type(spec.schema.field(spec.schema.event_time).type)
    if pa.types.is_date(target):
        return pa.array(np.floor_divide(time_us, 86_400_000_000).astype(np.int32), pa.date32()).cast(target)
    us = pa.array(time_us, pa.timestamp("us", getattr(target, "tz", None)))
    return us.cast(target, safe=False) if target != us.type else us


def event_time_text(spec: AggSpec, us: int) -> str:
    """An event time (microseconds since the epoch) as messages print it: ISO 8601 in
    the event time's own terms, naive for a naive timestamp (its UTC wall clock, without
    an offset it never had: ``2024-07-01T10:00:00``), with ``+00:00`` for a zoned one or
    a date (its UTC instant, a date's midnight UTC)."""
    assert spec.schema.event_time is not None
    t = spec.schema.field(spec.schema.event_time).type
    zone = None if t.kind is TypeKind.TIMESTAMP and t.tz is None else dt.UTC
    return (dt.datetime(1970, 1, 1, tzinfo=zone) + dt.timedelta(microseconds=us)).isoformat()


def late_rejects(spec: AggSpec, ctx: RunContext, entity: pa.Array, time_us: I64, sources: pa.Array,
                 newest_us: I64, released: npt.NDArray[np.bool_] | None = None) -> pa.Table:
    """One reject row per late event. A loop over late events only: the exception path."""
    n = len(time_us)
    if n == 0:
        return REJECTED_ROWS_SCHEMA.empty_table()
    schema = spec.schema
    assert schema.entity is not None and schema.event_time is not None
    et, ent = schema.event_time, schema.entity
    late_s = spec.aggregations.allowed_lateness_s
    raws, errors = [], []
    flags = released.tolist() if released is not None else [False] * n
    for e, t, newest, rel in zip(entity.to_pylist(), time_us.tolist(), newest_us.tolist(), flags,
                                 strict=True):
        got, floor = event_time_text(spec, t), event_time_text(spec, newest - spec.lateness_us)
        at = event_time_text(spec, newest)
        raws.append(json.dumps({ent: e, et: got}))
        why = (f"expected >= {floor} (the newest event of {ent} {e!r} seen before it is at {at}; "
               f"allowed lateness {late_s}s)")
        if rel:
            why = (f"the stream's watermark had passed the newest event of {ent} {e!r} ({at}) by a "
                   "whole window plus the allowed lateness, so the events its windows need were released; "
                   "the event is more than the allowed lateness behind its Kafka partition")
        errors.append(json.dumps([{
            "field": et, "rule": LATE_RULE, "reason": "lateness", "value": got,
            "message": (f"field {et} violates {LATE_RULE}: got {got}, {why}. "
                        "The row is stored in the history table but updates no aggregation"),
        }]))
    index = pc.cast(pc.extract_regex(sources, r"(?P<n>[0-9]+)$").field("n"), pa.int64())
    lineage = ctx.columns(sources)
    return pa.table({
        "_source": sources, "row_index": index, "raw": pa.array(raws, pa.string()),
        "errors": pa.array(errors, pa.string()),
        "event_time": pa.array(time_us, pa.timestamp("us", "UTC")),
        **{k: v for k, v in lineage.items() if k != "_source"},
    }, schema=REJECTED_ROWS_SCHEMA)


def _narrow(arr: pa.Array) -> pa.Array:
    """A decimal128(38, s) sum whose values fit 18 digits as decimal128(18, s): the same
    values, which the binary COPY encoder takes (``features.sinks.pgbinary``)."""
    t = arr.type
    if pa.types.is_decimal(t) and t.precision > 18:
        try:
            return arr.cast(pa.decimal128(18, t.scale))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return arr
    return arr


def _time_step_us(spec: AggSpec) -> int:
    """Microseconds per unit of the schema's event time type (a day for a date)."""
    assert spec.schema.event_time is not None
    t = arrow_type(spec.schema.field(spec.schema.event_time).type)
    if pa.types.is_date(t):
        return 86_400_000_000
    return {"s": 1_000_000, "ms": 1_000, "us": 1}.get(getattr(t, "unit", "us"), 1)


def _read_fields(spec: AggSpec) -> tuple[list[str], dict[str, pa.DataType]]:
    """The fields the aggregations read (besides the key), and how to read them back; the
    content digest too (what tells events at one instant apart, and orders them)."""
    schema = spec.schema
    names: list[str] = []
    for agg in spec.windowed:
        for name in (*(w for w, _ in agg.where), *([agg.of] if agg.of else [])):
            if name not in names:
                names.append(name)
    return names, {**{name: _read_type(arrow_type(schema.field(name).type)) for name in names},
                   DIGEST: pa.string()}


def _inputs(spec: AggSpec, names: list[str], read: tuple[pa.Array, pa.Array, dict[str, pa.Array], pa.Array]
            ) -> Inputs:
    schema = spec.schema
    assert schema.entity is not None and schema.event_time is not None
    ent, t_us, values, sources = read
    t = np.asarray(t_us.to_numpy(zero_copy_only=False), dtype=np.int64)
    rows = pa.table({
        **{name: values[name] for name in names if name not in (schema.entity, schema.event_time)},
        schema.entity: ent, schema.event_time: event_time_array(spec, t), "_source": sources,
        DIGEST: values[DIGEST]})
    return extract(spec, rows)


def _read_type(t: pa.DataType) -> pa.DataType:
    """How a field an aggregation reads comes back from the history table's CSV: numbers,
    booleans and text as themselves; anything else (an enum, a count's date or timestamp,
    where only null or not matters) as text."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_boolean(t):
        return t
    return pa.string()


class AggregateStores(Protocol):
    """The stores the aggregation stage writes through, given by whoever runs it (the
    pipeline: ``features.sinks.stores.aggregate_stores``), so the stage imports no sink."""

    def open(self) -> tuple[Any, Any]:
        """(hot, cold): the Redis sink of the aggregations and the Postgres sink, opened."""
        ...

    def unit(self, rows: pa.Table) -> Any:
        """What the hot sink's ``write`` takes for ``rows`` (no rejects, no ledger key)."""
        ...

    def tiles(self, *, signature: str, retention_us: int, size_us: int) -> Any:
        """The Redis writer of the request-time window tiles (``features.aggregate.tiles``), opened."""
        ...


@dataclass
class AggregateWriter:
    """Writes aggregation rows and late rejects for one schema (both paths use it)."""

    compiled: CompiledSchema
    stores: AggregateStores
    _pg: Any = field(default=None, init=False)
    _hot: Any = field(default=None, init=False)
    _pool: Any = field(default=None, init=False)
    _tiles: Any = field(default=None, init=False)

    def clone(self) -> AggregateWriter:
        """Another writer to the same stores (its own connections; not yet open)."""
        return AggregateWriter(self.compiled, self.stores)

    def open(self) -> None:
        self._hot, self._pg = self.stores.open()
        tspec = self.tile_spec
        if tspec is not None:
            self._tiles = self.stores.tiles(signature=tspec.signature, retention_us=tspec.retention_us,
                                            size_us=tspec.size_us)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aggregates-redis")

    @functools.cached_property
    def tile_spec(self) -> TileSpec | None:
        """What the schema's request-time window tiles hold (None: no hot aggregation)."""
        return TileSpec.of(AggSpec.of(self.compiled.schema))

    def write_tiles(self, rows: TileRows) -> int:
        """Write the tiles a load rewrote (``features.aggregate.tiles.build``) to Redis."""
        assert self._tiles is not None, "open() first (a schema with hot aggregations)"
        return int(self._tiles.write(rows))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._tiles is not None:
            self._tiles.close()
            self._tiles = None
        for sink in (self._hot, self._pg):
            if sink is not None:
                sink.close()

    def stored_inputs(self, spec: AggSpec, entity: pa.Array, lo_us: I64, hi_us: I64, *,
                      exclude_run: str | None = None, aggregated: bool = False) -> Inputs:
        """The aggregation inputs of the events the history table holds for ``entity[i]``
        with event time in ``[lo_us[i], hi_us[i])`` (one row per entity), except those run
        ``exclude_run`` wrote. Order: unspecified (the engine sorts)."""
        assert self._pg is not None, "open() first"
        # the stored type's precision: lo rounds down, the exclusive hi up (a superset)
        step = _time_step_us(spec)
        ranges = pa.table({"entity": entity, "lo": event_time_array(spec, lo_us // step * step),
                           "hi": event_time_array(spec, -(-hi_us // step) * step)})
        names, fields = _read_fields(spec)
        return _inputs(spec, names, self._pg.read_history(ranges, fields, exclude_run=exclude_run,
                                                          aggregated=aggregated))

    def accepted_inputs(self, spec: AggSpec, entity: pa.Array) -> Inputs:
        """The aggregation inputs of the events of ``entity`` (distinct values) that hold an
        aggregation row, within ``spec.horizon_us`` before each one's newest: the state
        a stream needs to go on where earlier runs and backfills stopped."""
        assert self._pg is not None, "open() first"
        names, fields = _read_fields(spec)
        return _inputs(spec, names, self._pg.read_accepted(entity, fields, spec.horizon_us))

    def stored_late(self, sources: pa.Array) -> npt.NDArray[np.bool_]:
        """Per source: whether a late reject (``aggregation.lateness``) is stored for it: the
        verdict an earlier pass gave a record a restart replays."""
        assert self._pg is not None, "open() first"
        found = self._pg.rejected_by(pc.unique(sources), LATE_RULE)
        return np.asarray(pc.is_in(sources, value_set=found).to_numpy(zero_copy_only=False), dtype=np.bool_)

    def write(self, spec: AggSpec, ctx: RunContext, entity: pa.Array, time_us: I64, sources: pa.Array,
              values: dict[str, pa.Array], late: pa.Table | None = None, *, new: bool = False,
              tiles: TileRows | None = None) -> AggregateCounts:
        """Store ``late`` rejects, then upsert aggregation ``values`` (one row per emitted
        event, in emission order: for a key emitted twice the last one wins). ``new``:
        the keys are expected to be new (``PostgresSink.upsert_aggregates``). ``tiles``:
        request-time window tiles to write too (:meth:`write_tiles`, while Postgres upserts)."""
        assert self._pg is not None and self._hot is not None, "open() first"
        schema = spec.schema
        assert schema.entity is not None and schema.event_time is not None
        counts = AggregateCounts()
        n = len(time_us)
        written = self._pool.submit(self.write_tiles, tiles) if tiles is not None and len(tiles) else None
        try:
            # the late rejects first: an aggregation row stored says every record before
            # its source has its verdict stored (what a replay after a restart looks up)
            if late is not None and late.num_rows:
                counts.late_rejects_stored = self._pg.insert_rejects(late)
            if n:
                codes = group_codes(entity)
                frame = pd.DataFrame({"k": codes, "t": time_us})
                keep = np.flatnonzero(~frame.duplicated(keep="last").to_numpy())
                take = pa.array(keep)
                rows = pa.table({
                    schema.entity: entity.take(take),
                    schema.event_time: event_time_array(spec, time_us[keep]),
                    **{name: _narrow(arr.take(take)) for name, arr in values.items()},
                    **ctx.columns(sources.take(take)),
                })
                hot = None
                if self._hot.features:
                    # only each entity's newest event can be the hot value; Redis is written
                    # while Postgres upserts
                    kc, kt = codes[keep], time_us[keep]
                    order = np.lexsort((np.arange(len(keep)), kt, kc))
                    last = order[np.r_[kc[order][1:] != kc[order][:-1], True]]
                    newest = rows.take(pa.array(last))
                    hot = self._pool.submit(self._hot.write, self.stores.unit(newest))
                try:
                    counts.rows_written = self._pg.upsert_aggregates(rows, new=new)
                finally:
                    if hot is not None:
                        counts.hot_written = hot.result().stored
                if counts.rows_written == 0:
                    counts.hot_restored = counts.hot_written
        finally:  # the tiles' write is waited for (and its error raised) whatever happened
            if written is not None:
                counts.tiles_written = written.result()
        return counts


__all__ = ["AggregateCounts", "AggregateStores", "AggregateWriter", "event_time_array", "late_rejects"]
