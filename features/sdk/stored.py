"""Which columns a compiled schema stores where (Redis, Postgres), and their declared
Arrow types: what the SDK reads back and what its fill writes (``features.sdk.store``,
``features.sdk.fallback``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from itertools import chain
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.errors import SinkError
from features.sinks.listtext import parse_list_text


def hot_columns(c: CompiledSchema) -> list[str]:
    """The fields and derived feature columns kept in Redis, in schema order."""
    s = c.schema
    return [f.name for f in s.fields if "hot" in f.store] + list(s.stored_features("hot"))


def cold_columns(c: CompiledSchema) -> list[str]:
    """The fields and derived feature columns kept in Postgres, in schema order."""
    s = c.schema
    return [f.name for f in s.fields if "cold" in f.store] + list(s.stored_features("cold"))


def aggregation_names(c: CompiledSchema, store: str) -> list[str]:
    """The schema's aggregations stored in ``store`` (``hot``/``cold``), in schema order."""
    aggs = c.schema.aggregations
    return [a.name for a in aggs.features if store in a.store] if aggs is not None else []


def declared_type(c: CompiledSchema, name: str) -> pa.DataType:
    """The declared Arrow type of stored column ``name``: a feature column's dtype, an
    aggregation's output type, else the field's type."""
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


#: The text of an integer as ``str(int)`` and Redis keys write it: no sign on zero, no
#: leading zeros, at most 19 digits (int64's width; the range is checked after).
_INTEGER_TEXT = r"^(0|-?[1-9][0-9]{0,18})$"


def entity_values(c: CompiledSchema, ids: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Caller-supplied entity ids (any Arrow type) as values of the entity's declared type,
    to compare with the stored entity column in its own type (and its index).

    Ids are compared as text, as the online reads compare them (a Redis key holds the
    entity's text): an id of another type is cast to ``string`` first, and an id matches
    the entity whose text it is. For an integer entity an id that is not the exact text of
    a value of the declared type (``"x"``, ``"007"``, ``"1.0"``, ``" 1"``, out of range) is
    null: it matches no entity. A null id stays null. Never raises for an id's value."""
    target = c.arrow_schema.field(str(c.schema.entity)).type
    ids = _unsliced(ids)
    text = ids if ids.type == pa.string() else pc.cast(ids, pa.string())
    if not pa.types.is_integer(target):
        return text.cast(target) if text.type != target else text
    wide = pa.decimal128(19, 0)  # every 19-digit text fits; the bounds then pick the type's range
    digits = pc.if_else(pc.match_substring_regex(text, _INTEGER_TEXT), text, pa.scalar(None, pa.string()))
    value = digits.cast(wide)
    lo, hi = -(2 ** (target.bit_width - 1)), 2 ** (target.bit_width - 1) - 1  # entities are signed
    fits = pc.and_(pc.greater_equal(value, pa.scalar(lo, wide)), pc.less_equal(value, pa.scalar(hi, wide)))
    return pc.if_else(fits, value, pa.scalar(None, wide)).cast(target)


def _unsliced(ids: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """``ids`` with every array at offset 0 (copied where sliced): pyarrow's ``if_else``
    misreads a sliced string array (found by tests/integration/test_historical_reference.py's
    sliced frame)."""
    if isinstance(ids, pa.ChunkedArray):
        return pa.chunked_array([_unsliced(a) for a in ids.chunks], ids.type)
    if ids.offset == 0:
        return ids
    return pa.concat_arrays([pa.array([], ids.type), ids])


def reply_columns(replies: Sequence[Sequence[Any]], width: int) -> list[pa.Array]:
    """HMGET replies of ``width`` fields each -> one string array per field: one Arrow
    array over every reply value, one strided take (column-major), then a zero-copy slice
    per field."""
    import numpy as np

    n = len(replies)
    flat = pa.array(list(chain.from_iterable(replies)), pa.binary()).cast(pa.string())
    cols = flat.take(pa.array((np.arange(n, dtype=np.int64)[None, :] * width
                               + np.arange(width, dtype=np.int64)[:, None]).ravel()))
    return [cols.slice(j * n, n) for j in range(width)]


#: Types of the lineage columns read back from Postgres.
_LINEAGE_TYPES = {"_source": pa.string(), "_schema_version": pa.string(), "_schema_fingerprint": pa.string(),
                  "_run_id": pa.string(), "_ingested_at": pa.timestamp("us", "UTC")}


def from_text(c: CompiledSchema, name: str, text: pa.Array, target: pa.DataType | None = None) -> pa.Array:
    """Redis text (encoding v1) -> the declared type, exactly.

    Every v1 text is one Arrow parses exactly (shortest float text, decimal text at the
    field's scale, ``true``/``false``, ISO dates, ``... HH:MM:SS.ffffffZ`` instants); a
    value that does not parse, or would lose digits, is not v1 and raises SinkError.
    """
    if target is None:
        target = declared_type(c, name)
    try:
        if pa.types.is_dictionary(target):
            return text.cast(target.value_type).dictionary_encode()
        if pa.types.is_list(target) or pa.types.is_fixed_size_list(target):
            return parse_list_text(text, target)
        return text.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SinkError(f"Redis holds a value for {c.name}.{name} that is not encoding v1 text of "
                        f"{target}: {exc}", store="redis") from exc


def rows_to_table(c: CompiledSchema, names: list[str], rows: Sequence[Sequence[Any]]) -> pa.Table:
    """psycopg rows -> Arrow in the declared types (decimals, zones and dates exact)."""
    cols: list[list[Any]] = [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in names]
    out = {}
    for name, values in zip(names, cols, strict=True):
        base = name.removeprefix("__agg")  # the aggregation row's event time and lineage
        t = _LINEAGE_TYPES.get(base) or declared_type(c, base)
        if pa.types.is_timestamp(t) and t.tz is not None:
            values = [v.astimezone(dt.UTC) if v is not None else None for v in values]
        out[name] = pa.array(values, t)
    return pa.table(out)


__all__ = ["aggregation_names", "cold_columns", "declared_type", "entity_values", "from_text", "hot_columns",
           "reply_columns", "rows_to_table"]
