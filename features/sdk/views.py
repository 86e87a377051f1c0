"""Reading a feature view (``views/*.yaml``, docs/views.md): one vector from several
schemas and entities, online and point in time, with request-time features.

A view's read is the schemas' own reads put side by side, never a second implementation
of them:

- **online**: the request rows are checked by the view's compiled rules
  (:meth:`features.views.CompiledView.check_request`); every source's Redis reads go out
  in one pipeline (one round trip for all sources; slot-routed on a cluster), then each
  source is finished as ``FeatureStore.online`` finishes it (the Postgres fallback for
  its misses: one query per schema, single-flight and fill as there). A source's cold-only
  features are read as ``historical`` reads them, at the call's instant. ``max_age`` is
  applied to every value (Redis's or Postgres's) against the store's clock; a row newer
  than the clock is read again as ``historical`` reads it at the clock (:func:`_not_after`);
- **historical**: every source is ``FeatureStore.historical`` of its schema at each
  frame row's timestamp (``max_age`` against that timestamp), then the same
  request-time derivation (:meth:`~features.views.CompiledView.derive`).

So a view read online at instant T and historically at T give the same row, and the
request-time features are computed by one function on both paths.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.compile.layout import aggregation_names as _aggregation_names
from features.compile.layout import hot_columns
from features.errors import ConfigError, RequestRejected
from features.sdk.columns import EVENT_TIME, FOUND, FROM
from features.sdk.online import LINEAGE_FIELDS, SMALL_CALL, OnlineRequest, small_rows
from features.sdk.request_time import DEFAULT_WINDOWS, WindowedRequest, request_time_windows
from features.validation.sure import checkers, sure_rows
from features.views.model import REQUEST_TIME

if TYPE_CHECKING:
    from features.compile import CompiledSchema
    from features.views import CompiledView, ViewSource

#: Per-source columns of a view's result, after the features: ``<alias>._found`` (the
#: source had a row for the key, within ``max_age``), ``<alias>._event_time`` (that row's
#: event time), ``<alias>._from`` (online: ``redis``/``postgres``/null), and with
#: ``lineage=True`` ``<alias>._source`` and ``<alias>._run_id`` (the stored row's lineage).
_T = TypeVar("_T")

META = (FOUND, EVENT_TIME)


def meta_column(source: ViewSource, what: str) -> str:
    """The name of a source's per-source column ``what`` (``_found``, ...)."""
    return f"{source.alias}.{what}"


class Store(Protocol):
    """What a view's read needs of :class:`features.sdk.store.FeatureStore` (a protocol,
    so this part does not import the facade that imports it)."""

    def schema(self, name: str) -> CompiledSchema: ...
    def historical(self, schema: str, entity_df: Any, features: Sequence[str] | None = None, *,
                   timestamp_column: str = "timestamp", max_age: dt.timedelta | None = None,
                   windows: str = DEFAULT_WINDOWS) -> pa.Table: ...
    def online_request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                        lineage: bool = False) -> OnlineRequest: ...
    def windowed_request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                         at: dt.datetime | None, *, lineage: bool = False, now_s: float | None = None,
                         lenient: bool = False) -> WindowedRequest: ...
    def finish_online(self, req: OnlineRequest | WindowedRequest, replies: list[Any], fallback: bool | None,
                        max_age: dt.timedelta | None, since: float) -> tuple[pa.Table, int, int]: ...
    def redis_replies(self, reads: list[tuple[list[str], list[str] | None]]) -> list[Any]: ...
    async def redis_replies_async(self, reads: list[tuple[list[str], list[str] | None]]) -> list[Any]: ...
    def now(self) -> float: ...
    def parallel(self, fns: Sequence[Callable[[], _T]]) -> list[_T]: ...


# --- the request ---------------------------------------------------------------------------


