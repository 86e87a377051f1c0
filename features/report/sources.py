"""Where the report's rows come from: Parquet files or Postgres, read in batches.

- Parquet: :class:`features.sources.parquet.ParquetSource` (row group by row group,
  declared columns only, at most ``batch_rows`` rows a batch), renamed from the input's
  column names to field names (a field's ``source:``) before anything reads them.
- Postgres: a server-side (named) cursor in a read-only transaction, fetched
  ``batch_rows`` rows at a time; tables are looked up through the connection's
  ``search_path`` (set it in the DSN: ``options=-csearch_path%3D<schema>``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
from psycopg import sql

from features import lineage as lin
from features.compile import CompiledSchema
from features.compile.postgres import cold_table_name, rejects_table_name
from features.errors import SinkError, SourceError
from features.report.core import BoundedSet, Chunk, Range, origin
from features.sinks.pg import address, connect, map_psycopg_errors
from features.sources.names import as_fields
from features.sources.parquet import ParquetSource

#: Rows fetched per round trip from a Postgres cursor.
PG_BATCH_ROWS = 50_000


# --------------------------------------------------------------------------- Parquet


@dataclass(frozen=True)
class _FileRows:
    """Row ``i`` of a batch -> ``file:///path#<first + i>`` (the loader's ``_source``)."""

    prefix: str
    first: int

    def __call__(self, i: int) -> str | None:
        return f"{self.prefix}#{self.first + i}"


def parquet_input(paths: Sequence[str | Path], compiled: CompiledSchema, batch_rows: int
                  ) -> tuple[dict[str, Any], int, Iterator[Chunk]]:
    """(lineage, total rows, chunks) of Parquet ``paths``; SourceError when a path
    matches no file, a file is unreadable or does not fit the schema."""
    source = ParquetSource(paths, compiled, batch_rows=batch_rows)
    files = [{"uri": f.uri, "rows": int(f.meta.num_rows), "row_groups": int(f.meta.num_row_groups),
              "footer_digest": f.digest, "columns": list(f.columns)} for f in source.files]
    lineage: dict[str, Any] = {"kind": "parquet", "files": files, "batch_rows": batch_rows}

    def chunks() -> Iterator[Chunk]:
        first = 0
        for sb in source.batches():
            batch = sb.batch
            if not isinstance(batch, pa.RecordBatch):  # pragma: no cover - Parquet yields Arrow
                raise SourceError("Parquet source yielded a non-Arrow batch")
            prefix, start = sb.lineage.prefix, sb.lineage.first_row
            yield Chunk(as_fields(batch, compiled.schema), first, _FileRows(prefix, start))
            first += batch.num_rows

    return lineage, source.total_rows, chunks()


# --------------------------------------------------------------------------- Postgres


class Postgres:
    """A read-only connection for the report; every failure becomes a FeaturesError
    (opened and translated by :mod:`features.sinks.pg`)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.address = address(dsn)
        self.conn: Any = None

    def __enter__(self) -> Postgres:
        self.conn = connect(self.dsn, read_only=True, hint=" (is it running? `features dev up`)")
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.conn is not None:
            self.conn.close()

    def find(self, table: str) -> tuple[str, str, list[str], int | None] | None:
        """(schema, table, columns, estimated rows) of ``table`` on the search_path, or
        None when there is none."""
        with map_psycopg_errors(self.dsn, f"the lookup of table {table!r}"):
            ident = sql.Identifier(table).as_string(self.conn)
            row = self.conn.execute(
                "SELECT n.nspname, c.relname, c.reltuples::bigint FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)", (ident,),
            ).fetchone()
            if row is None:
                self.conn.rollback()
                return None
            columns = [r[0] for r in self.conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum", (ident,)).fetchall()]
            self.conn.rollback()
        estimate = int(row[2]) if row[2] is not None and row[2] >= 0 else None
        return str(row[0]), str(row[1]), columns, estimate

    def resolve(self, table: str) -> tuple[str, str, list[str], int | None]:
        """(schema, table, columns, estimated rows) of ``table`` on the search_path;
        SinkError naming the search_path when there is none."""
        found = self.find(table)
        if found is None:
            with map_psycopg_errors(self.dsn, "the search_path lookup"):
                path = self.conn.execute("SHOW search_path").fetchone()[0]
                self.conn.rollback()
            raise SinkError(
                f"no table {table!r} on search_path {path!r} in Postgres at {self.address} "
                "(load data with `features load` first, or set the search_path in the DSN)",
                store="postgres", address=self.address)
        return found

    def count(self, nsp: str, table: str) -> int:
        """The exact row count of ``nsp.table``."""
        with map_psycopg_errors(self.dsn, f"the count of {nsp}.{table}"):
            row = self.conn.execute(sql.SQL("SELECT count(*) FROM {}.{}").format(
                sql.Identifier(nsp), sql.Identifier(table))).fetchone()
            self.conn.rollback()
        return int(row[0])

    def stream(self, query: Any, params: Sequence[Any], batch_rows: int, what: str
               ) -> Iterator[tuple[list[str], list[tuple[Any, ...]]]]:
        """(column names, rows) pages of ``query`` through a server-side cursor."""
        with map_psycopg_errors(self.dsn, f"the read of {what}"), self.conn.transaction(), \
                self.conn.cursor(name="features_report") as cur:
            cur.itersize = batch_rows
            cur.execute(query, params)
            names: list[str] | None = None
            while True:
                rows = cur.fetchmany(batch_rows)
                if names is None:
                    names = [d.name for d in cur.description]
                if not rows:
                    break
                yield names, rows


def arrow_column(values: list[Any], target: pa.DataType, name: str) -> pa.Array:
    """Python values from Postgres as Arrow: the declared type when they fit it
    exactly, else Arrow's own inference (the validator then rejects what does not fit)."""
    try:
        return pa.array(values, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        pass
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise SourceError(f"column {name!r}: values do not convert to Arrow: {exc}", field=name) from exc


def table_input(pg: Postgres, compiled: CompiledSchema, batch_rows: int, feature_columns: Sequence[str] = ()
                ) -> tuple[dict[str, Any], int | None, list[str], Iterator[Chunk]]:
    """(lineage, estimated rows, declared fields not in the table, chunks) of the
    schema's cold table; the stored derived-feature columns among ``feature_columns``
    ride along as each chunk's ``features``."""
    nsp, table, columns, estimate = pg.resolve(cold_table_name(compiled.schema))
    declared = [f.name for f in compiled.schema.fields if f.name in columns]
    absent = [f.name for f in compiled.schema.fields if f.name not in columns]
    extra = [c for c in (lin.SOURCE, lin.RUN_ID, lin.INGESTED_AT) if c in columns]
    stored = [c for c in feature_columns if c in columns and c not in declared]
    wanted = declared + stored + extra
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in wanted) if wanted else sql.SQL("NULL"),
        sql.Identifier(nsp), sql.Identifier(table))
    runs, origins, ingested = BoundedSet(), BoundedSet(), Range()
    lineage: dict[str, Any] = {"kind": "table", "table": f"{nsp}.{table}", "postgres": pg.address,
                               "columns": columns, "batch_rows": batch_rows,
                               # filled while the chunks are read; see features.report.build.finish
                               "run_ids": runs, "origins": origins, "ingested_at": ingested}
    targets = compiled.arrow_schema

    def chunks() -> Iterator[Chunk]:
        first = 0
        for names, rows in pg.stream(query, (), batch_rows, f"table {nsp}.{table}"):
            cols = list(zip(*rows, strict=True)) if rows else [() for _ in names]
            by_name = dict(zip(names, cols, strict=True))
            arrays = {n: arrow_column(list(by_name[n]), targets.field(n).type, n) for n in declared}
            batch = (pa.RecordBatch.from_pydict(arrays) if arrays
                     else pa.RecordBatch.from_pydict({"__none__": pa.nulls(len(rows))}))
            sources = [str(s) if s is not None else None for s in by_name.get(lin.SOURCE, [None] * len(rows))]
            runs.update(str(r) for r in by_name.get(lin.RUN_ID, []))
            origins.update(origin(s) for s in sources)
            ingested.update(by_name.get(lin.INGESTED_AT, []))
            features = pa.RecordBatch.from_pydict(
                {c: arrow_column(list(by_name[c]), pa.float64(), c) for c in stored}) if stored else None
            yield Chunk(batch, first, sources.__getitem__, features)
            first += len(rows)

    return lineage, estimate, absent, chunks()


