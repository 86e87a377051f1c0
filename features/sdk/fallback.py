"""The SDK's Postgres fallback under load: one read per entity however many callers miss it.

When a popular entity's hot hash expires, or Redis is flushed or restarted, every
concurrent ``FeatureStore.online`` call for it misses Redis at once. Without care each
one queries Postgres: the cache stampede. :class:`Fallback` stands between the misses
and Postgres (``docs/sdk.md``, "Under load"):

- **single-flight**: calls in one process that miss the same entity while its read
  runs (or whose Redis read began before that read finished) share that one Postgres
  query; threads and ``online_async`` alike (:class:`SingleFlight`);
- **read-through fill**: a row found in Postgres is written back to Redis with the
  sinks' newest-wins script in fill mode (``features.sinks.redis.FILL``: it never
  replaces a newer or an equal event, and marks the hash ``_filled`` so the pipeline's
  own write of the same event replaces it), by the one caller that wins a short
  per-entity lock (``SET <entity key>:fill NX PX``) across processes; a caller that
  loses it reads Postgres itself, or with ``fill_wait`` first waits that long for the
  winner's fill and then reads Redis;
- **negative cache**: an id Postgres does not have is remembered as absent for
  ``negative_ttl`` (per process), so a flood of unknown ids reaches Postgres once;
- **refresh** (logical expiry, ``hot.refresh_after`` in the schema): a hot value older
  than that since its last write is served flagged ``_stale`` while the caller that
  wins the same lock reads Postgres and fills (the fill renews the TTL of a value
  Postgres confirms is still the newest).

A fetched row carries every hot feature Postgres holds (whatever the caller asked for,
so callers asking for different features share it), its lineage (for the fill) and,
for a schema with aggregations, its newest aggregation row.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster

from features.compile import CompiledSchema
from features.compile.layout import declared_type, entity_key, hot_columns
from features.errors import SinkUnavailable
from features.lineage import DIGEST, INGESTED_AT, RUN_ID, SCHEMA_FINGERPRINT, SCHEMA_VERSION, SOURCE
from features.sdk.columns import time_column
from features.sinks.base import WriteUnit
from features.sinks.redis import RedisSink
from features.sinks.redis_wire import RedisEndpoint, map_redis_errors


class Host(Protocol):
    """What the fallback needs of the store it serves (:class:`features.sdk.store.
    FeatureStore`): its settings and its read of the newest stored rows. A protocol, so
    this module does not import the facade that imports it."""

    redis_url: str
    redis_address: str
    key_prefix: str
    timeout_s: float
    fill: bool
    fill_lock: dt.timedelta
    fill_wait: dt.timedelta
    negative_ttl: dt.timedelta

    def newest_rows(self, c: CompiledSchema, ids: list[str]) -> pa.Table: ...

#: The lineage a filled hash carries (the history row's own).
LINEAGE = (SOURCE, SCHEMA_VERSION, SCHEMA_FINGERPRINT, RUN_ID, INGESTED_AT)
#: Prefix of the aggregation row's event time and lineage in a fetched row.
AGG = "__agg"
#: How often a caller waiting for another process's fill looks at Redis (seconds).
_POLL_S = 0.002


class Again:
    """A fetched value meaning: another process filled Redis meanwhile, read Redis again."""


AGAIN = Again()


@dataclass
class _Entry:
    done: threading.Event = field(default_factory=threading.Event)
    done_at: float = float("inf")
    value: Any = None
    error: BaseException | None = None


class SingleFlight:
    """Concurrent fetches of one key share one call.

    :meth:`claim` splits keys into those the caller fetches itself (it must call
    :meth:`resolve` or :meth:`fail` for them) and those another caller is fetching, or
    fetched after this caller's ``since`` (a monotonic time: when its Redis read began, so
    that read could not have seen the other's fill). Finished entries are forgotten
    ``linger_s`` after they finish.

    Sharing depends only on ``since <= done_at``, never on the linger: the linger only
    bounds memory, and it must outlast the longest stall between a caller's Redis read and
    its claim. With hundreds of threads in one process that stall is the GIL's round robin
    (5 ms a turn: 200 runnable threads, ~1 s), so a 1 s linger let a stalled caller
    query Postgres a second time; 10 s holds a finished entry (a reference to a few rows)
    per key read in the last 10 s."""

    def __init__(self, linger_s: float = 10.0) -> None:
        self.linger_s = linger_s
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}
        self._finished: deque[tuple[float, Hashable, _Entry]] = deque()

    def claim(self, keys: Iterable[Hashable], since: float) -> tuple[list[Hashable], dict[Hashable, _Entry]]:
        mine: list[Hashable] = []
        theirs: dict[Hashable, _Entry] = {}
        with self._lock:
            self._forget(time.monotonic())
            for k in keys:
                e = self._entries.get(k)
                if e is not None and (not e.done.is_set() or since <= e.done_at):
                    theirs[k] = e
                else:
                    self._entries[k] = _Entry()
                    mine.append(k)
        return mine, theirs

    def _forget(self, now: float) -> None:
        while self._finished and self._finished[0][0] < now - self.linger_s:
            _, k, e = self._finished.popleft()
            if self._entries.get(k) is e:
                del self._entries[k]

    def resolve(self, values: dict[Hashable, Any]) -> None:
        self._finish(values.keys(), values, None)

    def fail(self, keys: Sequence[Hashable], error: BaseException) -> None:
        self._finish(keys, {}, error)

    def _finish(self, keys: Iterable[Hashable], values: dict[Hashable, Any], error: BaseException | None
                ) -> None:
        with self._lock:
            now = time.monotonic()
            for k in keys:
                e = self._entries.get(k)
                if e is None or e.done.is_set():
                    continue
                e.value, e.error, e.done_at = values.get(k), error, now
                self._finished.append((now, k, e))
                e.done.set()


class NegativeCache:
    """Ids known absent from Postgres, each until its expiry (monotonic seconds).

    Bounded and O(1) per id, however many ids callers ask for: one TTL for every entry
    and a re-added id moves to the end, so the entries stay in expiry order. An add first
    drops the expired entries at the front, and when ``max_entries`` are still live drops
    the oldest (counted in ``evicted``): an evicted id is only asked of Postgres again."""

    #: The default bound: 100,000 ids (some MB of keys) per FeatureStore.
    MAX_ENTRIES = 100_000

    def __init__(self, ttl_s: float, max_entries: int = MAX_ENTRIES) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        #: live entries dropped to make room (not the expired)
        self.evicted = 0
        self._lock = threading.Lock()
        self._until: OrderedDict[Hashable, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    def absent(self, key: Hashable, now: float) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until > now:
            return True
        with self._lock:
            if self._until.get(key, now) <= now:
                self._until.pop(key, None)
        return False

    def add(self, keys: Iterable[Hashable], now: float) -> None:
        if self.ttl_s <= 0:
            return
        until = now + self.ttl_s
        with self._lock:
            entries = self._until
            while entries and next(iter(entries.values())) <= now:
                entries.popitem(last=False)
            for k in keys:
                entries[k] = until
                entries.move_to_end(k)
                if len(entries) > self.max_entries:
                    entries.popitem(last=False)
                    self.evicted += 1


@dataclass
class Fetched:
    """What :meth:`Fallback.fetch` found: ``rows`` (the fetched rows of the ids found, one
    table), ``at`` (id -> its row in ``rows``), ``again`` (ids another process filled
    meanwhile: read them from Redis) and ``absent`` (ids Postgres does not hold)."""

    rows: pa.Table | None
    at: dict[str, int]
    again: set[str]
    absent: set[str]


@dataclass
class FallbackCounts:
    """What this process's fallback did (also in the SDK metrics)."""

    queries: int = 0          # Postgres queries made
    shared: int = 0           # ids served by another caller's query (single-flight)
    negative: int = 0         # ids answered by the negative cache
    fills: int = 0            # fill calls made (rows sent to Redis by this process)
    filled: int = 0           # hashes those calls wrote (newer than what Redis held)
    waited: int = 0           # ids another process filled while this one waited
    refreshes: int = 0        # stale ids this process refreshed