def request_table(cv: CompiledView, rows: Any, at: float | pa.Array | pa.ChunkedArray | None = None
                  ) -> pa.Table:
    """The request rows (a list of dicts, an Arrow table or batch, a pandas DataFrame) as
    a table of the view's request keys and fields in their declared types; any row that
    breaks the view's rules raises :class:`RequestRejected` with every field error.

    A view that declares the request field ``request_time`` (what its ``time_since``
    steps measure up to) gets it from ``at`` where the rows lack it: the store's clock
    online (seconds), each frame row's timestamp in historical."""
    if not isinstance(rows, pa.Table | pa.RecordBatch | list):
        rows = pa.Table.from_pandas(rows, preserve_index=False)
    if isinstance(rows, list) and not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"view {cv.name!r}: request rows must be mappings of request key/field to value",
                          key="rows")
    if REQUEST_TIME in cv.request_fields and at is not None:
        rows = _with_request_time(rows, at)
    table, result = cv.check_request(rows)
    if result.rejects.num_rows:
        raise _rejected(cv, result.rejects, result.input_rows, result.rejected_rows)
    return table


def _with_request_time(rows: pa.Table | pa.RecordBatch | list[dict[str, Any]],
                       at: float | pa.Array | pa.ChunkedArray) -> Any:
    if isinstance(rows, list):
        if all(REQUEST_TIME in r for r in rows):
            return rows
        when = dt.datetime.fromtimestamp(float(at), dt.UTC)
        return [r if REQUEST_TIME in r else {**r, REQUEST_TIME: when} for r in rows]
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    if REQUEST_TIME in table.column_names:
        return table
    if isinstance(at, pa.Array | pa.ChunkedArray):
        return table.append_column(REQUEST_TIME, at)
    us = pa.array(np.full(table.num_rows, _us(float(at)), dtype=np.int64))
    return table.append_column(REQUEST_TIME, us.cast(pa.timestamp("us", "UTC")))


def _rejected(cv: CompiledView, rejects: pa.Table, rows: int, rejected: int) -> RequestRejected:
    errors = rejects.to_pylist()
    shown = [f"  row {e['row']}: {e['message']}" for e in errors[:5]]
    more = f"\n  ... and {len(errors) - 5} more" if len(errors) > 5 else ""
    return RequestRejected(f"view {cv.name}: {rejected} of {rows} request rows rejected:\n"
                           + "\n".join(shown) + more, rejected=rejected, errors=errors)


def _derive(cv: CompiledView, base: pa.Table) -> pa.Table:
    """The request-time features over ``base`` (request keys and fields, fetched columns):
    the view's one derivation, for the online and the historical path alike."""
    derived, rejects = cv.derive_checked(base)
    if rejects.num_rows:
        raise _rejected(cv, rejects, base.num_rows, len(set(rejects.column("row").to_pylist())))
    return derived


# --- online ----------------------------------------------------------------------------------


def _split(cv: CompiledView, c_of: dict[str, CompiledSchema],
           source: ViewSource) -> tuple[list[str], list[str]]:
    """A source's features read from Redis (hot) and those read from Postgres (cold only)."""
    c = c_of[source.schema]
    hot = set(hot_columns(c)) | set(_aggregation_names(c, "hot"))
    stored = [f for f in source.features if f not in _keys(c)]
    return ([f for f in stored if f in hot], [f for f in stored if f not in hot])


def _keys(c: CompiledSchema) -> dict[str, str]:
    """A source feature that is the schema's entity or event time is no stored value of
    its own: it is the row's key (the request key, where the row was found) or its event
    time (``_event_time``). A static schema has no event time."""
    keys = {str(c.schema.entity): "entity"}
    if c.schema.event_time is not None:
        keys[c.schema.event_time] = EVENT_TIME
    return keys


def _keyed(c: CompiledSchema, f: str, got: pa.Table, key: pa.Array) -> pa.Array:
    """The column of a key feature ``f`` (see :func:`_keys`) in ``got``."""
    if _keys(c)[f] == EVENT_TIME:
        return got.column(EVENT_TIME).combine_chunks()
    found = got.column(FOUND).combine_chunks() if FOUND in got.column_names else \
        got.column(EVENT_TIME).combine_chunks().is_valid()
    return pc.if_else(found, key, pa.scalar(None, key.type))


