"""The SDK's hot reader (:class:`HotReader`): ``FeatureStore.online`` and its kin read
Redis here. One pipelined round trip of ``HMGET`` per call (the entity hashes, the
aggregates hashes, PTTL for ``hot.refresh_after``, the lineage); the replies decoded into
the declared Arrow types (or, for a small call found whole, straight into dicts); hashes
an earlier version wrote rewritten and read again (:class:`features.sdk.upgrade.Versions`);
ids missing from Redis read from Postgres through the shared fallback
(:class:`features.sdk.fallback.Fallback`). Metrics are counted by the facade."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import errors

from features.compile import CompiledSchema
from features.compile.layout import (
    aggregates_key,
    aggregation_names,
    cold_columns,
    declared_type,
    entity_key,
    from_text,
    reply_columns,
)
from features.errors import SinkError
from features.sdk.asof import windows_at
from features.sdk.columns import (
    AGE,
    CHECKED,
    EVENT_TIME,
    FOUND,
    FROM,
    NULL_ID,
    STALE,
    entity_text,
    event_time_type,
    requested_columns,
    time_column,
)
from features.sdk.online import (
    LINEAGE_FIELDS,
    SMALL_CALL,
    UPGRADE_ATTEMPTS,
    OnlineRequest,
    Outdated,
    Plan,
    python_decoders,
    scatter,
    small_rows,
    still_outdated,
)
from features.sdk.request_time import (
    DEFAULT_WINDOWS,
    WindowedRequest,
    request_micros,
    request_time_windows,
    tile_read,
    tile_spec,
    windowed_row,
    windowed_values,
)

if TYPE_CHECKING:
    from features.sdk.catalog import Catalog
    from features.sdk.connections import Connections
    from features.sdk.fallback import Fallback
    from features.sdk.upgrade import Versions
    from features.sinks.versions import Newer


class Read(NamedTuple):
    """What one online read gave: the result, how many ids it read, how many the Postgres
    fallback served and how many were found nowhere (the facade's metrics)."""

    value: Any  # a pyarrow.Table, or a list of dicts
    ids: int
    from_pg: int
    missed: int


class HotReader:
    """Online reads of the schemas of ``catalog`` through ``connections``. ``fallback``
    (the default of a call's ``fallback=``) and ``max_age`` (the default of its
    ``max_age=``) as ``FeatureStore`` takes them; ``clock``: the time of a request-time
    read's default ``at``."""

    def __init__(self, connections: Connections, catalog: Catalog, versions: Versions, fallback: Fallback,
                 *, use_fallback: bool, max_age: dt.timedelta | None, clock: Callable[[], float],
                 on_history: Callable[[str, int], None] | None = None) -> None:
        self.connections = connections
        self.catalog = catalog
        self.versions = versions
        self.fallback = fallback
        self.use_fallback = use_fallback
        self.max_age = max_age
        self.clock = clock
        #: called with (schema, entities) after a request-time read computed the windows of
        #: entities without a tiles hash from the history (the facade's metric)
        self.on_history = on_history
        self._plans: dict[tuple[str, tuple[str, ...] | None], Plan] = {}
        #: schema -> its features.aggregate.tiles.TileSpec and the aggregations it holds
        self._tile_specs: dict[str, tuple[Any, frozenset[str]]] = {}
        #: (schema, features) -> :meth:`_windowed_plan`
        self._windowed_plans: dict[tuple[str, tuple[str, ...] | None], tuple[Any, tuple[str, ...],
                                                                              tuple[str, ...]]] = {}

    def plan(self, schema: str, features: Sequence[str] | None) -> Plan:
        """What an online call for ``features`` of ``schema`` reads, computed once per
        (schema, features) and kept: the small-call path costs little more than Redis."""
        key = (schema, tuple(features) if features is not None else None)
        plan = self._plans.get(key)
        if plan is None:
            c = self.catalog.loadable(schema)
            columns = requested_columns(c, features, "hot")
            hot_aggs = set(aggregation_names(c, "hot"))
            names = [x for x in columns if x not in hot_aggs]
            aggs = [x for x in columns if x in hot_aggs]
            cold = set(cold_columns(c))
            cold_aggs = set(aggregation_names(c, "cold"))
            hot = c.schema.hot
            refresh_ms = (hot.refresh_after_seconds * 1000 if hot.refresh_after_seconds and hot.ttl_seconds
                          else None)
            types = {name: declared_type(c, name) for name in [*names, *aggs]}
            plan = Plan(c, columns, names, aggs, [*names, *CHECKED, EVENT_TIME],
                        [*aggs, *CHECKED, EVENT_TIME], [x for x in names if x in cold],
                        [x for x in aggs if x in cold_aggs],
                        (hot.ttl_seconds or 0) * 1000, refresh_ms, types,
                        pa.schema([(str(c.schema.entity), pa.string()), *[(x, types[x]) for x in columns],
                                   (EVENT_TIME, event_time_type(c)), (AGE, pa.float64()),
                                   (FROM, pa.string()), (FOUND, pa.bool_()), (STALE, pa.bool_())]),
                        python_decoders([types[x] for x in [*names, *aggs]]))
            if len(self._plans) > 1024:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                lineage: bool = False) -> OnlineRequest:
        """What one online call reads, for the sync and the async path alike: the entity
        hashes, then (when hot aggregations are requested) the aggregates hashes, then
        (for a schema with ``hot.refresh_after``) the entity hashes' PTTL, then (with
        ``lineage``) the entity hashes' ``_source`` and ``_run_id``."""
        plan = self.plan(schema, features)
        name = plan.c.name
        prefix = self.connections.key_prefix
        ids = [entity_text(i) for i in entity_ids]
        keys = [prefix + entity_key(name, i) for i in ids]
        reads: list[tuple[list[str], list[str] | None]] = [(keys, plan.fields)]
        if plan.aggs:
            reads.append(([prefix + aggregates_key(name, i) for i in ids], plan.agg_fields))
        if plan.refresh_ms is not None:
            reads.append((keys, None))
        if lineage:
            reads.append((keys, list(LINEAGE_FIELDS)))
        return OnlineRequest(plan, ids, reads, lineage)

    def online(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
               fallback: bool | None, max_age: dt.timedelta | None, windows: str = DEFAULT_WINDOWS,
               at: dt.datetime | None = None) -> Read:
        """``FeatureStore.online``: a table (``windows="request_time"``:
        :meth:`online_request_time`; ConfigError for a ``windows`` other than
        :data:`features.sdk.request_time.WINDOWS`, or ``at`` without request-time windows)."""
        if self.windowed(schema, features, windows, at):
            return self.online_request_time(schema, entity_ids, features, fallback, max_age, at)
        since = time.monotonic()
        req = self.request(schema, entity_ids, features)
        replies = self.connections.redis_replies(req.reads)
        rows = small_rows(req, replies) if len(req.ids) <= SMALL_CALL else None
        if rows is not None:  # every id in Redis, fresh: no Arrow decoding
            return Read(pa.Table.from_pylist(rows, req.plan.result), len(req.ids), 0, 0)
        table, from_pg, missed = self.finish(req, replies, fallback, max_age, since)
        return Read(table, len(req.ids), from_pg, missed)

    def online_dicts(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                     fallback: bool | None, max_age: dt.timedelta | None, windows: str = DEFAULT_WINDOWS,
                     at: dt.datetime | None = None) -> Read:
        """``FeatureStore.online_dicts``: one dict per id, no Arrow object when every id is
        in Redis (and fresh); ``windows="request_time"``: the rows of
        :meth:`online_request_time`'s table."""
        if self.windowed(schema, features, windows, at):
            read = self.online_request_time(schema, entity_ids, features, fallback, max_age, at)
            return Read(read.value.to_pylist(), read.ids, read.from_pg, read.missed)
        since = time.monotonic()
        req = self.request(schema, entity_ids, features)
        replies = self.connections.redis_replies(req.reads)
        rows = small_rows(req, replies)  # any size: the dicts are made in Python either way
        if rows is not None:
            return Read(rows, len(req.ids), 0, 0)
        table, from_pg, missed = self.finish(req, replies, fallback, max_age, since)
        return Read(table.to_pylist(), len(req.ids), from_pg, missed)

    async def online_async(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                           fallback: bool | None, max_age: dt.timedelta | None,
                           windows: str = DEFAULT_WINDOWS, at: dt.datetime | None = None) -> Read:
        """``FeatureStore.online_async``: redis.asyncio; decoding and the fallback in a
        worker thread (``windows="request_time"``: the tiles read in the same round trip)."""
        since = time.monotonic()
        req: OnlineRequest | WindowedRequest
        if self.windowed(schema, features, windows, at):
            req = self.windowed_request(schema, entity_ids, features, at)
        else:
            req = self.request(schema, entity_ids, features)
        base = req.base if isinstance(req, WindowedRequest) else req
        for _ in range(UPGRADE_ATTEMPTS):
            # every attempt reads the whole pipeline (a windowed read's tiles too) with
            # redis.asyncio: the worker thread decodes, never reads Redis again itself
            replies = await self.connections.redis_replies_async(req.reads)
            try:
                table, from_pg, missed = await asyncio.to_thread(
                    self._finish_once, req, replies, fallback, max_age, since)
                return Read(table, len(req.ids), from_pg, missed)
            except Outdated:  # hashes an earlier version wrote: rewritten, then read again
                await asyncio.to_thread(self.versions.upgrade, base)
        raise still_outdated(base)

    def _finish_once(self, req: OnlineRequest | WindowedRequest, replies: list[Any], fallback: bool | None,
                     max_age: dt.timedelta | None, since: float) -> tuple[pa.Table, int, int]:
        """:meth:`finish` without its upgrade loop: Outdated for hashes an earlier version
        wrote (the async read rewrites them and reads again with redis.asyncio)."""
        if isinstance(req, WindowedRequest):
            return self.finish_windowed(req, replies, fallback, max_age, since, upgrade=False)
        return self._finish(req, replies, fallback, max_age, since)

    def windowed(self, schema: str, features: Sequence[str] | None, windows: str, at: dt.datetime | None
                 ) -> bool:
        """Whether an online call reads request-time windows: ``windows="request_time"``
        (ConfigError for another value than :data:`features.sdk.request_time.WINDOWS`, or
        ``at`` without it) and some hot aggregation is requested; a call that reads none
        takes the per-event path, whose rows are the same (``at`` still checked)."""
        if not request_time_windows(windows, at):
            return False
        plan = self.plan(schema, features)
        if plan.aggs:
            return True
        if at is not None:
            request_micros(plan.c, at, 0.0)  # a bad at is refused whatever the read
        return False

    def windowed_columns(self, schema: str, features: Sequence[str] | None
                         ) -> tuple[CompiledSchema, list[str], list[str], list[str]]:
        """A request-time read's schema, its columns (the requested features and hot
        aggregations, in result order), the aggregations among them and the other
        features: those of :meth:`plan` (computed once per (schema, features) and kept)."""
        plan = self.plan(schema, features)
        return plan.c, plan.columns, plan.aggs, plan.names

    def windowed_request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                         at: dt.datetime | None, *, lineage: bool = False, now_s: float | None = None,
                         lenient: bool = False) -> WindowedRequest:
        """What one online call with ``windows="request_time"`` reads (every online call,
        views included, through this one read): the features as :meth:`request` reads
        them, then the hot aggregations' tiles at ``at`` (None: ``now_s``, default the
        store's clock), in the same pipeline."""
        c, columns, aggs, names = self.windowed_columns(schema, features)
        base = self.request(schema, entity_ids, names, lineage)
        t_us = request_micros(c, at, self.clock() if now_s is None else now_s)
        if not aggs:
            return WindowedRequest(base, None, columns, lenient, (), t_us)
        tspec, history, tiled = self._windowed_plan(c, schema, features, aggs)
        tiles = (tile_read(tspec, c, base.ids, t_us, self.connections.key_prefix, tiled)
                 if tspec is not None and tiled else None)
        return WindowedRequest(base, tiles, columns, lenient, history, t_us, at is None)

    def _windowed_plan(self, c: CompiledSchema, schema: str, features: Sequence[str] | None,
                       aggs: list[str]) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
        """A request-time read's tile spec (None: the schema has no tiles), the requested
        aggregations the tiles do not hold (from the history, exactly: none since they
        hold the sketches; kept for any the tiles leave out) and those they hold: made
        once per (schema, features), as :meth:`plan`."""
        key = (schema, tuple(features) if features is not None else None)
        got = self._windowed_plans.get(key)
        if got is None:
            if c.name not in self._tile_specs:
                ts = tile_spec(c)
                self._tile_specs[c.name] = (ts, frozenset(a.name for a in ts.spec.aggregations.features)
                                            if ts is not None else frozenset())
            tspec, held = self._tile_specs[c.name]
            got = (tspec, tuple(x for x in aggs if x not in held), tuple(x for x in aggs if x in held))
            if len(self._windowed_plans) > 1024:
                self._windowed_plans.clear()
            self._windowed_plans[key] = got
        return got

    def finish_windowed(self, req: WindowedRequest, replies: list[Any], fallback: bool | None,
                        max_age: dt.timedelta | None, since: float, *, upgrade: bool = True
                        ) -> tuple[pa.Table, int, int]:
        """:meth:`finish` of a :class:`WindowedRequest`: the features as ``online``
        finishes them (``upgrade``: hashes an earlier version wrote rewritten and read
        again; else Outdated is raised), then the aggregations from the tiles; an entity
        found (in Redis or by the fallback) whose tiles hash is absent has its windows
        computed from the history instead (:meth:`history_windows`)."""
        base, tiles = req.split(replies)
        absent = np.zeros(len(tiles), np.bool_)
        if req.tiles is not None:
            # a tiles hash written with another layout (another version of the aggregations)
            # is of no use to this reader: read like an absent one, from the history
            sig = req.tiles.tspec.signature.encode()
            # the clock behind an entity's events: its history
            late = (req.t_us + req.tiles.tspec.spec.lateness_us if req.clocked and not req.lenient
                    else None)
            # a hash complete only from after the windows' start (made again after Redis lost
            # it, ``c``): from the history until the windows no longer reach before that
            reach = req.tiles.earliest_us
            absent = np.asarray([(r[0] is None and r[1] is None) or (r[1] is not None and r[1] != sig)
                                 or (late is not None and r[0] is not None and int(r[0]) > late)
                                 or (r[-1] is not None and int(r[-1]) > reach)
                                 for r in tiles], dtype=np.bool_)
        rows = (small_rows(req.base, base) if len(req.ids) <= SMALL_CALL and not req.base.lineage
                else None)
        if (rows is not None and len(rows) == 1 and len(set(req.columns)) == len(req.columns)
                and not req.history and not absent.any()):
            # one entity with its tiles, every aggregation in them: its windows as Python
            # values, in one table with its features
            one = windowed_row(req, tiles)
            if one is not None and all(x in one or x in rows[0] for x in req.columns):
                rows[0].update(one)
                return pa.Table.from_pylist(rows, self.plan(req.base.plan.c.name, req.columns).result), 0, 0
        if rows is not None:  # every id in Redis, fresh: no Arrow decoding of the features
            table, from_pg, missed = pa.Table.from_pylist(rows, req.base.plan.result), 0, 0
        elif upgrade:
            table, from_pg, missed = self.finish(req.base, base, fallback, max_age, since)
        else:
            table, from_pg, missed = self._finish(req.base, base, fallback, max_age, since)
        if absent.any():
            tiles = [[None] * len(r) if a else r for r, a in zip(tiles, absent.tolist(), strict=True)]
        values = windowed_values(req, tiles)
        if values:
            values = self.history_windows(req, absent, table, values)
        if req.history:
            values.update(self.untiled_windows(req, table))
        entity = str(req.base.plan.c.schema.entity)
        return with_windows(table, entity, req.columns, set(values), values), from_pg, missed

    def untiled_windows(self, req: WindowedRequest, table: pa.Table) -> dict[str, pa.Array]:
        """The requested hot aggregations the tiles do not hold (``req.history``: none
        while the tiles hold every hot aggregation, the sketches included) at the
        request time, computed from the history table as ``historical(...,
        windows="request_time")`` computes them (:func:`features.sdk.asof.windows_at`, one
        Postgres read) for the entities found (``table``'s ``_found``); the others read the
        empty window, as from the tiles."""
        c = req.base.plan.c
        found = np.asarray(table.column(FOUND).to_numpy(zero_copy_only=False), dtype=np.bool_)
        ids = pa.array(req.ids, pa.string())
        try:
            return windows_at(self.connections, c, ids, req.t_us, list(req.history), read=found)
        except errors.UndefinedTable:  # no history table: every window is empty
            return windows_at(self.connections, c, ids, req.t_us, list(req.history),
                              read=np.zeros(len(found), np.bool_))

    def history_windows(self, req: WindowedRequest, absent: npt.NDArray[np.bool_], table: pa.Table,
                        values: dict[str, pa.Array]) -> dict[str, pa.Array]:
        """``values`` (the windows read from the tiles) with the entities whose tiles hash
        is ``absent`` (or of another layout) but that were found (``table``'s ``_found``:
        their entity hash in Redis, or their row by the Postgres fallback) computed from
        the history table at the request time instead, as ``historical(...,
        windows="request_time")`` computes them (:func:`features.sdk.asof.windows_at`: one
        Postgres read for all of them). An entity loaded before tiles existed, whose tiles
        Redis lost, or whose tiles an earlier version of the aggregations wrote, so never
        reads an empty window it does not have; an entity found nowhere keeps the empty
        window (no query). The tiles are not written back here (docs/aggregations.md, "Missing
        tiles"). Counted through ``on_history``."""
        assert req.tiles is not None
        found = np.asarray(table.column(FOUND).to_numpy(zero_copy_only=False), dtype=np.bool_)
        rows = np.flatnonzero(absent & found)
        if not len(rows):
            return values
        c = req.base.plan.c
        ids = pa.array([req.ids[i] for i in rows], pa.string())
        try:
            got = windows_at(self.connections, c, ids, req.tiles.t_us, list(values))
        except errors.UndefinedTable:  # no history table (Redis written, Postgres elsewhere)
            return values
        if self.on_history is not None:
            self.on_history(c.name, len(rows))
        return {name: scatter(arr, rows, got[name]) for name, arr in values.items()}

    def online_request_time(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                            fallback: bool | None, max_age: dt.timedelta | None, at: dt.datetime | None
                            ) -> Read:
        """``FeatureStore.online`` with ``windows="request_time"``: the features as
        :meth:`online` reads them and the aggregations from the tiles, in one round trip."""
        since = time.monotonic()
        req = self.windowed_request(schema, entity_ids, features, at)
        replies = self.connections.redis_replies(req.reads)
        table, from_pg, missed = self.finish_windowed(req, replies, fallback, max_age, since)
        return Read(table, len(req.ids), from_pg, missed)

    def finish(self, req: OnlineRequest | WindowedRequest, replies: list[Any], fallback: bool | None,
               max_age: dt.timedelta | None, since: float) -> tuple[pa.Table, int, int]:
        """The result table of ``req`` from its ``replies`` (the Postgres fallback for the
        ids Redis lacks), how many ids the fallback served, how many were found nowhere;
        the hashes an earlier version of the schema wrote rewritten and read again first
        (a :class:`WindowedRequest`'s aggregations from its tiles: :meth:`finish_windowed`)."""
        if isinstance(req, WindowedRequest):
            return self.finish_windowed(req, replies, fallback, max_age, since)
        for _ in range(UPGRADE_ATTEMPTS):
            try:
                return self._finish(req, replies, fallback, max_age, since)
            except Outdated:
                self.versions.upgrade(req)
                replies = self.connections.redis_replies(req.reads)
        raise still_outdated(req)

    def _decode_hashes(self, plan: Plan, names: list[str], replies: Sequence[Any],
                       what: str) -> tuple[dict[str, pa.Array], pa.Array]:
        """HMGET replies (the ``names``, then ``_enc``, ``_schema_fingerprint`` and
        ``_event_time``) -> the columns in their declared types and the event times (int64
        microseconds, null where the hash is absent). Checks every hash found first."""
        c = plan.c
        cols = reply_columns(replies, len(names) + len(CHECKED) + 1)
        newer = self.versions.check_hashes(c, cols[len(names)], cols[len(names) + 1], what)
        columns = {name: from_text(c, name, cols[j], plan.types[name]) if newer is None
                   else _from_newer(c, newer, name, cols[j], cols[len(names) + 1], plan.types[name])
                   for j, name in enumerate(names)}
        return columns, cols[-1].cast(pa.int64())

    def _finish(self, req: OnlineRequest, replies: list[Any], fallback: bool | None,
                max_age: dt.timedelta | None, since: float) -> tuple[pa.Table, int, int]:
        """The result table, how many ids the Postgres fallback served, how many were found nowhere."""
        plan, ids = req.plan, req.ids
        c = plan.c
        schema = c.schema
        n = len(ids)
        columns, micros = self._decode_hashes(plan, plan.names, replies[:n], "hashes")
        found = np.asarray(micros.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
        k = n
        if plan.aggs:
            aggs, _ = self._decode_hashes(plan, plan.aggs, replies[n:2 * n], "aggregates hashes")
            k += n
            # A row's values come from one place: the aggregates of an id without an entity
            # hash are dropped (the Postgres fallback, or nulls, give that row).
            if not found.all():
                keep = pa.array(np.arange(n, dtype=np.int64), mask=~found)
                aggs = {name: arr.take(keep) for name, arr in aggs.items()}
            columns.update(aggs)
        stale = np.zeros(n, dtype=np.bool_)
        if plan.refresh_ms is not None:
            pttl = np.array(replies[k:k + n], dtype=np.int64)
            # written longer ago than refresh_after: ttl - remaining
            stale = found & (pttl >= 0) & (plan.ttl_ms - pttl > plan.refresh_ms)
        if req.lineage:  # the last read: the entity hashes' _source, _run_id
            lineage = reply_columns(replies[-n:], len(LINEAGE_FIELDS)) if n else [
                pa.array([], pa.string()) for _ in LINEAGE_FIELDS]
            columns.update(zip(LINEAGE_FIELDS, lineage, strict=True))
        data: dict[str, pa.Array] = {str(schema.entity): pa.array([None if i == NULL_ID else i for i in ids],
                                                                  pa.string()),
                                     **{name: columns[name] for name in plan.columns},
                                     EVENT_TIME: micros.cast(plan.result.field(EVENT_TIME).type)}
        if req.lineage:
            data.update({name: columns[name] for name in LINEAGE_FIELDS})
        in_redis = int(found.sum())
        source = np.array(["redis" if f else None for f in found.tolist()], dtype=object)
        use_fallback = self.use_fallback if fallback is None else fallback
        if use_fallback and in_redis < n:
            valid = np.array([i != NULL_ID for i in ids], dtype=np.bool_)
            missing = np.flatnonzero(~found & valid)
            if len(missing):
                self._fill_from_fallback(req, data, found, source, missing,
                                         max_age if max_age is not None else self.max_age, since)
        if use_fallback and stale.any():
            self.fallback.refresh(c, sorted({ids[i] for i in np.flatnonzero(stale)}))
        now_us = time.time_ns() // 1000
        ev = data[EVENT_TIME]
        age = pc.divide(pc.subtract(pa.scalar(now_us, pa.int64()), ev.cast(pa.int64())), 1_000_000.0)
        data[AGE] = age
        data[FROM] = pa.array(source.tolist(), pa.string())
        data[FOUND] = pa.array(found)
        data[STALE] = pa.array(stale)
        hits = int(found.sum())
        return pa.table(data), hits - in_redis, n - hits

    def _fill_from_fallback(self, req: OnlineRequest, data: dict[str, pa.Array],
                            found: npt.NDArray[np.bool_], source: npt.NDArray[Any],
                            missing: npt.NDArray[np.int64], max_age: dt.timedelta | None,
                            since: float) -> None:
        """Rows ``missing`` from Redis, from the shared Postgres read (``features.fallback``):
        their columns in ``data``, ``found`` and ``source`` updated in place. Ids another
        process filled meanwhile are read from Redis again."""
        plan, ids = req.plan, req.ids
        c = plan.c
        got = self.fallback.fetch(c, sorted({ids[i] for i in missing}), since)
        if got.again:
            again = missing[np.array([ids[i] in got.again for i in missing], dtype=np.bool_)]
            sub_ids = [ids[i] for i in again]
            sub = self.request(c.name, sub_ids, plan.columns if plan.columns else None, req.lineage)
            sub_table, _, _ = self._finish(sub, self.connections.redis_replies(sub.reads), False, None, since)
            hit = np.asarray(sub_table.column(FOUND).to_numpy(zero_copy_only=False), dtype=np.bool_)
            if hit.any():
                rows_at = again[hit]
                take = pa.array(np.flatnonzero(hit))
                for name in [*plan.columns, EVENT_TIME, *(LINEAGE_FIELDS if req.lineage else ())]:
                    value = sub_table.column(name).combine_chunks().take(take)
                    data[name] = scatter(data[name], rows_at, value)
                found[rows_at] = True
                source[rows_at] = "redis"
        if got.rows is None:
            return
        # naive = UTC: a naive event time's microseconds are its UTC wall clock, as in Redis
        event_type = plan.result.field(EVENT_TIME).type
        event = got.rows.column(time_column(c)).combine_chunks().cast(event_type)
        oldest = (None if max_age is None else
                  int((dt.datetime.now(dt.UTC) - max_age).timestamp() * 1_000_000))
        pick = np.array([got.at.get(ids[i], -1) for i in missing], dtype=np.int64)
        if oldest is not None and (pick >= 0).any():
            ev_us = np.asarray(event.cast(pa.int64()).to_numpy(zero_copy_only=False))
            pick[(pick >= 0) & (ev_us[np.maximum(pick, 0)] < oldest)] = -1
        rows_at = missing[pick >= 0]
        if not len(rows_at):
            return
        take = pa.array(pick[pick >= 0])
        for name in [*plan.cold_names, *plan.cold_aggs, EVENT_TIME, *(LINEAGE_FIELDS if req.lineage else ())]:
            src = event if name == EVENT_TIME else got.rows.column(name).combine_chunks()
            data[name] = scatter(data[name], rows_at, src.take(take))
        found[rows_at] = True
        source[rows_at] = "postgres"


def _from_newer(c: CompiledSchema, newer: Newer, name: str, text: pa.Array, fingerprints: pa.Array,
                target: pa.DataType) -> pa.Array:
    """Column ``name`` of hashes of ``c`` and of the compatible newer versions of ``newer``,
    in ``c``'s declared type ``target``: a newer hash's text is read in the newest type (a
    compatible change only widens), then cast to ``target``; a value that does not fit it
    raises SinkError naming the newer version."""
    wide = declared_type(newer.c, name)
    if wide == target:
        return from_text(c, name, text, target)
    is_newer = pc.fill_null(pc.is_in(fingerprints, pa.array(sorted(newer.fingerprints), pa.string())), False)
    none = pa.nulls(len(text), text.type)
    mine = from_text(c, name, pc.if_else(is_newer, none, text), target)
    read = from_text(newer.c, name, pc.if_else(is_newer, text, none), wide)
    try:
        theirs = read.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SinkError(f"Redis holds a {c.name}.{name} value written by {c.name} "
                        f"{newer.c.schema.version_str} that does not fit this reader's {target} "
                        f"({c.schema.version_str}): {exc}; use the "
                        "schema file of that version", store="redis") from exc
    return pc.if_else(is_newer, theirs, mine)


def with_windows(table: pa.Table, entity: str, columns: list[str], aggs: set[str],
                 values: dict[str, pa.Array]) -> pa.Table:
    """``table`` (the entity, the requested columns that are not aggregations in
    ``columns``' order, then the read's own columns) with each aggregation of ``columns``
    (``aggs``) from ``values`` put in its place (``add_column``: a third of the time of
    building a table anew)."""
    if table.column_names[0] != entity or len(set(columns)) != len(columns):
        out = {entity: table.column(0)}
        for x in columns:
            out[x] = values[x] if x in aggs else table.column(x)
        for x in table.column_names[1 + sum(x not in aggs for x in columns):]:
            out[x] = table.column(x)
        return pa.table(out)
    for i, x in enumerate(columns):
        if x in aggs:
            table = table.add_column(1 + i, x, values[x])
    return table


__all__ = ["HotReader", "Read", "with_windows"]
