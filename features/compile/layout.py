"""The storage layout: where a compiled schema's columns live in the stores and how
their values are written there, one place for the sinks that write and the readers
(SDK, migrations, health, views) that read.

- **Columns**: which fields, derived feature columns and aggregations each store keeps
  (:func:`hot_columns`, :func:`cold_columns`, :func:`aggregation_names`), and the declared
  Arrow type of each (:func:`declared_type`, :func:`aggregation_type`).
- **Redis keys** (encoding version :data:`ENCODING_VERSION`, ``docs/redis.md``):
  ``features:<schema>:{<entity>}`` per entity (:func:`entity_key`), its aggregations'
  hash (:func:`aggregates_key`), its request-time window tiles (:func:`tiles_key`), the
  load ledger (:func:`ledger_key`), and the Redis Cluster slot of a key (:func:`key_slot`,
  :func:`key_slots`: CRC16 of the hash tag).
- **Values**: Arrow -> the text Redis stores (:func:`encode_column`, event times as
  microseconds :func:`event_time_micros`) and back (:func:`from_text`); Postgres rows and
  HMGET replies -> Arrow in the declared types (:func:`rows_to_table`,
  :func:`reply_columns`); caller ids in the entity's type (:func:`entity_values`).

It sits in ``compile`` (below kernels, validation, views, sources and sinks) so that
every layer that needs the layout imports it downwards.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from features.compile import CompiledSchema
from features.compile.arrow import arrow_type
from features.compile.listtext import JSON, list_text, parse_list_text
from features.errors import SinkError
from features.lineage import DIGEST
from features.schema.model import FLOAT_KINDS, INTEGER_KINDS, Aggregation, Schema
from features.schema.syntax import AGGREGATES_SUFFIX, TILES_SUFFIX

#: The version of the Redis value encoding this code writes and reads (the ``_enc`` field).
ENCODING_VERSION = "1"
KEY_PREFIX = "features"
#: The aggregation functions whose stored value is a float64 moment.
MOMENT_FUNCTIONS = ("variance", "stddev", "variance_sample", "stddev_sample")


# --------------------------------------------------------------------------- columns


def stored_fields(schema: Schema, store: str) -> tuple[str, ...]:
    """The fields kept in ``store`` (``hot``: Redis, ``cold``: Postgres), in schema order."""
    return tuple(f.name for f in schema.fields if store in f.store)


def stored_aggregations(schema: Schema, store: str) -> tuple[str, ...]:
    """The schema's aggregations kept in ``store`` (``hot``/``cold``), in schema order."""
    aggs = schema.aggregations
    return tuple(a.name for a in aggs.features if store in a.store) if aggs is not None else ()


def hot_columns(c: CompiledSchema) -> list[str]:
    """The fields and derived feature columns kept in Redis, in schema order."""
    return [*stored_fields(c.schema, "hot"), *c.schema.stored_features("hot")]


def cold_columns(c: CompiledSchema) -> list[str]:
    """The fields and derived feature columns kept in Postgres, in schema order."""
    return [*stored_fields(c.schema, "cold"), *c.schema.stored_features("cold")]


def aggregation_names(c: CompiledSchema, store: str) -> list[str]:
    """The schema's aggregations stored in ``store`` (``hot``/``cold``), in schema order."""
    return list(stored_aggregations(c.schema, store))


def declared_type(c: CompiledSchema, name: str) -> pa.DataType:
    """The declared Arrow type of stored column ``name``: a feature column's dtype, an
    aggregation's output type, the content digest's text, else the field's type."""
    if name == DIGEST:
        return pa.string()
    for feature in c.schema.features:
        if name in c.schema.feature_columns(feature):
            return arrow_type(feature.dtype)
    aggs = c.schema.aggregations
    for agg in aggs.features if aggs is not None else ():
        if agg.name == name:
            return aggregation_type(c.schema, agg)
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
    n = len(replies)
    flat = pa.array(list(chain.from_iterable(replies)), pa.binary()).cast(pa.string())
    cols = flat.take(pa.array((np.arange(n, dtype=np.int64)[None, :] * width
                               + np.arange(width, dtype=np.int64)[:, None]).ravel()))
    return [cols.slice(j * n, n) for j in range(width)]


#: Types of the lineage columns read back from Postgres.
_LINEAGE_TYPES = {"_source": pa.string(), "_schema_version": pa.string(), "_schema_fingerprint": pa.string(),
                  "_run_id": pa.string(), "_ingested_at": pa.timestamp("us", "UTC"), DIGEST: pa.string()}


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