class _OnlinePlan:
    """One online call of a view: a request per source, all sent as one pipeline. The
    request is ``rows`` (dicts, surely valid: :func:`_sure`) or ``table`` (checked).
    ``instant``: the call's instant (``windows="request_time"``: the window time of every
    source's aggregations, read from their tiles, :class:`WindowedRequest`)."""

    def __init__(self, store: Store, cv: CompiledView, lineage: bool, instant: _Instant, *,
                 table: pa.Table | None = None, rows: list[dict[str, Any]] | None = None) -> None:
        c_of = {s.schema: store.schema(s.schema) for s in cv.sources}
        self.cv, self.lineage, self.instant = cv, lineage, instant
        self._table, self.rows = table, rows
        self.split = [_split(cv, c_of, s) for s in cv.sources]

        def keys(name: str) -> list[Any]:
            return [r[name] for r in rows] if rows is not None else self.table.column(name).to_pylist()

        self.requests: list[OnlineRequest | WindowedRequest] = [
            store.windowed_request(s.schema, keys(s.key), hot, instant.at, lineage=lineage,
                                   now_s=instant.now_s, lenient=True) if instant.windowed
            else store.online_request(s.schema, keys(s.key), hot, lineage)
            for s, (hot, _) in zip(cv.sources, self.split, strict=True)]
        self.reads = [r for req in self.requests for r in req.reads]

    @property
    def table(self) -> pa.Table:
        if self._table is None:
            self._table = pa.Table.from_pylist(self.rows or [], schema=self.cv.request_schema)
        return self._table

    @property
    def n(self) -> int:
        return len(self.rows) if self.rows is not None else self.table.num_rows

    def parts(self, replies: list[Any]) -> list[list[Any]]:
        out, at = [], 0
        for req in self.requests:
            k = sum(len(keys) for keys, _ in req.reads)
            out.append(replies[at:at + k])
            at += k
        return out


def _sure(cv: CompiledView, rows: Any, now_s: float, limit: int | None = SMALL_CALL
          ) -> list[dict[str, Any]] | None:
    """A few request rows (at most ``limit``; None: any number) as the view's checked
    request, when every value is surely valid (``features.validation.sure``: the validator
    would accept them as they are); else None and the validator checks them."""
    if not isinstance(rows, list) or not rows or (limit is not None and len(rows) > limit):
        return None
    if not all(type(r) is dict for r in rows):
        return None
    checks = _CHECKS.get(cv.fingerprint, _NO_CHECKS)
    if checks is _NO_CHECKS:
        fields = cv.request_validation.schema.fields
        checks = _CHECKS[cv.fingerprint] = (checkers(fields), [f.name for f in fields])
    if checks is None or checks[0] is None:
        return None

    if REQUEST_TIME in cv.request_fields:
        rows = _with_request_time(rows, now_s)
    return sure_rows(checks[0], checks[1], rows)


#: per view fingerprint: its request fields' checks and names (None: some field has none)
_CHECKS: dict[str, Any] = {}
_NO_CHECKS: Any = object()


def _windows(store: Store, cv: CompiledView, windows: str, at: dt.datetime | None) -> str:
    """``windows`` for an online call of ``cv``, but ``"event"`` for a request-time call
    without ``at`` of a view that reads no aggregation: its rows are the same either way,
    and the per-event path keeps the small-call shortcut."""
    if windows != "request_time" or at is not None:
        return windows
    schemas = [store.schema(source.schema) for source in cv.sources]
    key = (cv.fingerprint, *(c.fingerprint for c in schemas))
    reads = _READS_WINDOWS.get(key)
    if reads is None:
        if len(_READS_WINDOWS) > 1024:
            _READS_WINDOWS.clear()
        reads = _READS_WINDOWS[key] = any(
            f in {*_aggregation_names(c, "hot"), *_aggregation_names(c, "cold")}
            for source, c in zip(cv.sources, schemas, strict=True) for f in source.features)
    return windows if reads else "event"


#: per (view fingerprint, its sources' schema fingerprints): whether it reads an aggregation
_READS_WINDOWS: dict[tuple[str, ...], bool] = {}


