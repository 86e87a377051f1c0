"""The SDK's cold reader (:class:`ColdReader`): what it reads from Postgres. The
point-in-time rows of ``FeatureStore.historical`` (the as-of join: :mod:`features.sdk.asof`),
the newest stored row of some entities (the online fallback's read, ``features.sdk.fallback``)
and ``prewarm``'s read of every entity's newest row, written to Redis with the fill's
newest-wins script."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from psycopg import errors

from features.compile import CompiledSchema
from features.compile.layout import aggregation_names, cold_columns, hot_columns, rows_to_table
from features.compile.postgres import aggregates_table_name, cold_table_name, quote_ident
from features.errors import ConfigError, SinkError
from features.lineage import DIGEST
from features.sdk.asof import as_of  # the as-of join (copied out of Postgres, joined in NumPy)
from features.sdk.columns import EVENT_TIME, entity_in, entity_list, requested_columns, time_column
from features.sdk.fallback import AGG, LINEAGE, fill_rows, fillable
from features.sdk.historical import as_of_times
from features.sinks import pg
from features.sinks.redis import RedisSink

if TYPE_CHECKING:
    from features.sdk.catalog import Catalog
    from features.sdk.connections import Connections
    from features.sdk.upgrade import Versions


class ColdReader:
    """Postgres reads of the schemas of ``catalog`` through ``connections``."""

    def __init__(self, connections: Connections, catalog: Catalog, versions: Versions) -> None:
        self.connections = connections
        self.catalog = catalog
        self.versions = versions

    def historical(self, schema: str, entity_df: Any, features: Sequence[str] | None,
                   timestamp_column: str, max_age: dt.timedelta | None, request_time: bool = False
                   ) -> pa.Table:
        """``FeatureStore.historical`` (its docstring says what it returns), the input
        checked: ConfigError naming what is wrong."""
        c = self.catalog.loadable(schema)
        columns = requested_columns(c, features, "cold")
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

        try:
            self.versions.check_fingerprint(c)
            return as_of(self.connections, c, entity_df, columns, ts, max_age, request_time=request_time)
        except errors.UndefinedTable as exc:
            raise self.no_table(c, exc) from exc

    def no_table(self, c: CompiledSchema, exc: Exception) -> SinkError:
        """The error of a read that met no table of ``c`` (nothing loaded, or another DSN)."""
        return SinkError(f"Postgres has no table for schema {c.name!r} ({str(exc).strip().splitlines()[0]}; "
                         f"table {cold_table_name(c.schema)!r}, search_path "
                         f"{self.connections.search_path or 'from the DSN'}): load data first, or check "
                         "the DSN", store="postgres")

    def fetch_query(self, c: CompiledSchema, where: str) -> tuple[str, list[str]]:
        """The query of the newest stored row per entity among the history rows matching
        ``where`` (SQL over alias ``h``, with ``%s`` parameters), and its column names: the
        entity, the event time, every hot feature Postgres holds, the lineage, and for a
        schema with aggregations the entity's newest aggregation row (hot aggregations
        Postgres holds, its event time and lineage, prefixed ``__agg``)."""
        schema = c.schema
        keys = [str(schema.entity), time_column(c)]
        cold = set(cold_columns(c))
        names = [*keys, *[x for x in hot_columns(c) if x in cold and x not in keys],
                 *[x for x in LINEAGE if x not in keys], DIGEST]
        ent, et, dg = (quote_ident(k) for k in (*keys, DIGEST))
        # of events at one instant, the newest is the one with the greatest content digest
        query = (f"SELECT DISTINCT ON (h.{ent}) {', '.join('h.' + quote_ident(x) for x in names)} "
                 f"FROM {quote_ident(cold_table_name(schema))} h WHERE {where} "
                 f"ORDER BY h.{ent}, h.{et} DESC, h.{dg} DESC")
        aggs = [x for x in aggregation_names(c, "hot") if x in set(aggregation_names(c, "cold"))]
        if schema.aggregations is not None and aggregation_names(c, "hot"):
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
        self.versions.check_fingerprint_or_none(c)
        query, names = self.fetch_query(c, entity_in(c))
        values = entity_list(c, ids)
        try:
            rows = self.connections.run_postgres(
                "the fallback read", lambda conn: conn.execute(query, [values]).fetchall())
        except errors.UndefinedTable:
            rows = []
        return rows_to_table(c, names, rows)

    def prewarm(self, schema: str, *, since: dt.timedelta | None, ids: Sequence[Any] | None,
                chunk_rows: int, progress: Any) -> dict[str, int]:
        """``FeatureStore.prewarm`` (its docstring says what it does)."""
        c = self.catalog.loadable(schema)
        if not fillable(c):
            raise ConfigError(f"schema {schema!r} has no hot features: nothing to prewarm", key="schema")
        self.versions.check_fingerprint(c, writing=True)  # it writes this version's layout
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
                sinks[aggregates] = RedisSink(self.connections.redis_url, c,
                                              key_prefix=self.connections.key_prefix, fill=True,
                                              aggregates=aggregates)
                sinks[aggregates].open()
            return sinks[aggregates]

        done = written = 0
        try:
            with pg.map_psycopg_errors(self.connections.postgres_dsn, "the prewarm read"), \
                    self.connections.connect_postgres(autocommit=False) as conn, \
                    conn.cursor(name="featureline_prewarm") as cur:
                cur.execute(query, params)
                while True:
                    batch = cur.fetchmany(chunk_rows)
                    if not batch:
                        break
                    rows = rows_to_table(c, names, batch)
                    written += fill_rows(c, rows, sink_for)
                    done += rows.num_rows
                    if progress is not None:
                        progress(done, written)
        finally:
            for sink in sinks.values():
                sink.close()
        return {"rows": done, "written": written}


__all__ = ["ColdReader"]
