"""A static schema's point-in-time read (``event_time: none``, docs/schema.md "Tables
without time"): every request row gets its entity's one stored row, whatever its time.

The cold table of a static schema holds one row per entity, the newest load's. There is
no history to go back in: a request at a time before that load still gets it (the
leakage docs/schema.md warns of). ``_event_time`` is the row's load (``_ingested_at``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.compile.layout import rows_to_table
from features.compile.postgres import cold_table_name, quote_ident
from features.lineage import INGESTED_AT
from features.sdk.columns import EVENT_TIME, entity_pg_type, ts_utc

_T = TypeVar("_T")


class Host(Protocol):
    """What the read needs of the store: its Postgres connection, errors mapped."""

    def run_postgres(self, what: str, fn: Callable[[Any], _T]) -> _T: ...


def static_rows(store: Host, c: CompiledSchema, frame: pa.Table, columns: list[str], ids: pa.Array
                ) -> pa.Table:
    """``frame`` with ``columns`` (cold features of the static schema ``c``) and
    ``_event_time`` (the row's load, UTC) appended: for each row, the stored row of its
    entity ``ids`` (declared type; null: matches nothing), or nulls where none is
    stored. One query for the frame's distinct entities; matched with Arrow, not per row."""
    entity = str(c.schema.entity)
    wanted = pc.unique(ids.drop_null())
    names = [entity, *columns, INGESTED_AT]
    table = quote_ident(cold_table_name(c.schema))
    query = (f"SELECT {', '.join(quote_ident(n) for n in names)} FROM {table} "
             f"WHERE {quote_ident(entity)} = ANY(%s::{entity_pg_type(c)}[])")
    values = wanted.to_pylist()  # the distinct ids only, as the query's one parameter
    rows = (store.run_postgres("the static read", lambda conn: conn.execute(query, [values]).fetchall())
            if values else [])
    got = rows_to_table(c, names, rows)
    at = pc.index_in(ids, value_set=got.column(entity).combine_chunks())
    out = frame
    for name in columns:
        out = out.append_column(name, got.column(name).combine_chunks().take(at))
    return out.append_column(EVENT_TIME, got.column(INGESTED_AT).combine_chunks().take(at).cast(ts_utc()))


__all__ = ["static_rows"]