class _Instant:
    """An online view call's instant: with ``windows="request_time"`` one instant for the
    whole call, ``at`` (naive: UTC) or else the store's clock once; otherwise the store's
    clock read at each use. ConfigError for a bad ``windows`` or ``at``."""

    def __init__(self, store: Store, windows: str, at: dt.datetime | None) -> None:
        self.windowed = request_time_windows(windows, at)
        if at is None and self.windowed:
            at = _EPOCH_UTC + dt.timedelta(microseconds=_us(store.now()))
        self.at = at
        self.fixed: float | None = None
        if at is not None:
            if not isinstance(at, dt.datetime):
                raise ConfigError(f"at must be a datetime, not {type(at).__name__}", key="at")
            self.fixed = _micros(at) / 1_000_000

    def now(self, store: Store) -> float:
        return store.now() if self.fixed is None else self.fixed

    @property
    def now_s(self) -> float | None:
        return self.fixed


def _us(seconds: float) -> int:
    """``seconds`` since the epoch as whole microseconds (rounded: an instant given as
    microseconds comes back as those)."""
    return round(seconds * 1_000_000)


def _plan_for(store: Store, cv: CompiledView, rows: Any, lineage: bool, instant: _Instant,
              as_dicts: bool = False) -> _OnlinePlan:
    now_s = instant.now(store)
    # dicts: the rows stay Python objects at any size (a table is built only if needed)
    sure = _sure(cv, rows, now_s, None if as_dicts else SMALL_CALL) if not lineage else None
    if sure is not None:
        return _OnlinePlan(store, cv, lineage, instant, rows=sure)
    return _OnlinePlan(store, cv, lineage, instant, table=request_table(cv, rows, now_s))


def online(store: Store, cv: CompiledView, rows: Any, *, lineage: bool = False,
           fallback: bool | None = None, as_dicts: bool = False, windows: str = DEFAULT_WINDOWS,
           at: dt.datetime | None = None) -> pa.Table | list[dict[str, Any]]:
    """See :meth:`features.sdk.store.FeatureStore.online_view`; ``as_dicts``: the rows
    as dicts (:meth:`~features.sdk.store.FeatureStore.online_view_dicts`), made without
    Arrow when a few rows were all in Redis and the view has no request-time features."""
    instant = _Instant(store, _windows(store, cv, windows, at), at)
    plan = _plan_for(store, cv, rows, lineage, instant, as_dicts)
    since = time.monotonic()
    return _finish(store, plan, store.redis_replies(plan.reads), fallback, since, as_dicts)


async def online_async(store: Store, cv: CompiledView, rows: Any, *, lineage: bool = False,
                       fallback: bool | None = None, windows: str = DEFAULT_WINDOWS,
                       at: dt.datetime | None = None) -> pa.Table:
    """:func:`online` for asyncio callers: the Redis round trip on redis.asyncio, the rest
    (decoding, the Postgres fallback, the derivation) in a worker thread."""
    plan = _plan_for(store, cv, rows, lineage, _Instant(store, _windows(store, cv, windows, at), at))
    since = time.monotonic()
    replies = await store.redis_replies_async(plan.reads)
    out = await asyncio.to_thread(_finish, store, plan, replies, fallback, since, False)
    assert isinstance(out, pa.Table)
    return out


