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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema, compile_schema
from features.errors import ConfigError, SinkError, SinkUnavailable
from features.metrics import DEFAULT_HOST, MetricsServer, Registry, SdkMethod, SdkMetrics

#: Columns every ``online`` result carries besides the entity and the features.
EVENT_TIME = "_event_time"
AGE = "_age_seconds"
FROM = "_from"            # "redis", "postgres" or null (found nowhere)
FOUND = "_found"
#: Read with every hash and checked (encoding version, schema fingerprint).
_CHECKED = ("_enc", "_schema_fingerprint")


def _ts_utc() -> pa.DataType:
    return pa.timestamp("us", "UTC")


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
                 metrics_host: str = DEFAULT_HOST) -> None:
        self.redis_url = redis_url
        self.postgres_dsn = postgres_dsn
        self.schemas_path = Path(schemas)
        self.fallback = fallback
        self.max_age = max_age
        self.search_path = search_path
        self.key_prefix = key_prefix
        self.timeout_s = timeout_s
        self._compiled: dict[str, CompiledSchema] = {}
        self._aredis: Any = None
        self._raw: _RawRedis | None = None
        self._pg: Any = None
        self._checked: set[str] = set()
        self.registry = registry if registry is not None else Registry()
        self._metrics = SdkMetrics(self.registry)
        #: the metrics endpoint (``metrics_port``), or None
        self.metrics_server: MetricsServer | None = (
            MetricsServer(self.registry, metrics_port, metrics_host) if metrics_port is not None else None)

    @classmethod
    def from_env(cls, **overrides: Any) -> FeatureStore:
        """Settings from ``FEATURES_*`` environment variables and ``featureline.toml``
        (``features.config``); keyword arguments override them."""
        from features.config import resolve_settings

        s = resolve_settings()
        args: dict[str, Any] = {"redis_url": s.redis_url, "postgres_dsn": s.postgres_dsn,
                                "schemas": s.schemas_dir}
        args.update(overrides)
        return cls(**args)

    # --- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        if self._raw is not None:
            self._raw.close()
            self._raw = None
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

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- schemas ------------------------------------------------------------------------

    def schema(self, name: str) -> CompiledSchema:
        """The compiled schema ``name`` (ConfigError naming the known ones when absent)."""
        if name not in self._compiled:
            from features.schema import load_schemas

            schemas = load_schemas(self.schemas_path)
            if name not in schemas:
                raise ConfigError(f"no schema named {name!r} in {self.schemas_path} (known: "
                                  f"{', '.join(sorted(schemas)) or 'none'})", key="schema",
                                  looked_in=[str(self.schemas_path)])
            self._compiled[name] = compile_schema(schemas[name])
        return self._compiled[name]

    def _loadable(self, name: str) -> CompiledSchema:
        c = self.schema(name)
        if not c.schema.loadable:
            raise ConfigError(f"schema {name!r} is validation-only (no entity/event_time): it has no "
                              "stored features", key="schema")
        return c

    def _check_fingerprint(self, c: CompiledSchema) -> None:
        if c.name in self._checked:
            return
        from features.compile.postgres import SCHEMAS_TABLE, quote_ident

        conn = self._postgres()
        row = conn.execute(f"SELECT version, fingerprint FROM {quote_ident(SCHEMAS_TABLE)} "
                           "WHERE schema_name = %s", (c.name,)).fetchone()
        if row is not None and row[1] != c.fingerprint:
            raise SinkError(f"the stores hold schema {c.name} {row[0]} (fingerprint {row[1][:12]}), but "
                            f"{self.schemas_path} has {c.schema.version_str} (fingerprint "
                            f"{c.fingerprint[:12]}): use the schema the data was written with, or "
                            "migrate the stores", store="postgres")
        self._checked.add(c.name)

    # --- connections ----------------------------------------------------------------------

    def _postgres(self) -> Any:
        if self._pg is None or self._pg.closed:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict

            options = " ".join(filter(None, [str(conninfo_to_dict(self.postgres_dsn).get("options") or ""),
                                             "-c TimeZone=UTC",
                                             f"-c search_path={self.search_path}" if self.search_path
                                             else ""]))
            try:
                self._pg = psycopg.connect(self.postgres_dsn, autocommit=True,
                                           connect_timeout=max(int(self.timeout_s), 1), options=options)
            except psycopg.OperationalError as exc:
                from features.sinks.postgres import _address

                raise SinkUnavailable(f"Postgres unreachable at {_address(self.postgres_dsn)}: "
                                      f"{str(exc).strip()}", store="postgres",
                                      address=_address(self.postgres_dsn)) from exc
        return self._pg

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
            raise ConfigError(f"schema {c.name!r} has no feature(s) {', '.join(map(repr, unknown))} in "
                              f"{where}; it has: {', '.join(have)}", key="features")
        return list(features)

    def _online_request(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None
                        ) -> _OnlineRequest:
        """What one online call reads, for the sync and the async path alike: the entity
        hashes, then (when hot aggregations are requested) the aggregates hashes."""
        from features.sinks.redis import aggregates_key, entity_key

        c = self._loadable(schema)
        columns = self._features(c, features, "hot")
        hot_aggs = set(_aggregation_names(c, "hot"))
        names = [x for x in columns if x not in hot_aggs]
        aggs = [x for x in columns if x in hot_aggs]
        ids = [_entity_text(i) for i in entity_ids]
        reads = [([self.key_prefix + entity_key(c.name, i) for i in ids], [*names, *_CHECKED, EVENT_TIME])]
        if aggs:
            reads.append(([self.key_prefix + aggregates_key(c.name, i) for i in ids],
                          [*aggs, *_CHECKED, EVENT_TIME]))
        return _OnlineRequest(c, ids, columns, names, aggs, reads)

    def online(self, schema: str, entity_ids: Sequence[Any], features: Sequence[str] | None = None, *,
               fallback: bool | None = None, max_age: dt.timedelta | None = None) -> pa.Table:
        """The latest features of ``entity_ids``: one row per id, in request order.

        Columns: the entity, the requested features and aggregations (default: every hot
        feature, then every hot aggregation) in their declared types, ``_event_time`` (the
        row's event time), ``_age_seconds`` (now minus the event time), ``_from``
        (``redis``, ``postgres`` or null) and ``_found``. One Redis round trip for all ids
        (pipelined ``HMGET`` of the entity hash and, for aggregations, of the aggregates
        hash); ids missing from Redis take one Postgres query together (their latest row
        and their newest aggregation row, unless ``fallback=False``, or older than
        ``max_age``; hot-only aggregations stay null there). Ids found nowhere come back
        as nulls with ``_found`` false; this never raises for a missing id.
        """
        t0 = time.perf_counter()
        try:
            req = self._online_request(schema, entity_ids, features)
            if self._raw is None:
                self._raw = _RawRedis(self.redis_url, self.timeout_s)
            replies = self._raw.hmget_many(req.reads)
            table, from_pg, missed = self._finish_online(req, replies, fallback, max_age)
        except Exception:  # counted, then raised as it is
            self._metrics.error(schema, "online")
            raise
        self._observe(schema, "online", t0, len(req.ids), from_pg, missed)
        return table

    async def online_async(self, schema: str, entity_ids: Sequence[Any],
                           features: Sequence[str] | None = None, *, fallback: bool | None = None,
                           max_age: dt.timedelta | None = None) -> pa.Table:
        """:meth:`online` for asyncio model servers (redis.asyncio; the Postgres fallback
        runs in a worker thread)."""
        t0 = time.perf_counter()
        try:
            req = self._online_request(schema, entity_ids, features)
            table, from_pg, missed = await self._online_async(req, fallback, max_age)
        except Exception:  # counted, then raised as it is
            self._metrics.error(schema, "online_async")
            raise
        self._observe(schema, "online_async", t0, len(req.ids), from_pg, missed)
        return table

    async def _online_async(self, req: _OnlineRequest, fallback: bool | None, max_age: dt.timedelta | None
                            ) -> tuple[pa.Table, int, int]:
        import asyncio

        import redis.asyncio as aredis

        if self._aredis is None:
            from features.sinks.redis import RedisEndpoint

            endpoint = RedisEndpoint.from_url(self.redis_url)
            tls = endpoint.redis_py_options()  # the same TLS checks
            if endpoint.cluster:  # redis-py's cluster client: routes each HMGET by slot
                from redis.asyncio.cluster import ClusterNode, RedisCluster

                self._aredis = RedisCluster(
                    startup_nodes=[ClusterNode(h, p) for h, p in endpoint.seeds],
                    username=endpoint.username, password=endpoint.password, socket_timeout=self.timeout_s,
                    ssl=endpoint.tls, ssl_ca_certs=endpoint.ca_certs, ssl_certfile=endpoint.certfile,
                    ssl_keyfile=endpoint.keyfile,
                    **({"ssl_cert_reqs": endpoint.cert_reqs} if endpoint.tls else {}), **tls)
            else:
                self._aredis = aredis.Redis.from_url(self.redis_url, socket_timeout=self.timeout_s, **tls)
        pipe = self._aredis.pipeline(transaction=False)
        for keys, fields in req.reads:
            for k in keys:
                pipe.hmget(k, fields)
        try:
            replies = await pipe.execute()
        except (aredis.ConnectionError, aredis.TimeoutError) as exc:
            raise SinkUnavailable(f"Redis unreachable at {self.redis_url.split('@')[-1]}: {exc}",
                                  store="redis") from exc
        return await asyncio.to_thread(self._finish_online, req, replies, fallback, max_age)

    async def aclose(self) -> None:
        if self._aredis is not None:
            await self._aredis.aclose()
            self._aredis = None
        self.close()

    def _decode_hashes(self, c: CompiledSchema, names: list[str], replies: Sequence[Any],
                       what: str) -> tuple[dict[str, pa.Array], pa.Array]:
        """HMGET replies (the ``names``, then ``_enc``, ``_schema_fingerprint`` and
        ``_event_time``) -> the columns in their declared types and the event times (int64
        microseconds, null where the hash is absent). Checks every hash found first."""
        n = len(replies)
        width = len(names) + len(_CHECKED) + 1
        # One Arrow array over every reply value, then one strided take per column.
        flat = pa.array(list(chain.from_iterable(replies)), pa.binary()).cast(pa.string())
        # column-major: one take, then a zero-copy slice per column
        cols = flat.take(pa.array((np.arange(n, dtype=np.int64)[None, :] * width
                                   + np.arange(width, dtype=np.int64)[:, None]).ravel()))
        self._check_hashes(c, cols.slice(len(names) * n, 2 * n), n, what)
        columns = {name: _from_text(c, name, cols.slice(j * n, n)) for j, name in enumerate(names)}
        return columns, cols.slice((width - 1) * n, n).cast(pa.int64())

    def _finish_online(self, req: _OnlineRequest, replies: list[Any], fallback: bool | None,
                       max_age: dt.timedelta | None) -> tuple[pa.Table, int, int]:
        """The result table, how many ids the Postgres fallback served, how many were found nowhere."""
        c, ids = req.c, req.ids
        schema = c.schema
        n = len(ids)
        columns, micros = self._decode_hashes(c, req.names, replies[:n], "hashes")
        found = np.asarray(micros.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
        if req.aggs:
            aggs, _ = self._decode_hashes(c, req.aggs, replies[n:2 * n], "aggregates hashes")
            # A row's values come from one place: the aggregates of an id without an entity
            # hash are dropped (the Postgres fallback, or nulls, give that row).
            keep = pa.array(np.arange(n, dtype=np.int64), mask=~found)
            columns.update({name: arr.take(keep) for name, arr in aggs.items()})
        event = micros.cast(_ts_utc())
        source = pc.if_else(pa.array(found), pa.scalar("redis"), pa.scalar(None, pa.string()))
        data: dict[str, pa.Array] = {str(schema.entity): pa.array([None if i == _NULL_ID else i for i in ids],
                                                                  pa.string()),
                                     **{name: columns[name] for name in req.columns}, EVENT_TIME: event}
        table = pa.table(data)
        in_redis = int(found.sum())
        use_fallback = self.fallback if fallback is None else fallback
        missing = np.flatnonzero(~found & pa.array(ids).is_valid().to_numpy(zero_copy_only=False)
                                 & np.array([i != _NULL_ID for i in ids], dtype=np.bool_))
        if use_fallback and len(missing):
            cold = set(_cold_columns(c))
            wanted = [x for x in req.names if x in cold]
            cold_aggs = set(_aggregation_names(c, "cold"))
            wanted_aggs = [x for x in req.aggs if x in cold_aggs]  # hot-only ones stay null
            got = self._latest_cold(c, [ids[i] for i in missing], wanted,
                                    max_age if max_age is not None else self.max_age, aggs=wanted_aggs,
                                    missing_ok=True)
            if got.num_rows:
                pos = {e: i for i, e in enumerate(got.column(schema.entity).to_pylist())}
                hit = np.array([pos.get(ids[i], -1) for i in missing], dtype=np.int64)
                rows_at = missing[hit >= 0]
                take = pa.array(hit[hit >= 0])
                for name in [*wanted, *wanted_aggs, EVENT_TIME]:
                    src = got.column(schema.event_time if name == EVENT_TIME else name).combine_chunks()
                    if name == EVENT_TIME:  # a date or another zone: the column is timestamp(us, UTC)
                        src = src.cast(_ts_utc())
                    table = table.set_column(table.schema.get_field_index(name), name,
                                             _scatter(table.column(name).combine_chunks(), rows_at,
                                                      src.take(take)))
                found[rows_at] = True
                source = _scatter(source, rows_at, pa.repeat(pa.scalar("postgres"), len(rows_at)))
        now = pa.scalar(dt.datetime.now(dt.UTC), _ts_utc())
        ev = table.column(EVENT_TIME).combine_chunks()
        age = pc.divide(pc.cast(pc.subtract(now, ev), pa.int64()), 1_000_000.0)
        table = table.append_column(AGE, age).append_column(FROM, source).append_column(FOUND,
                                                                                        pa.array(found))
        hits = int(found.sum())
        return table, hits - in_redis, n - hits

    def _check_hashes(self, c: CompiledSchema, checked: pa.Array, n: int, what: str) -> None:
        """Every hash found must be encoding v1 of this schema's fingerprint (docs/redis.md).
        ``checked``: the ``_enc`` values of the ``n`` hashes, then their fingerprints;
        ``what`` names the hashes in the message (``hashes``, ``aggregates hashes``)."""
        from features.sinks.redis import ENCODING_VERSION

        encs = set(pc.unique(checked.slice(0, n)).to_pylist()) - {None}
        fps = set(pc.unique(checked.slice(n, n)).to_pylist()) - {None}
        if encs - {ENCODING_VERSION}:
            raise SinkError(f"Redis holds {c.name} {what} with encoding version "
                            f"{sorted(encs - {ENCODING_VERSION})[0]}; this reader knows version "
                            f"{ENCODING_VERSION}", store="redis")
        if fps - {c.fingerprint}:
            raise SinkError(f"Redis holds {c.name} {what} written with schema fingerprint "
                            f"{sorted(fps - {c.fingerprint})[0][:12]}, but {self.schemas_path} has "
                            f"{c.schema.version_str} (fingerprint {c.fingerprint[:12]}): use the schema the "
                            "data was written with, or migrate the stores", store="redis")

    def _latest_cold(self, c: CompiledSchema, ids: list[str], names: list[str],
                     max_age: dt.timedelta | None, *, aggs: Sequence[str] = (),
                     missing_ok: bool = False) -> pa.Table:
        """The latest Postgres row of each of ``ids`` with the cold ``aggs`` of the id's newest
        ``<schema>__aggregates`` row (one query for all of them). With ``missing_ok``, a
        database without the schema's tables has no rows (instead of SinkError)."""
        from psycopg import errors

        schema = c.schema
        try:
            return self._latest_cold_query(c, ids, names, max_age, list(aggs))
        except errors.UndefinedTable as exc:
            if missing_ok:
                return _rows_to_table(c, [str(schema.entity), str(schema.event_time), *names, *aggs], [])
            raise self._no_table(c, exc) from exc

    def _no_table(self, c: CompiledSchema, exc: Exception) -> SinkError:
        from features.compile.postgres import cold_table_name

        return SinkError(f"Postgres has no table for schema {c.name!r} ({str(exc).strip().splitlines()[0]}; "
                         f"table {cold_table_name(c.schema)!r}, search_path "
                         f"{self.search_path or 'from the DSN'}): load data first, or check the DSN",
                         store="postgres")

    def _latest_cold_query(self, c: CompiledSchema, ids: list[str], names: list[str],
                           max_age: dt.timedelta | None, aggs: list[str]) -> pa.Table:
        from features.compile.postgres import aggregates_table_name, cold_table_name, quote_ident

        self._check_fingerprint(c)
        schema = c.schema
        keys = [str(schema.entity), str(schema.event_time)]
        ent, et = (quote_ident(k) for k in keys)
        where = f"{ent} = ANY(%s)"
        params: list[Any] = [ids]
        if max_age is not None:
            where += f" AND {et} >= now() - %s"
            params.append(max_age)
        query = (f"SELECT DISTINCT ON ({ent}) {', '.join(quote_ident(x) for x in [*keys, *names])} "
                 f"FROM {quote_ident(cold_table_name(schema))} WHERE {where} ORDER BY {ent}, {et} DESC")
        if aggs:
            # the newest aggregation row, whatever max_age: it decided on the history row
            outer = ", ".join([f"m.{quote_ident(x)}" for x in [*keys, *names]]
                              + [f"a.{quote_ident(x)}" for x in aggs])
            query = (f"SELECT {outer} FROM ({query}) m LEFT JOIN LATERAL ("
                     f"SELECT {', '.join(quote_ident(x) for x in aggs)} "
                     f"FROM {quote_ident(aggregates_table_name(schema))} g WHERE g.{ent} = m.{ent} "
                     f"ORDER BY g.{et} DESC LIMIT 1) a ON true")
        rows = self._postgres().execute(query, params).fetchall()
        return _rows_to_table(c, [*keys, *names, *aggs], rows)

    # --- historical -------------------------------------------------------------------------

    def historical(self, schema: str, entity_df: Any, features: Sequence[str] | None = None, *,
                   timestamp_column: str = "timestamp", max_age: dt.timedelta | None = None) -> pa.Table:
        """Point-in-time-correct training rows: for each row of ``entity_df`` (an Arrow
        table or a pandas DataFrame with the entity column and ``timestamp_column``, a
        zoned timestamp), the latest stored values at or before its timestamp, never a
        later one (and none older than ``max_age``). Done in Postgres: the entity rows go
        in with one COPY into a temporary table, then one ``LEFT JOIN LATERAL`` as-of
        query. Returns the input rows in order with the requested columns (default: every
        cold feature, then every cold aggregation) and ``_event_time`` (the history row's
        event time; null where nothing qualifies).

        An aggregation column holds the ``<schema>__aggregates`` row of the entity's
        newest aggregated event at or before the timestamp: the value the online store
        served at that time (not the window re-evaluated at the timestamp).
        """
        t0 = time.perf_counter()
        try:
            out = self._historical_checked(schema, entity_df, features, timestamp_column, max_age)
        except Exception:  # counted, then raised as it is
            self._metrics.error(schema, "historical")
            raise
        missed = out.column(EVENT_TIME).null_count
        self._observe(schema, "historical", t0, out.num_rows, 0, missed)
        return out

    def _historical_checked(self, schema: str, entity_df: Any, features: Sequence[str] | None,
                            timestamp_column: str, max_age: dt.timedelta | None) -> pa.Table:
        c = self._loadable(schema)
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
        ts = entity_df.column(timestamp_column)
        if not pa.types.is_timestamp(ts.type) or ts.type.tz is None:
            raise ConfigError(f"entity_df column {timestamp_column!r} is {ts.type}; expected a timestamp "
                              "with a time zone (a naive time is ambiguous)", key="entity_df")
        from psycopg import errors

        try:
            self._check_fingerprint(c)
            return self._historical(c, entity_df, columns, ts, max_age)
        except errors.UndefinedTable as exc:
            raise self._no_table(c, exc) from exc

    def _historical(self, c: CompiledSchema, entity_df: pa.Table, columns: list[str], ts: Any,
                    max_age: dt.timedelta | None) -> pa.Table:
        from features.compile.postgres import aggregates_table_name, cold_table_name, quote_ident
        from features.sinks.postgres import copy_csv

        s = c.schema
        entity, event_time = str(s.entity), str(s.event_time)
        cold_aggs = set(_aggregation_names(c, "cold"))
        names = [x for x in columns if x not in cold_aggs]
        aggs = [x for x in columns if x in cold_aggs]
        conn = self._postgres()
        ids = pc.cast(entity_df.column(entity), pa.string())
        # Event times are microseconds: flooring a finer timestamp keeps the as-of answer.
        if ts.type.unit == "ns":
            ts = pc.floor_temporal(ts, unit="microsecond")
        stage = pa.table({"e": ids, "t": ts.cast(_ts_utc()),
                          "o": pa.array(np.arange(entity_df.num_rows, dtype=np.int64))})
        # One as-of lateral join per table: the history (features, event time), then the
        # aggregation rows (newest aggregated event at or before q.t) when any are asked for.
        joins = [("f", cold_table_name(s), [event_time, *names])]
        if aggs:
            joins.append(("g", aggregates_table_name(s), aggs))
        ent, et = quote_ident(entity), quote_ident(event_time)
        age = f"AND h.{et} >= q.t - %s " if max_age is not None else ""
        select = ", ".join(f"{alias}.{quote_ident(x)}" for alias, _, cols in joins for x in cols)
        laterals = " ".join(
            f"LEFT JOIN LATERAL (SELECT {', '.join(quote_ident(x) for x in cols)} "
            f"FROM {quote_ident(table)} h WHERE h.{ent} = q.e AND h.{et} <= q.t {age}"
            f"ORDER BY h.{et} DESC LIMIT 1) {alias} ON true"
            for alias, table, cols in joins)
        query = f"SELECT {select} FROM _featureline_asof q {laterals} ORDER BY q.o"
        with conn.transaction():
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS _featureline_asof "
                         "(e text, t timestamptz, o bigint) ON COMMIT DELETE ROWS")
            copy = "COPY _featureline_asof (e, t, o) FROM STDIN (FORMAT csv)"
            with conn.cursor() as cur, cur.copy(copy) as cp:
                cp.write(copy_csv(stage))
            conn.execute("ANALYZE _featureline_asof")
            rows = conn.execute(query, [max_age] * len(joins) if max_age is not None else []).fetchall()
        got = _rows_to_table(c, [event_time, *names, *aggs], rows)
        out = entity_df
        for name in columns:
            out = out.append_column(name, got.column(name))
        return out.append_column(EVENT_TIME, got.column(event_time).cast(_ts_utc()))

    # --- validation ---------------------------------------------------------------------------

    def validate(self, schema: str, rows: Any) -> Any:
        """The compiled rules on model inputs: a list of dicts, an Arrow table/batch or a
        pandas DataFrame. Returns the pipelines' ``ValidationResult``."""
        from features.validate import validate

        c = self.schema(schema)
        if not isinstance(rows, pa.Table | pa.RecordBatch | list):
            rows = pa.Table.from_pandas(rows, preserve_index=False)
        return validate(rows, c)


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class _OnlineRequest:
    """What one ``online``/``online_async`` call reads from Redis (built once, for both)."""

    c: CompiledSchema
    ids: list[str]                  # the ids as text, in request order (null: ``_NULL_ID``)
    columns: list[str]              # the requested features and aggregations, in result order
    names: list[str]                # ... those read from the entity hash
    aggs: list[str]                 # ... those read from the aggregates hash
    #: per hash kind, its keys (one per id) and HMGET fields (the values, ``_enc``,
    #: ``_schema_fingerprint``, ``_event_time``): the entity hashes, then the aggregates
    #: hashes when ``aggs``. Sent as one pipeline: one round trip.
    reads: list[tuple[list[str], list[str]]]