class Fallback:
    """The stampede-proof fallback of one FeatureStore (see the module docstring)."""

    def __init__(self, store: Host) -> None:
        self.store = store
        self.flight = SingleFlight()
        self.negative = NegativeCache(store.negative_ttl.total_seconds())
        self.counts = FallbackCounts()
        self._counts_lock = threading.Lock()
        self._control: Any = None
        self._sinks: dict[tuple[str, bool], Any] = {}
        self._sink_lock = threading.Lock()
        self._token = uuid.uuid4().hex

    def close(self) -> None:
        with self._sink_lock:
            for sink in self._sinks.values():
                sink.close()
            self._sinks.clear()
        if self._control is not None:
            self._control.close()
            self._control = None

    def _count(self, **amounts: int) -> None:
        with self._counts_lock:
            for name, n in amounts.items():
                setattr(self.counts, name, getattr(self.counts, name) + n)

    # --- the fetch ----------------------------------------------------------------------

    def fetch(self, c: CompiledSchema, ids: Sequence[str], since: float) -> Fetched:
        """The newest stored row of each of ``ids`` (distinct), shared with concurrent callers."""
        now = time.monotonic()
        absent = {i for i in ids if self.negative.absent((c.name, i), now)}
        if absent:
            self._count(negative=len(absent))
        keys = [(c.name, i) for i in ids if i not in absent]
        mine, theirs = self.flight.claim(keys, since)
        values: dict[Hashable, Any] = {}
        if mine:
            try:
                values.update(self._lead(c, [k[1] for k in mine]))  # type: ignore[index]
            except BaseException as exc:
                self.flight.fail(mine, exc)
                raise
            self.flight.resolve({k: values[k] for k in mine})
        if theirs:
            self._count(shared=len(theirs))
            deadline = time.monotonic() + self.store.timeout_s + 1.0
            for k, e in theirs.items():
                if not e.done.wait(max(deadline - time.monotonic(), 0.0)):
                    who = k[1]  # type: ignore[index]
                    wait = self.store.timeout_s + 1.0
                    raise SinkUnavailable(f"Postgres read of {who!r} shared with another caller did not "
                                          f"finish within {wait:.0f} s", store="postgres")
                if e.error is not None:
                    raise e.error
                values[k] = e.value
        tables: dict[int, pa.Table] = {}
        picks: list[tuple[str, int, int]] = []
        again: set[str] = set()
        for key, v in values.items():
            i: str = key[1]  # type: ignore[index]
            if v is AGAIN:
                again.add(i)
            elif v is None:
                absent.add(i)
            else:
                table, row = v
                tables.setdefault(id(table), table)
                picks.append((i, id(table), row))
        if not picks:
            return Fetched(None, {}, again, absent)
        order = list(tables)
        base = dict(zip(order, np.cumsum([0] + [tables[t].num_rows for t in order[:-1]]), strict=True))
        rows = pa.concat_tables([tables[t] for t in order]) if len(order) > 1 else tables[order[0]]
        at = {i: int(base[t]) + r for i, t, r in picks}
        return Fetched(rows, at, again, absent)

    def _lead(self, c: CompiledSchema, ids: list[str]) -> dict[Hashable, Any]:
        """This caller's share: lock (when filling), maybe wait for another's fill, one
        Postgres query, the fill. Returns (schema, id) -> (rows, row) | None | AGAIN."""
        store = self.store
        fill = store.fill and fillable(c)
        owned = self._lock_fill(c, ids) if fill else set()
        again: set[str] = set()
        if fill and store.fill_wait.total_seconds() > 0 and len(owned) < len(ids):
            again = self._await_fill(c, [i for i in ids if i not in owned])
            self._count(waited=len(again))
        query = [i for i in ids if i not in again]
        out: dict[Hashable, Any] = {(c.name, i): AGAIN for i in again}
        if query:
            rows = store.newest_rows(c, query)
            self._count(queries=1)
            # the stored entity (of its own type) as the text the ids are (a Redis key's)
            entities = pc.cast(rows.column(str(c.schema.entity)), pa.string()).to_pylist()
            pos = {e: r for r, e in enumerate(entities)}
            missing = [i for i in query if i not in pos]
            self.negative.add(((c.name, i) for i in missing), time.monotonic())
            out.update({(c.name, i): ((rows, pos[i]) if i in pos else None) for i in query})
            mine = [pos[i] for i in query if i in owned and i in pos]
            if mine:
                self._fill(c, rows.take(pa.array(mine, pa.int64())))
        return out

    # --- refresh (logical expiry) ----------------------------------------------------------

    def refresh(self, c: CompiledSchema, ids: Sequence[str]) -> int:
        """Refresh the stale hashes of ``ids`` whose lock this caller wins: their newest
        Postgres rows, filled (a newer row replaces the hash, the same row renews its TTL).
        Returns how many it refreshed."""
        owned = self._lock_fill(c, ids)
        if not owned:
            return 0
        mine = [i for i in ids if i in owned]
        rows = self.store.newest_rows(c, mine)
        self._count(queries=1, refreshes=len(mine))
        if rows.num_rows:
            self._fill(c, rows)
        return len(mine)

    # --- Redis: the lock, the wait, the fill ----------------------------------------------------

    def _lock_key(self, c: CompiledSchema, i: str) -> str:
        return self.store.key_prefix + entity_key(c.name, i) + ":fill"

    def _redis(self) -> Any:
        """The one redis-py client of the fill locks, made once under a lock: two threads
        that each made one would leave one client to be collected (closing its sockets)
        while the other thread's pipeline is on it (``Bad file descriptor``: a 503)."""
        if self._control is None:
            with self._sink_lock:
                if self._control is None:
                    self._control = redis_py_client(self.store.redis_url, self.store.timeout_s)
        return self._control

    def _pipeline(self, commands: Sequence[Sequence[Any]], what: str) -> list[Any]:
        pipe = self._redis().pipeline(transaction=False)
        for cmd in commands:
            pipe.execute_command(*cmd)
        with map_redis_errors(self.store.redis_address, f"the {what}"):
            return list(pipe.execute())

    def _lock_fill(self, c: CompiledSchema, ids: Sequence[str]) -> set[str]:
        """The ids whose fill lock this caller won (``SET NX PX``, one round trip)."""
        ms = max(int(self.store.fill_lock.total_seconds() * 1000), 1)
        replies = self._pipeline([("SET", self._lock_key(c, i), self._token, "NX", "PX", ms) for i in ids],
                                 "fill lock")
        return {i for i, r in zip(ids, replies, strict=True) if r}

    def _await_fill(self, c: CompiledSchema, ids: list[str]) -> set[str]:
        """Wait up to ``fill_wait`` for other callers' fills of ``ids``; the ids filled."""
        deadline = time.monotonic() + self.store.fill_wait.total_seconds()
        left = list(ids)
        done: set[str] = set()
        while left:
            keys = [self.store.key_prefix + entity_key(c.name, i) for i in left]
            present = self._pipeline([("EXISTS", k) for k in keys], "fill wait")
            done.update(i for i, p in zip(left, present, strict=True) if p)
            left = [i for i, p in zip(left, present, strict=True) if not p]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_S)
        return done

    def _sink(self, c: CompiledSchema, aggregates: bool) -> Any:
        key = (c.name, aggregates)
        sink = self._sinks.get(key)
        if sink is None:
            sink = RedisSink(self.store.redis_url, c, key_prefix=self.store.key_prefix, fill=True,
                             aggregates=aggregates, timeout_s=self.store.timeout_s, retries=1)
            sink.open()
            self._sinks[key] = sink
        return sink

    def _fill(self, c: CompiledSchema, rows: pa.Table) -> int:
        """Write fetched ``rows`` to Redis (entity hashes, and aggregates hashes for the rows
        that have an aggregation row); returns the hashes written."""
        with self._sink_lock:  # one fill at a time: the sinks are one connection each
            written = fill_rows(c, rows, lambda aggregates: self._sink(c, aggregates))
        self._count(fills=1, filled=written)
        return written