def _finish(store: Store, plan: _OnlinePlan, replies: list[Any], fallback: bool | None,
            since: float, as_dicts: bool = False) -> pa.Table | list[dict[str, Any]]:
    cv = plan.cv
    now_s = plan.instant.now(store)
    windows = "request_time" if plan.instant.windowed else "event"
    parts = plan.parts(replies)
    # dicts at any size (decoded straight into Python values), a table for a few rows
    if ((as_dicts or plan.n <= SMALL_CALL) and not plan.lineage and not plan.instant.windowed
            and not any(cold for _, cold in plan.split)):
        small = [small_rows(req, part) for req, part in zip(plan.requests, parts, strict=True)
                 if isinstance(req, OnlineRequest)]
        now_us = _us(now_s)
        # every source's hash in Redis, fresh, none newer than the clock: no Arrow decoding
        if all(rows is not None and all(_micros(r[EVENT_TIME]) <= now_us for r in rows) for rows in small):
            return _finish_small(store, plan, small, now_s, as_dicts)  # type: ignore[arg-type]
    table = plan.table
    fetched: dict[str, pa.Array] = {}
    meta: dict[str, pa.Array] = {}
    for source, req, part, (_, cold) in zip(cv.sources, plan.requests, parts, plan.split, strict=True):
        got, _, _ = store.finish_online(req, part, fallback, None, since)
        if cold:  # cold-only features: Postgres's newest row at or before now, as historical reads it
            at = _cold_now(store, source, table, cold, now_s, windows)
            got = got.drop_columns([name for name in cold if name in got.column_names])
            for name in cold:
                got = got.append_column(name, at.column(name))
        got = _not_after(store, source, table, got, now_s, windows)
        c = store.schema(source.schema)
        key = table.column(source.key).combine_chunks()
        values = {f: _keyed(c, f, got, key) if f in _keys(c) else got.column(f).combine_chunks()
                  for f in source.features}
        event = got.column(EVENT_TIME).combine_chunks()
        found = got.column(FOUND).combine_chunks()
        wanted = [FROM, *LINEAGE_FIELDS] if plan.lineage else [FROM]
        extra = {w: got.column(w).combine_chunks() for w in wanted}
        # a window at the request time is bounded by its size, not by max_age (as historical)
        aggs = ({*_aggregation_names(c, "hot"), *_aggregation_names(c, "cold")} if plan.instant.windowed
                else set())
        windowed = {f: values.pop(f) for f in list(values) if f in aggs}
        values, event, found, extra = _within(source, values, event, found, extra, now_s)
        values.update(windowed)
        for f in source.features:
            fetched[source.column(f)] = values[f]
        meta[meta_column(source, FOUND)] = found
        meta[meta_column(source, EVENT_TIME)] = event
        for w, arr in extra.items():
            meta[meta_column(source, w)] = arr
    out = _assemble(cv, table, fetched, meta)
    return out.to_pylist() if as_dicts else out


def _finish_small(store: Store, plan: _OnlinePlan, small: list[list[dict[str, Any]]], now_s: float,
                  as_dicts: bool = False) -> pa.Table | list[dict[str, Any]]:
    """:func:`_finish` for a few rows every source found in Redis: the rows decoded in
    Python (``features.sdk.online.small_rows``, the values ``online`` gives), ``max_age``
    applied to their event times, then one small table for the request-time features
    (none for dicts of a view without them: the rows as they are)."""
    cv = plan.cv
    base = [dict(r) for r in plan.rows] if plan.rows is not None else plan.table.to_pylist()
    meta: dict[str, list[Any]] = {}
    for source, rows in zip(cv.sources, small, strict=True):
        cutoff = (None if source.max_age_seconds is None
                  else int((now_s - source.max_age_seconds) * 1_000_000))
        keys = _keys(store.schema(source.schema))
        found, events, froms = [], [], []
        for out, row in zip(base, rows, strict=True):
            ev = row[EVENT_TIME]
            live = cutoff is None or _micros(ev) >= cutoff
            for f in source.features:
                value = row[f] if f not in keys else ev if keys[f] == EVENT_TIME else out[source.key]
                out[source.column(f)] = value if live else None
            found.append(live)
            events.append(ev if live else None)
            froms.append("redis" if live else None)
        meta[meta_column(source, FOUND)] = found
        meta[meta_column(source, EVENT_TIME)] = events
        meta[meta_column(source, FROM)] = froms
    types = {meta_column(s, EVENT_TIME): r.plan.result.field(EVENT_TIME).type
             for s, r in zip(cv.sources, plan.requests, strict=True) if isinstance(r, OnlineRequest)}
    if not len(cv.derived):  # nothing to compute: the rows are the result
        for i, row in enumerate(base):
            for name, values in meta.items():
                row[name] = values[i]
        if as_dicts:
            return base
        metas = [(name, types.get(name, pa.bool_() if name.endswith(FOUND) else pa.string()))
                 for name in meta]
        return pa.Table.from_pylist(base, schema=pa.schema([*cv.request_schema, *cv.fetched, *metas]))
    fetched = pa.Table.from_pylist(base, schema=pa.schema([*cv.request_schema, *cv.fetched]))
    out = _derive(cv, fetched)
    for name, values in meta.items():
        t = types.get(name, pa.bool_() if name.endswith(FOUND) else pa.string())
        out = out.append_column(name, pa.array(values, t))
    return out.to_pylist() if as_dicts else out


