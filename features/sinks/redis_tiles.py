"""Redis hashes of request-time window tiles (``features.aggregate.tiles``): one per entity.

Layout: key ``features:<schema>__tiles:{<entity>}`` (:func:`features.compile.layout.
tiles_key`: the entity's hash tag, as its other hashes, so one slot in Redis Cluster);
fields ``s`` (every kept tile's summary in one value, ascending by start:
``features.aggregate.tilepack.pack_summary_set``, so a read fetches them all as one bulk
reply), ``e:<tile start us>`` (a tile's events), ``n`` (the newest event time written,
us), ``v`` (the tiles' layout signature: a hash written with another layout is
dropped and written anew) and ``c`` (us: from when the hash holds every event of the
entity a read can reach; absent: all of them. A writer that makes the hash again after
Redis lost it (evicted, restarted without persistence) while older events of the entity
are in the history sets it to the end of the last tile it knows holds one and does not
write, ``TileRows.complete_from_us``; a read whose windows reach before it computes them
from the history, ``features.sdk.hot.HotReader.finish_windowed``. A new entity's hash,
and every hash written while Redis keeps it, has none).

A tile is always written COMPLETE (every event of its time range, never a delta), so a
write is idempotent and the order of two writes of one tile changes nothing.
:data:`TILES_WRITE` writes one entity's tiles (its arguments: ``s:<start>`` and
``e:<start>`` per tile, as before; the summaries spliced into ``s``: the kept ones read
back, the written ones replacing theirs, the set packed again in start order, so the
value is a function of the kept tiles alone), keeps the newest event time, drops the
tiles that start before ``floor((newest - retention) / tile) * tile`` (Redis 7.0 has no
per-field expiry: the trim is what bounds the hash) and sets the schema's hot TTL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from features.compile.layout import KEY_PREFIX, TILES_WHOLE_US, encode_column, key_slots
from features.errors import SinkError, SinkUnavailable
from features.schema.syntax import TILES_SUFFIX
from features.sinks.base import retrying
from features.sinks.redis_cluster import Cluster
from features.sinks.redis_wire import Conn, RedisEndpoint, ReplyError, command

TILES_WRITE = """
-- KEYS[1]: one entity's tiles hash. ARGV: TTL s (0: none), layout signature, newest event
-- time of the write (us), retention (us), tile size (us), complete from (us), then pairs
-- field, text
local key = KEYS[1]; local ttl = tonumber(ARGV[1]); local sig = ARGV[2]
local cur = redis.call('HGET', key, 'v')
if cur and cur ~= sig then redis.call('DEL', key); cur = false end
local newest = tonumber(ARGV[3])
local old = redis.call('HGET', key, 'n')
if old and cur == sig and tonumber(old) > newest then newest = tonumber(old) end
local h = tonumber(ARGV[5])
local cutoff = math.floor((newest - tonumber(ARGV[4])) / h) * h
-- 'c': from when the hash holds every event (none: all a read can reach). ARGV[6] is the
-- end of the last tile holding an event this write knows and does not write ('': none).
-- A hash made here (absent, or of another layout) takes it; one that has a 'c' (made
-- again after Redis lost it) lowers it, or drops it once a write leaves no event out.
local cover = ARGV[6]
if not cur then
  if cover ~= '' then redis.call('HSET', key, 'c', cover) end
else
  local c = redis.call('HGET', key, 'c')
  if c and cover == '' then redis.call('HDEL', key, 'c')
  elseif c and tonumber(cover) < tonumber(c) then redis.call('HSET', key, 'c', cover) end
end
redis.call('HSET', key, 'v', sig, 'n', string.format('%.0f', newest))
-- the summaries kept: 's' = count (u32), starts (i64 each), lengths (u32 each), summaries
local summ = {}
local packed = redis.call('HGET', key, 's')
if packed then
  local n = struct.unpack('<I4', packed)
  local at = 5 + 12 * n
  for i = 0, n - 1 do
    local len = struct.unpack('<I4', packed, 5 + 8 * n + 4 * i)
    summ[struct.unpack('<i8', packed, 5 + 8 * i)] = string.sub(packed, at, at + len - 1)
    at = at + len
  end