def fillable(c: CompiledSchema) -> bool:
    """Whether the schema's rows can be filled into Redis: it has hot features."""
    return bool(c.schema.loadable and hot_columns(c))


def fill_rows(c: CompiledSchema, rows: pa.Table, sink_for: Any) -> int:
    """Write rows read back from Postgres (:func:`fetch_columns`) to Redis with the fill
    script: the entity hashes (hot features Postgres does not hold stay absent, as the
    fallback serves them: null) and, where a row has one, the aggregates hashes. Returns
    the hashes written."""
    schema = c.schema
    ent, et = str(schema.entity), time_column(c)
    written = 0
    units: list[tuple[bool, pa.Table]] = []
    sink = sink_for(False)  # the callable opens each sink once
    data = {ent: rows.column(ent), et: rows.column(et)}
    for name in sink.hot_columns:
        data[name] = rows.column(name) if name in rows.column_names else pa.nulls(rows.num_rows,
                                                                                   declared_type(c, name))
    for name in (*LINEAGE, *((DIGEST,) if schema.static else ())):
        data[name] = rows.column(name)
    if DIGEST in rows.column_names:  # the event's content digest: Redis's tie-break
        data[DIGEST] = rows.column(DIGEST)
    units.append((False, pa.table(data)))
    if AGG + et in rows.column_names:
        agg_sink = sink_for(True)
        have = rows.filter(pc.is_valid(rows.column(AGG + et)))
        if have.num_rows and agg_sink.hot_columns:
            data = {ent: have.column(ent), et: have.column(AGG + et)}
            for name in agg_sink.hot_columns:
                data[name] = have.column(name) if name in have.column_names else pa.nulls(
                    have.num_rows, declared_type(c, name))
            for name in LINEAGE:
                data[name] = have.column(AGG + name)
            units.append((True, pa.table(data)))
    for aggregates, table in units:
        written += sink_for(aggregates).write(WriteUnit(table, pa.table({}), None, table.num_rows)).stored
    return written


