"""What an online read plans, sends and decodes: the per-(schema, features) plan, the
request of one call, and the small-call path that decodes a few rows in Python."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from features.compile import CompiledSchema
from features.errors import SinkError
from features.sdk.columns import AGE, EVENT_TIME, FOUND, FROM, NULL_ID, STALE


@dataclass(frozen=True)
class Plan:
    """What online calls for one (schema, features) read and return, computed once."""

    c: CompiledSchema
    columns: list[str]              # the requested features and aggregations, in result order
    names: list[str]                # ... those read from the entity hash
    aggs: list[str]                 # ... those read from the aggregates hash
    fields: list[str]               # the entity hash's HMGET fields (names, _enc, fingerprint, _event_time)
    agg_fields: list[str]           # the aggregates hash's
    cold_names: list[str]           # names the Postgres fallback has (hot-only ones stay null)
    cold_aggs: list[str]            # aggs the Postgres fallback has
    ttl_ms: int                     # the schema's hot TTL (0: none)
    refresh_ms: int | None          # hot.refresh_after (None: no logical expiry)
    types: dict[str, pa.DataType]   # declared type of each name and agg
    result: pa.Schema               # the result table's schema
    #: per name, then per agg: the Python decoder of its v1 text (the small-call path),
    #: or None when a column's type has none (then every call takes the Arrow path)
    decoders: list[Callable[[bytes], Any]] | None


@dataclass(frozen=True)
class OnlineRequest:
    """What one ``online``/``online_async`` call reads from Redis (built once, for both)."""

    plan: Plan
    ids: list[str]                  # the ids as text, in request order (null: ``NULL_ID``)
    #: per read, its keys (one per id) and HMGET fields (the values, ``_enc``,
    #: ``_schema_fingerprint``, ``_event_time``), or None for a PTTL: the entity hashes,
    #: the aggregates hashes when the plan has aggs, their PTTL for logical expiry. Sent
    #: as one pipeline: one round trip. With ``lineage``, last: the entity hashes'
    #: ``_source`` and ``_run_id`` (:data:`LINEAGE_FIELDS`).
    reads: list[tuple[list[str], list[str] | None]]
    lineage: bool = False


#: What ``lineage=True`` reads of each entity hash: which stored row a value came from.
LINEAGE_FIELDS = ("_source", "_run_id")



class Outdated(Exception):
    """Hashes an earlier version of the schema wrote, which the stores were migrated from:
    rewritten in the current layout (``features.sinks.versions.Upgrader``), then read again."""


#: reads of a request rewritten and repeated at most this often (a writer of the old
#: version may write again in between)
UPGRADE_ATTEMPTS = 3


def still_outdated(req: OnlineRequest) -> SinkError:
    c = req.plan.c
    return SinkError(f"Redis hashes of {c.name} were written by an earlier schema version again while "
                     f"they were rewritten to {c.schema.version_str} ({UPGRADE_ATTEMPTS} times): is a "
                     "loader or stream of the old version still running? Stop it, then retry", store="redis")



def scatter(base: pa.Array, rows: npt.NDArray[np.int64], values: pa.Array) -> pa.Array:
    """``base`` with ``values`` placed at ``rows``."""
    idx = np.arange(len(base), dtype=np.int64)
    src = np.zeros(len(base), dtype=np.int64)
    use = np.zeros(len(base), dtype=bool)
    use[rows] = True
    src[rows] = np.arange(len(rows), dtype=np.int64)
    merged = pa.concat_arrays([base.cast(values.type) if base.type != values.type else base, values])
    take = np.where(use, len(base) + src, idx)
    return merged.take(pa.array(take))




#: ``online`` calls of at most this many ids try the small-call path (Python decoding)
#: first; larger ones decode with Arrow kernels (cheaper per value, dearer per call).
SMALL_CALL = 16
_EPOCH_NAIVE = dt.datetime(1970, 1, 1)


def small_rows(req: OnlineRequest, replies: list[Any]) -> list[dict[str, Any]] | None:
    """The result rows decoded in Python, when every id's hash is in Redis, written by
    this schema (encoding v1, its fingerprint) and not stale; None otherwise (and when a
    column's type has no Python decoder, or a value does not decode): then the Arrow path
    (:meth:`features.sdk.hot.HotReader.finish`) decides, with its fallback and its errors. The
    values are those of ``online(...).to_pylist()`` (``tests/integration/test_sdk.py``
    holds the two paths equal).

    Column by column (the replies transposed by ``zip``, each column's checks one set,
    its values decoded by one ``map``), then one ``dict(zip(...))`` per row; the keys
    and the column order are the plan's, computed once (:func:`_row_layout`).
    ``online_dicts`` takes this path at any size (the dicts are Python objects whichever
    way they are made: decoding straight into them skips the Arrow arrays and their
    ``to_pylist``); ``online`` for at most :data:`SMALL_CALL` ids."""
    plan, ids = req.plan, req.ids
    layout = _row_layout(plan)
    if layout is None:
        return None
    keys, decoders, agg_decoders, order = layout
    n = len(ids)
    if not n:
        return []
    nn = len(plan.names)
    na = len(plan.aggs)
    fp = plan.c.fingerprint.encode()
    hashes = replies[:n]
    # column by column: each field's n values as one tuple (zip in C), checked as a set
    fields = list(zip(*hashes, strict=True))
    if None in fields[-1] or set(fields[nn]) != _V1 or set(fields[nn + 1]) != {fp}:
        return None
    try:
        values = [_decode_column(d, col) for d, col in zip(decoders, fields, strict=False)]
        if na:
            aggs = replies[n:2 * n]
            got = [h for h in aggs if h[-1] is not None]
            if got and (set(h[na] for h in got) != _V1 or set(h[na + 1] for h in got) != {fp}):
                return None
            agg_fields = list(zip(*aggs, strict=True))
            values += [_decode_column(d, col) for d, col in zip(agg_decoders, agg_fields, strict=False)]
        if plan.refresh_ms is not None:
            at = (2 if na else 1) * n
            ttl, refresh = plan.ttl_ms, plan.refresh_ms
            if any(p >= 0 and ttl - p > refresh for p in replies[at:at + n]):
                return None
        if order is not None:
            values = [values[i] for i in order]
        micros = list(map(int, fields[-1]))
    except (ValueError, LookupError, ArithmeticError, UnicodeDecodeError, OverflowError):
        return None
    now_us = time.time_ns() // 1000
    # the epoch as ``_event_time`` gives it: naive for a naive event time (naive = UTC)
    epoch = _EPOCH_NAIVE if plan.result.field(EVENT_TIME).type.tz is None else _EPOCH_UTC
    delta = dt.timedelta
    events = [epoch + delta(microseconds=ev) for ev in micros]
    ages = [(now_us - ev) / 1_000_000.0 for ev in micros]
    entity = [None if i == NULL_ID else i for i in ids]
    return [dict(zip(keys, row, strict=True)) for row in zip(
        entity, *values, events, ages, repeat("redis"), repeat(True), repeat(False))]


_V1 = {b"1"}


def _decode_column(decode: Callable[[bytes], Any], col: tuple[bytes | None, ...]) -> list[Any]:
    """One column's values decoded (None stays None)."""
    if None in col:
        return [None if v is None else decode(v) for v in col]
    return list(map(decode, col))  # type: ignore[arg-type]  # no None in it


_Layout = tuple[list[str], list[Callable[[bytes], Any]], list[Callable[[bytes], Any]], list[int] | None]
#: per plan (by identity: plans are cached and frozen), its row layout
_LAYOUTS: dict[int, tuple[Plan, _Layout | None]] = {}


def _row_layout(plan: Plan) -> _Layout | None:
    """A plan's row keys (entity, columns, then the five meta columns), its entity-hash
    and aggregates-hash decoders, and the permutation from (names, aggs) to the column
    order (None where they are in order already); None without Python decoders."""
    held = _LAYOUTS.get(id(plan))
    if held is not None and held[0] is plan:
        return held[1]
    layout: _Layout | None = None
    if plan.decoders is not None:
        nn = len(plan.names)
        keys = [str(plan.c.schema.entity), *plan.columns, EVENT_TIME, AGE, FROM, FOUND, STALE]
        decoded = [*plan.names, *plan.aggs]
        order = None if decoded == plan.columns else [decoded.index(col) for col in plan.columns]
        layout = (keys, plan.decoders[:nn], plan.decoders[nn:], order)
    if len(_LAYOUTS) > 1024:
        _LAYOUTS.clear()
    _LAYOUTS[id(plan)] = (plan, layout)
    return layout


def _pyarrow_utc() -> Any:
    """The tzinfo pyarrow gives UTC timestamps in ``to_pylist`` (pytz's, when installed)."""
    return pa.array([0], pa.timestamp("us", "UTC")).to_pylist()[0].tzinfo


_PYARROW_UTC = _pyarrow_utc()
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=_PYARROW_UTC)