def aggregation_type(schema: Schema, agg: Aggregation) -> pa.DataType:
    """The Arrow type of a stored aggregation column."""
    f = agg.function
    if f in ("count", "count_distinct", "approx_count_distinct"):
        return pa.int64()
    if f == "approx_percentile":  # one quantile: a double; a list of them: a list
        return pa.list_(pa.float64()) if isinstance(agg.q, tuple) else pa.float64()
    if f in ("mean", "ratio") or f in MOMENT_FUNCTIONS:
        return pa.float64()
    assert agg.of is not None
    ft = schema.field(agg.of).type
    if f == "sum" and ft.kind in FLOAT_KINDS:
        return pa.float64()  # a fixed-point sum (scale), as a double
    if f == "sum":
        return pa.int64() if ft.kind in INTEGER_KINDS else pa.decimal128(38, int(ft.scale or 0))
    if f == "last_k":
        return pa.list_(arrow_type(ft))
    return arrow_type(ft)


# --------------------------------------------------------------------------- Redis keys and values


def entity_key(schema_name: str, entity: str) -> str:
    """The Redis key of one entity (what readers such as the SDK compute)."""
    return f"{KEY_PREFIX}:{schema_name}:{{{entity}}}"


def aggregates_key(schema_name: str, entity: str) -> str:
    """The hash of one entity's hot aggregations: ``features:<schema>__aggregates:{<entity>}``."""
    return entity_key(schema_name + AGGREGATES_SUFFIX, entity)


#: ``TileRows.complete_from_us`` (features.aggregate.tiles.build) of an entity whose write
#: leaves none of its known events out: features.sinks.redis_tiles then sends no ``c``
TILES_WHOLE_US = -(2**63)


def tiles_key(schema_name: str, entity: str) -> str:
    """The hash of one entity's request-time window tiles (``features.aggregate.tiles``):
    ``features:<schema>__tiles:{<entity>}``."""
    return entity_key(schema_name + TILES_SUFFIX, entity)


def ledger_key(schema_name: str) -> str:
    return f"{KEY_PREFIX}:{schema_name}:__ledger__"


def encode_column(arr: pa.Array) -> pa.Array:
    """Values as the text Redis stores (nulls stay null, i.e. absent fields).

    strings/enums: as they are (UTF-8); integers: decimal; floats: the shortest text
    that parses back to the same value (``0.1``, ``1e+20``); decimals: with their scale
    (``1234.50``); bools: ``true``/``false``; dates: ``YYYY-MM-DD``; timestamps with a
    zone: converted to UTC, ``YYYY-MM-DD HH:MM:SS.ffffffZ``; naive timestamps: the same
    without ``Z``; lists: the JSON array of their elements' shortest text, ``[0.5,-0,1e-45]``
    (:mod:`features.compile.listtext`).
    """
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_string(t):
        return arr
    if pa.types.is_large_string(t):
        return arr.cast(pa.string())
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_large_list(t):
        return list_text(arr, JSON)
    if pa.types.is_timestamp(t) and t.tz is not None:
        # Formatting a zoned timestamp consults the zone database per value (~5 µs);
        # the UTC wall clock of the same instant formats 20x faster, then gets its Z.
        naive = arr.cast(pa.timestamp(t.unit, "UTC")).cast(pa.timestamp(t.unit))
        return pc.binary_join_element_wise(pc.cast(naive, pa.string()), "Z", "")
    return pc.cast(arr, pa.string())


def event_time_micros(arr: pa.Array) -> pa.Array:
    """Event times (timestamp or date) as int64 microseconds since the epoch (UTC)."""
    t = arr.type
    if pa.types.is_date(t):
        arr = arr.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
        return pc.multiply(arr, 86_400_000_000)
    if pa.types.is_timestamp(t):
        return arr.cast(pa.timestamp("us", t.tz)).cast(pa.int64())
    raise SinkError(f"event time column has type {t}, expected a timestamp or date", store="redis")


# --------------------------------------------------------------------------- Redis Cluster slots

SLOTS = 16384


def _crc16_table() -> npt.NDArray[np.uint16]:
    """CRC16-XMODEM (polynomial 0x1021), the one Redis Cluster hashes keys with."""
    table = np.zeros(256, dtype=np.uint16)
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else (crc << 1)
        table[byte] = crc & 0xFFFF
    return table