def redis_py_client(url: str, timeout_s: float, *, asyncio: bool = False) -> Any:
    """A redis-py client for ``url`` (a ``redis+cluster://`` URL: redis-py's cluster
    client), with the endpoint's TLS checks; ``asyncio``: the ``redis.asyncio`` one."""
    endpoint = RedisEndpoint.from_url(url)
    tls = endpoint.redis_py_options()
    if endpoint.cluster:
        node: Any = AsyncClusterNode if asyncio else ClusterNode
        cluster: Any = AsyncRedisCluster if asyncio else RedisCluster
        return cluster(startup_nodes=[node(h, p) for h, p in endpoint.seeds],
                       username=endpoint.username, password=endpoint.password, socket_timeout=timeout_s,
                       ssl=endpoint.tls, ssl_ca_certs=endpoint.ca_certs, ssl_certfile=endpoint.certfile,
                       ssl_keyfile=endpoint.keyfile,
                       **({"ssl_cert_reqs": endpoint.cert_reqs} if endpoint.tls else {}), **tls)
    if asyncio:
        return aredis.Redis.from_url(url, socket_timeout=timeout_s, **tls)
    return redis.Redis.from_url(url, socket_timeout=timeout_s, **tls)


__all__ = ["AGAIN", "Fallback", "Fetched", "NegativeCache", "SingleFlight", "fill_rows", "redis_py_client"]