end
local written = 0
for i = 7, #ARGV, 2 do
  local f = ARGV[i]
  local s = tonumber(string.sub(f, 3))
  if s >= cutoff then
    if string.sub(f, 1, 2) == 's:' then summ[s] = ARGV[i + 1] else redis.call('HSET', key, f, ARGV[i + 1]) end
    written = written + 1
  end
end
local starts = {}
for s, _ in pairs(summ) do if s >= cutoff then starts[#starts + 1] = s end end
table.sort(starts)
if #starts > 0 then
  local head, lens, body = {struct.pack('<I4', #starts)}, {}, {}
  for i, s in ipairs(starts) do
    head[i + 1] = struct.pack('<i8', s); lens[i] = struct.pack('<I4', #summ[s]); body[i] = summ[s]
  end
  redis.call('HSET', key, 's', table.concat(head) .. table.concat(lens) .. table.concat(body))
else
  redis.call('HDEL', key, 's')
end
for _, f in ipairs(redis.call('HKEYS', key)) do
  if string.sub(f, 1, 2) == 'e:' and tonumber(string.sub(f, 3)) < cutoff then redis.call('HDEL', key, f) end
end
if ttl > 0 then redis.call('EXPIRE', key, ttl) end
return written
"""
TILES_WRITE_SHA = hashlib.sha1(TILES_WRITE.encode()).hexdigest()
#: entities per pipelined round (one EVALSHA each)
_CALLS_PER_ROUND = 1024


def tiles_keys(schema_name: str, entity: pa.Array, key_prefix: str = "") -> list[str]:
    """The tiles hash of each entity (as :func:`features.compile.layout.tiles_key`, vectorised)."""
    text = pc.cast(encode_column(entity), pa.string())
    keys: list[str] = pc.binary_join_element_wise(
        f"{key_prefix}{KEY_PREFIX}:{schema_name}{TILES_SUFFIX}:{{", text, "}", "").to_pylist()
    return keys


class TileWriter:
    """Writes tiles with :data:`TILES_WRITE`, pipelined (a single server) or routed by slot
    (Redis Cluster, ``features.sinks.redis_cluster``)."""

    name = "redis"

    def __init__(self, url: str, schema_name: str, *, ttl_s: int, signature: str, retention_us: int,
                 size_us: int, key_prefix: str = "", timeout_s: float = 30.0, retries: int = 5,
                 backoff_s: float = 0.5) -> None:
        self.endpoint = RedisEndpoint.from_url(url)
        self.address = self.endpoint.address
        self.schema_name = schema_name
        self.head = [str(ttl_s), signature, "", str(retention_us), str(size_us)]
        self.key_prefix = key_prefix
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._conn: Conn | None = None
        self._cluster: Any = None

    def open(self) -> None:
        self._retrying("script load", self._connect)

    def _connect(self) -> None:
        if self._cluster is not None or self._conn is not None:
            return
        if self.endpoint.cluster:
            self._use_cluster()
            return
        self._conn = Conn(self.endpoint.connect(self.timeout_s, store=self.name), self.address)
        reply = self._conn.call(["SCRIPT", "LOAD", TILES_WRITE])
        if isinstance(reply, ReplyError) and reply.code == "MOVED":
            self._use_cluster()  # a plain URL naming a node of a cluster
        elif isinstance(reply, ReplyError):
            raise SinkError(f"Redis at {self.address} refused SCRIPT LOAD: -{reply.text}", store=self.name,
                            address=self.address)
        else:
            info = self._conn.call(["INFO", "cluster"])
            if isinstance(info, bytes) and b"cluster_enabled:1" in info:
                self._use_cluster()

    def _use_cluster(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._cluster = Cluster(self.endpoint, timeout_s=self.timeout_s, store=self.name)
        self._cluster.load_script(TILES_WRITE, TILES_WRITE_SHA)
        self.address = self._cluster.address

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.invalidate()
            self._cluster = None
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _retrying(self, what: str, fn: Any) -> Any:
        def give_up(exc: BaseException, attempts: int) -> SinkUnavailable:
            return SinkUnavailable(f"Redis at {self.address}: {what} failed after {attempts} attempts: {exc}",
                                   store=self.name, address=self.address)

        return retrying(fn, attempts=self.retries, backoff_s=self.backoff_s,
                        transient=(OSError, ConnectionError, SinkUnavailable), reset=self.close,
                        give_up=give_up)

    def calls(self, rows: Any) -> tuple[list[bytes], list[str]]:
        """One EVALSHA per entity of ``rows`` (a ``features.aggregate.tiles.TileRows``)
        and its key: a loop over the rewritten tiles (grouped by entity), not over events."""
        n_ent = len(rows.newest_us)
        if n_ent == 0:
            return [], []
        ent_keys = tiles_keys(self.schema_name, rows.newest_entity, self.key_prefix)
        index = {k: i for i, k in enumerate(ent_keys)}
        args: list[list[str | bytes]] = [[] for _ in range(n_ent)]
        if len(rows):
            tile_keys = tiles_keys(self.schema_name, rows.entity, self.key_prefix)
            starts = pc.cast(pa.array(rows.start_us), pa.string()).to_pylist()
            for k, s, summary, events in zip(tile_keys, starts, rows.summary.to_pylist(),
                                             rows.events.to_pylist(), strict=True):
                args[index[k]].extend((f"s:{s}", summary, f"e:{s}", events))
        head = self.head
        newest = np.asarray(rows.newest_us).tolist()
        cover = ["" if c == TILES_WHOLE_US else str(c) for c in np.asarray(rows.complete_from_us).tolist()]
        out = [command(["EVALSHA", TILES_WRITE_SHA, "1", k, head[0], head[1], str(t), head[3], head[4],
                        c, *a])
               for k, t, c, a in zip(ent_keys, newest, cover, args, strict=True)]
        return out, ent_keys

    def write(self, rows: Any) -> int:
        """Write every tile of ``rows``; returns how many tiles were kept (written)."""
        calls, keys = self.calls(rows)
        if not calls:
            return 0
        return int(self._retrying("tiles write", lambda: self._send(calls, keys)))

    def _send(self, calls: Sequence[bytes], keys: Sequence[str]) -> int:
        self._connect()
        if self._cluster is not None:
            replies = self._cluster.send_calls(list(calls), key_slots(pa.array(keys, pa.string())),
                                               script_sha=TILES_WRITE_SHA)
            return sum(self._count(r) for r in replies)
        conn = self._conn
        assert conn is not None
        written = 0
        for at in range(0, len(calls), _CALLS_PER_ROUND):
            part = calls[at:at + _CALLS_PER_ROUND]
            conn.send(b"".join(part))
            lines = conn.read_lines(len(part))
            if any(line.startswith(b"-NOSCRIPT") for line in lines):  # the server lost the script
                conn.call(["SCRIPT", "LOAD", TILES_WRITE])
                conn.send(b"".join(part))  # idempotent: complete tiles
                lines = conn.read_lines(len(part))
            written += sum(self._count(line) for line in lines)
        return written

    def _count(self, reply: Any) -> int:
        if isinstance(reply, bytes) and reply.startswith(b":"):
            return int(reply[1:])
        text = getattr(reply, "text", reply)
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        if isinstance(text, str) and text.lstrip("-").startswith(("LOADING", "BUSY", "TRYAGAIN")):
            raise ConnectionError(f"Redis is not ready: {text}")
        raise SinkError(f"Redis at {self.address} rejected a tiles write: {text}", store=self.name,
                        address=self.address)


__all__ = ["TILES_WRITE", "TileWriter", "tiles_keys"]
