"""``features recompute --schema S``: the stored history's aggregations and derived features, again.

For an aggregation or a derived feature added to a schema (a compatible change,
``features migrate``): the rows already stored have no value for it, and loading the
same files again stores nothing (every event is already present). This computes, from
the history table alone (no source files), every value of
the schema's aggregations and derived features for the stored rows, with the engines
the loader and the stream use, and writes those that differ:

- aggregations: each entity's events are read back (of an entity that holds
  aggregation rows, only the events that hold one: the stream's late events update
  none), the batch engine computes every value, and the aggregates table is upserted
  (only rows whose values differ change) and the Redis aggregates hash of each entity's
  newest event written;
- derived features (stored in Postgres, whose input field is stored in Postgres):
  the transform kernels run over the stored rows, the history table's column is
  updated where it differs, and the Redis hash of an entity whose newest event changed
  is rewritten with the values from Postgres (``features.sinks.versions.Upgrader``, the same
  atomic rewrite a migration uses). A feature whose input is not stored cold cannot be
  recomputed from Postgres and is reported as skipped.

Work goes entity by entity in chunks of about ``--chunk-events`` history rows; running it
again changes nothing. Exit 0 when done, 2 on usage, schema or store errors.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.aggregate.engine import AggSpec, compute, finalize, raw_schema
from features.aggregate.tiles import build
from features.aggregate.writer import AggregateCounts, AggregateWriter
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import entity_key, hot_columns, rows_to_table, stored_fields
from features.compile.postgres import cold_table_name, quote_ident
from features.config import Settings
from features.errors import ConfigError
from features.kernels import transform_program
from features.lineage import DIGEST, RunContext
from features.sdk.columns import entity_pg_type as _entity_pg_type
from features.sdk.connections import Connections
from features.sdk.upgrade import Versions
from features.sinks import pg
from features.sinks.postgres import copy_csv
from features.sinks.stores import aggregate_stores
from features.sinks.versions import Upgrader, read_recorded

#: history rows read and computed at a time (whole entities)
DEFAULT_CHUNK_EVENTS = 100_000


@dataclass
class Recomputed:
    """What a recompute did."""

    entities: int = 0
    history_rows: int = 0
    aggregate_rows_written: int = 0      # aggregates table rows inserted or changed
    aggregate_hashes_written: int = 0    # Redis aggregates hashes written
    feature_rows_updated: int = 0        # history rows whose derived features changed
    feature_hashes_rewritten: int = 0    # Redis entity hashes rewritten with them
    features: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)   # feature -> why it was not recomputed
    seconds: float = 0.0


def recomputable(c: CompiledSchema) -> tuple[list[str], dict[str, str]]:
    """The derived features Postgres holds that can be computed from what it holds, and
    why each other one cannot."""
    s = c.schema
    cold_fields = set(stored_fields(s, "cold"))
    ok: list[str] = []
    skipped: dict[str, str] = {}
    for feature in s.features:
        if "cold" not in feature.store:
            skipped[feature.name] = ("stored in Redis only: its history is not kept, so it gets values "
                                     "as the pipeline writes each entity again")
        elif missing := [x for x in feature_inputs(feature) if x not in cold_fields]:
            skipped[feature.name] = (f"its input field {missing[0]!r} is not stored in Postgres: "
                                     "load the source files again into a fresh table to compute it")
        else:
            ok.append(feature.name)
    return ok, skipped


def feature_inputs(feature: Any) -> list[str]:
    """The fields a derived feature reads: its ``from`` field and a ratio's denominator."""
    out = [feature.source]
    for step in feature.steps:
        for key, value in step.args:
            if key == "denominator" and isinstance(value, str) and value not in out:
                out.append(value)
    return out


def _entity_chunks(conn: Any, c: CompiledSchema, chunk_events: int
                   ) -> Iterator[tuple[list[Any], Any, Any, int]]:
    """(entities, first event us, last event us, rows) of whole entities, about
    ``chunk_events`` history rows at a time, in entity order."""
    s = c.schema
    ent, et = quote_ident(str(s.entity)), quote_ident(str(s.event_time))
    query = (f"SELECT {ent}, count(*), (extract(epoch FROM min({et})) * 1000000)::bigint, "
             f"(extract(epoch FROM max({et})) * 1000000)::bigint FROM {quote_ident(cold_table_name(s))} "
             f"GROUP BY {ent} ORDER BY {ent}")
    ids: list[Any] = []
    lo: list[int] = []
    hi: list[int] = []
    rows = 0
    with conn.cursor(name="featureline_recompute") as cur:
        cur.execute(query)
        while True:
            batch = cur.fetchmany(10_000)
            if not batch:
                break
            for e, n, a, b in batch:  # per entity, not per row: the chunking itself
                ids.append(e)
                lo.append(a)
                hi.append(b)
                rows += n
                if rows >= chunk_events:
                    yield ids, np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64), rows
                    ids, lo, hi, rows = [], [], [], 0
    if ids:
        yield ids, np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64), rows


