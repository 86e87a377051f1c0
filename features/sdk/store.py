"""The feature SDK for model code: online lookups, point-in-time training sets, validation.

```python
from features import FeatureStore

fs = FeatureStore.from_env()                      # FEATURES_REDIS_URL, FEATURES_POSTGRES_DSN, ...
row = fs.online("credit_applicant", ["APP-000000000042"])          # pyarrow.Table
train = fs.historical("credit_applicant", entity_df, ["income_log"])  # as-of join in Postgres
result = fs.validate("credit_applicant", [{"application_id": ...}])   # ValidationResult
```

Every table comes back in the schema's declared Arrow types. See ``docs/sdk.md``.
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema, compile_schema
from features.compile.layout import aggregation_names as _aggregation_names
from features.compile.layout import cold_columns as _cold_columns
from features.compile.layout import declared_type as _declared_type
from features.compile.layout import from_text as _from_text
from features.compile.layout import hot_columns as _hot_columns
from features.compile.layout import reply_columns as _reply_columns
from features.compile.layout import rows_to_table as _rows_to_table
from features.compile.migration import mismatch_hint
from features.errors import ConfigError, SchemaError, SinkError
from features.observe.metrics import DEFAULT_HOST, MetricsServer, Registry, SdkMethod, SdkMetrics
from features.schema.syntax import suggest
from features.sdk.columns import (
    AGE,
    CHECKED,
    EVENT_TIME,
    FOUND,
    FROM,
    NULL_ID,
    STALE,
    UNKNOWN_SCHEMA,
    entity_in,
    entity_list,
    entity_text,
    event_time_type,
    time_column,
)
from features.sdk.fallback import Fallback
from features.sdk.historical import as_of_times
from features.sdk.online import (
    LINEAGE_FIELDS,
    SMALL_CALL,
    UPGRADE_ATTEMPTS,
    OnlineRequest,
    Outdated,
    Plan,
    python_decoders,
    scatter,
    small_rows,
    still_outdated,
)
from features.sdk.redis_read import RawPool

if TYPE_CHECKING:
    from features.schema import Schema
    from features.sdk.write import WriteSummary

_T = TypeVar("_T")
#: ``historical``'s ``windows``: aggregations as of the newest event, or evaluated at the row's time
WINDOWS = ("event", "request_time")


class FeatureStore:
    """Reads the stores the loader and the stream job write (see the module docstring).

    ``schemas`` is a folder of schema YAML files (or one file). Opening a schema checks
    the fingerprint Postgres recorded for it (``featureline_schemas``): a store written
    with another version of the schema raises SinkError naming both versions. ``fallback``
    (default True): entities missing from Redis are looked up in Postgres (their latest
    row); ``max_age``: a fallback row older than this is treated as missing.

    Metrics (``docs/operations.md``): every call counts into ``registry`` (its own unless
    given one to share with the application): ``featureline_sdk_lookup_seconds``,
    ``..._lookups_total``, ``..._fallback_total``, ``..._miss_total``, ``..._errors_total``.
    :meth:`metrics` renders them as Prometheus text; ``metrics_port`` also serves them on
    ``http://metrics_host:metrics_port/metrics`` from a daemon thread until :meth:`close`
    (port 0: a free port, see ``metrics_server.port``).
    """

    def __init__(self, *, redis_url: str, postgres_dsn: str, schemas: str | Path = "schemas",
                 fallback: bool = True, max_age: dt.timedelta | None = None,
                 search_path: str | None = None, key_prefix: str = "", timeout_s: float = 5.0,
                 registry: Registry | None = None, metrics_port: int | None = None,
                 metrics_host: str = DEFAULT_HOST, fill: bool = True,
                 fill_lock: dt.timedelta = dt.timedelta(seconds=2), fill_wait: dt.timedelta = dt.timedelta(0),
                 negative_ttl: dt.timedelta = dt.timedelta(seconds=1), views: str | Path = "views",
                 clock: Callable[[], float] | None = None) -> None:
        from features.sinks.redis_wire import RedisEndpoint

        self.redis_url = redis_url
        #: ``host:port`` of the Redis URL (the first seed of a cluster), never its password
        self.redis_address = RedisEndpoint.from_url(redis_url).address
        self.postgres_dsn = postgres_dsn
        self.schemas_path = Path(schemas)
        #: the folder of view YAML files (docs/views.md)
        self.views_path = Path(views)
        #: seconds since the epoch (default time.time): the instant of online views' max_age;
        #: a test or a replay freezes it
        self.clock = clock if clock is not None else time.time
        self.fallback = fallback
        self.max_age = max_age
        self.search_path = search_path
        self.key_prefix = key_prefix
        self.timeout_s = timeout_s
        #: the fallback under load (``features.fallback``, docs/sdk.md "Under load")
        self.fill = fill
        self.fill_lock = fill_lock
        self.fill_wait = fill_wait
        self.negative_ttl = negative_ttl
        self._compiled: dict[str, CompiledSchema] = {}
        self._views: dict[str, Any] = {}
        #: the schemas and views folders, parsed once, again when their stat changes
        self._schema_folder = _Parsed()
        self._view_folder = _Parsed()
        self._index_lock = threading.Lock()
        self._aredis: Any = None
        self._pool = RawPool(redis_url, timeout_s)
        self._plans: dict[tuple[str, tuple[str, ...] | None], Plan] = {}
        self._tile_specs: dict[str, Any] = {}  # schema -> features.aggregate.tiles.TileSpec
        self._fallback = Fallback(self)
        self._pg: Any = None
        #: per thread of :meth:`parallel`: ``own`` (use ``conn``, not ``_pg``) and ``conn``
        self._pg_local = threading.local()
        self._checked: set[str] = set()
        #: schema name -> the features.sinks.versions.Upgrader of hashes older versions wrote
        self._upgraders: dict[str, Any] = {}
        self._upgraders_lock = threading.Lock()
        #: schema name -> the features.sinks.versions.Newer the stores hold (a compatible newer
        #: version this reader reads in its own layout), kept until a fingerprint it does
        #: not know is met
        self._newer: dict[str, Any] = {}
        self.registry = registry if registry is not None else Registry()
        self._metrics = SdkMetrics(self.registry)
        #: the metrics endpoint (``metrics_port``), or None
        self.metrics_server: MetricsServer | None = (
            MetricsServer(self.registry, metrics_port, metrics_host) if metrics_port is not None else None)

    @classmethod
    def from_env(cls, **overrides: Any) -> FeatureStore:
        """Settings from ``FEATURES_*`` environment variables and ``featureline.toml``
        (``features.config``); keyword arguments override them. Raises ConfigError when the
        schemas folder the settings name does not exist (run outside a project, say),
        naming the project folder it resolved and how to point at the right one."""
        from pathlib import Path

        from features.config import resolve_settings
        from features.errors import ConfigError
        from features.home import CONFIG_FILE, HOME_VAR, project_home

        s = resolve_settings()
        args: dict[str, Any] = {"redis_url": s.redis_url, "postgres_dsn": s.postgres_dsn,
                                "schemas": s.schemas_dir, "views": s.views_dir}
        args.update(overrides)
        schemas = args["schemas"]
        if isinstance(schemas, str | Path) and not Path(schemas).exists():
            home = project_home()
            how = (f"{HOME_VAR} names {home}" if os.environ.get(HOME_VAR) else
                   f"no {CONFIG_FILE} at or above {Path.cwd()} and {HOME_VAR} is not set, so the project "
                   f"folder is the current one")
            raise ConfigError(f"no schemas folder at {Path(schemas).absolute()} ({how}): run from the "
                              f"project folder, set {HOME_VAR} to it, set FEATURES_SCHEMAS_DIR, or pass "
                              "FeatureStore.from_env(schemas=...)", key="schemas_dir",
                              looked_in=[HOME_VAR, CONFIG_FILE, "FEATURES_SCHEMAS_DIR"])
        return cls(**args)

    # --- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        with self._upgraders_lock:
            upgraders, self._upgraders = list(self._upgraders.values()), {}
        for up in upgraders:
            up.close()
        self._pool.close()
        self._fallback.close()
        if self._pg is not None:
            self._pg.close()
            self._pg = None
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def metrics(self) -> str:
        """This store's metrics (and whatever else shares its registry) in the Prometheus
        text exposition format, for an application's own ``/metrics`` handler."""
        return self.registry.exposition()

    def _observe(self, schema: str, method: SdkMethod, t0: float, entities: int, fallback: int,
                 missed: int) -> None:
        self._metrics.lookup(schema, method, time.perf_counter() - t0, entities=entities, fallback=fallback,
                             missed=missed)

    def _label(self, schema: str) -> str:
        """The metrics' ``schema`` label of a call: the name of a schema this store opened,
        else :data:`UNKNOWN_SCHEMA` (a caller's unknown names never grow the registry)."""
        return schema if schema in self._compiled else UNKNOWN_SCHEMA

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- schemas ------------------------------------------------------------------------

    def schema(self, name: str) -> CompiledSchema:
        """The compiled schema ``name`` (ConfigError naming the known ones when absent).

        The schema files are parsed once into an index of names (:meth:`_schema_index`),
        so an unknown name costs a ``stat`` of ``schemas``, never a parse; a schema once
        compiled is kept for the store's life."""
        c = self._compiled.get(name)
        if c is not None:
            return c
        schemas = self._schema_index()
        if name not in schemas:
            raise _unknown("schema", name, schemas, self.schemas_path)
        with self._index_lock:
            c = self._compiled.get(name)
            if c is None:
                c = self._compiled[name] = compile_schema(schemas[name])
        return c

    def _schema_index(self) -> dict[str, Schema]:
        """Every schema in ``schemas`` by name, parsed once and again only when the
        folder's (or the file's) ``stat`` changes: a file added, removed or renamed in it
        (an editor's save by rename too). A file edited in place is seen by a new store.
        A folder that does not parse raises its SchemaError each time, parsed once."""
        from features.schema import load_schemas

        found: dict[str, Schema] = self._schema_folder.get(
            self.schemas_path, lambda: load_schemas(self.schemas_path), self._index_lock)
        return found

    def use_schema(self, c: CompiledSchema) -> None:
        """Serve ``c`` under its name from now on, instead of the file in the schemas folder
        (a command that compiled it already: ``features recompute``)."""
        self._compiled[c.name] = c

    @property
    def redis_pool(self) -> RawPool:
        """The raw Redis connections this store reads with (pipelined ``HMGET``,
        :class:`features.sdk.redis_read.RawPool`)."""
        return self._pool

    def loadable_schema(self, name: str) -> CompiledSchema:
        c = self.schema(name)
        if not c.schema.loadable:
            raise ConfigError(f"schema {name!r} is validation-only (no entity/event_time): it has no "
                              "stored features", key="schema")
        return c

    def check_fingerprint(self, c: CompiledSchema, *, writing: bool = False) -> None:
        """The stores must hold ``c``'s version, or (for a read, not ``writing``) a compatible
        newer one this reader reads in its layout (:meth:`_newer_version`); else SinkError
        saying what to do. A read's answer is kept for the store's life."""
        if c.name in self._checked and not writing:
            return
        from features.compile.postgres import SCHEMAS_TABLE, quote_ident

        row = self.run_postgres("the fingerprint check", lambda conn: conn.execute(
            f"SELECT version, fingerprint FROM {quote_ident(SCHEMAS_TABLE)} WHERE schema_name = %s",
            (c.name,)).fetchone())
        if row is not None and row[1] != c.fingerprint and (
                writing or self._newer_version(c, {row[1]}) is None):
            raise SinkError(f"the stores hold schema {c.name} {row[0]} (fingerprint {row[1][:12]}), but "
                            f"{self.schemas_path} has {c.schema.version_str} (fingerprint "
                            f"{c.fingerprint[:12]}): {mismatch_hint(c.schema, row[0])}", store="postgres")
        self._checked.add(c.name)

    def _newer_version(self, c: CompiledSchema, others: set[str], *, read: bool = True) -> Any:
        """The :class:`features.sinks.versions.Newer` the stores hold when every fingerprint of
        ``others`` is a compatible version migrated (transitively) from ``c``'s that a reader
        of ``c`` reads in ``c``'s layout (docs/evolution.md, "Readers of an earlier version");
        else None. Read from Postgres again when one of ``others`` is not known yet
        (``read=False``: only what is known)."""
        from features.sinks.versions import newer_readable, read_recorded

        with self._upgraders_lock:
            newer = self._newer.get(c.name)
        if newer is not None and others <= newer.fingerprints:
            return newer
        if not read:
            return None
        recorded = self.run_postgres("the schema versions read", lambda conn: read_recorded(conn, c.name))
        newer = newer_readable(recorded, c)
        if newer is None or not others <= newer.fingerprints:
            return None
        with self._upgraders_lock:
            self._newer[c.name] = newer
        return newer

    def _upgrader(self, c: CompiledSchema, others: set[str]) -> Any:
        """The :class:`features.sinks.versions.Upgrader` of ``c`` when every fingerprint of ``others``
        is an earlier version the stores were migrated from (read from Postgres again when
        one is not known yet: a migration may have run since), else None."""
        from features.sinks.versions import Upgrader, read_recorded

        with self._upgraders_lock:
            up = self._upgraders.get(c.name)
        if up is not None and others <= up.old_fingerprints:
            return up
        recorded = self.run_postgres("the schema versions read", lambda conn: read_recorded(conn, c.name))
        if recorded.fingerprint != c.fingerprint or not others <= set(recorded.ancestors(c.fingerprint)):
            return None
        up = Upgrader(self, c, recorded)
        with self._upgraders_lock:
            old = self._upgraders.get(c.name)
            self._upgraders[c.name] = up
        if old is not None:
            old.close()
        return up

    def _upgrade(self, req: OnlineRequest) -> None:
        """Rewrite the hashes of ``req`` that an earlier version of its schema wrote."""
        plan = req.plan
        with self._upgraders_lock:
            up = self._upgraders.get(plan.c.name)  # made by the check that raised Outdated
        if up is None:
            return
        up.upgrade(req.reads[0][0], False)
        if plan.aggs:
            up.upgrade(req.reads[1][0], True)

    # --- connections ----------------------------------------------------------------------

    def run_postgres(self, what: str, fn: Callable[[Any], _T]) -> _T:
        """``fn(connection)``, with driver errors translated at this edge
        (:func:`features.sinks.pg.map_psycopg_errors`): a connection lost under it (the
        server restarted, the backend was terminated) is reopened once and ``fn`` run
        again; still failing: SinkUnavailable naming the address. Any other driver error
        is a SinkError naming ``what``; UndefinedTable passes through (the callers decide
        what a missing table means)."""
        import psycopg
        from psycopg import errors

        from features.sinks import pg

        with pg.map_psycopg_errors(self.postgres_dsn, what, passthrough=(errors.UndefinedTable,)):
            conn = self._postgres()
            try:
                return fn(conn)
            except psycopg.OperationalError:
                conn.close()
            return fn(self._postgres())

    def _postgres(self) -> Any:
        local = self._pg_local
        if getattr(local, "own", False):  # a thread of :meth:`parallel`: its own connection
            if local.conn is None or local.conn.closed:
                local.conn = self._connect_postgres()
            return local.conn
        if self._pg is None or self._pg.closed:
            self._pg = self._connect_postgres()
        return self._pg

    def _connect_postgres(self) -> Any:
        from features.sinks import pg

        return pg.connect(self.postgres_dsn, autocommit=True, utc=True, search_path=self.search_path,
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
        from concurrent.futures import ThreadPoolExecutor

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

    # --- online -----------------------------------------------------------------------------

    def _features(self, c: CompiledSchema, features: Sequence[str] | None, store: str) -> list[str]:
        """The requested stored columns (default: all of the store's features, then its
        aggregations, in schema order), checked by name."""
        schema = c.schema
        keys = {schema.entity, schema.event_time}
        columns = _hot_columns(c) if store == "hot" else _cold_columns(c)
        have = [n for n in columns if n not in keys] + _aggregation_names(c, store)
        if features is None:
            return have
        unknown = [f for f in features if f not in have]
        if unknown:
            where = "the hot store (Redis)" if store == "hot" else "the cold store (Postgres)"
            other, reader = (("cold", "FeatureStore.historical") if store == "hot"
                             else ("hot", "FeatureStore.online"))
            elsewhere = set(_hot_columns(c) if other == "hot" else _cold_columns(c)) - keys | set(
                _aggregation_names(c, other))
            named = ", ".join(f"{f!r} (only in the {other} store: {reader} reads it)" if f in elsewhere
                              else f"{f!r}{suggest(f, have)}" for f in unknown)
            raise ConfigError(f"schema {c.name!r} has no feature(s) {named} in {where}; it has: "
                              f"{', '.join(have)}", key="features")
        return list(features)

    def _plan(self, schema: str, features: Sequence[str] | None) -> Plan:
        """What an online call for ``features`` of ``schema`` reads, computed once per
        (schema, features) and kept: the small-call path costs little more than Redis."""
        key = (schema, tuple(features) if features is not None else None)
        plan = self._plans.get(key)
        if plan is None:
            c = self.loadable_schema(schema)
            columns = self._features(c, features, "hot")
            hot_aggs = set(_aggregation_names(c, "hot"))
            names = [x for x in columns if x not in hot_aggs]
            aggs = [x for x in columns if x in hot_aggs]
            cold = set(_cold_columns(c))
            cold_aggs = set(_aggregation_names(c, "cold"))
            hot = c.schema.hot
            refresh_ms = (hot.refresh_after_seconds * 1000 if hot.refresh_after_seconds and hot.ttl_seconds
                          else None)
            types = {name: _declared_type(c, name) for name in [*names, *aggs]}
            plan = Plan(c, columns, names, aggs, [*names, *CHECKED, EVENT_TIME],
                         [*aggs, *CHECKED, EVENT_TIME], [x for x in names if x in cold],
                         [x for x in aggs if x in cold_aggs],
                         (hot.ttl_seconds or 0) * 1000, refresh_ms, types,
                         pa.schema([(str(c.schema.entity), pa.string()), *[(x, types[x]) for x in columns],
                                    (EVENT_TIME, event_time_type(c)), (AGE, pa.float64()),
                                    (FROM, pa.string()), (FOUND, pa.bool_()), (STALE, pa.bool_())]),
                         python_decoders([types[x] for x in [*names, *aggs]]))
            if len(self._plans) > 1024:
                self._plans.clear()
            self._plans[key] = plan
        return plan

    def online_request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                        lineage: bool = False) -> OnlineRequest:
        """What one online call reads, for the sync and the async path alike: the entity
        hashes, then (when hot aggregations are requested) the aggregates hashes, then
        (for a schema with ``hot.refresh_after``) the entity hashes' PTTL, then (with
        ``lineage``) the entity hashes' ``_source`` and ``_run_id``."""
        from features.compile.layout import aggregates_key, entity_key

        plan = self._plan(schema, features)
        name = plan.c.name
        ids = [entity_text(i) for i in entity_ids]
        keys = [self.key_prefix + entity_key(name, i) for i in ids]
        reads: list[tuple[list[str], list[str] | None]] = [(keys, plan.fields)]
        if plan.aggs:
            reads.append(([self.key_prefix + aggregates_key(name, i) for i in ids], plan.agg_fields))
        if plan.refresh_ms is not None:
            reads.append((keys, None))
        if lineage:
            reads.append((keys, list(LINEAGE_FIELDS)))
        return OnlineRequest(plan, ids, reads, lineage)

    def online(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None = None, *,
               fallback: bool | None = None, max_age: dt.timedelta | None = None, windows: str = "event",
               at: dt.datetime | None = None) -> pa.Table:
        """The latest features of ``entity_ids``: one row per id, in request order.

        Columns: the entity, the requested features and aggregations (default: every hot
        feature, then every hot aggregation) in their declared types, ``_event_time`` (the
        row's event time: ``timestamp[us]`` for a naive event time, else ``timestamp[us,
        UTC]``), ``_age_seconds`` (now minus the event time, a naive one read as UTC), ``_from``
        (``redis``, ``postgres`` or null), ``_found`` and ``_stale`` (a Redis value past
        the schema's ``hot.refresh_after``, served while it is refreshed). One Redis round
        trip for all ids (pipelined ``HMGET`` of the entity hash and, for aggregations, of
        the aggregates hash); ids missing from Redis take one Postgres query together
        (their latest row and their newest aggregation row, unless ``fallback=False``, or
        older than ``max_age``; hot-only features and aggregations stay null there),
        shared with concurrent callers and written back to Redis (docs/sdk.md, "Under
        load"). Ids found nowhere come back as nulls with ``_found`` false; this never
        raises for a missing id.

        ``windows`` says what an aggregation column holds, as for :meth:`historical`:
        ``"event"`` (the default) the value as of the entity's newest event;
        ``"request_time"`` its window evaluated at ``at`` (default: now, :meth:`now`), read
        from the entity's tiles (docs/aggregations.md, "Windows at request time"; the same
        values as ``historical(..., windows="request_time")`` at that time; filled by batch
        loads only for now). ``at`` must not be more than the schema's allowed lateness
        before the entity's newest event (ConfigError: read such times with ``historical``).
        """
        if windows not in WINDOWS:
            raise ConfigError(f"windows must be one of {', '.join(map(repr, WINDOWS))}, not {windows!r}",
                              key="windows")
        if windows == "request_time":
            return self._online_request_time(schema, entity_ids, features, fallback, max_age, at)
        if at is not None:
            raise ConfigError("at= is the request time of windows='request_time'", key="at")
        t0 = time.perf_counter()
        since = time.monotonic()
        try:
            req = self.online_request(schema, entity_ids, features)
            replies = self._pool.hmget_many(req.reads)
            rows = small_rows(req, replies) if len(req.ids) <= SMALL_CALL else None
            if rows is not None:  # every id in Redis, fresh: no Arrow decoding
                table, from_pg, missed = pa.Table.from_pylist(rows, req.plan.result), 0, 0
            else:
                table, from_pg, missed = self.finish_online(req, replies, fallback, max_age, since)
        except Exception:  # counted, then raised as it is
            self._metrics.error(self._label(schema), "online")
            raise
        self._observe(schema, "online", t0, len(req.ids), from_pg, missed)
        return table

    def _online_request_time(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                             fallback: bool | None, max_age: dt.timedelta | None, at: dt.datetime | None
                             ) -> pa.Table:
        """:meth:`online` with ``windows="request_time"``: the features as ``online`` reads
        them and the aggregations from the tiles, in one round trip."""
        from features.sdk.request_time import request_micros, tile_read, tile_spec, window_values

        t0 = time.perf_counter()
        since = time.monotonic()
        try:
            c = self.loadable_schema(schema)
            columns = self._features(c, features, "hot")
            hot_aggs = set(_aggregation_names(c, "hot"))
            aggs = [x for x in columns if x in hot_aggs]
            req = self.online_request(schema, entity_ids, [x for x in columns if x not in hot_aggs])
            tspec = self._tile_specs.get(c.name)
            if tspec is None:
                tspec = self._tile_specs[c.name] = tile_spec(c)
            held = {a.name for a in tspec.spec.aggregations.features}
            if any(x not in held for x in aggs):
                missing = ", ".join(x for x in aggs if x not in held)
                raise ConfigError(f"windows='request_time' does not serve {missing} online yet "
                                  "(approx_count_distinct/approx_percentile are not in the tiles); "
                                  "name the other aggregations in features=", key="features")
            read = tile_read(tspec, c, req.ids, request_micros(c, at, self.now()), self.key_prefix)
            replies = self._pool.hmget_many([*req.reads, (read.keys, read.fields)])
            k = len(replies) - len(read.keys)
            base = replies[:k]
            rows = small_rows(req, base) if len(req.ids) <= SMALL_CALL else None
            if rows is not None:
                table, from_pg, missed = pa.Table.from_pylist(rows, req.plan.result), 0, 0
            else:
                table, from_pg, missed = self.finish_online(req, base, fallback, max_age, since)
            values = window_values(read, replies[k:], c) if aggs else {}
            out = {str(c.schema.entity): table.column(0)}
            for x in columns:
                out[x] = values[x] if x in hot_aggs else table.column(x)
            for x in table.column_names[1 + len(req.plan.names):]:
                out[x] = table.column(x)
            result = pa.table(out)
        except Exception:  # counted, then raised as it is
            self._metrics.error(self._label(schema), "online")
            raise
        self._observe(schema, "online", t0, len(req.ids), from_pg, missed)
        return result

    def online_dicts(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None = None,
                     *, fallback: bool | None = None, max_age: dt.timedelta | None = None
                     ) -> list[dict[str, Any]]:
        """:meth:`online` as one dict per id (``online(...).to_pylist()``: the same keys,
        values and decoding rules), for scoring services that read a few entities per
        request: when every id is in Redis (and fresh) no Arrow object is made at all,
        whatever the number of ids (each value decoded straight into its dict)."""
        t0 = time.perf_counter()
        since = time.monotonic()
        try:
            req = self.online_request(schema, entity_ids, features)
            replies = self._pool.hmget_many(req.reads)
            rows = small_rows(req, replies)  # any size: the dicts are made in Python either way
            from_pg = missed = 0
            if rows is None:
                table, from_pg, missed = self.finish_online(req, replies, fallback, max_age, since)
                rows = table.to_pylist()
        except Exception:  # counted, then raised as it is
            self._metrics.error(self._label(schema), "online_dicts")
            raise
        self._observe(schema, "online_dicts", t0, len(req.ids), from_pg, missed)
        return rows

    async def online_async(self, schema: str, entity_ids: Sequence[Any],
                           features: Sequence[str] | None = None, *, fallback: bool | None = None,
                           max_age: dt.timedelta | None = None) -> pa.Table:
        """:meth:`online` for asyncio model servers (redis.asyncio; the Postgres fallback
        runs in a worker thread, shared with concurrent callers as in :meth:`online`)."""
        t0 = time.perf_counter()
        since = time.monotonic()
        try:
            req = self.online_request(schema, entity_ids, features)
            table, from_pg, missed = await self._online_async(req, fallback, max_age, since)
        except Exception:  # counted, then raised as it is
            self._metrics.error(self._label(schema), "online_async")
            raise
        self._observe(schema, "online_async", t0, len(req.ids), from_pg, missed)
        return table

    async def _online_async(self, req: OnlineRequest, fallback: bool | None, max_age: dt.timedelta | None,
                            since: float) -> tuple[pa.Table, int, int]:
        import asyncio

        from features.sinks.redis_wire import map_redis_errors

        if self._aredis is None:  # redis-py's cluster client for a cluster: routes each HMGET by slot
            from features.sdk.fallback import redis_py_client

            self._aredis = redis_py_client(self.redis_url, self.timeout_s, asyncio=True)
        for _ in range(UPGRADE_ATTEMPTS):
            pipe = self._aredis.pipeline(transaction=False)
            for keys, fields in req.reads:
                for k in keys:
                    if fields is None:
                        pipe.pttl(k)
                    else:
                        pipe.hmget(k, fields)
            with map_redis_errors(self.redis_address, "the online read"):
                replies = await pipe.execute()
            try:
                return await asyncio.to_thread(self._finish_online, req, replies, fallback, max_age, since)
            except Outdated:  # hashes an earlier version wrote: rewritten, then read again
                await asyncio.to_thread(self._upgrade, req)
        raise still_outdated(req)

    def finish_online(self, req: OnlineRequest, replies: list[Any], fallback: bool | None,
                        max_age: dt.timedelta | None, since: float) -> tuple[pa.Table, int, int]:
        """:meth:`_finish_online`, after rewriting the hashes an earlier version of the
        schema wrote (and reading them again) when there are any."""
        for _ in range(UPGRADE_ATTEMPTS):
            try:
                return self._finish_online(req, replies, fallback, max_age, since)
            except Outdated:
                self._upgrade(req)
                replies = self._pool.hmget_many(req.reads)
        raise still_outdated(req)

    async def aclose(self) -> None:
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None
        self.close()

    def _decode_hashes(self, plan: Plan, names: list[str], replies: Sequence[Any],
                       what: str) -> tuple[dict[str, pa.Array], pa.Array]:
        """HMGET replies (the ``names``, then ``_enc``, ``_schema_fingerprint`` and
        ``_event_time``) -> the columns in their declared types and the event times (int64
        microseconds, null where the hash is absent). Checks every hash found first."""
        c = plan.c
        cols = _reply_columns(replies, len(names) + len(CHECKED) + 1)
        newer = self._check_hashes(c, cols[len(names)], cols[len(names) + 1], what)
        columns = {name: _from_text(c, name, cols[j], plan.types[name]) if newer is None
                   else _from_newer(c, newer, name, cols[j], cols[len(names) + 1], plan.types[name])
                   for j, name in enumerate(names)}
        return columns, cols[-1].cast(pa.int64())

    def _finish_online(self, req: OnlineRequest, replies: list[Any], fallback: bool | None,
                       max_age: dt.timedelta | None, since: float) -> tuple[pa.Table, int, int]:
        """The result table, how many ids the Postgres fallback served, how many were found nowhere."""
        plan, ids = req.plan, req.ids
        c = plan.c
        schema = c.schema
        n = len(ids)
        columns, micros = self._decode_hashes(plan, plan.names, replies[:n], "hashes")
        found = np.asarray(micros.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
        k = n
        if plan.aggs:
            aggs, _ = self._decode_hashes(plan, plan.aggs, replies[n:2 * n], "aggregates hashes")
            k += n
            # A row's values come from one place: the aggregates of an id without an entity
            # hash are dropped (the Postgres fallback, or nulls, give that row).
            if not found.all():
                keep = pa.array(np.arange(n, dtype=np.int64), mask=~found)
                aggs = {name: arr.take(keep) for name, arr in aggs.items()}
            columns.update(aggs)
        stale = np.zeros(n, dtype=np.bool_)
        if plan.refresh_ms is not None:
            pttl = np.array(replies[k:k + n], dtype=np.int64)
            # written longer ago than refresh_after: ttl - remaining
            stale = found & (pttl >= 0) & (plan.ttl_ms - pttl > plan.refresh_ms)
        if req.lineage:  # the last read: the entity hashes' _source, _run_id
            lineage = _reply_columns(replies[-n:], len(LINEAGE_FIELDS)) if n else [
                pa.array([], pa.string()) for _ in LINEAGE_FIELDS]
            columns.update(zip(LINEAGE_FIELDS, lineage, strict=True))
        data: dict[str, pa.Array] = {str(schema.entity): pa.array([None if i == NULL_ID else i for i in ids],
                                                                  pa.string()),
                                     **{name: columns[name] for name in plan.columns},
                                     EVENT_TIME: micros.cast(plan.result.field(EVENT_TIME).type)}
        if req.lineage:
            data.update({name: columns[name] for name in LINEAGE_FIELDS})
        in_redis = int(found.sum())
        source = np.array(["redis" if f else None for f in found.tolist()], dtype=object)
        use_fallback = self.fallback if fallback is None else fallback
        if use_fallback and in_redis < n:
            valid = np.array([i != NULL_ID for i in ids], dtype=np.bool_)
            missing = np.flatnonzero(~found & valid)
            if len(missing):
                self._fill_from_fallback(req, data, found, source, missing,
                                         max_age if max_age is not None else self.max_age, since)
        if use_fallback and stale.any():
            self._fallback.refresh(c, sorted({ids[i] for i in np.flatnonzero(stale)}))
        now_us = time.time_ns() // 1000
        ev = data[EVENT_TIME]
        age = pc.divide(pc.subtract(pa.scalar(now_us, pa.int64()), ev.cast(pa.int64())), 1_000_000.0)
        data[AGE] = age
        data[FROM] = pa.array(source.tolist(), pa.string())
        data[FOUND] = pa.array(found)
        data[STALE] = pa.array(stale)
        hits = int(found.sum())
        return pa.table(data), hits - in_redis, n - hits

    def _fill_from_fallback(self, req: OnlineRequest, data: dict[str, pa.Array],
                            found: npt.NDArray[np.bool_], source: npt.NDArray[Any],
                            missing: npt.NDArray[np.int64], max_age: dt.timedelta | None,
                            since: float) -> None:
        """Rows ``missing`` from Redis, from the shared Postgres read (``features.fallback``):
        their columns in ``data``, ``found`` and ``source`` updated in place. Ids another
        process filled meanwhile are read from Redis again."""
        plan, ids = req.plan, req.ids
        c = plan.c
        got = self._fallback.fetch(c, sorted({ids[i] for i in missing}), since)
        if got.again:
            again = missing[np.array([ids[i] in got.again for i in missing], dtype=np.bool_)]
            sub_ids = [ids[i] for i in again]
            sub = self.online_request(c.name, sub_ids, plan.columns if plan.columns else None, req.lineage)
            sub_table, _, _ = self._finish_online(sub, self._pool.hmget_many(sub.reads), False, None, since)
            hit = np.asarray(sub_table.column(FOUND).to_numpy(zero_copy_only=False), dtype=np.bool_)
            if hit.any():
                rows_at = again[hit]
                take = pa.array(np.flatnonzero(hit))
                for name in [*plan.columns, EVENT_TIME, *(LINEAGE_FIELDS if req.lineage else ())]:
                    value = sub_table.column(name).combine_chunks().take(take)
                    data[name] = scatter(data[name], rows_at, value)
                found[rows_at] = True
                source[rows_at] = "redis"
        if got.rows is None:
            return
        # naive = UTC: a naive event time's microseconds are its UTC wall clock, as in Redis
        event_type = plan.result.field(EVENT_TIME).type
        event = got.rows.column(time_column(c)).combine_chunks().cast(event_type)
        oldest = (None if max_age is None else
                  int((dt.datetime.now(dt.UTC) - max_age).timestamp() * 1_000_000))
        pick = np.array([got.at.get(ids[i], -1) for i in missing], dtype=np.int64)
        if oldest is not None and (pick >= 0).any():
            ev_us = np.asarray(event.cast(pa.int64()).to_numpy(zero_copy_only=False))
            pick[(pick >= 0) & (ev_us[np.maximum(pick, 0)] < oldest)] = -1
        rows_at = missing[pick >= 0]
        if not len(rows_at):
            return
        take = pa.array(pick[pick >= 0])
        for name in [*plan.cold_names, *plan.cold_aggs, EVENT_TIME, *(LINEAGE_FIELDS if req.lineage else ())]:
            src = event if name == EVENT_TIME else got.rows.column(name).combine_chunks()
            data[name] = scatter(data[name], rows_at, src.take(take))
        found[rows_at] = True
        source[rows_at] = "postgres"

    def _check_hashes(self, c: CompiledSchema, encodings: pa.Array, fingerprints: pa.Array,
                      what: str) -> Any:
        """Every hash found must be encoding v1 of this schema's fingerprint (docs/redis.md),
        or of an earlier version the stores were migrated from (then :class:`Outdated`), or
        of a compatible newer version this reader reads in its layout (then that
        :class:`features.sinks.versions.Newer` is returned; else None).
        ``encodings``, ``fingerprints``: the ``_enc`` and ``_schema_fingerprint`` of the
        hashes; ``what`` names the hashes in the message (``hashes``, ``aggregates hashes``)."""
        from features.compile.layout import ENCODING_VERSION

        encs = set(pc.unique(encodings).to_pylist()) - {None}
        fps = set(pc.unique(fingerprints).to_pylist()) - {None}
        if encs - {ENCODING_VERSION}:
            raise SinkError(f"Redis holds {c.name} {what} with encoding version "
                            f"{sorted(encs - {ENCODING_VERSION})[0]}; this reader knows version "
                            f"{ENCODING_VERSION}", store="redis")
        others = fps - {c.fingerprint}
        if others:
            newer = self._newer_version(c, others, read=False)
            if newer is not None:
                return newer  # a compatible newer version, read in this layout
            if self._upgrader(c, others) is not None:
                raise Outdated  # rewritten in this layout, then read again (docs/evolution.md)
            newer = self._newer_version(c, others)
            if newer is not None:
                return newer
            self._checked.discard(c.name)
            self.check_fingerprint(c)  # Postgres holds another version: that error says what to do
            raise SinkError(f"Redis holds {c.name} {what} written with schema fingerprint "
                            f"{sorted(others)[0][:12]}, which is no earlier version the stores were migrated "
                            f"from to {c.schema.version_str} (fingerprint {c.fingerprint[:12]}, "
                            f"{self.schemas_path}): {mismatch_hint(c.schema, '')}", store="redis")
        return None

    # --- the fallback's reads (features.fallback) and prewarm ----------------------------------

    def fetch_query(self, c: CompiledSchema, where: str) -> tuple[str, list[str]]:
        """The query of the newest stored row per entity among the history rows matching
        ``where`` (SQL over alias ``h``, with ``%s`` parameters), and its column names: the
        entity, the event time, every hot feature Postgres holds, the lineage, and for a
        schema with aggregations the entity's newest aggregation row (hot aggregations
        Postgres holds, its event time and lineage, prefixed ``__agg``)."""
        from features.compile.postgres import aggregates_table_name, cold_table_name, quote_ident
        from features.lineage import DIGEST
        from features.sdk.fallback import AGG, LINEAGE

        schema = c.schema
        keys = [str(schema.entity), time_column(c)]
        cold = set(_cold_columns(c))
        names = [*keys, *[x for x in _hot_columns(c) if x in cold and x not in keys],
                 *[x for x in LINEAGE if x not in keys], DIGEST]
        ent, et, dg = (quote_ident(k) for k in (*keys, DIGEST))
        # of events at one instant, the newest is the one with the greatest content digest
        query = (f"SELECT DISTINCT ON (h.{ent}) {', '.join('h.' + quote_ident(x) for x in names)} "
                 f"FROM {quote_ident(cold_table_name(schema))} h WHERE {where} "
                 f"ORDER BY h.{ent}, h.{et} DESC, h.{dg} DESC")
        aggs = [x for x in _aggregation_names(c, "hot") if x in set(_aggregation_names(c, "cold"))]
        if schema.aggregations is not None and _aggregation_names(c, "hot"):
            agg_cols = [str(schema.event_time), *aggs, *LINEAGE]
            outer = ", ".join([f"m.{quote_ident(x)}" for x in names]
                              + [f"a.{quote_ident(x)} AS {quote_ident(x if x in aggs else AGG + x)}"
                                 for x in agg_cols])
            query = (f"SELECT {outer} FROM ({query}) m LEFT JOIN LATERAL ("
                     f"SELECT {', '.join(quote_ident(x) for x in agg_cols)} "
                     f"FROM {quote_ident(aggregates_table_name(schema))} g WHERE g.{ent} = m.{ent} "
                     f"ORDER BY g.{et} DESC LIMIT 1) a ON true")
            names += [x if x in aggs else AGG + x for x in agg_cols]
        return query, names

    def newest_rows(self, c: CompiledSchema, ids: list[str]) -> pa.Table:
        """The newest stored row of each of ``ids`` (see :meth:`fetch_query`), one query. A
        database without the schema's tables has none."""
        from psycopg import errors

        self._check_fingerprint_or_none(c)
        query, names = self.fetch_query(c, entity_in(c))
        values = entity_list(c, ids)
        try:
            rows = self.run_postgres(
                "the fallback read", lambda conn: conn.execute(query, [values]).fetchall())
        except errors.UndefinedTable:
            rows = []
        return _rows_to_table(c, names, rows)

    def _no_table(self, c: CompiledSchema, exc: Exception) -> SinkError:
        from features.compile.postgres import cold_table_name

        return SinkError(f"Postgres has no table for schema {c.name!r} ({str(exc).strip().splitlines()[0]}; "
                         f"table {cold_table_name(c.schema)!r}, search_path "
                         f"{self.search_path or 'from the DSN'}): load data first, or check the DSN",
                         store="postgres")

    def _check_fingerprint_or_none(self, c: CompiledSchema) -> None:
        from psycopg import errors

        try:
            self.check_fingerprint(c)
        except errors.UndefinedTable:
            pass

    def prewarm(self, schema: str, *, since: dt.timedelta | None = None, ids: Sequence[Any] | None = None,
                chunk_rows: int = 50_000, progress: Any = None) -> dict[str, int]:
        """Fill Redis from the newest Postgres row of every entity (``since``: only entities
        with an event in that span; ``ids``: only those, compared as text as ``online`` compares
        them), with the fill's newest-wins script:
        a hash Redis holds with a newer or the same event is left as it is. For deploys and
        after a Redis loss (``features prewarm``). ``progress(done_rows, written)`` is called
        after each chunk. Returns ``{"rows": read from Postgres, "written": hashes written}``."""
        from features.compile.postgres import quote_ident
        from features.sdk.fallback import fill_rows, fillable

        c = self.loadable_schema(schema)
        if not fillable(c):
            raise ConfigError(f"schema {schema!r} has no hot features: nothing to prewarm", key="schema")
        self.check_fingerprint(c, writing=True)  # it writes this version's layout
        et = quote_ident(time_column(c))
        where: list[str] = ["true"]
        params: list[Any] = []
        if ids is not None:
            where.append(entity_in(c))
            params.append(entity_list(c, ids))
        if since is not None:  # entities with an event in the span: their newest row is in it
            where.append(f"h.{et} >= now() - %s")
            params.append(since)
        query, names = self.fetch_query(c, " AND ".join(where))
        sinks: dict[bool, Any] = {}

        def sink_for(aggregates: bool) -> Any:
            if aggregates not in sinks:
                from features.sinks.redis import RedisSink

                sinks[aggregates] = RedisSink(self.redis_url, c, key_prefix=self.key_prefix, fill=True,
                                              aggregates=aggregates)
                sinks[aggregates].open()
            return sinks[aggregates]

        from features.sinks import pg

        done = written = 0
        try:
            with pg.map_psycopg_errors(self.postgres_dsn, "the prewarm read"), \
                    pg.connect(self.postgres_dsn, utc=True, search_path=self.search_path,
                               timeout_s=self.timeout_s) as conn, \
                    conn.cursor(name="featureline_prewarm") as cur:
                cur.execute(query, params)
                while True:
                    batch = cur.fetchmany(chunk_rows)
                    if not batch:
                        break
                    rows = _rows_to_table(c, names, batch)
                    written += fill_rows(c, rows, sink_for)
                    done += rows.num_rows
                    if progress is not None:
                        progress(done, written)
        finally:
            for sink in sinks.values():
                sink.close()
        return {"rows": done, "written": written}


    # --- historical -------------------------------------------------------------------------

    def historical(self, schema: str, entity_df: Any, features: Sequence[str] | None = None, *,
                   timestamp_column: str = "timestamp", max_age: dt.timedelta | None = None,
                   windows: str = "event") -> pa.Table:
        """Point-in-time-correct training rows: for each row of ``entity_df`` (an Arrow
        table or a pandas DataFrame with the entity column and ``timestamp_column``, a
        zoned timestamp, or a naive one when the schema's event time is naive: then both
        are UTC wall-clock times), the latest stored values at or before its timestamp,
        never a later one (and none older than ``max_age``). Done in Postgres: the entity
        rows go in with one COPY into a temporary table, then one ``LEFT JOIN LATERAL``
        as-of query. Returns the input rows in order with the requested columns (default:
        every cold feature, then every cold aggregation) and ``_event_time`` (the history
        row's event time, typed as :func:`event_time_type` says; null where nothing
        qualifies). A naive time against a zoned or date event time raises ConfigError.

        ``windows`` says what an aggregation column holds: ``"event"`` (the default) the
        ``<schema>__aggregates`` row of the entity's newest aggregated event at or before
        the timestamp, the value the online store served at that time (not the window
        re-evaluated at the timestamp); ``"request_time"`` the window evaluated at the
        row's timestamp over the history table's events (docs/aggregations.md, "Windows
        at request time": a quiet entity's count falls to 0), ``max_age`` not applied to it.
        """
        if windows not in WINDOWS:
            raise ConfigError(f"windows must be one of {', '.join(map(repr, WINDOWS))}, not {windows!r}",
                              key="windows")
        t0 = time.perf_counter()
        try:
            out = self._historical_checked(schema, entity_df, features, timestamp_column, max_age,
                                           windows == "request_time")
        except Exception:  # counted, then raised as it is
            self._metrics.error(self._label(schema), "historical")
            raise
        missed = out.column(EVENT_TIME).null_count
        self._observe(schema, "historical", t0, out.num_rows, 0, missed)
        return out

    def _historical_checked(self, schema: str, entity_df: Any, features: Sequence[str] | None,
                            timestamp_column: str, max_age: dt.timedelta | None,
                            request_time: bool = False) -> pa.Table:
        c = self.loadable_schema(schema)
        columns = self._features(c, features, "cold")
        entity = str(c.schema.entity)
        if not isinstance(entity_df, pa.Table):
            entity_df = pa.Table.from_pandas(entity_df, preserve_index=False)
        for col in (entity, timestamp_column):
            if col not in entity_df.column_names:
                raise ConfigError(f"entity_df has no column {col!r} (it has "
                                  f"{', '.join(entity_df.column_names)})", key="entity_df")
        clash = [x for x in [*columns, EVENT_TIME] if x in entity_df.column_names]
        if clash:
            raise ConfigError(f"entity_df already has column(s) {', '.join(clash)}, which the result adds; "
                              "rename them first", key="entity_df")
        ts = as_of_times(c, entity_df.column(timestamp_column), timestamp_column)
        if c.schema.static and max_age is not None:
            raise ConfigError(f"schema {c.name!r} is static (event_time: none): its one row per entity has "
                              "no event time for max_age to measure; leave max_age out", key="max_age")
        from psycopg import errors

        try:
            self.check_fingerprint(c)
            return self._historical(c, entity_df, columns, ts, max_age, request_time)
        except errors.UndefinedTable as exc:
            raise self._no_table(c, exc) from exc

    def _historical(self, c: CompiledSchema, entity_df: pa.Table, columns: list[str], ts: Any,
                    max_age: dt.timedelta | None, request_time: bool = False) -> pa.Table:
        from features.sdk.asof import as_of  # the as-of join (copied out of Postgres, joined in NumPy)

        return as_of(self, c, entity_df, columns, ts, max_age, request_time=request_time)

    # --- views (docs/views.md) -----------------------------------------------------------------

    def view(self, name: str) -> Any:
        """The compiled view ``name`` (a :class:`features.views.CompiledView`; ConfigError
        naming the known ones when absent). Parsed from ``views`` (against the schemas of
        ``schemas``) once, again when the folder's ``stat`` changes; compiled once."""
        cv = self._views.get(name)
        if cv is not None:
            return cv
        views = self._view_defs()
        if name not in views:
            raise _unknown("view", name, views, self.views_path)
        from features.views import compile_view

        v = views[name]
        schemas = {s.schema: self.loadable_schema(s.schema) for s in v.sources}
        with self._index_lock:
            cv = self._views.get(name)
            if cv is None:
                cv = self._views[name] = compile_view(v, schemas)
        return cv

    def _view_defs(self) -> dict[str, Any]:
        from features.views import load_views

        schemas = self._schema_index()
        found: dict[str, Any] = self._view_folder.get(
            self.views_path, lambda: load_views(self.views_path, schemas) if self.views_path.exists() else {},
            self._index_lock, id(schemas))  # parsed again when the schemas were
        return found

    def _view_label(self, name: str) -> str:
        return name if name in self._views else UNKNOWN_SCHEMA

    def now(self) -> float:
        """The store's clock (``clock``): seconds since the epoch."""
        return self.clock()

    def redis_replies(self, reads: list[tuple[list[str], list[str] | None]]) -> list[Any]:
        return self._pool.hmget_many(reads)

    async def redis_replies_async(self, reads: list[tuple[list[str], list[str] | None]]) -> list[Any]:
        from features.sinks.redis_wire import map_redis_errors

        if self._aredis is None:  # redis-py's cluster client for a cluster: routes each HMGET by slot
            from features.sdk.fallback import redis_py_client

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

    def online_view(self, view: str, rows: Any, *, lineage: bool = False, fallback: bool | None = None
                    ) -> pa.Table:
        """View ``view`` for each request row (a list of dicts, an Arrow table or a pandas
        DataFrame holding the view's request keys and fields): one result row per request
        row, in order. Columns: the request keys and fields, every source's features under
        their output names (declared types), the request-time features, then per source
        ``<alias>._found``, ``<alias>._event_time``, ``<alias>._from`` and with ``lineage``
        ``<alias>._source`` and ``<alias>._run_id`` (the stored row each value came from).
        One Redis round trip for every source; each source's misses take one Postgres query
        (``online``'s fallback); ``max_age`` per source against :meth:`now`. A request row
        that breaks the view's rules raises :class:`features.errors.RequestRejected` with
        every field error (docs/views.md)."""
        from features.sdk import views

        out = self._view_call(view, "online_view", lambda cv: views.online(
            self, cv, rows, lineage=lineage, fallback=fallback))
        assert isinstance(out, pa.Table)
        return out

    def _view_call(self, view: str, method: SdkMethod, read: Callable[[Any], _T]) -> _T:
        """``read(compiled view)``, counted in the SDK's metrics under the view's name (its
        rows; an error counted, then raised as it is)."""
        t0 = time.perf_counter()
        try:
            out = read(self.view(view))
        except Exception:
            self._metrics.error(self._view_label(view), method)
            raise
        self._observe(view, method, t0, out.num_rows if isinstance(out, pa.Table) else len(out),  # type: ignore[arg-type]
                      0, 0)
        return out

    def online_view_dicts(self, view: str, rows: Any, *, lineage: bool = False,
                          fallback: bool | None = None) -> list[dict[str, Any]]:
        """:meth:`online_view` as one dict per request row (the same keys and values)."""
        from features.sdk import views

        out = self._view_call(view, "online_view_dicts", lambda cv: views.online(
            self, cv, rows, lineage=lineage, fallback=fallback, as_dicts=True))
        assert isinstance(out, list)
        return out

    async def online_view_async(self, view: str, rows: Any, *, lineage: bool = False,
                                fallback: bool | None = None) -> pa.Table:
        """:meth:`online_view` for asyncio callers (redis.asyncio; decoding, the Postgres
        fallback and the request-time features in a worker thread)."""
        from features.sdk import views

        t0 = time.perf_counter()
        try:
            cv = self.view(view)
            out = await views.online_async(self, cv, rows, lineage=lineage, fallback=fallback)
        except Exception:
            self._metrics.error(self._view_label(view), "online_view_async")
            raise
        self._observe(view, "online_view_async", t0, out.num_rows, 0, 0)
        return out

    def historical_view(self, view: str, entity_df: Any, *, timestamp_column: str = "timestamp") -> pa.Table:
        """Point-in-time rows of view ``view``: for each row of ``entity_df`` (Arrow or
        pandas, with the view's request keys and fields and ``timestamp_column``; any other
        column, labels, passed through), each source's values as ``historical`` gives them
        at the row's timestamp (``max_age`` against it), then the request-time features
        computed as :meth:`online_view` computes them. Columns: ``entity_df``'s, the
        fetched features, the request-time features, per source ``<alias>._found`` and
        ``<alias>._event_time``. Bad request fields raise RequestRejected."""
        from features.sdk import views

        return self._view_call(view, "historical_view", lambda cv: views.historical(
            self, cv, entity_df, timestamp_column=timestamp_column))

    # --- validation ---------------------------------------------------------------------------

    def validate(self, schema: str, rows: Any) -> Any:
        """The compiled rules on model inputs: a list of dicts, an Arrow table/batch or a
        pandas DataFrame. Returns the pipelines' ``ValidationResult``."""
        from features.validation import validate

        c = self.schema(schema)
        if not isinstance(rows, pa.Table | pa.RecordBatch | list):
            rows = pa.Table.from_pandas(rows, preserve_index=False)
        return validate(rows, c)

    # --- writing --------------------------------------------------------------------------------

    def write(self, schema: str, data: Any, *, run_id: str | None = None,
              source: str | None = None) -> WriteSummary:
        """Write ``data`` (a pandas DataFrame or an Arrow table) into this store's Redis and
        Postgres through the batch loader's core: validation, transforms, rejects with
        field-level errors, aggregations; lineage ``python://<run_id>#<row>``; the same
        ``run_id`` and rows again change nothing. Returns a ``features.sdk.write.WriteSummary``
        (``rows == stored + rejected + already_present``). See ``docs/sdk.md``."""
        from features.sdk.write import write

        return write(self, schema, data, run_id=run_id, source=source)



def _from_newer(c: CompiledSchema, newer: Any, name: str, text: pa.Array, fingerprints: pa.Array,
                target: pa.DataType) -> pa.Array:
    """Column ``name`` of hashes of ``c`` and of the compatible newer versions of ``newer``
    (a :class:`features.sinks.versions.Newer`), in ``c``'s declared type ``target``: a newer hash's
    text is read in the newest type (a compatible change only widens), then cast to
    ``target``; a value that does not fit it raises SinkError naming the newer version."""
    wide = _declared_type(newer.c, name)
    if wide == target:
        return _from_text(c, name, text, target)
    is_newer = pc.fill_null(pc.is_in(fingerprints, pa.array(sorted(newer.fingerprints), pa.string())), False)
    none = pa.nulls(len(text), text.type)
    mine = _from_text(c, name, pc.if_else(is_newer, none, text), target)
    read = _from_text(newer.c, name, pc.if_else(is_newer, text, none), wide)
    try:
        theirs = read.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SinkError(f"Redis holds a {c.name}.{name} value written by {c.name} "
                        f"{newer.c.schema.version_str} that does not fit this reader's {target} "
                        f"({c.schema.version_str}): {exc}; use the "
                        "schema file of that version", store="redis") from exc
    return pc.if_else(is_newer, theirs, mine)


class _Parsed:
    """What parsing a folder (or file) gave, kept until its ``stat`` signal changes (a
    file added, removed or renamed in it): :meth:`FeatureStore._schema_index` and the
    views'. A folder that does not parse raises its SchemaError each time, parsed once."""

    def __init__(self) -> None:
        self._held: tuple[tuple[Any, ...], Any] | None = None

    def get(self, path: Path, parse: Callable[[], Any], lock: threading.Lock, *extra: Any) -> Any:
        try:
            st = path.stat()
            signal: tuple[Any, ...] = (st.st_ino, st.st_mtime_ns, st.st_size, *extra)
        except OSError:
            signal = (None, *extra)  # the parse says what is wrong
        with lock:
            if self._held is None or self._held[0] != signal:
                try:
                    self._held = (signal, parse())
                except SchemaError as exc:
                    self._held = (signal, exc)
            found = self._held[1]
        if isinstance(found, SchemaError):
            raise found.with_traceback(None)
        return found


def _unknown(kind: str, name: str, known: dict[str, Any], where: Path) -> ConfigError:
    """No schema/view ``name`` in ``where``: the error naming the close and the known ones."""
    return ConfigError(f"no {kind} named {name!r}{suggest(name, known)} in {where} "
                       f"(known: {', '.join(sorted(known)) or 'none'})", key=kind, looked_in=[str(where)])


__all__ = ["AGE", "EVENT_TIME", "FOUND", "FROM", "STALE", "UNKNOWN_SCHEMA", "FeatureStore"]
