"""The feature SDK for model code (``from features import FeatureStore``).

- :mod:`features.sdk.store`: the facade, :class:`FeatureStore`: online reads, point in
  time (historical), views, validation, prewarm, writes; it counts each call in its metrics
  and delegates to the parts below (public methods only);
- :mod:`features.sdk.connections`: Redis (the read pool, redis.asyncio) and Postgres (errors
  mapped, a connection per thread of a parallel read);
- :mod:`features.sdk.catalog`: the schemas and views by name, parsed and compiled once;
- :mod:`features.sdk.upgrade`: the fingerprint check; hashes an earlier version wrote
  (rewritten by :class:`features.sinks.versions.Upgrader`) or a compatible newer one;
- :mod:`features.sdk.hot`: the hot reader (``online`` and its kin);
- :mod:`features.sdk.cold`: the cold reader (``historical``, the fallback's read, prewarm);
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
