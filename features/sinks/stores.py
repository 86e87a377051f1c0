"""The one place the two stores of a schema are constructed from the settings: the cold
store (Postgres, the primary: its commit decides "stored") and the hot store (Redis).
Batch loads (``features.pipeline.run``), the stream micro-batch
(``features.stream.core``) and the checks before a load or a Flink job starts
(``features.load.stores``, ``features.cli.stream``) take them from here."""

from __future__ import annotations

from collections.abc import Iterable

from features.compile import CompiledSchema
from features.config import Settings
from features.sinks.base import Sink
from features.sinks.postgres import PostgresSink
from features.sinks.redis import RedisSink


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
