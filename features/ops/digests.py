"""Moving a history table made before content digests to the key (entity, event time,
``_digest``) (``features migrate``, docs/evolution.md "Events at one instant").

A history table of an earlier release is keyed by (entity, event time) and has no
``_digest`` column; the sink refuses to write to it (it would keep one event per
instant). :func:`migrate_digests` brings it over, in steps that a run stopped half way
resumes:

1. ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS "_digest" text COLLATE "C"`` (nullable:
   no table rewrite);
2. ``batch_rows`` rows at a time (one transaction each), the rows without a digest are
   read back with one ``COPY ... TO STDOUT`` (CSV parsed by Arrow: timestamps as epoch
   microseconds, dates as days, lists as Postgres array text), their digests computed
   by :func:`features.kernels.digest.digests` (the function every load uses, over the
   declared fields: a field the table does not hold, ``store: hot`` only, counts as
   null), written with one ``COPY`` into a temporary table and one ``UPDATE ... FROM``
   joined on ``ctid``;
3. ``ALTER COLUMN "_digest" SET NOT NULL`` and the primary key replaced by (entity,
   event time, ``_digest``), in one transaction.

Every step holds the namespace's DDL lock (the one the sink takes to create tables).

A static schema's table (``event_time: none``, keyed by the entity alone) was made with
its ``_digest`` (``NOT NULL``) from the start: there is nothing to move, and both
functions leave it alone.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pacsv

from features.compile import CompiledSchema
from features.compile.arrow import arrow_type
from features.compile.listtext import POSTGRES, parse_list_text
from features.compile.postgres import DIGEST_TYPE, cold_table_name, primary_key_name, quote_ident
from features.errors import SinkError
from features.kernels.digest import digests
from features.lineage import DIGEST
from features.schema.model import TypeKind

#: Rows read, hashed and updated per transaction.
DEFAULT_BATCH = 100_000
_LOCK = "SELECT pg_advisory_xact_lock(hashtext('featureline:ddl:' || coalesce(current_schema(), '')))"

State = Literal["none", "missing", "unfilled", "done"]


@dataclass(frozen=True)
class DigestPlan:
    """What :func:`migrate_digests` would do to ``table``: ``state`` ``none`` (no such
    table), ``missing`` (no ``_digest`` column), ``unfilled`` (a run stopped half way),
    ``done``; ``rows``: rows without a digest; ``hot_only``: declared fields the table
    does not hold (their values cannot enter the digests it computes)."""

    table: str
    state: State
    rows: int
    hot_only: tuple[str, ...]

    @property
    def needed(self) -> bool:
        return self.state in ("missing", "unfilled")

    def statements(self) -> list[str]:
        t, dg = quote_ident(self.table), quote_ident(DIGEST)
        return [f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {dg} {DIGEST_TYPE}",
                f"-- {self.rows:,} rows: UPDATE {t} SET {dg} = <content digest> (computed by featureline, "
                f"{DEFAULT_BATCH:,} rows per transaction)",
                f"ALTER TABLE {t} ALTER COLUMN {dg} SET NOT NULL",
                f"ALTER TABLE {t} DROP CONSTRAINT <primary key>, ADD PRIMARY KEY (entity, event time, {dg})"]


def _state(conn: Any, table: str) -> State:
    if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (quote_ident(table),)).fetchone()[0]:
        return "none"
    row = conn.execute("SELECT attnotnull FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                       "AND attname = %s AND NOT attisdropped", (quote_ident(table), DIGEST)).fetchone()
    if row is None:
        return "missing"
    return "done" if row[0] else "unfilled"


def plan_digests(conn: Any, c: CompiledSchema) -> DigestPlan:
    """Read-only: where ``c``'s history table stands (see :class:`DigestPlan`)."""
    table = cold_table_name(c.schema)
    state = _state(conn, table)
    if c.schema.static:  # made with its digest (module docstring)
        conn.rollback()
        return DigestPlan(table, "none" if state == "none" else "done", 0, ())
    t, dg = quote_ident(table), quote_ident(DIGEST)
    rows = 0
    if state == "missing":
        rows = int(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
    elif state == "unfilled":
        rows = int(conn.execute(f"SELECT count(*) FROM {t} WHERE {dg} IS NULL").fetchone()[0])
    held = _columns(conn, table) if state != "none" else set()
    hot_only = tuple(f.name for f in c.schema.fields if f.name not in held) if held else ()
    conn.rollback()
    return DigestPlan(table, state, rows, hot_only)


def _columns(conn: Any, table: str) -> set[str]:
    rows = conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                        "AND NOT attisdropped", (quote_ident(table),)).fetchall()
    return {r[0] for r in rows}


def _select(name: str, kind: TypeKind) -> str:
    """The SQL reading field ``name`` back in a form Arrow's CSV reader parses exactly."""
    col = quote_ident(name)
    if kind is TypeKind.TIMESTAMP:
        return f"(extract(epoch FROM {col}) * 1000000)::bigint"
    if kind is TypeKind.DATE:
        return f"({col} - DATE '1970-01-01')"
    if kind is TypeKind.LIST:
        return f"{col}::text"
    return col


def _read_type(kind: TypeKind, declared: pa.DataType) -> pa.DataType:
    if kind is TypeKind.TIMESTAMP:
        return pa.int64()
    if kind is TypeKind.DATE:
        return pa.int32()
    if kind in (TypeKind.LIST, TypeKind.ENUM):
        return pa.string()
    return declared