def recompute_aggregations(spec: AggSpec, writer: AggregateWriter, ctx: RunContext, entities: pa.Array,
                           lo_us: npt.NDArray[np.int64], hi_us: npt.NDArray[np.int64], *,
                           tiles: bool = False) -> AggregateCounts:
    """Every aggregation value of the stored events of ``entities[i]`` with event time in
    ``[lo_us[i], hi_us[i]]`` (whole entities: a window never reaches before ``lo_us``),
    computed again from the history table with the batch engine and written through
    ``writer`` (the aggregates table upserted, only rows whose values differ change; the
    Redis aggregates hash of each entity's newest event written). ``tiles``: the entities'
    request-time window tiles are built again from the same events
    (:func:`features.aggregate.tiles.build`, every event counted as new, so every tile
    within the retention is written complete); the caller deletes the old tiles hashes
    first when tiles may have to disappear (``features rollback``). Of an entity that holds
    aggregation rows only the events that hold one are read (the stream's late events
    update none). Returns the writer's counts."""
    stored = writer.stored_inputs(spec, entities, lo_us, hi_us + 1, aggregated=True)
    result = compute(spec, stored)
    acc = pa.array(result.accepted)
    values = finalize(spec, pa.table(result.raw, schema=raw_schema(spec)))
    tspec = writer.tile_spec if tiles else None
    rows = build(tspec, stored, np.ones(len(stored), dtype=np.bool_)) if tspec is not None and len(stored) \
        else None
    return writer.write(spec, ctx, stored.entity.take(acc), stored.time_us[result.accepted],
                        stored.source.take(acc), values, tiles=rows)


def recompute(c: CompiledSchema, settings: Settings, *, search_path: str | None = None, key_prefix: str = "",
              chunk_events: int = DEFAULT_CHUNK_EVENTS, run_id: str | None = None,
              progress: Callable[[Recomputed], None] | None = None) -> Recomputed:
    """Compute the schema's aggregations and derived features again over the stored
    history and write what differs (the module docstring); returns the counts."""
    s = c.schema
    if not s.loadable:
        raise ConfigError(f"schema {c.name!r} is validation-only: it has no stored history", key="schema")
    if s.static:  # TODO(issue 47): recompute a static table's derived features from its rows
        raise ConfigError(f"schema {c.name!r} is static (event_time: none): it has no history to "
                          "recompute from; load its source again (a newer load replaces every row)",
                          key="schema")
    t0 = time.perf_counter()
    out = Recomputed()
    out.features, out.skipped = recomputable(c)
    spec = AggSpec.of(s)
    ctx = RunContext(c.name, s.version_str, c.fingerprint, run_id or f"recompute-{uuid.uuid4().hex[:12]}",
                     dt.datetime.now(dt.UTC))
    writer = None
    if spec is not None:
        writer = AggregateWriter(c, aggregate_stores(c, settings, search_path=search_path,
                                                     key_prefix=key_prefix))
        writer.open()  # checks the stores hold this version (the fingerprint), as a load does
    entity_type = c.arrow_schema.field(str(s.entity)).type
    store = Connections(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                        search_path=search_path, key_prefix=key_prefix)
    try:
        Versions(store, Path(s.path or ".")).check_fingerprint(c, writing=True)
        features = _FeatureRecompute(store, c, out.features) if out.features else None
        with pg.map_psycopg_errors(settings.postgres_dsn, "the history read"), \
                pg.connect(settings.postgres_dsn, utc=True, search_path=search_path) as conn:
            for ids, lo, hi, rows in _entity_chunks(conn, c, chunk_events):
                entities = pa.array(ids, entity_type)
                out.entities += len(ids)
                out.history_rows += rows
                if writer is not None and spec is not None:
                    done = recompute_aggregations(spec, writer, ctx, entities, lo, hi)
                    out.aggregate_rows_written += done.rows_written
                    out.aggregate_hashes_written += done.hot_written
                if features is not None:
                    updated, rewritten = features.run(entities)
                    out.feature_rows_updated += updated
                    out.feature_hashes_rewritten += rewritten
                out.seconds = time.perf_counter() - t0
                if progress is not None:
                    progress(out)
    finally:
        if writer is not None:
            writer.close()
        store.close()
    out.seconds = time.perf_counter() - t0
    return out


