"""The feature SDK for model code: online lookups, point-in-time training sets, validation.

```python
from features import FeatureStore

fs = FeatureStore.from_env()                      # FEATURES_REDIS_URL, FEATURES_POSTGRES_DSN, ...
row = fs.online("credit_applicant", ["APP-000000000042"])          # pyarrow.Table
train = fs.historical("credit_applicant", entity_df, ["income_log"])  # as-of join in Postgres
result = fs.validate("credit_applicant", [{"application_id": ...}])   # ValidationResult
```

Every table comes back in the schema's declared Arrow types. See ``docs/sdk.md``.

:class:`FeatureStore` is a facade: it counts each call in its metrics and delegates to the
SDK's parts, each with public methods only: :class:`features.sdk.connections.Connections`
(the Redis pool, Postgres with errors mapped, parallel reads), :class:`features.sdk.catalog.
Catalog` (the schemas and views, compiled once), :class:`features.sdk.upgrade.Versions` (the
fingerprint check, hashes of other versions), :class:`features.sdk.hot.HotReader` (online
reads), :class:`features.sdk.cold.ColdReader` (historical, the fallback's read, prewarm),
:mod:`features.sdk.views` and :mod:`features.sdk.write`.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from features.compile import CompiledSchema
from features.config import resolve_settings
from features.errors import ConfigError
from features.home import CONFIG_FILE, HOME_VAR, project_home
from features.observe.metrics import DEFAULT_HOST, MetricsServer, Registry, SdkMethod, SdkMetrics
from features.sdk import views
from features.sdk.catalog import Catalog
from features.sdk.cold import ColdReader
from features.sdk.columns import AGE, EVENT_TIME, FOUND, FROM, STALE, UNKNOWN_SCHEMA
from features.sdk.connections import Connections
from features.sdk.fallback import Fallback
from features.sdk.hot import HotReader, Read
from features.sdk.online import OnlineRequest
from features.sdk.redis_read import RawPool
from features.sdk.request_time import DEFAULT_WINDOWS, WindowedRequest, request_time_windows
from features.sdk.upgrade import Versions
from features.sdk.write import write
from features.validation import validate

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from features.sdk.write import WriteSummary

_T = TypeVar("_T")


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
        #: the parts (public interfaces): Redis and Postgres, the schemas and views, the
        #: version checks, the hot and the cold reader
        self.connections = Connections(redis_url=redis_url, postgres_dsn=postgres_dsn,
                                       search_path=search_path, key_prefix=key_prefix, timeout_s=timeout_s)
        self.catalog = Catalog(Path(schemas), Path(views))
        self.versions = Versions(self.connections, self.catalog.schemas_path)
        self.redis_url = redis_url
        #: ``host:port`` of the Redis URL (the first seed of a cluster), never its password
        self.redis_address = self.connections.redis_address
        self.postgres_dsn = postgres_dsn
        self.schemas_path = self.catalog.schemas_path
        #: the folder of view YAML files (docs/views.md)
        self.views_path = self.catalog.views_path
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
        self.cold = ColdReader(self.connections, self.catalog, self.versions)
        self._fallback = Fallback(self)  # reads this store's settings and its newest_rows
        self.registry = registry if registry is not None else Registry()
        self._metrics = SdkMetrics(self.registry)
        self.hot = HotReader(self.connections, self.catalog, self.versions, self._fallback,
                             use_fallback=fallback, max_age=max_age, clock=self.now,
                             on_history=self._metrics.windows_from_history)
        #: the metrics endpoint (``metrics_port``), or None
        self.metrics_server: MetricsServer | None = (
            MetricsServer(self.registry, metrics_port, metrics_host) if metrics_port is not None else None)

    @classmethod
    def from_env(cls, **overrides: Any) -> FeatureStore:
        """Settings from ``FEATURES_*`` environment variables and ``featureline.toml``
        (``features.config``); keyword arguments override them. Raises ConfigError when the
        schemas folder the settings name does not exist (run outside a project, say),
        naming the project folder it resolved and how to point at the right one."""
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
        self.versions.close()
        self._fallback.close()
        self.connections.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    async def aclose(self) -> None:
        """:meth:`close`, the asyncio Redis client of the async reads first."""
        await self.connections.aclose()
        self.close()

    def metrics(self) -> str:
        """This store's metrics (and whatever else shares its registry) in the Prometheus
        text exposition format, for an application's own ``/metrics`` handler."""
        return self.registry.exposition()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _counted(self, label: Callable[[str], str], name: str, method: SdkMethod, read: Callable[[], Read]
                 ) -> Any:
        """``read()``'s value, counted in the SDK's metrics under ``name`` (the ids it read,
        the fallback's and the misses; an error counted under ``label(name)``, then raised
        as it is)."""
        with self._count(label, name, method) as got:
            got.append(read())
        return got[0].value

    async def _counted_async(self, label: Callable[[str], str], name: str, method: SdkMethod,
                             read: Callable[[], Awaitable[Read]]) -> Any:
        """:meth:`_counted` of a coroutine."""
        with self._count(label, name, method) as got:
            got.append(await read())
        return got[0].value

    @contextmanager
    def _count(self, label: Callable[[str], str], name: str, method: SdkMethod) -> Iterator[list[Read]]:
        """Times the block, which puts its :class:`features.sdk.hot.Read` in the list."""
        t0 = time.perf_counter()
        got: list[Read] = []
        try:
            yield got
        except Exception:
            self._metrics.error(label(name), method)
            raise
        self._metrics.lookup(name, method, time.perf_counter() - t0, entities=got[0].ids,
                             fallback=got[0].from_pg, missed=got[0].missed)

    # --- schemas and connections (the parts' public methods, for the SDK's modules) -----------

    def schema(self, name: str) -> CompiledSchema:
        """The compiled schema ``name`` (ConfigError naming the known ones when absent).

        The schema files are parsed once into an index of names, so an unknown name costs
        a ``stat`` of ``schemas``, never a parse; a schema once compiled is kept for the
        store's life."""
        return self.catalog.schema(name)

    def use_schema(self, c: CompiledSchema) -> None:
        """Serve ``c`` under its name from now on, instead of the file in the schemas folder
        (a command that compiled it already: ``features recompute``)."""
        self.catalog.use(c)

    def loadable_schema(self, name: str) -> CompiledSchema:
        return self.catalog.loadable(name)

    @property
    def redis_pool(self) -> RawPool:
        """The raw Redis connections this store reads with (pipelined ``HMGET``,
        :class:`features.sdk.redis_read.RawPool`)."""
        return self.connections.redis_pool

    def check_fingerprint(self, c: CompiledSchema, *, writing: bool = False) -> None:
        """The stores must hold ``c``'s version, or (for a read, not ``writing``) a compatible
        newer one this reader reads in its layout; else SinkError saying what to do
        (:meth:`features.sdk.upgrade.Versions.check_fingerprint`)."""
        self.versions.check_fingerprint(c, writing=writing)

    def run_postgres(self, what: str, fn: Callable[[Any], _T]) -> _T:
        """``fn(connection)``, driver errors mapped
        (:meth:`features.sdk.connections.Connections.run_postgres`)."""
        return self.connections.run_postgres(what, fn)

    def in_parallel(self) -> bool:
        """Whether this thread is one of :meth:`parallel`'s."""
        return self.connections.in_parallel()

    def parallel(self, fns: Sequence[Callable[[], _T]]) -> list[_T]:
        """``fn()`` of each at once, each thread with a Postgres connection of its own
        (:meth:`features.sdk.connections.Connections.parallel`)."""
        return self.connections.parallel(fns)

    def redis_replies(self, reads: list[tuple[list[str], list[str] | None]]) -> list[Any]:
        return self.connections.redis_replies(reads)

    async def redis_replies_async(self, reads: list[tuple[list[str], list[str] | None]]) -> list[Any]:
        return await self.connections.redis_replies_async(reads)

    def now(self) -> float:
        """The store's clock (``clock``): seconds since the epoch."""
        return self.clock()

    # --- online -----------------------------------------------------------------------------

    def online_request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                       lineage: bool = False) -> OnlineRequest:
        """What one online call reads, for the sync and the async path alike: the entity
        hashes, then (when hot aggregations are requested) the aggregates hashes, then
        (for a schema with ``hot.refresh_after``) the entity hashes' PTTL, then (with
        ``lineage``) the entity hashes' ``_source`` and ``_run_id``."""
        return self.hot.request(schema, entity_ids, features, lineage)

    def windowed_request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None,
                         at: dt.datetime | None, *, lineage: bool = False, now_s: float | None = None,
                         lenient: bool = False) -> WindowedRequest:
        """What one online call with ``windows="request_time"`` reads: the features as
        :meth:`online_request` reads them, then the hot aggregations' tiles at ``at`` (None:
        ``now_s``, default :meth:`now`), in the same pipeline
        (:meth:`features.sdk.hot.HotReader.windowed_request`)."""
        return self.hot.windowed_request(schema, entity_ids, features, at, lineage=lineage, now_s=now_s,
                                         lenient=lenient)

    def finish_online(self, req: OnlineRequest | WindowedRequest, replies: list[Any], fallback: bool | None,
                      max_age: dt.timedelta | None, since: float) -> tuple[pa.Table, int, int]:
        """The result table of ``req`` from its Redis ``replies``, how many ids the Postgres
        fallback served, how many were found nowhere (:meth:`features.sdk.hot.HotReader.finish`:
        hashes an earlier version wrote rewritten and read again first; a
        :class:`WindowedRequest`'s aggregations from its tiles)."""
        return self.hot.finish(req, replies, fallback, max_age, since)

    def online(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None = None, *,
               fallback: bool | None = None, max_age: dt.timedelta | None = None,
               windows: str = DEFAULT_WINDOWS, at: dt.datetime | None = None) -> pa.Table:
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
        ``"request_time"`` (the default) its window evaluated at ``at`` (default: now,
        :meth:`now`), read from the entity's tiles (docs/aggregations.md, "Windows at request
        time"; the same values as ``historical`` gives at that time, so a quiet entity's
        counts decay; written by batch loads and the stream job; an entity whose tiles hash
        is absent computed from the Postgres history); ``"event"`` the value as of the
        entity's newest event (what the hot store holds; no decay). ``at`` must not be more
        than the schema's allowed lateness before the entity's newest event (ConfigError:
        read such times with ``historical``; without ``at``, such an entity is read from
        the history at the clock's time instead).
        """
        out: pa.Table = self._counted(self.catalog.schema_label, schema, "online", lambda: self.hot.online(
            schema, entity_ids, features, fallback, max_age, windows, at))
        return out

    def online_dicts(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None = None,
                     *, fallback: bool | None = None, max_age: dt.timedelta | None = None,
                     windows: str = DEFAULT_WINDOWS, at: dt.datetime | None = None) -> list[dict[str, Any]]:
        """:meth:`online` as one dict per id (``online(...).to_pylist()``: the same keys,
        values and decoding rules), for scoring services that read a few entities per
        request: when every id is in Redis (and fresh) no Arrow object is made at all,
        whatever the number of ids (each value decoded straight into its dict).
        ``windows``/``at`` as for :meth:`online` (``"request_time"``: the rows of that
        table)."""
        out: list[dict[str, Any]] = self._counted(self.catalog.schema_label, schema, "online_dicts",
                                                  lambda: self.hot.online_dicts(
                                                      schema, entity_ids, features, fallback, max_age,
                                                      windows, at))
        return out

    async def online_async(self, schema: str, entity_ids: Sequence[Any],
                           features: Sequence[str] | None = None, *, fallback: bool | None = None,
                           max_age: dt.timedelta | None = None, windows: str = DEFAULT_WINDOWS,
                           at: dt.datetime | None = None) -> pa.Table:
        """:meth:`online` for asyncio model servers (redis.asyncio; the Postgres fallback
        runs in a worker thread, shared with concurrent callers as in :meth:`online`);
        ``windows``/``at`` as for :meth:`online` (the tiles read in the same round trip)."""
        out: pa.Table = await self._counted_async(self.catalog.schema_label, schema, "online_async",
                                                  lambda: self.hot.online_async(
                                                      schema, entity_ids, features, fallback, max_age,
                                                      windows, at))
        return out

    # --- the fallback's reads (features.fallback) and prewarm ----------------------------------

    def fetch_query(self, c: CompiledSchema, where: str) -> tuple[str, list[str]]:
        """The query of the newest stored row per entity among the history rows matching
        ``where`` (SQL over alias ``h``, with ``%s`` parameters), and its column names: the
        entity, the event time, every hot feature Postgres holds, the lineage, and for a
        schema with aggregations the entity's newest aggregation row (hot aggregations
        Postgres holds, its event time and lineage, prefixed ``__agg``)."""
        return self.cold.fetch_query(c, where)

    def newest_rows(self, c: CompiledSchema, ids: list[str]) -> pa.Table:
        """The newest stored row of each of ``ids`` (see :meth:`fetch_query`), one query. A
        database without the schema's tables has none."""
        return self.cold.newest_rows(c, ids)

    def prewarm(self, schema: str, *, since: dt.timedelta | None = None, ids: Sequence[Any] | None = None,
                chunk_rows: int = 50_000, progress: Any = None) -> dict[str, int]:
        """Fill Redis from the newest Postgres row of every entity (``since``: only entities
        with an event in that span; ``ids``: only those, compared as text as ``online`` compares
        them), with the fill's newest-wins script:
        a hash Redis holds with a newer or the same event is left as it is. For deploys and
        after a Redis loss (``features prewarm``). ``progress(done_rows, written)`` is called
        after each chunk. Returns ``{"rows": read from Postgres, "written": hashes written}``."""
        return self.cold.prewarm(schema, since=since, ids=ids, chunk_rows=chunk_rows, progress=progress)

    # --- historical -------------------------------------------------------------------------

    def historical(self, schema: str, entity_df: Any, features: Sequence[str] | None = None, *,
                   timestamp_column: str = "timestamp", max_age: dt.timedelta | None = None,
                   windows: str = DEFAULT_WINDOWS) -> pa.Table:
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

        ``windows`` says what an aggregation column holds: ``"request_time"`` (the
        default) the window evaluated at the row's timestamp over the history table's
        events (docs/aggregations.md, "Windows at request time": a quiet entity's count
        falls to 0; what the default :meth:`online` serves at that time), ``max_age`` not
        applied to it; ``"event"`` the ``<schema>__aggregates`` row of the entity's newest
        aggregated event at or before the timestamp (the hot store's per-event value then,
        not the window re-evaluated at the timestamp).
        """
        request_time = request_time_windows(windows, None)

        def read() -> Read:
            out = self.cold.historical(schema, entity_df, features, timestamp_column, max_age, request_time)
            return Read(out, out.num_rows, 0, out.column(EVENT_TIME).null_count)

        table: pa.Table = self._counted(self.catalog.schema_label, schema, "historical", read)
        return table

    # --- views (docs/views.md) -----------------------------------------------------------------

    def view(self, name: str) -> Any:
        """The compiled view ``name`` (a :class:`features.views.CompiledView`; ConfigError
        naming the known ones when absent). Parsed from ``views`` (against the schemas of
        ``schemas``) once, again when the folder's ``stat`` changes; compiled once."""
        return self.catalog.view(name)

    def _view_call(self, view: str, method: SdkMethod, read: Callable[[Any], _T]) -> _T:
        """``read(compiled view)``, counted in the SDK's metrics under the view's name (its
        rows; an error counted, then raised as it is)."""
        def counted() -> Read:
            out = read(self.view(view))
            return Read(out, out.num_rows if isinstance(out, pa.Table) else len(out), 0, 0)  # type: ignore[arg-type]

        got: _T = self._counted(self.catalog.view_label, view, method, counted)
        return got

    def online_view(self, view: str, rows: Any, *, lineage: bool = False, fallback: bool | None = None,
                    windows: str = DEFAULT_WINDOWS, at: dt.datetime | None = None) -> pa.Table:
        """View ``view`` for each request row (a list of dicts, an Arrow table or a pandas
        DataFrame holding the view's request keys and fields): one result row per request
        row, in order. Columns: the request keys and fields, every source's features under
        their output names (declared types), the request-time features, then per source
        ``<alias>._found``, ``<alias>._event_time``, ``<alias>._from`` and with ``lineage``
        ``<alias>._source`` and ``<alias>._run_id`` (the stored row each value came from).
        One Redis round trip for every source; each source's misses take one Postgres query
        (``online``'s fallback); ``max_age`` per source against :meth:`now`. A request row
        that breaks the view's rules raises :class:`features.errors.RequestRejected` with
        every field error (docs/views.md).

        ``windows="request_time"`` (the default): every source's aggregations are their
        windows at the call's instant, ``at`` (default: :meth:`now`; it is then the view's
        instant for ``max_age``, ``request_time`` and the rows newer than it too), as
        :meth:`online` reads them: the same row ``historical_view`` gives at that time
        (docs/views.md, "Windows at request time"); ``windows="event"``: their values as of
        each entity's newest event."""
        out = self._view_call(view, "online_view", lambda cv: views.online(
            self, cv, rows, lineage=lineage, fallback=fallback, windows=windows, at=at))
        assert isinstance(out, pa.Table)
        return out

    def online_view_dicts(self, view: str, rows: Any, *, lineage: bool = False,
                          fallback: bool | None = None, windows: str = DEFAULT_WINDOWS,
                          at: dt.datetime | None = None) -> list[dict[str, Any]]:
        """:meth:`online_view` as one dict per request row (the same keys and values)."""
        out = self._view_call(view, "online_view_dicts", lambda cv: views.online(
            self, cv, rows, lineage=lineage, fallback=fallback, as_dicts=True, windows=windows, at=at))
        assert isinstance(out, list)
        return out

    async def online_view_async(self, view: str, rows: Any, *, lineage: bool = False,
                                fallback: bool | None = None, windows: str = DEFAULT_WINDOWS,
                                at: dt.datetime | None = None) -> pa.Table:
        """:meth:`online_view` for asyncio callers (redis.asyncio; decoding, the Postgres
        fallback and the request-time features in a worker thread)."""
        async def read() -> Read:
            out = await views.online_async(self, self.view(view), rows, lineage=lineage, fallback=fallback,
                                           windows=windows, at=at)
            return Read(out, out.num_rows, 0, 0)

        table: pa.Table = await self._counted_async(self.catalog.view_label, view, "online_view_async", read)
        return table

    def historical_view(self, view: str, entity_df: Any, *, timestamp_column: str = "timestamp",
                        windows: str = DEFAULT_WINDOWS) -> pa.Table:
        """Point-in-time rows of view ``view``: for each row of ``entity_df`` (Arrow or
        pandas, with the view's request keys and fields and ``timestamp_column``; any other
        column, labels, passed through), each source's values as ``historical`` gives them
        at the row's timestamp (``max_age`` against it), then the request-time features
        computed as :meth:`online_view` computes them. Columns: ``entity_df``'s, the
        fetched features, the request-time features, per source ``<alias>._found`` and
        ``<alias>._event_time``. Bad request fields raise RequestRejected. ``windows`` as
        for :meth:`historical`: ``"request_time"`` (the default) evaluates every source's
        aggregations at the row's timestamp (what :meth:`online_view` served at that
        instant), ``"event"`` reads their per-event values."""
        return self._view_call(view, "historical_view", lambda cv: views.historical(
            self, cv, entity_df, timestamp_column=timestamp_column, windows=windows))

    # --- validation ---------------------------------------------------------------------------

    def validate(self, schema: str, rows: Any) -> Any:
        """The compiled rules on model inputs: a list of dicts, an Arrow table/batch or a
        pandas DataFrame. Returns the pipelines' ``ValidationResult``."""
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
        return write(self, schema, data, run_id=run_id, source=source)


__all__ = ["AGE", "EVENT_TIME", "FOUND", "FROM", "STALE", "UNKNOWN_SCHEMA", "FeatureStore"]
