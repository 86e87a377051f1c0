"""The SDK's connections to the two stores (:class:`Connections`): a pool of raw Redis
connections for pipelined reads (:class:`features.sdk.redis_read.RawPool`), redis-py's
asyncio client for the async reads, and one Postgres connection (one per thread of
:meth:`Connections.parallel`) with the driver's errors mapped at this edge. Every other
part of the SDK (the hot and cold readers, the version checks, views, the migration's
:class:`features.sinks.versions.Upgrader`) reads the stores through these public methods.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from psycopg import errors

from features.sdk.fallback import redis_py_client
from features.sdk.redis_read import RawPool
from features.sinks import pg
from features.sinks.redis_wire import RedisEndpoint, map_redis_errors

_T = TypeVar("_T")


class Connections:
    """The stores' addresses and the connections to them (opened on first use, closed by
    :meth:`close`). ``search_path``: the Postgres schema search path (None: the DSN's);
    ``key_prefix``: put before every Redis key; ``timeout_s``: connect and read timeout."""

    def __init__(self, *, redis_url: str, postgres_dsn: str, search_path: str | None = None,
                 key_prefix: str = "", timeout_s: float = 5.0) -> None:
        self.redis_url = redis_url
        #: ``host:port`` of the Redis URL (the first seed of a cluster), never its password
        self.redis_address = RedisEndpoint.from_url(redis_url).address
        self.postgres_dsn = postgres_dsn
        self.search_path = search_path
        self.key_prefix = key_prefix
        self.timeout_s = timeout_s
        #: the raw Redis connections reads use (pipelined ``HMGET``)
        self.redis_pool = RawPool(redis_url, timeout_s)
        self._aredis: Any = None
        self._pg: Any = None
        #: per thread of :meth:`parallel`: ``own`` (use ``conn``, not ``_pg``) and ``conn``
        self._pg_local = threading.local()

    def close(self) -> None:
        self.redis_pool.close()
        if self._pg is not None:
            self._pg.close()
            self._pg = None

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def aclose(self) -> None:
        """Close the asyncio Redis client, then everything :meth:`close` closes."""
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None
        self.close()

    # --- Redis ------------------------------------------------------------------------------

    def redis_replies(self, reads: Sequence[tuple[Sequence[str], Sequence[str] | None]]) -> list[Any]:
        """One ``HMGET`` per key of each ``(keys, fields)`` group (``PTTL`` where ``fields``
        is None), in one round trip (:meth:`features.sdk.redis_read.RawPool.hmget_many`)."""
        return self.redis_pool.hmget_many(reads)

    async def redis_replies_async(self, reads: Sequence[tuple[Sequence[str], Sequence[str] | None]]
                                  ) -> list[Any]:
        """:meth:`redis_replies` on redis-py's asyncio client (a cluster's routes each
        ``HMGET`` by slot); errors mapped as the raw connections' are."""
        if self._aredis is None:
            self._aredis = redis_py_client(self.redis_url, self.timeout_s, asyncio=True)
        pipe = self._aredis.pipeline(transaction=False)
        for keys, fields in reads:
            for k in keys:
                if fields is None:
                    pipe.pttl(k)
                else:
                    pipe.hmget(k, fields)
        with map_redis_errors(self.redis_address, "the online read"):
            replies: list[Any] = await pipe.execute()
        return replies

    # --- Postgres -----------------------------------------------------------------------------

    def run_postgres(self, what: str, fn: Callable[[Any], _T]) -> _T:
        """``fn(connection)``, with driver errors translated at this edge
        (:func:`features.sinks.pg.map_psycopg_errors`): a connection lost under it (the
        server restarted, the backend was terminated) is reopened once and ``fn`` run
        again; still failing: SinkUnavailable naming the address. Any other driver error
        is a SinkError naming ``what``; UndefinedTable passes through (the callers decide
        what a missing table means)."""
        with pg.map_psycopg_errors(self.postgres_dsn, what, passthrough=(errors.UndefinedTable,)):
            conn = self.postgres()
            try:
                return fn(conn)
            except psycopg.OperationalError:
                conn.close()
            return fn(self.postgres())

    def postgres(self) -> Any:
        """This thread's Postgres connection (autocommit, UTC), opened again when closed:
        the store's one connection, or in a thread of :meth:`parallel` its own."""
        local = self._pg_local
        if getattr(local, "own", False):
            if local.conn is None or local.conn.closed:
                local.conn = self.connect_postgres()
            return local.conn
        if self._pg is None or self._pg.closed:
            self._pg = self.connect_postgres()
        return self._pg

    def connect_postgres(self, *, autocommit: bool = True) -> Any:
        """A new Postgres connection with this store's settings (the caller closes it)."""
        return pg.connect(self.postgres_dsn, autocommit=autocommit, utc=True, search_path=self.search_path,
                          timeout_s=self.timeout_s)

    def in_parallel(self) -> bool:
        """Whether this thread is one of :meth:`parallel`'s."""
        return bool(getattr(self._pg_local, "own", False))

    def parallel(self, fns: Sequence[Callable[[], _T]]) -> list[_T]:
        """``fn()`` of each, at once, each in a thread whose :meth:`run_postgres` calls use a
        connection of its own (opened on first use, closed after): Postgres reads that
        would otherwise queue on the one connection (the sources of a view, the history
        and aggregates tables of a schema) run side by side, one backend each. The
        results in order; the first failure is raised (after every call has ended)."""
        if len(fns) < 2:
            return [fn() for fn in fns]

        def own(fn: Callable[[], _T]) -> _T:
            local = self._pg_local
            local.own, local.conn = True, None
            try:
                return fn()
            finally:
                conn, local.own, local.conn = local.conn, False, None
                if conn is not None:
                    conn.close()

        with ThreadPoolExecutor(len(fns), thread_name_prefix="featureline-pg") as pool:
            futures = [pool.submit(own, fn) for fn in fns]
        return [f.result() for f in futures]


__all__ = ["Connections"]