class _RawRedis:
    """One Redis connection that pipelines HMGETs as protocol bytes and parses the replies
    itself (redis-py's pure-Python reply parser costs ~45 µs per HMGET; this ~5 µs).
    Reconnects once on a lost connection; an unreachable server raises SinkUnavailable."""

    def __init__(self, url: str, timeout_s: float) -> None:
        from features.sinks.redis import RedisEndpoint

        self.endpoint = RedisEndpoint.from_url(url)
        self.address = self.endpoint.address
        self.timeout_s = timeout_s
        self._sock: Any = None
        #: a Redis Cluster (a ``redis+cluster://`` URL, or a node that answered -MOVED):
        #: each HMGET goes to its slot's primary (features.sinks.redis_cluster)
        self._cluster: Any = None
        if self.endpoint.cluster:
            self._use_cluster()

    def _use_cluster(self) -> None:
        from features.sinks.redis_cluster import Cluster

        self.close()
        self._cluster = Cluster(self.endpoint, timeout_s=self.timeout_s)
        self.address = self._cluster.address

    def _connect(self) -> None:
        self._sock = self.endpoint.connect(self.timeout_s)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.invalidate()
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def hmget_many(self, reads: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[list[bytes | None]]:
        """One ``HMGET key *fields`` per key of each ``(keys, fields)`` group, every group
        sent in one write (one round trip); the replies in the same order."""
        if self._cluster is not None:
            return self._hmget_cluster(reads)
        request = b"".join(_hmget_request(keys, fields) for keys, fields in reads)
        widths = [len(fields) for keys, fields in reads for _ in keys]
        for attempt in (1, 2):
            try:
                if self._sock is None:
                    self._connect()
                self._sock.sendall(request)
                return self._read_arrays(widths)
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

    def _hmget_cluster(self, reads: Sequence[tuple[Sequence[str], Sequence[str]]]
                       ) -> list[list[bytes | None]]:
        """:meth:`hmget_many` on a cluster: every primary gets its keys' HMGETs in one write
        (all primaries before any reply is read), redirections followed."""
        from features.sinks.redis_cluster import ReplyError, key_slots

        keys = [k for ks, _ in reads for k in ks]
        calls = [_hmget_request([k], fields) for ks, fields in reads for k in ks]
        slots = key_slots(pa.array(keys, pa.string()))
        for attempt in (1, 2):
            try:
                replies = self._cluster.send_calls(calls, slots, replies=True)
                break
            except (OSError, ConnectionError, SinkUnavailable) as exc:
                self._cluster.invalidate()
                if attempt == 2:
                    raise SinkUnavailable(f"Redis Cluster unreachable at {self.address}: {exc}",
                                          store="redis", address=self.address) from exc
        for reply in replies:
            if isinstance(reply, ReplyError):
                raise SinkError(f"Redis Cluster at {self.address} refused HMGET: {reply.text}",
                                store="redis", address=self.address)
        return replies  # type: ignore[no-any-return]  # lists of bytes/None

    def _read_arrays(self, widths: Sequence[int]) -> list[list[bytes | None]]:
        """One reply per item of ``widths``, each an array of that many bulk strings (or an
        error)."""
        buf = bytearray()
        out: list[list[bytes | None]] = []
        pos = 0
        sock = self._sock

        def more() -> None:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("connection closed by Redis")
            buf.extend(chunk)

        while len(out) < len(widths):
            width = widths[len(out)]
            start = pos
            try:
                row: list[bytes | None] = []
                end = buf.index(b"\r\n", pos)
                head = bytes(buf[pos:end])
                if head.startswith(b"-MOVED"):
                    raise _Moved(head.decode(errors="replace"))
                if head[:1] == b"-":
                    raise SinkError(f"Redis at {self.address} refused HMGET: {head.decode(errors='replace')}",
                                    store="redis", address=self.address)
                pos = end + 2
                for _ in range(width):
                    end = buf.index(b"\r\n", pos)
                    size = int(buf[pos + 1:end])
                    if size < 0:
                        row.append(None)
                        pos = end + 2
                        continue
                    stop = end + 2 + size
                    if stop + 2 > len(buf):
                        raise ValueError("incomplete")
                    row.append(bytes(buf[end + 2:stop]))
                    pos = stop + 2
                out.append(row)
            except ValueError:  # an incomplete reply (bytes.index or our check): read more
                pos = start
                more()
        return out


class _Moved(Exception):
    """A -MOVED reply: the server is one node of a Redis Cluster."""


def _hmget_request(keys: Sequence[str], fields: Sequence[str]) -> bytes:
    tail = "".join(f"${len(f.encode())}\r\n{f}\r\n" for f in fields)
    head = f"*{2 + len(fields)}\r\n$5\r\nHMGET\r\n"
    return "".join(f"{head}${len(k.encode())}\r\n{k}\r\n{tail}" for k in keys).encode()



def _hot_columns(c: CompiledSchema) -> list[str]:
    s = c.schema
    return [f.name for f in s.fields if "hot" in f.store] + list(s.stored_features("hot"))


def _cold_columns(c: CompiledSchema) -> list[str]:
    s = c.schema
    return [f.name for f in s.fields if "cold" in f.store] + list(s.stored_features("cold"))


def _aggregation_names(c: CompiledSchema, store: str) -> list[str]:
    """The schema's aggregations stored in ``store`` (``hot``/``cold``), in schema order."""
    aggs = c.schema.aggregations
    return [a.name for a in aggs.features if store in a.store] if aggs is not None else []


def _declared_type(c: CompiledSchema, name: str) -> pa.DataType:
    from features.compile.arrow import arrow_type

    for feature in c.schema.features:
        if name in c.schema.feature_columns(feature):
            return arrow_type(feature.dtype)
    aggs = c.schema.aggregations
    for agg in aggs.features if aggs is not None else ():
        if agg.name == name:
            from features.aggregate.engine import AggSpec

            spec = AggSpec.of(c.schema)
            assert spec is not None
            return spec.output_type(agg)
    return c.arrow_schema.field(name).type


#: Stands for a null id: a key no writer can create (a NUL character is a type reject).
_NULL_ID = "\x00"


def _entity_text(value: Any) -> str:
    if value is None:
        return _NULL_ID
    return value if isinstance(value, str) else str(value)


def _from_text(c: CompiledSchema, name: str, text: pa.Array) -> pa.Array:
    """Redis text (encoding v1) -> the declared type, exactly.

    Every v1 text is one Arrow parses exactly (shortest float text, decimal text at the
    field's scale, ``true``/``false``, ISO dates, ``... HH:MM:SS.ffffffZ`` instants); a
    value that does not parse, or would lose digits, is not v1 and raises SinkError.
    """
    target = _declared_type(c, name)
    try:
        if pa.types.is_dictionary(target):
            return text.cast(target.value_type).dictionary_encode()
        return text.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SinkError(f"Redis holds a value for {c.name}.{name} that is not encoding v1 text of "
                        f"{target}: {exc}", store="redis") from exc


def _scatter(base: pa.Array, rows: npt.NDArray[np.int64], values: pa.Array) -> pa.Array:
    """``base`` with ``values`` placed at ``rows``."""
    idx = np.arange(len(base), dtype=np.int64)
    src = np.zeros(len(base), dtype=np.int64)
    use = np.zeros(len(base), dtype=bool)
    use[rows] = True
    src[rows] = np.arange(len(rows), dtype=np.int64)
    merged = pa.concat_arrays([base.cast(values.type) if base.type != values.type else base, values])
    take = np.where(use, len(base) + src, idx)
    return merged.take(pa.array(take))


def _rows_to_table(c: CompiledSchema, names: list[str], rows: Sequence[Sequence[Any]]) -> pa.Table:
    """psycopg rows -> Arrow in the declared types (decimals, zones and dates exact)."""
    cols: list[list[Any]] = [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in names]
    out = {}
    for name, values in zip(names, cols, strict=True):
        t = _declared_type(c, name)
        if pa.types.is_timestamp(t) and t.tz is not None:
            values = [v.astimezone(dt.UTC) if v is not None else None for v in values]
        out[name] = pa.array(values, t)
    return pa.table(out)


__all__ = ["AGE", "EVENT_TIME", "FOUND", "FROM", "FeatureStore"]