def _declared(col: pa.Array, kind: TypeKind, declared: pa.DataType) -> pa.Array:
    """A column as read (:func:`_read_type`) in its declared Arrow type."""
    if kind is TypeKind.TIMESTAMP:
        micros = col.cast(pa.timestamp("us", "UTC"))
        unit = declared.unit
        return micros.cast(pa.timestamp(unit, "UTC"), safe=False).cast(declared) if unit != "us" \
            else micros.cast(declared)
    if kind is TypeKind.DATE:
        return col.cast(pa.date32())
    if kind is TypeKind.LIST:
        return parse_list_text(col, declared, POSTGRES)
    return col.cast(declared)


def _fill_batch(conn: Any, c: CompiledSchema, table: str, held: set[str], limit: int) -> int:
    """Give up to ``limit`` rows without a digest theirs; returns how many."""
    schema = c.schema
    names = [f.name for f in schema.fields if f.name in held]
    kinds = {f.name: f.type.kind for f in schema.fields}
    declared = {f.name: arrow_type(f.type) for f in schema.fields}
    t, dg = quote_ident(table), quote_ident(DIGEST)
    picked = ", ".join(["ctid::text", *(_select(n, kinds[n]) for n in names)])
    buf = io.BytesIO()
    with conn.cursor() as cur, cur.copy(
            f"COPY (SELECT {picked} FROM {t} WHERE {dg} IS NULL LIMIT {int(limit)}) TO STDOUT (FORMAT csv)"
    ) as copy:
        for chunk in copy:
            buf.write(chunk)
    if not buf.getbuffer().nbytes:
        return 0
    cols = ["tid", *(f"c{i}" for i in range(len(names)))]  # positional: a field may share any name
    types = [pa.string(), *(_read_type(kinds[n], declared[n]) for n in names)]
    convert = pacsv.ConvertOptions(column_types=dict(zip(cols, types, strict=True)), strings_can_be_null=True,
                                   quoted_strings_can_be_null=False, null_values=[""],
                                   true_values=["t"], false_values=["f"])
    read = pacsv.read_csv(io.BytesIO(buf.getvalue()), read_options=pacsv.ReadOptions(column_names=cols),
                          parse_options=pacsv.ParseOptions(newlines_in_values=True),
                          convert_options=convert).combine_chunks()
    n = read.num_rows
    values = {name: _declared(read.column(f"c{i}").combine_chunks(), kinds[name], declared[name])
              for i, name in enumerate(names)}
    rows = pa.table({f.name: values[f.name] if f.name in values else pa.nulls(n, declared[f.name])
                     for f in schema.fields})
    stage = "_featureline_digest_fill"
    conn.execute(f'CREATE TEMP TABLE IF NOT EXISTS {quote_ident(stage)} ("tid" tid, "d" text) '
                 "ON COMMIT DELETE ROWS")
    out = io.BytesIO()
    pacsv.write_csv(pa.table({"tid": read.column("tid"), "d": digests(rows, schema)}), out,
                    write_options=pacsv.WriteOptions(include_header=False))
    fill = f'COPY {quote_ident(stage)} ("tid", "d") FROM STDIN (FORMAT csv)'
    with conn.cursor() as cur, cur.copy(fill) as cp:
        cp.write(out.getvalue())
    conn.execute(f'UPDATE {t} h SET {dg} = s."d" FROM {quote_ident(stage)} s WHERE h.ctid = s."tid" '
                 f"AND h.{dg} IS NULL")
    return int(n)


def migrate_digests(conn: Any, c: CompiledSchema, *, batch_rows: int = DEFAULT_BATCH,
                    progress: Any = None) -> int:
    """Bring ``c``'s history table to the key (entity, event time, ``_digest``) (module
    docstring). ``conn``: a psycopg connection outside a transaction block, its
    search_path the namespace. Returns how many rows got a digest; 0 when there was
    nothing to do."""
    schema = c.schema
    if schema.static:  # made with its digest (module docstring)
        return 0
    table = cold_table_name(schema)
    with conn.transaction():
        conn.execute(_LOCK)
        state = _state(conn, table)
        if state in ("none", "done"):
            return 0
        conn.execute(f"ALTER TABLE {quote_ident(table)} ADD COLUMN IF NOT EXISTS {quote_ident(DIGEST)} "
                     f"{DIGEST_TYPE}")
        held = _columns(conn, table)
    filled = 0
    while True:
        with conn.transaction():
            conn.execute(_LOCK)
            n = _fill_batch(conn, c, table, held, batch_rows)
        filled += n
        if progress is not None and n:
            progress(filled)
        if n < batch_rows:
            break
    assert schema.entity is not None and schema.event_time is not None
    key = ", ".join(quote_ident(k) for k in (schema.entity, schema.event_time, DIGEST))
    pkey = quote_ident(primary_key_name(table))
    with conn.transaction():
        conn.execute(_LOCK)
        t, dg = quote_ident(table), quote_ident(DIGEST)
        if conn.execute(f"SELECT EXISTS (SELECT 1 FROM {t} WHERE {dg} IS NULL)").fetchone()[0]:
            raise SinkError(f"rows without a digest appeared in {table!r} meanwhile (a writer of an earlier "
                            "release?): run features migrate again", store="postgres")
        conn.execute(f"ALTER TABLE {quote_ident(table)} ALTER COLUMN {quote_ident(DIGEST)} SET NOT NULL")
        conn.execute(f"ALTER TABLE {quote_ident(table)} DROP CONSTRAINT IF EXISTS {pkey}, "
                     f"ADD CONSTRAINT {pkey} PRIMARY KEY ({key})")
    return filled


__all__ = ["DEFAULT_BATCH", "DigestPlan", "migrate_digests", "plan_digests"]
