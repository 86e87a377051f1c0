"""Redis (hot) sink: the latest value per entity, newest event wins, atomically.

Layout (encoding version 1, documented in ``docs/redis.md``):

- one hash per entity, key ``features:<schema>:{<entity>}`` (the braces are a Redis
  Cluster hash tag, so every key of one entity maps to one slot);
- a field per hot feature holding its value as text (see :func:`encode_column`); a
  null value is an **absent field**;
- ``_event_time`` (integer microseconds since the Unix epoch, UTC), ``_enc`` (``1``)
  and the lineage fields ``_source``, ``_schema_version``, ``_schema_fingerprint``,
  ``_run_id``, ``_ingested_at``;
- a TTL of ``hot.ttl`` seconds from the write (none when the schema sets no TTL).

Every write runs the Lua script :data:`NEWEST_WINS` for one key: it replaces the hash
only when the stored (``_event_time``, ``_digest``) is absent or smaller, times compared
first. ``_digest`` is the event's content digest (:mod:`features.kernels.digest`), so of
two different events at one instant the one with the greater digest is the newest,
whatever order they arrive in (Postgres keeps both); an exact copy (same time, same
digest) leaves the hash as it is, so replays and re-runs are no-ops.

Writes are built with Arrow string kernels (no Python loop over rows): the keys as
Redis protocol bulks, the values as one MessagePack array per script call, which the
script decodes with Redis's built-in ``cmsgpack``. The writer thread encodes a unit
16,384 rows at a time and keeps up to three such chunks at the server over one connection,
``redis-cli --pipe`` style, so Redis works while the next chunk is encoded; replies
are counted in bulk.

Why one module of this size: :class:`RedisSink`'s vectorised encoding, its Lua scripts
and its pipelined writes and reads share one connection and one key layout; the wire
protocol (``features.sinks.redis_wire``), the cluster routing
(``features.sinks.redis_cluster``) and the layout itself (``features.compile.layout``)
already live apart.
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import redis

from features.compile import CompiledSchema
from features.compile.layout import (
    ENCODING_VERSION,
    KEY_PREFIX,
    encode_column,
    event_time_micros,
    key_slot,
    key_slots,
    ledger_key,
    stored_aggregations,
    stored_fields,
)
from features.errors import SinkError, SinkUnavailable
from features.lineage import DIGEST, INGESTED_AT, RUN_ID, SCHEMA_FINGERPRINT, SCHEMA_VERSION, SOURCE
from features.schema.syntax import AGGREGATES_SUFFIX, TILES_SUFFIX
from features.sinks.base import WriteResult, WriteUnit, binary_rows, laid_end_to_end, retrying, with_digest
from features.sinks.redis_cluster import Cluster, ConnOrCluster
from features.sinks.redis_wire import Conn, RedisEndpoint, ReplyError, command, map_redis_errors

NEWEST_WINS = """
-- KEYS: entity hashes. ARGV[1]: TTL in seconds (0: none). ARGV[2]: a MessagePack array
-- holding, per key in order: its event time, a count n, then n field/value strings
-- (null values are absent; the event's _digest, when it has one, is the first pair).
local ttl = tonumber(ARGV[1]); local t = cmsgpack.unpack(ARGV[2])
local p = 1; local written = 0
-- the TTL as one absolute time per call: PEXPIREAT of a string costs the server less
-- than EXPIRE, which Redis rewrites into a PEXPIREAT for every key
local now = redis.call('TIME')
local at = string.format('%d', (tonumber(now[1]) + ttl) * 1000 + math.floor(tonumber(now[2]) / 1000))
-- whether the row at p (n field/value strings) has the _source that the hash holds: the
-- same event, not another one of the same event time (which Postgres refused)
local function same_source(key, p, n)
  local held = redis.call('HGET', key, '_source')
  for i = p + 2, p + n, 2 do
    if t[i] == '_source' then return held == t[i + 1] end
  end
  return false
end
-- whether digest a (16 hex digits, or '' for none) is smaller than b: in two 32-bit
-- halves, numbers a double holds exactly (string order would follow the server's locale)
local function dg_less(a, b)
  if a == b or b == '' then return false end
  if a == '' then return true end
  local ah, bh = tonumber(string.sub(a, 1, 8), 16), tonumber(string.sub(b, 1, 8), 16)
  if ah ~= bh then return ah < bh end
  return tonumber(string.sub(a, 9), 16) < tonumber(string.sub(b, 9), 16)
end
for k = 1, #KEYS do
  local et = t[p]; local n = t[p + 1]
  local dg = ''
  if n > 0 and t[p + 2] == '_digest' then dg = t[p + 3] end
  local held = redis.call('HMGET', KEYS[k], '_event_time', '_digest')
  local cur = held[1]; local curdg = held[2] or ''
  -- of two events at one instant, the greater digest is the newest (Postgres keeps both);
  -- a hash the SDK filled from Postgres (_filled) yields to the pipeline's write of its
  -- event (the same _source)
  if (not cur) or tonumber(cur) < tonumber(et)
      or (tonumber(cur) == tonumber(et) and dg_less(curdg, dg))
      or (tonumber(cur) == tonumber(et) and redis.call('HEXISTS', KEYS[k], '_filled') == 1
          and same_source(KEYS[k], p, n)) then
    if cur then redis.call('DEL', KEYS[k]) end
    redis.call('HSET', KEYS[k], '_event_time', et, unpack(t, p + 2, p + 1 + n))
    if ttl > 0 then redis.call('PEXPIREAT', KEYS[k], at) end
    written = written + 1
  end
  p = p + 2 + n
end
return written
"""
NEWEST_WINS_SHA = hashlib.sha1(NEWEST_WINS.encode()).hexdigest()
#: The aggregates' variant: an equal event time replaces too, because a late event
#: (within the allowed lateness) updates the aggregation values of the newest event, but
#: only a hash that holds something else: one holding the same values, lineage and layout
#: but for the run's own ``_run_id``/``_ingested_at`` (a re-load of the same files, which
#: recomputes every value of its entities) is left as it is, so its lineage keeps naming
#: the run that wrote those values.
NEWEST_OR_EQUAL_WINS = NEWEST_WINS.replace("for k = 1, #KEYS do\n", """\
-- whether the hash at key holds exactly the row at p but for the run's own lineage
-- (_run_id, _ingested_at): the same fields (no more: a value that became null is an
-- absent field) with the same text
local function same_row(key, p, n)
  if redis.call('HLEN', key) ~= n / 2 + 1 then return false end
  local names = {}
  for i = p + 2, p + n, 2 do names[#names + 1] = t[i] end
  local held = redis.call('HMGET', key, unpack(names))
  for j = 1, #names do
    local name = names[j]
    if name ~= '_run_id' and name ~= '_ingested_at' and held[j] ~= t[p + 1 + 2 * j] then return false end
  end
  return true
end
for k = 1, #KEYS do
""", 1).replace("tonumber(cur) < tonumber(et)", "tonumber(cur) < tonumber(et)\n"
                "      or (tonumber(cur) == tonumber(et) and not same_row(KEYS[k], p, n))")
NEWEST_OR_EQUAL_WINS_SHA = hashlib.sha1(NEWEST_OR_EQUAL_WINS.encode()).hexdigest()
#: The SDK's read-through fill and ``features prewarm`` (rows read back from Postgres):
#: newest wins as above, the hash is marked ``_filled`` (so the pipeline's own write of the
#: same event replaces it), and a hash that already holds the same event gets its TTL
#: renewed (Postgres confirmed it is still the newest: the refresh of a logically
#: expired value, ``hot.refresh_after``). A fill never replaces a hash of the same event.
FILL = NEWEST_WINS.replace(
    "  -- a hash the SDK filled from Postgres (_filled) yields to the pipeline's write of its\n"
    "  -- event (the same _source)\n",
    "").replace(
    """
      or (tonumber(cur) == tonumber(et) and redis.call('HEXISTS', KEYS[k], '_filled') == 1
          and same_source(KEYS[k], p, n))""", "").replace(
    """    written = written + 1
  end""", """    written = written + 1
  elseif ttl > 0 and tonumber(cur) == tonumber(et) and curdg == dg then
    redis.call('PEXPIREAT', KEYS[k], at)
  end""")
FILL_SHA = hashlib.sha1(FILL.encode()).hexdigest()
#: The field marking a hash written by the fill (value ``1``).
FILLED = "_filled"
#: ``features migrate`` and readers meeting a hash an earlier version of the schema wrote
#: (``features.sinks.versions.Upgrader``): the hash is rewritten in the new layout only while it
#: still holds the event and the fingerprint it was read with (a write meanwhile wins),
#: keeping its remaining TTL.
RESTAMP = """
-- KEYS: hashes. ARGV[1]: the schema fingerprint a hash must hold to be rewritten. ARGV[2]:
-- a MessagePack array as for NEWEST_WINS (the event time the hash must hold, a count n,
-- then n field/value strings).
local want = ARGV[1]; local t = cmsgpack.unpack(ARGV[2])
local p = 1; local written = 0
for k = 1, #KEYS do
  local et = t[p]; local n = t[p + 1]
  local cur = redis.call('HMGET', KEYS[k], '_event_time', '_schema_fingerprint')
  if cur[1] and tonumber(cur[1]) == tonumber(et) and cur[2] == want then
    local left = redis.call('PTTL', KEYS[k])
    redis.call('DEL', KEYS[k])
    redis.call('HSET', KEYS[k], '_event_time', cur[1], unpack(t, p + 2, p + 1 + n))
    if left > 0 then redis.call('PEXPIRE', KEYS[k], left) end
    written = written + 1
  end
  p = p + 2 + n
end
return written
"""
RESTAMP_SHA = hashlib.sha1(RESTAMP.encode()).hexdigest()

#: Lineage that is the same for every row of a run (its text is taken from the first row).
_CONSTANT_LINEAGE = (SCHEMA_VERSION, SCHEMA_FINGERPRINT, RUN_ID, INGESTED_AT)
_KEYS_PER_CALL = 256      # rows per script call at most (on a cluster: rows of one slot)
_CALLS_PER_ROUND = 256    # NOSCRIPT recovery: script calls sent before their replies are read
_ROWS_PER_CHUNK = 16_384  # rows encoded at a time on the writer thread, while Redis runs the last chunk
_CHUNKS_IN_FLIGHT = 3     # chunks at the server before the oldest one's replies are read
#: rows routed at a time on a cluster: a call's keys share one slot, so the more rows, the
#: more keys per call (100k rows over 16,384 slots: ~6 per call; bench/RESULTS.md)
_CLUSTER_ROWS_PER_CHUNK = 131_072




# --- a static schema's row version ----------------------------------------------------
#
# The version of a static schema's row (``event_time: none``, docs/schema.md "Tables
# without time"): which of two rows of one entity both stores keep.
#
# A static schema's stores hold one row per entity. A row replaces the stored one when its
# version is greater, compared as the pair:
#
# 1. ``_ingested_at``: the load's time (one per batch run, one per stream micro-batch,
#    one per ``FeatureStore.write``): a later load replaces an earlier one;
# 2. ``_digest`` (:data:`features.lineage.DIGEST`, :mod:`features.kernels.digest`): of
#    two rows of one entity in one load, the one whose content digest is greater, so the
#    outcome does not depend on the input's order, nor on how it was cut into batches.
#
# In Redis ``_event_time`` holds the load's time, and :data:`NEWEST_WINS`'s tie-break of
# equal event times (the greater ``_digest``) is this rule; Postgres upserts by the same
# pair (``features.sinks.postgres``). Equal versions mean equal content: the stored row
# stays (a replay changes nothing).


def _bulk(values: pa.Array) -> pa.Array:
    """``$<bytes>\\r\\n<value>\\r\\n`` per value (null stays null)."""
    lengths = pc.cast(pc.binary_length(values), pa.string())
    return pc.binary_join_element_wise("$", lengths, "\r\n", values, "\r\n", "")


def _const_bulk(text: str) -> str:
    return f"${len(text.encode())}\r\n{text}\r\n"


def _concat_bytes(arr: pa.Array) -> bytes:
    """The bytes of a null-free string or binary array laid end to end."""
    if isinstance(arr, pa.ChunkedArray):
        return b"".join(_concat_bytes(c) for c in arr.chunks)
    return bytes(laid_end_to_end(arr))


Offsets = npt.NDArray[np.int64]


def _msgpack_str(text: str) -> bytes:
    """One MessagePack string (the smallest header that fits)."""
    data = text.encode()
    n = len(data)
    if n < 32:
        return bytes([0xA0 | n]) + data
    if n < 256:
        return b"\xd9" + bytes([n]) + data
    if n < 65536:
        return b"\xda" + n.to_bytes(2, "big") + data
    return b"\xdb" + n.to_bytes(4, "big") + data


def _msgpack_strs(values: pa.Array) -> pa.Array:
    """Each value as a MessagePack string (binary; nulls stay null). One header width
    for the whole column, the smallest that fits its longest value (MessagePack lets a
    short string use a wider header)."""
    lengths = pc.binary_length(values).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    longest = int(lengths.max()) if len(lengths) else 0
    n = len(values)
    if longest < 32:
        head = (0xA0 | lengths).astype(np.uint8).reshape(n, 1)
    elif longest < 256:
        head = np.empty((n, 2), dtype=np.uint8)
        head[:, 0] = 0xD9
        head[:, 1] = lengths
    elif longest < 65536:
        head = np.empty((n, 3), dtype=np.uint8)
        head[:, 0] = 0xDA
        head[:, 1:] = lengths.astype(">u2").view(np.uint8).reshape(n, 2)
    else:
        head = np.empty((n, 5), dtype=np.uint8)
        head[:, 0] = 0xDB
        head[:, 1:] = lengths.astype(">u4").view(np.uint8).reshape(n, 4)
    return pc.binary_join_element_wise(binary_rows(head), values.cast(pa.binary()), b"")


def _offsets(arr: pa.Array) -> Offsets:
    """Start offsets (plus the end) of each value in ``_concat_bytes(arr)``."""
    lengths = pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


class RedisSink(ConnOrCluster):
    """Hot features, newest event per entity. See the module docstring for the layout."""

    name = "redis"

    def __init__(self, url: str, compiled: CompiledSchema, *, key_prefix: str = "",
                 retries: int = 5, backoff_s: float = 0.5, timeout_s: float = 30.0,
                 aggregates: bool = False, fill: bool = False, restamp: str | None = None) -> None:
        schema = compiled.schema
        if not schema.loadable:
            raise SinkError(f"schema {compiled.name!r} is validation-only: it cannot be loaded into Redis",
                            store=self.name)
        self.url = url
        self.endpoint = RedisEndpoint.from_url(url)
        self.host, self.port, self.db = self.endpoint.host, self.endpoint.port, self.endpoint.db
        self.address = self.endpoint.address
        self.compiled = compiled
        self.key_prefix = key_prefix
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.ttl = schema.hot.ttl_seconds or 0
        entity, event_time = schema.entity, schema.event_time
        assert entity is not None
        self.entity = entity
        #: the column ordering writes: the event time, or for a static schema (``event_time:
        #: none``) the load's time, ties broken by the content digest as for any schema
        self.static = schema.static
        self.event_time = INGESTED_AT if event_time is None else event_time
        self.fields = stored_fields(schema, "hot")
        self.features = schema.stored_features("hot")  # a one_hot feature: one column per value
        #: ``aggregates``: this sink writes the hot aggregations instead (their own hash per
        #: entity, see :func:`aggregates_key`; an equal event time replaces the values).
        self.hash_name = compiled.name
        self.script, self.script_sha = NEWEST_WINS, NEWEST_WINS_SHA
        if aggregates:
            self.fields, self.features = (), stored_aggregations(schema, "hot")
            self.hash_name = compiled.name + AGGREGATES_SUFFIX
            self.script, self.script_sha = NEWEST_OR_EQUAL_WINS, NEWEST_OR_EQUAL_WINS_SHA
        #: ``fill``: rows read back from Postgres (the SDK's read-through fill, ``features
        #: prewarm``): the :data:`FILL` script, every row's own lineage, a ``_filled`` mark
        self.fill = fill
        if fill:
            self.script, self.script_sha = FILL, FILL_SHA
        #: ``restamp``: hashes of an earlier version (this fingerprint) rewritten in this
        #: schema's layout (``features.sinks.versions``): the :data:`RESTAMP` script, every row's
        #: own lineage and ``_filled`` mark
        self.restamp = restamp
        if restamp is not None:
            self.script, self.script_sha = RESTAMP, RESTAMP_SHA
        self._conn: Conn | None = None  # the one connection to a standalone server
        self.keys_per_call = _KEYS_PER_CALL
        #: a Redis Cluster (a ``redis+cluster://`` URL, or a node that says it is one):
        #: writes are routed by slot, see features.sinks.redis_cluster
        self._cluster: Cluster | None = None
        #: longest wait (ms) for a primary's replicas to acknowledge a unit before its
        #: ledger entry is written (cluster only; WAIT)
        self.replica_wait_ms = int(timeout_s * 1000 / 3)

    @property
    def hot_columns(self) -> tuple[str, ...]:
        return (*self.fields, *self.features)

    # --- connection ---------------------------------------------------------------

    def _connect(self) -> Conn:
        self._conn = Conn(self.endpoint.connect(self.timeout_s, store=self.name), self.address)
        return self._conn

    def _redis_py(self) -> redis.Redis:
        """A redis-py client for the control calls (INFO, the ledger), with the same TLS checks."""
        return redis.Redis.from_url(self.url, socket_timeout=self.timeout_s,
                                    **self.endpoint.redis_py_options())

    def _call(self, args: Sequence[str], *, what: str) -> Any:
        """Send one command, return its parsed reply; a server that is not ready yet
        (``-LOADING``, ``-BUSY``, ``-TRYAGAIN``) raises ConnectionError, which the
        retries handle; other errors become SinkError."""
        assert self._conn is not None
        reply = self._conn.call(args)
        if isinstance(reply, ReplyError):
            _raise_if_not_ready(b"-" + reply.text.encode())
            raise SinkError(f"Redis at {self.address} refused {what}: -{reply.text}", store=self.name,
                            address=self.address)
        return reply

    def _retrying(self, what: str, fn: Any) -> Any:
        def attempt() -> Any:
            if self._cluster is not None:
                self._cluster.ensure_map()
            elif self._conn is None:
                self._connect()
            return fn()

        def give_up(exc: BaseException, attempts: int) -> SinkUnavailable:
            return SinkUnavailable(f"Redis at {self.address}: {what} failed after {attempts} attempts: {exc}",
                                   store=self.name, address=self.address)

        return retrying(attempt, attempts=self.retries, backoff_s=self.backoff_s,
                        transient=(OSError, ConnectionError, SinkUnavailable), reset=self.close,
                        give_up=give_up)

    def open(self) -> None:
        """Check the server (unreachable: SinkUnavailable naming the address) and load the
        script; on a Redis Cluster (a ``redis+cluster://`` URL, or a node that reports
        ``cluster_enabled``) read the slot map and load the script on every primary."""

        if self.endpoint.cluster:
            self._open_cluster()
            return
        client = self._redis_py()
        try:
            with map_redis_errors(self.address, "INFO", store=self.name):
                info = client.info("cluster")
        finally:
            client.close()
        if info.get("cluster_enabled"):  # type: ignore[union-attr]  # sync client
            self._open_cluster()  # a plain URL naming one node of a cluster: it seeds the map
            return
        self._retrying("script load", self._load_script)

    def _open_cluster(self) -> None:
        self._cluster = Cluster(self.endpoint, timeout_s=self.timeout_s, store=self.name)
        cluster = self._cluster
        self._retrying("script load", lambda: cluster.load_script(self.script, self.script_sha))
        self.address = cluster.address

    def _load_script(self) -> None:
        reply = self._call(["SCRIPT", "LOAD", self.script], what="SCRIPT LOAD")
        if reply != self.script_sha.encode():
            raise SinkError(f"unexpected SCRIPT LOAD reply {reply[:80]!r}", store=self.name)

    # --- ledger -------------------------------------------------------------------

    def _ledger(self) -> str:
        return self.key_prefix + ledger_key(self.compiled.name)

    def committed_units(self) -> set[str]:
        def fetch() -> set[str]:

            if self._cluster is not None:

                members = self._cluster.call(key_slot(self._ledger()), ["SMEMBERS", self._ledger()])
                prefix = self.compiled.fingerprint[:16] + " "
                return {m.decode()[len(prefix):] for m in members if m.decode().startswith(prefix)}
            client = self._redis_py()
            try:
                with map_redis_errors(self.address, "SMEMBERS", store=self.name):
                    members = client.smembers(self._ledger())
            finally:
                client.close()
            prefix = self.compiled.fingerprint[:16] + " "
            return {m.decode()[len(prefix):] for m in members  # type: ignore[union-attr]  # sync client
                    if m.decode().startswith(prefix)}

        result: set[str] = self._retrying("ledger read", fetch)
        return result

    def forget_units(self, units: Sequence[tuple[str, str]]) -> int:
        """Take ``units`` ((fingerprint, ledger key) pairs) out of the ledger, so a load of
        the same input writes them again (``features rollback``); returns how many were
        there. Running it again removes nothing."""
        if not units:
            return 0
        ledger = self._ledger()
        members = [f"{fp[:16]} {unit}" for fp, unit in units]

        def send() -> int:
            removed = 0
            for at in range(0, len(members), _KEYS_PER_CALL):
                args = ["SREM", ledger, *members[at:at + _KEYS_PER_CALL]]
                if self._cluster is not None:
                    reply = self._cluster.call(key_slot(ledger), args)
                else:
                    reply = self._call(args, what="SREM ledger")
                removed += int(reply)
            return removed

        return int(self._retrying("ledger removal", send))

    def delete_entities(self, entity: pa.Array) -> int:
        """Delete every hash of each of ``entity``: its hot features, its hot aggregations
        and its request-time window tiles (one ``DEL`` per entity: its keys share the
        entity's hash tag, so one slot in a cluster). Returns how many keys existed.
        ``features rollback`` writes them again from Postgres afterwards."""
        if len(entity) == 0:
            return 0
        text = pc.cast(encode_column(entity), pa.string())
        keys = [pc.binary_join_element_wise(f"{self.key_prefix}{KEY_PREFIX}:{name}:{{", text, "}", "")
                for name in (self.compiled.name, self.compiled.name + AGGREGATES_SUFFIX,
                             self.compiled.name + TILES_SUFFIX)]
        calls = [command(["DEL", *ks]) for ks in zip(*(k.to_pylist() for k in keys), strict=True)]

        def send() -> int:
            deleted = 0
            if self._cluster is not None:
                for reply in self._cluster.send_calls(calls, key_slots(keys[0])):
                    if not (isinstance(reply, bytes) and reply.startswith(b":")):
                        raise SinkError(f"Redis Cluster refused DEL: {getattr(reply, 'text', reply)}",
                                        store=self.name, address=self.address)
                    deleted += int(reply[1:])
                return deleted
            conn = self._conn
            assert conn is not None
            for at in range(0, len(calls), _CALLS_PER_ROUND):
                part = calls[at:at + _CALLS_PER_ROUND]
                conn.send(b"".join(part))
                for line in conn.read_lines(len(part)):
                    if not line.startswith(b":"):
                        _raise_if_not_ready(line)
                        text = line.decode(errors="replace")
                        raise SinkError(f"Redis at {self.address} refused DEL: {text}", store=self.name,
                                        address=self.address)
                    deleted += int(line[1:])
            return deleted

        return int(self._retrying("hash deletion", send))

    # --- writes -------------------------------------------------------------------

    def _keys(self, rows: pa.Table) -> pa.Array:
        """Every row's hash key (:func:`entity_key` with the sink's prefix)."""
        return pc.binary_join_element_wise(
            f"{self.key_prefix}{KEY_PREFIX}:{self.hash_name}:{{",
            pc.cast(encode_column(rows.column(self.entity).combine_chunks()), pa.string()), "}", "")

    def _row_blobs(self, rows: pa.Table) -> tuple[bytes, Offsets, bytes, Offsets, Offsets]:
        """Built with Arrow string kernels (no loop over rows): the RESP bulk of every
        row's key, and every row's MessagePack items (event time, count, field/value
        pairs of its non-null values, the run's constant lineage), with their offsets
        and per-row item counts."""
        keys = _bulk(self._keys(rows))
        micros = pc.cast(event_time_micros(rows.column(self.event_time).combine_chunks()), pa.string())
        present = np.zeros(rows.num_rows, dtype=np.int64)
        pairs: list[pa.Array] = []
        # rows read back from Postgres (or rewritten by a migration) carry their own
        # lineage each (several runs); the hash is stamped with the schema whose layout it
        # is written in, this one (docs/redis.md)
        per_row: tuple[str, ...] = (SOURCE,)
        if self.fill:
            per_row = (SOURCE, RUN_ID, INGESTED_AT)
        elif self.restamp is not None:
            per_row = (SOURCE, RUN_ID, INGESTED_AT, FILLED)
        digest = (DIGEST,) if DIGEST in rows.column_names and self.hash_name == self.compiled.name else ()
        for name in (*digest, *self.hot_columns, *per_row):
            v = encode_column(rows.column(name).combine_chunks())
            present += np.asarray(v.is_valid(), dtype=np.int64)
            pair = pc.binary_join_element_wise(_msgpack_str(name), _msgpack_strs(v), b"")
            pairs.append(pc.fill_null(pair, b""))
        # The run's constant lineage, taken from the first row (same text as encode_column).
        if self.fill or self.restamp is not None:
            constants = {SCHEMA_VERSION: self.compiled.schema.version_str,
                         SCHEMA_FINGERPRINT: self.compiled.fingerprint}
        else:
            constants = {c: str(encode_column(rows.column(c).slice(0, 1).combine_chunks())[0].as_py())
                         for c in _CONSTANT_LINEAGE}
        constants["_enc"] = ENCODING_VERSION
        if self.fill:
            constants[FILLED] = "1"
        const = b"".join(_msgpack_str(n) + _msgpack_str(v) for n, v in constants.items())
        present += len(constants)
        # the count as a MessagePack uint16 (0xcd + 2 bytes), whatever its value
        count = np.empty((rows.num_rows, 3), dtype=np.uint8)
        count[:, 0] = 0xCD
        count[:, 1:] = (2 * present).astype(">u2").view(np.uint8).reshape(-1, 2)
        # the digest's pair first (the script reads it there), then the constants
        head, rest = pairs[:len(digest)], pairs[len(digest):]
        per_row = pc.binary_join_element_wise(_msgpack_strs(micros), binary_rows(count), *head, const, *rest,
                                              b"")
        return _concat_bytes(keys), _offsets(keys), _concat_bytes(per_row), _offsets(per_row), 2 + 2 * present

    def calls(self, rows: pa.Table, bounds: Sequence[int] | None = None) -> list[bytes]:
        """The EVALSHA calls writing ``rows``: one per group of up to ``keys_per_call``
        rows, or per ``rows[bounds[i]:bounds[i + 1]]`` (a Python loop over groups, not rows)."""
        n = rows.num_rows
        if n == 0:
            return []
        kb, koff, rb, roff, items = self._row_blobs(rows)
        items_before = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(items, out=items_before[1:])
        ttl = _const_bulk(self.restamp if self.restamp is not None else str(self.ttl)).encode()
        out = []
        if bounds is None:
            bounds = [*range(0, n, self.keys_per_call), n]
        for s, e in itertools.pairwise(bounds):
            m = e - s
            body = int(roff[e] - roff[s])
            out.append(b"".join((
                f"*{5 + m}\r\n$7\r\nEVALSHA\r\n$40\r\n{self.script_sha}\r\n{_const_bulk(str(m))}".encode(),
                kb[koff[s]:koff[e]], ttl, f"${5 + body}\r\n".encode(),
                b"\xdd" + int(items_before[e] - items_before[s]).to_bytes(4, "big"),  # array32 header
                rb[roff[s]:roff[e]], b"\r\n")))
        return out

    def write(self, unit: WriteUnit) -> WriteResult:
        t0 = time.perf_counter()
        rows = unit.rows
        if self.hash_name == self.compiled.name and not self.fill and self.restamp is None:
            rows = with_digest(rows, self.compiled.schema)  # the tie-break of equal event times
        written = 0
        member = None if unit.unit is None else f"{self.compiled.fingerprint[:16]} {unit.unit}"

        def send_unit() -> int:
            # The ledger entry follows the rows on the same connection, in one retried step:
            # a server that restarted in between (empty, without persistence) never gets
            # the entry without the rows, because the retry sends both again.
            if self._cluster is not None:
                return self._send_cluster(rows, member)
            n = self._send(_UnitCalls(self, rows)) if rows.num_rows else 0
            if member is not None:
                self._call(["SADD", self._ledger(), member], what="SADD ledger")
            return n

        if rows.num_rows or member is not None:
            try:
                written = int(self._retrying("write", send_unit))
            except SinkError:
                self.close()  # replies to calls already sent may still be on the way
                raise
        return WriteResult(stored=written, already_present=rows.num_rows - written,
                           seconds=time.perf_counter() - t0)

    def cluster_calls(self, rows: pa.Table) -> tuple[list[bytes], npt.NDArray[np.int64]]:
        """For a cluster: the EVALSHA calls writing ``rows`` and the slot of each. A call's
        keys must share a slot, so the rows are ordered by slot (stably: rows of one entity
        keep their order) and each call takes up to ``keys_per_call`` rows of one slot."""

        slots = key_slots(self._keys(rows))
        order = np.argsort(slots, kind="stable")
        slots = slots[order]
        n = len(slots)
        idx = np.arange(n, dtype=np.int64)
        new_slot = np.ones(n, dtype=bool)
        new_slot[1:] = slots[1:] != slots[:-1]
        run_start = np.maximum.accumulate(np.where(new_slot, idx, 0))
        firsts = idx[(idx - run_start) % self.keys_per_call == 0]  # a call starts here
        calls = self.calls(rows.take(pa.array(order)), [*firsts.tolist(), n])
        return calls, slots[firsts]

    def _send_cluster(self, rows: pa.Table, member: str | None) -> int:
        """Write ``rows`` to a cluster chunk by chunk (every primary's share of a chunk
        sent before any reply is read), wait for each written primary's replicas, then add
        the ledger entry. A failure raises before the entry: the retry sends it all again."""
        cluster = self._cluster
        assert cluster is not None
        written = 0
        touched: set[tuple[str, int]] = set()
        for start in range(0, rows.num_rows, _CLUSTER_ROWS_PER_CHUNK):
            calls, slots = self.cluster_calls(rows.slice(start, _CLUSTER_ROWS_PER_CHUNK))
            for reply in cluster.send_calls(calls, slots, script_sha=self.script_sha):
                if isinstance(reply, bytes) and reply.startswith(b":"):
                    written += int(reply[1:])
                    continue
                text = getattr(reply, "text", reply)
                raise SinkError(f"Redis Cluster at {cluster.address} rejected a write: -{text}",
                                store=self.name, address=cluster.address)
            touched.update(cluster.nodes[i] for i in np.unique(cluster.owner[slots]).tolist())
        if member is not None:
            short = cluster.wait_replicas(sorted(touched), self.replica_wait_ms)
            if short:  # a failover now could lose rows the ledger would call written
                raise SinkUnavailable(f"Redis Cluster: replicas did not acknowledge the unit within "
                                      f"{self.replica_wait_ms} ms: {', '.join(short)}", store=self.name,
                                      address=cluster.address)
            ledger = self._ledger()
            reply = cluster.send_calls([command(["SADD", ledger, member])], np.array([key_slot(ledger)]))[0]
            if not (isinstance(reply, bytes) and reply.startswith(b":")):
                raise SinkError(f"Redis Cluster refused SADD ledger: {getattr(reply, 'text', reply)}",
                                store=self.name, address=cluster.address)
        return written

    def _send(self, chunks: Iterable[list[bytes]]) -> int:
        """Send the calls chunk by chunk and count the rows they wrote. Up to
        ``_CHUNKS_IN_FLIGHT`` chunks are at the server at a time, so it works on them
        while the next is encoded and sent.

        A server that lost the script (restarted, ``SCRIPT FLUSH``) answers NOSCRIPT:
        then the script is loaded again and every call from the first refused one on is
        sent again, in order (a call that had run writes nothing the second time: an
        equal event time keeps the stored value)."""
        conn = self._conn
        assert conn is not None
        written = 0
        pending: deque[list[bytes]] = deque()
        redo: list[bytes] = []

        def settle(part: list[bytes]) -> None:
            nonlocal written
            for call, line in zip(part, conn.read_lines(len(part)), strict=True):
                if line.startswith(b":"):
                    written += int(line[1:])
                    if redo:
                        redo.append(call)
                elif line.startswith(b"-NOSCRIPT"):
                    redo.append(call)
                else:
                    _raise_if_not_ready(line)
                    raise SinkError(f"Redis at {self.address} rejected a write: "
                                    f"{line.decode(errors='replace')}", store=self.name, address=self.address)

        def recover() -> None:
            while pending:
                settle(pending.popleft())
            self._load_script()
            again = list(redo)
            redo.clear()
            for start in range(0, len(again), _CALLS_PER_ROUND):
                part = again[start:start + _CALLS_PER_ROUND]
                conn.send(b"".join(part))
                settle(part)
            if redo:
                raise SinkError(f"Redis at {self.address} answered NOSCRIPT right after SCRIPT LOAD",
                                store=self.name, address=self.address)

        for part in chunks:
            conn.send(b"".join(part))
            pending.append(part)
            if len(pending) > _CHUNKS_IN_FLIGHT:
                settle(pending.popleft())
            if redo:
                recover()
        while pending:
            settle(pending.popleft())
        if redo:
            recover()
        return written


#: Replies of a server that cannot answer yet: loading its data after a restart, busy
#: with another client's long script, or (a cluster) moving a slot. Retried.
_NOT_READY = (b"-LOADING", b"-BUSY", b"-TRYAGAIN")


def _raise_if_not_ready(reply: bytes) -> None:
    if reply.startswith(_NOT_READY):
        raise ConnectionError(f"Redis is not ready: {reply.decode(errors='replace').strip()}")


class _UnitCalls:
    """A unit's EVALSHA calls, encoded ``_ROWS_PER_CHUNK`` rows at a time as they are
    iterated (again from the start when a write is retried)."""

    def __init__(self, sink: RedisSink, rows: pa.Table) -> None:
        self.sink = sink
        self.rows = rows

    def __iter__(self) -> Iterator[list[bytes]]:
        for start in range(0, self.rows.num_rows, _ROWS_PER_CHUNK):
            yield self.sink.calls(self.rows.slice(start, _ROWS_PER_CHUNK))