def aggregates_input(pg: Postgres, table: str, columns: Sequence[str], batch_rows: int
                     ) -> tuple[str, list[str], Iterator[pa.RecordBatch]] | None:
    """(qualified table, columns found, batches) of the stored aggregation ``columns`` of
    the aggregates ``table``, or None when the table is absent (nothing aggregated yet)."""
    found = pg.find(table)
    if found is None:
        return None
    nsp, name, present, _ = found
    wanted = [c for c in columns if c in present]
    if not wanted:
        return f"{nsp}.{name}", [], iter(())
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in wanted), sql.Identifier(nsp), sql.Identifier(name))

    def batches() -> Iterator[pa.RecordBatch]:
        for names, rows in pg.stream(query, (), batch_rows, f"table {nsp}.{name}"):
            cols = list(zip(*rows, strict=True))
            yield pa.RecordBatch.from_pydict({n: arrow_column(list(c), pa.float64(), n)
                                              for n, c in zip(names, cols, strict=True)})

    return f"{nsp}.{name}", wanted, batches()


def rejects_input(pg: Postgres, compiled: CompiledSchema, since: dt.datetime | None, batch_rows: int
                  ) -> tuple[dict[str, Any], int | None, Iterator[list[dict[str, Any]]]]:
    """(lineage, estimated rows, pages of reject records) of ``<schema>__rejects``,
    only rows ingested at or after ``since`` when given."""
    nsp, table, columns, estimate = pg.resolve(rejects_table_name(compiled.schema))
    wanted = [c for c in ("_source", "row_index", "errors", "event_time", "_ingested_at", "_run_id",
                          "_schema_fingerprint") if c in columns]
    if "errors" not in wanted:
        raise SourceError(f"table {nsp}.{table} has no errors column: not a rejects table")
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in wanted), sql.Identifier(nsp), sql.Identifier(table))
    params: list[Any] = []
    if since is not None:
        if "_ingested_at" not in columns:
            raise SourceError(f"table {nsp}.{table} has no _ingested_at column: --since cannot apply")
        query = sql.SQL("{} WHERE {} >= %s").format(query, sql.Identifier("_ingested_at"))
        params.append(since)
    if "id" in columns:
        query = sql.SQL("{} ORDER BY {}").format(query, sql.Identifier("id"))
    lineage: dict[str, Any] = {"kind": "rejects", "table": f"{nsp}.{table}", "postgres": pg.address,
                               "since": since.isoformat() if since else None, "batch_rows": batch_rows}

    def pages() -> Iterator[list[dict[str, Any]]]:
        for names, rows in pg.stream(query, params, batch_rows, f"table {nsp}.{table}"):
            yield [dict(zip(names, r, strict=True)) for r in rows]

    return lineage, (None if since is not None else estimate), pages()


__all__ = ["PG_BATCH_ROWS", "Postgres", "aggregates_input", "arrow_column", "parquet_input", "rejects_input",
           "table_input"]