_CRC16 = _crc16_table()


def _hash_span(key: bytes) -> bytes:
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


_CRC16_LIST: list[int] = [int(v) for v in _CRC16]

#: Below this many keys still being hashed, :func:`key_slots` finishes them one by one
#: in Python: a numpy step costs the same few microseconds for one key as for a thousand,
#: so one 100 KB key among short ones would take 100,000 steps of nearly nothing.
_SCALAR_BELOW = 16


def _crc16(data: bytes | memoryview, crc: int = 0) -> int:
    table = _CRC16_LIST
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ byte]
    return crc


def key_slot(key: bytes | str) -> int:
    """The slot of one key (Redis Cluster spec: CRC16 of the hash tag, mod 16384)."""
    return _crc16(_hash_span(key.encode() if isinstance(key, str) else key)) % SLOTS


def _first_at_or_after(sorted_positions: npt.NDArray[np.int64], at: npt.NDArray[np.int64],
                       before: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Per row, the first of ``sorted_positions`` in ``[at, before)``, or -1."""
    i = np.searchsorted(sorted_positions, at, side="left")
    found = np.full(len(at), -1, dtype=np.int64)
    if len(sorted_positions):
        hit = i < len(sorted_positions)
        pos = sorted_positions[np.minimum(i, len(sorted_positions) - 1)]
        hit &= pos < before
        found[hit] = pos[hit]
    return found


def key_slots(keys: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.int64]:
    """:func:`key_slot` of every key of a string/binary array (no nulls), vectorised and
    in memory linear in the keys' total bytes (never rows times the longest key): the hash
    tag's bounds come from the positions of the ``{``/``}`` bytes in the data buffer, then
    one CRC16 step per byte position advances every key still that long at once (the
    keys ordered longest first, so a step's keys are a prefix); the last few long keys
    are finished one by one. Raises ValueError on a null key."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    keys = keys.cast(pa.large_binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if keys.null_count:
        raise ValueError("key_slots: null keys have no slot")
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64, count=n + 1, offset=keys.offset * 8)
    data_buf = keys.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts, ends = offsets[:-1], offsets[1:]
    # Only the keys' own bytes: a slice's buffer may hold other rows before and after.
    window = data[int(offsets[0]):int(offsets[-1])]
    base = int(offsets[0])
    opens = np.flatnonzero(window == ord("{")).astype(np.int64) + base
    closes = np.flatnonzero(window == ord("}")).astype(np.int64) + base
    open_at = _first_at_or_after(opens, starts, ends)
    close_at = _first_at_or_after(closes, open_at + 1, ends)
    tagged = (open_at >= 0) & (close_at > open_at + 1)
    lo = np.where(tagged, open_at + 1, starts)
    span = np.where(tagged, close_at, ends) - lo
    order = np.argsort(-span, kind="stable")
    lo, span = lo[order], span[order]
    # still[j]: how many keys (a prefix of ``order``) have more than j bytes to hash
    steps = int(span[0])
    still = np.searchsorted(-span, -np.arange(steps, dtype=np.int64), side="left") if steps else span[:0]
    crc = np.zeros(n, dtype=np.int64)
    table = _CRC16.astype(np.int64)
    j = 0
    while j < steps and still[j] >= _SCALAR_BELOW:
        k = int(still[j])
        head = crc[:k]
        crc[:k] = ((head << 8) & 0xFFFF) ^ table[((head >> 8) ^ data[lo[:k] + j]) & 0xFF]
        j += 1
    if j < steps:
        view = data.data  # a memoryview of the buffer: no copy
        for r in range(int(still[j])):
            crc[r] = _crc16(view[int(lo[r]) + j:int(lo[r] + span[r])], int(crc[r]))
    out = np.empty(n, dtype=np.int64)
    out[order] = crc % SLOTS
    return out


__all__ = [
    "ENCODING_VERSION", "KEY_PREFIX", "MOMENT_FUNCTIONS", "SLOTS", "TILES_WHOLE_US", "aggregates_key",
    "aggregation_names", "aggregation_type", "cold_columns", "declared_type", "encode_column", "entity_key",
    "entity_values", "event_time_micros", "from_text", "hot_columns", "key_slot", "key_slots", "ledger_key",
    "reply_columns", "rows_to_table", "stored_aggregations", "stored_fields", "tiles_key",
]
