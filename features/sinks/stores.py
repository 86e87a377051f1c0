"""The one place the two stores of a schema are constructed from the settings: the cold
store (Postgres, the primary: its commit decides "stored") and the hot store (Redis).
Batch loads (``features.pipeline.run``), the stream micro-batch
(``features.stream.core``) and the checks before a load or a Flink job starts
(``features.load.stores``, ``features.cli.stream``) take them from here; so does the
aggregation stage, through the :class:`AggregateSinks` its caller hands it
(``features.aggregate.writer.AggregateStores``: the stage imports no sink)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from features.compile import CompiledSchema
from features.config import Settings
from features.sinks.base import Sink, WriteUnit
from features.sinks.postgres import PostgresSink
from features.sinks.redis import RedisSink
from features.sinks.redis_tiles import TileWriter


def store_sinks(compiled: CompiledSchema, settings: Settings, *, search_path: str | None = None,
                key_prefix: str = "") -> tuple[PostgresSink, RedisSink]:
    """(cold, hot): ``compiled``'s Postgres sink (tables under ``search_path``) and its
    Redis sink (keys under ``key_prefix``), neither opened yet; both try a lost store
    ``settings.store_retries`` times, ``settings.store_backoff_s`` apart, doubling."""
    return (PostgresSink(settings.postgres_dsn, compiled, search_path=search_path,
                         retries=settings.store_retries, backoff_s=settings.store_backoff_s),
            RedisSink(settings.redis_url, compiled, key_prefix=key_prefix,
                      retries=settings.store_retries, backoff_s=settings.store_backoff_s))


def check_stores(sinks: Iterable[Sink]) -> None:
    """Open and close each of ``sinks`` in turn: every store answers, its schema's
    fingerprint matches, its DDL and scripts are in place (the first that fails raises its
    SinkUnavailable or SinkError, naming the store)."""
    for sink in sinks:
        try:
            sink.open()
        finally:
            sink.close()


@dataclass(frozen=True)
class AggregateSinks:
    """The stores of a schema's windowed aggregations: its Redis sink of aggregations and
    its Postgres sink, and the writer of its request-time window tiles. Each :meth:`open`
    and :meth:`tiles` opens new connections (a cloned writer has its own)."""

    compiled: CompiledSchema
    postgres_dsn: str = field(repr=False)  # credentials: never in a repr
    redis_url: str = field(repr=False)
    search_path: str | None = None
    key_prefix: str = ""

    def open(self) -> tuple[RedisSink, PostgresSink]:
        """(hot, cold), both opened (Redis first); neither left open when one fails."""
        hot = RedisSink(self.redis_url, self.compiled, key_prefix=self.key_prefix, aggregates=True)
        cold = PostgresSink(self.postgres_dsn, self.compiled, search_path=self.search_path)
        try:
            for sink in (hot, cold):
                sink.open()
        except BaseException:
            for sink in (hot, cold):
                sink.close()
            raise
        return hot, cold

    def unit(self, rows: pa.Table) -> WriteUnit:
        """The hot sink's write of ``rows``: no rejects, no ledger key."""
        return WriteUnit(rows, rows.slice(0, 0), None, rows.num_rows)

    def tiles(self, *, signature: str, retention_us: int, size_us: int) -> TileWriter:
        """The schema's request-time window tiles' writer (``features.aggregate.tiles``), opened."""
        writer = TileWriter(self.redis_url, self.compiled.name,
                            ttl_s=self.compiled.schema.hot.ttl_seconds or 0, signature=signature,
                            retention_us=retention_us, size_us=size_us, key_prefix=self.key_prefix)
        writer.open()
        return writer


def aggregate_stores(compiled: CompiledSchema, settings: Settings, *, search_path: str | None = None,
                     key_prefix: str = "") -> AggregateSinks:
    """The stores ``features.aggregate.writer.AggregateWriter`` writes ``compiled``'s
    aggregations to (tables under ``search_path``, keys under ``key_prefix``)."""
    return AggregateSinks(compiled, settings.postgres_dsn, settings.redis_url, search_path=search_path,
                          key_prefix=key_prefix)