_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)


def _micros(when: dt.datetime) -> int:
    return (when - (_EPOCH_NAIVE if when.tzinfo is None else _EPOCH_UTC)) // dt.timedelta(microseconds=1)


def _cold_now(store: Store, source: ViewSource, table: pa.Table, cold: list[str], now_s: float,
              windows: str) -> pa.Table:
    c = store.schema(source.schema)
    ts = pa.array(np.full(table.num_rows, _us(now_s), dtype=np.int64)).cast(pa.timestamp("us", "UTC"))
    entity = str(c.schema.entity)
    frame = pa.table({entity: _entity_column(c, table.column(source.key)), "timestamp": ts})
    return store.historical(source.schema, frame, cold, windows=windows)


def _not_after(store: Store, source: ViewSource, table: pa.Table, got: pa.Table, now_s: float,
               windows: str) -> pa.Table:
    """``got`` with each row whose event time is after ``now_s`` (the store's clock is
    behind the stored rows: a frozen or replayed clock, events stamped ahead of it) read
    again as ``historical`` reads it at ``now_s``: the newest Postgres row at or before
    it, or none (not found). Its ``_from`` is then ``postgres`` and its lineage null (the
    as-of read does not carry it). So online at instant T never serves a row newer than T."""
    if store.schema(source.schema).schema.static:
        return got  # one row per entity, served at any time (its _event_time is its load)
    now_us = _us(now_s)
    ahead = pc.fill_null(pc.greater(got.column(EVENT_TIME).combine_chunks().cast(pa.int64()),
                                    pa.scalar(now_us, pa.int64())), False)
    if not pc.any(ahead).as_py():
        return got
    rows = pc.indices_nonzero(ahead)
    c = store.schema(source.schema)
    wanted = [f for f in source.features if f not in _keys(c)]
    ts = pa.array(np.full(len(rows), now_us, dtype=np.int64)).cast(pa.timestamp("us", "UTC"))
    frame = pa.table({str(c.schema.entity): _entity_column(c, table.column(source.key).take(rows)),
                      "timestamp": ts})
    past = store.historical(source.schema, frame, wanted, windows=windows)
    where = np.full(got.num_rows, -1, dtype=np.int64)
    where[rows.to_numpy()] = np.arange(len(rows))
    at = pa.array(where, mask=where < 0)
    found = past.column(EVENT_TIME).combine_chunks().is_valid()
    again = {**{f: past.column(f).combine_chunks() for f in wanted},
             EVENT_TIME: past.column(EVENT_TIME).combine_chunks(), FOUND: found,
             FROM: pc.if_else(found, pa.scalar("postgres"), pa.scalar(None, pa.string()))}
    for i, name in enumerate(got.column_names):
        if name not in again and name not in LINEAGE_FIELDS:
            continue  # the entity (the request's key), the age (no column of a view)
        old = got.column(name).combine_chunks()
        new = again[name].take(at) if name in again else pa.nulls(got.num_rows, old.type)
        got = got.set_column(i, name, pc.if_else(ahead, new.cast(old.type), old))
    return got


