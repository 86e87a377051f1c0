"""Opening every store a load writes to, once, before the workers or Flink tasks start
(``features.load.load_workers``, ``features.flink.batch``)."""

from __future__ import annotations

from typing import Any

from features.aggregate.engine import AggSpec
from features.aggregate.writer import AggregateWriter
from features.compile import CompiledSchema
from features.config import Settings
from features.sinks.stores import aggregate_stores, store_sinks


def open_stores(compiled: CompiledSchema, settings: Settings, *, search_path: str | None = None,
                key_prefix: str = "") -> None:
    """Open (and close) every store a load writes to: checks they answer and the schema's
    fingerprint, applies the DDL and loads the Redis scripts once, before workers start
    (concurrent ``CREATE TABLE IF NOT EXISTS`` can fail in Postgres)."""
    cold, hot = store_sinks(compiled, settings, search_path=search_path, key_prefix=key_prefix)
    stores: list[Any] = [hot, cold]
    if AggSpec.of(compiled.schema) is not None:
        stores.append(AggregateWriter(compiled, aggregate_stores(compiled, settings, search_path=search_path,
                                                                 key_prefix=key_prefix)))
    try:
        for store in stores:
            store.open()
    finally:
        for store in stores:
            store.close()