class _FeatureRecompute:
    """The derived features of the stored rows of some entities, computed again."""

    def __init__(self, store: Connections, c: CompiledSchema, names: list[str]) -> None:
        self.store = store
        self.c = c
        self.names = names
        s = c.schema
        # the program of just these features (the others read fields Postgres does not hold)
        only = dataclasses.replace(s, features=tuple(f for f in s.features if f.name in names))
        self.program = transform_program(compile_schema(only), Settings(device="cpu"))
        self.inputs = sorted({x for f in only.features for x in feature_inputs(f)}
                             | {str(s.entity), str(s.event_time)})
        self.columns = [col for f in only.features for col in s.feature_columns(f) if "cold" in f.store]
        self.hot_columns = [x for x in self.columns if x in set(hot_columns(c))]

    def run(self, entities: pa.Array) -> tuple[int, int]:
        """(history rows updated, Redis hashes rewritten) for ``entities``."""
        s = self.c.schema
        ent, et = str(s.entity), str(s.event_time)
        table = quote_ident(cold_table_name(s))
        pg_type = _entity_pg_type(self.c)
        # the digest too: it tells apart two events of one (entity, event time)
        names = [*self.inputs, DIGEST]
        read = (f"SELECT {', '.join('h.' + quote_ident(x) for x in names)} FROM {table} h "
                f"WHERE h.{quote_ident(ent)} = ANY(%s::{pg_type}[])")
        rows = self.store.run_postgres("the history read", lambda conn: conn.execute(
            read, [entities.to_pylist()]).fetchall())
        got = rows_to_table(self.c, names, rows)
        assert self.program is not None
        result = self.program.run(pa.RecordBatch.from_arrays(
            [got.column(x).combine_chunks() for x in self.inputs], names=self.inputs))
        kept = result.kept_row_index
        new = pa.table({ent: got.column(ent).take(kept), et: got.column(et).take(kept),
                        DIGEST: got.column(DIGEST).take(kept),
                        **{x: result.features.column(x) for x in self.columns}})
        stage = "_featureline_recompute"
        cols = [ent, et, DIGEST, *self.columns]
        dg = quote_ident(DIGEST)
        changed = " OR ".join(f"h.{quote_ident(x)} IS DISTINCT FROM s.{quote_ident(x)}" for x in self.columns)
        sets = ", ".join(f"{quote_ident(x)} = s.{quote_ident(x)}" for x in self.columns)
        update = (f"UPDATE {table} h SET {sets} "
                  f"FROM {quote_ident(stage)} s WHERE h.{quote_ident(ent)} = s.{quote_ident(ent)} AND "
                  f"h.{quote_ident(et)} = s.{quote_ident(et)} AND h.{dg} = s.{dg} "
                  f"AND ({changed}) RETURNING h.{quote_ident(ent)}")

        def write(conn: Any) -> list[Any]:
            with conn.transaction():
                conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {quote_ident(stage)} ON COMMIT DELETE ROWS AS "
                             f"SELECT {', '.join(quote_ident(x) for x in cols)} FROM {table} WITH NO DATA")
                with conn.cursor() as cur, cur.copy(
                        f"COPY {quote_ident(stage)} ({', '.join(quote_ident(x) for x in cols)}) "
                        "FROM STDIN (FORMAT csv)") as cp:
                    cp.write(copy_csv(new))
                out: list[Any] = conn.execute(update).fetchall()
                return out

        updated = self.store.run_postgres("the derived features' update", write)
        rewritten = 0
        if updated and self.hot_columns:
            recorded = self.store.run_postgres(
                "the versions read", lambda conn: read_recorded(conn, self.c.name))
            up = Upgrader(self.store, self.c, recorded)
            try:
                ids = sorted({str(r[0]) for r in updated})
                keys = [self.store.key_prefix + entity_key(self.c.name, i) for i in ids]
                rewritten = up.refresh(keys, self.hot_columns)
            finally:
                up.close()
        return len(updated), rewritten


__all__ = ["Recomputed", "recomputable", "recompute", "recompute_aggregations"]