def _entity_column(c: CompiledSchema, keys: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The request key's values as the schema's entity column (its ids as text compare as
    the SDK compares them: an integer key's text is its digits)."""
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    return keys.cast(pa.string())


def _within(source: ViewSource, values: dict[str, pa.Array], event: pa.Array, found: pa.Array,
            extra: dict[str, pa.Array], now_s: float
            ) -> tuple[dict[str, pa.Array], pa.Array, pa.Array, dict[str, pa.Array]]:
    """The source's values older than its ``max_age`` at ``now_s`` made missing (nulls,
    ``_found`` false), as ``historical`` treats them at its timestamp."""
    if source.max_age_seconds is None or not len(event):
        return values, event, found, extra
    cutoff = _us(now_s - source.max_age_seconds)
    ev = event.cast(pa.int64())
    old = pc.fill_null(pc.less(ev, pa.scalar(cutoff, pa.int64())), False)
    if not pc.any(old).as_py():
        return values, event, found, extra

    def blank(a: pa.Array) -> pa.Array:
        return pc.if_else(old, pa.scalar(None, a.type), a)

    return ({k: blank(v) for k, v in values.items()}, blank(event), pc.and_not(found, old),
            {k: blank(v) for k, v in extra.items()})


def _assemble(cv: CompiledView, table: pa.Table, fetched: dict[str, pa.Array],
              meta: dict[str, pa.Array]) -> pa.Table:
    """The request columns, the fetched ones (declared types), the request-time features,
    then the per-source columns."""
    base = table
    for f in cv.fetched:
        arr = fetched[f.name]
        base = base.append_column(f.name, arr if arr.type == f.type else arr.cast(f.type))
    out = _derive(cv, base)
    for name, arr in meta.items():
        out = out.append_column(name, arr)
    return out


# --- historical ------------------------------------------------------------------------------


def historical(store: Store, cv: CompiledView, entity_df: Any, *, timestamp_column: str = "timestamp",
               windows: str = DEFAULT_WINDOWS) -> pa.Table:
    """See :meth:`features.sdk.store.FeatureStore.historical_view`."""
    request_time_windows(windows, None)
    if not isinstance(entity_df, pa.Table):
        entity_df = pa.Table.from_pandas(entity_df, preserve_index=False)
    need = [*cv.keys, *[f for f in cv.request_fields if f != REQUEST_TIME], timestamp_column]
    absent = [x for x in need if x not in entity_df.column_names]
    if absent:
        raise ConfigError(f"entity_df has no column(s) {', '.join(map(repr, absent))} for view {cv.name!r} "
                          f"(it needs the request keys and fields {', '.join(need[:-1])} and the "
                          f"timestamp {timestamp_column!r}; it has {', '.join(entity_df.column_names)})",
                          key="entity_df")
    out_names = [*cv.fetched.names, *cv.derived.names,
                 *[meta_column(s, w) for s in cv.sources for w in META]]
    clash = [x for x in out_names if x in entity_df.column_names]
    if clash:
        raise ConfigError(f"entity_df already has column(s) {', '.join(clash)}, which view {cv.name!r} adds; "
                          "rename them first", key="entity_df")
    ts = entity_df.column(timestamp_column)
    asked = [x for x in [*cv.keys, *cv.request_fields] if x in entity_df.column_names]
    table = request_table(cv, entity_df.select(asked), ts)
    fetched: dict[str, pa.Array] = {}
    meta: dict[str, pa.Array] = {}

    def read(source: ViewSource) -> pa.Table:
        c = store.schema(source.schema)
        entity = str(c.schema.entity)
        frame = pa.table({entity: _entity_column(c, table.column(source.key)), timestamp_column: ts})
        max_age = dt.timedelta(seconds=source.max_age_seconds) if source.max_age_seconds is not None else None
        keys = _keys(c)
        return store.historical(source.schema, frame, [f for f in source.features if f not in keys],
                                timestamp_column=timestamp_column, max_age=max_age, windows=windows)

    # the sources read side by side, a Postgres connection each (FeatureStore.parallel)
    gots = store.parallel([functools.partial(read, source) for source in cv.sources])
    for source, got in zip(cv.sources, gots, strict=True):
        c = store.schema(source.schema)
        keys = _keys(c)
        key = table.column(source.key).combine_chunks()
        for f in source.features:
            fetched[source.column(f)] = (_keyed(c, f, got, key) if f in keys
                                         else got.column(f).combine_chunks())
        event = got.column(EVENT_TIME).combine_chunks()
        meta[meta_column(source, FOUND)] = event.is_valid()
        meta[meta_column(source, EVENT_TIME)] = event
    base = table
    for f in cv.fetched:
        arr = fetched[f.name]
        base = base.append_column(f.name, arr if arr.type == f.type else arr.cast(f.type))
    derived = _derive(cv, base)
    out = entity_df
    for name in [*cv.fetched.names, *cv.derived.names]:
        out = out.append_column(name, derived.column(name))
    for name, arr in meta.items():
        out = out.append_column(name, arr)
    return out



__all__ = ["META", "historical", "meta_column", "online", "online_async", "request_table"]
