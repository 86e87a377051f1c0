"""The feature SDK for model code (``from features import FeatureStore``).

- :mod:`features.sdk.store`: the facade, :class:`FeatureStore`: online reads, point in
  time (historical), views, validation, prewarm, writes;
- :mod:`features.sdk.online`: what an online read plans and decodes (the small-call path);
- :mod:`features.sdk.redis_read`: pipelined ``HMGET`` on raw connections, cluster-aware;
- :mod:`features.sdk.fallback`: the Postgres fallback under load (single-flight, fill,
  negative cache, refresh);
- :mod:`features.sdk.historical`: the point-in-time read;
- :mod:`features.sdk.columns`: the result columns and the entity ids' forms (which columns
  are stored where, and their declared types: :mod:`features.compile.layout`).

``features prewarm`` (:mod:`features.cli.prewarm`) calls :meth:`FeatureStore.prewarm`.

See ``docs/sdk.md``.
"""

from __future__ import annotations

from features.sdk.columns import AGE, EVENT_TIME, FOUND, FROM, STALE, UNKNOWN_SCHEMA
from features.sdk.store import FeatureStore

__all__ = ["AGE", "EVENT_TIME", "FOUND", "FROM", "STALE", "UNKNOWN_SCHEMA", "FeatureStore"]