def python_decoders(types: Sequence[pa.DataType]) -> list[Callable[[bytes], Any]] | None:
    out = [python_decoder(t) for t in types]
    return None if any(d is None for d in out) else out  # type: ignore[return-value]


def python_decoder(t: pa.DataType) -> Callable[[bytes], Any] | None:
    """The Python decoder of encoding-v1 text of type ``t``, giving what Arrow's cast and
    ``to_pylist`` give (strict: text a v1 writer cannot produce raises ValueError); None
    for types decoded by Arrow only (float32, zones other than UTC, non-microsecond units)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _utf8
    if pa.types.is_integer(t):
        lo, hi = ((0, 2 ** t.bit_width - 1) if pa.types.is_unsigned_integer(t)
                  else (-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1))

        def integer(b: bytes) -> int:
            if not (b.isdigit() or (b[:1] == b"-" and b[1:].isdigit())):
                raise ValueError(b)
            v = int(b)
            if not lo <= v <= hi:
                raise ValueError(b)
            return v

        return integer
    if pa.types.is_float64(t):
        def double(b: bytes) -> float:
            # v1 text starts with a digit or "-" and ends with a digit: never nan/inf/" 1"/"1_0"
            if not b or b[0] not in _LEAD or b[-1] not in _DIGITS or b"_" in b:
                raise ValueError(b)
            return float(b)

        return double
    if pa.types.is_decimal(t):
        scale, precision = t.scale, t.precision
        quantum = Decimal(1).scaleb(-scale)

        def decimal(b: bytes) -> Decimal:
            # the writer's form: [-]digits.<scale digits>, no more than precision digits
            if scale and len(b) > scale and b[-scale - 1] == 46:  # "."
                whole = b[1:-scale - 1] if b[0] == 45 else b[:-scale - 1]  # "-"
                if (whole.isdigit() and b[-scale:].isdigit()
                        and len(whole.lstrip(b"0")) + scale <= precision):
                    return Decimal(b.decode("ascii"))
            d = Decimal(b.decode("ascii"))
            if not d.is_finite():
                raise ValueError(b)
            if d.as_tuple().exponent != -scale:
                q = d.quantize(quantum)
                if q != d:
                    raise ValueError(b)
                d = q
            if len(d.as_tuple().digits) > precision:
                raise ValueError(b)
            return d

        return decimal
    if pa.types.is_boolean(t):
        return _BOOLS.__getitem__
    if pa.types.is_date32(t):
        return lambda b: dt.date.fromisoformat(b.decode("ascii"))
    if pa.types.is_timestamp(t) and t.unit == "us" and t.tz == "UTC":
        def instant(b: bytes) -> dt.datetime:
            if len(b) != 27 or b[-1:] != b"Z":
                raise ValueError(b)
            return dt.datetime.fromisoformat(b.decode("ascii")).astimezone(_PYARROW_UTC)

        return instant
    return None


_BOOLS = {b"true": True, b"false": False}
_DIGITS = frozenset(b"0123456789")
_LEAD = frozenset(b"-0123456789")


def _utf8(b: bytes) -> str:
    return b.decode("utf-8")

