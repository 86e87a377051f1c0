"""The SDK's Redis reads: pipelined ``HMGET``s as protocol bytes, on a pool of raw
connections (one per concurrent caller), routed by slot on a Redis Cluster."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from features.compile.layout import key_slots
from features.errors import SinkError, SinkUnavailable
from features.sinks.redis_cluster import Cluster, ConnOrCluster
from features.sinks.redis_wire import Conn, RedisEndpoint, ReplyError, repeated_commands


class RawPool:
    """:class:`RawRedis` connections for concurrent callers: each call takes an idle one
    (or opens one) and puts it back, so threads never share a connection."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._idle: list[RawRedis] = []
        self._lock = threading.Lock()

    def hmget_many(self, reads: Sequence[tuple[Sequence[str], Sequence[str] | None]]) -> list[Any]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = RawRedis(self.url, self.timeout_s)
        replies = conn.hmget_many(reads)  # a failure drops the connection (it closed itself)
        with self._lock:
            self._idle.append(conn)
        return replies

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class RawRedis(ConnOrCluster):
    """One Redis connection that pipelines HMGETs as protocol bytes (``features.sinks.
    redis_wire``: the replies read by hiredis's C reader). Reconnects once on a lost
    connection; an unreachable server raises SinkUnavailable."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.endpoint = RedisEndpoint.from_url(url)
        self.address = self.endpoint.address
        self.timeout_s = timeout_s
        self._conn = None  # a features.sinks.redis_wire.Conn
        #: a Redis Cluster (a ``redis+cluster://`` URL, or a node that answered -MOVED):
        #: each HMGET goes to its slot's primary (features.sinks.redis_cluster)
        self._cluster = None
        if self.endpoint.cluster:
            self._use_cluster()

    def _use_cluster(self) -> None:
        self.close()
        self._cluster = Cluster(self.endpoint, timeout_s=self.timeout_s)
        self.address = self._cluster.address

    def _connect(self) -> Conn:
        self._conn = Conn(self.endpoint.connect(self.timeout_s), self.address)
        return self._conn

    def hmget_many(self, reads: Sequence[tuple[Sequence[str], Sequence[str] | None]]) -> list[Any]:
        """One ``HMGET key *fields`` per key of each ``(keys, fields)`` group (``PTTL key``
        where ``fields`` is None), every group sent in one write (one round trip); the
        replies in the same order (lists of bytes/None; integers for PTTL)."""
        if self._cluster is not None:
            return self._hmget_cluster(reads)

        request = b"".join(hmget_request(keys, fields) for keys, fields in reads)
        n = sum(len(keys) for keys, _ in reads)
        for attempt in (1, 2):
            try:
                conn = self._conn if self._conn is not None else self._connect()
                conn.send(request)
                replies: list[Any] = conn.read_replies(n)
                for reply in replies:
                    if isinstance(reply, ReplyError):
                        if reply.code == "MOVED":
                            raise _Moved(reply.text)
                        raise SinkError(f"Redis at {self.address} refused HMGET: -{reply.text}",
                                        store="redis", address=self.address)
                return replies
            except _Moved:  # a plain URL naming one node of a cluster: route by slot from now on
                self._use_cluster()
                return self._hmget_cluster(reads)
            except (OSError, ConnectionError) as exc:
                self.close()
                if attempt == 2:
                    raise SinkUnavailable(f"Redis unreachable at {self.address}: {exc}", store="redis",
                                          address=self.address) from exc
            except BaseException:
                self.close()  # replies may be left unread: never reuse this connection
                raise
        raise AssertionError("unreachable")

    def _hmget_cluster(self, reads: Sequence[tuple[Sequence[str], Sequence[str] | None]]) -> list[Any]:
        """:meth:`hmget_many` on a cluster: every primary gets its keys' HMGETs in one write
        (all primaries before any reply is read), redirections followed."""
        keys = [k for ks, _ in reads for k in ks]
        calls = [hmget_request([k], fields) for ks, fields in reads for k in ks]
        slots = key_slots(pa.array(keys, pa.string()))
        cluster = self._cluster
        assert cluster is not None
        for attempt in (1, 2):
            try:
                replies = cluster.send_calls(calls, slots, replies=True)
                break
            except (OSError, ConnectionError, SinkUnavailable) as exc:
                cluster.invalidate()
                if attempt == 2:
                    raise SinkUnavailable(f"Redis Cluster unreachable at {self.address}: {exc}",
                                          store="redis", address=self.address) from exc
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise SinkError(f"Redis Cluster at {self.address} refused HMGET: {reply.text}",
                                store="redis", address=self.address)
        return replies  # lists of bytes/None


class _Moved(Exception):
    """A -MOVED reply: the server is one node of a Redis Cluster."""


def hmget_request(keys: Sequence[str], fields: Sequence[str] | None) -> bytes:
    """``HMGET key *fields`` per key (``PTTL key`` where ``fields`` is None)."""
    if fields is None:
        return repeated_commands(["PTTL"], keys, [])
    return repeated_commands(["HMGET"], keys, fields)


