"""The as-of (point-in-time) join behind ``FeatureStore.historical``: the history a frame
needs is copied out of Postgres once per frame chunk and joined in Arrow/NumPy.

Chosen by measurement (bench/historical.py, bench/RESULTS.md "Issue 31: the as-of join
for historical"): a ``LEFT JOIN LATERAL`` per entity row costs ~12 µs in Postgres; copying
the rows of the frame's entities out (``COPY (SELECT ...) TO STDOUT (FORMAT csv)``, parsed
by ``pyarrow.csv`` with the declared column types, in C++ on every core) and joining with
one sort and one ``np.searchsorted`` costs a fraction of that.

Per frame chunk (``chunk_rows`` entity rows, default :data:`CHUNK_ROWS`):

1. the chunk's ids in the entity's own type (:func:`features.compile.layout.entity_values`: an id
   that is no value of it is null and matches nothing), dictionary-encoded: one integer
   code per distinct id;
2. the distinct ids go into a temporary table with one COPY, each with its latest frame
   time (and, with ``max_age``, its earliest minus ``max_age``), and one ``COPY (SELECT
   ...) TO STDOUT (FORMAT binary)`` reads the rows of their history the join can pick
   (at or before the entity's latest frame time, not older than its bound): the cold
   table, and the ``<schema>__aggregates`` table too when aggregation columns are asked
   for, side by side on connections of their own (``Connections.parallel``; a large
   chunk in :data:`READ_PARTS` parts by entity). Postgres packs each row's fixed-width
   values into one record (``int8send``/``float8send``/... ``||``; decimals as unscaled
   int8, text as a length plus one concatenated string) and aggregates the records of
   2**14 entities into one value (``string_agg``): a few COPY rows, parsed with one
   structured ``np.frombuffer`` instead of a Python iteration per row. Lists and
   decimals wider than 18 digits keep the CSV read (``pyarrow.csv``);
3. history rows get the same codes (``pc.index_in``); keys ``code * (n + 1) + rank of the
   event time`` (ranks from one sort of the history's times, so the key fits int64 for any
   span of time), one argsort, one ``searchsorted(side="right") - 1`` per frame row: the
   newest row at or before its time (an event at exactly T counts); a different code, no
   row, or one older than ``max_age`` gives nulls.

Memory: a chunk holds its frame rows, the history rows of its (at most ``chunk_rows``)
distinct entities within its time range, and a few int64 arrays of those lengths; the
result of :func:`as_of` is the frame plus the columns asked for. :func:`as_of_chunks`
yields one chunk's result at a time, so a caller that writes them out (``features
historical``) holds one chunk, whatever the frame's length.

Why one module of this size: the three steps share the chunk's codes, bounds and column
plans, and the binary record layout written in SQL (step 2) is the one parsed here; split
apart, each half would have to name the other's private layout.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from features.aggregate.engine import AggSpec, extract
from features.aggregate.request_time import at_times, fields_read, sub_spec
from features.compile import CompiledSchema
from features.compile.layout import aggregation_names, declared_type, entity_values
from features.compile.listtext import POSTGRES, parse_list_text
from features.compile.postgres import aggregates_table_name, cold_table_name, pg_type, quote_ident
from features.lineage import DIGEST
from features.schema.model import TypeKind
from features.sdk.static import static_rows
from features.sinks.postgres import copy_csv

_T = TypeVar("_T")


class Postgres(Protocol):
    """What the join needs: Postgres with errors mapped and parallel reads
    (:class:`features.sdk.connections.Connections`, or the ``FeatureStore`` that holds one)."""

    def run_postgres(self, what: str, fn: Callable[[Any], _T]) -> _T: ...

    def parallel(self, fns: Sequence[Callable[[], _T]]) -> list[_T]: ...

    def in_parallel(self) -> bool: ...

#: Frame rows per chunk: one history fetch and one join each.
CHUNK_ROWS = 1_000_000
#: The result's event time column.
EVENT_TIME = "_event_time"

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)
#: 0001-01-01 in epoch microseconds: the earliest bound a datetime can pass.
_YEAR_1 = -62_135_596_800_000_000


def as_of(store: Postgres, c: CompiledSchema, entity_df: pa.Table, columns: list[str], ts: Any,
          max_age: dt.timedelta | None, *, chunk_rows: int | None = None,
          request_time: bool = False) -> pa.Table:
    """``entity_df`` (checked by the caller) with ``columns`` (cold features and cold
    aggregations of ``c``) and ``_event_time`` appended: for each row, the values of the
    entity's newest stored row at or before its time ``ts`` (zoned timestamps, one per
    row), none older than ``max_age``; nulls where none qualifies. With
    ``request_time``, an aggregation column is instead its window evaluated at the row's
    time (:mod:`features.aggregate.request_time`) over the history table's events
    (``max_age`` does not apply to it; a row whose entity or time is null gets null)."""
    parts = list(as_of_chunks(store, c, entity_df, columns, ts, max_age, chunk_rows=chunk_rows,
                              request_time=request_time))
    return pa.concat_tables(parts)


def as_of_chunks(store: Postgres, c: CompiledSchema, entity_df: pa.Table, columns: list[str], ts: Any,
                 max_age: dt.timedelta | None, *, chunk_rows: int | None = None,
                 request_time: bool = False) -> Iterator[pa.Table]:
    """:func:`as_of`, one frame chunk of ``chunk_rows`` rows (default :data:`CHUNK_ROWS`,
    read at each call) at a time, in frame order (at least one, possibly empty, table)."""
    chunk_rows = CHUNK_ROWS if chunk_rows is None else chunk_rows
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, not {chunk_rows}")
    n = entity_df.num_rows
    # The whole frame's ids and times at once, from unsliced arrays: pyarrow's if_else
    # (in entity_values) reads a sliced string array's values wrongly.
    ids = entity_values(c, _unsliced(entity_df.column(str(c.schema.entity))))
    if c.schema.static:  # one row per entity, whatever the time (features.sdk.static)
        for lo in range(0, max(n, 1), chunk_rows):
            yield static_rows(store, c, entity_df.slice(lo, chunk_rows), columns, ids.slice(lo, chunk_rows))
        return
    t_us = _micros(ts)
    for lo in range(0, max(n, 1), chunk_rows):
        yield _chunk(store, c, entity_df.slice(lo, chunk_rows), columns, ids.slice(lo, chunk_rows),
                     t_us.slice(lo, chunk_rows), max_age, request_time)


def _unsliced(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``col`` as one array at offset 0 (a copy where it was a slice)."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return arr.take(pa.array(np.arange(len(arr), dtype=np.int64))) if arr.offset else arr


def _chunk(store: Postgres, c: CompiledSchema, frame: pa.Table, columns: list[str], ids: pa.Array,
           t_us: pa.Array, max_age: dt.timedelta | None, request_time: bool) -> pa.Table:
    s = c.schema
    cold_aggs = set(aggregation_names(c, "cold"))
    names = [x for x in columns if x not in cold_aggs]
    aggs = [x for x in columns if x in cold_aggs]
    windows = _Windows.of(c, aggs) if request_time and aggs else None
    if windows is not None:
        aggs = []
    enc = ids.dictionary_encode()
    ok = np.asarray(pc.and_(pc.is_valid(enc.indices), pc.is_valid(t_us)))
    codes = np.asarray(enc.indices.fill_null(0), dtype=np.int64)
    t_q = np.asarray(t_us.fill_null(0), dtype=np.int64)
    # a max_age past any representable span (days=999_999_999) is no limit: clamped so the
    # arithmetic on epoch microseconds stays in int64
    age = None if max_age is None else min(max_age // _US, 2**62)
    bounds = (int(t_q[ok].min()), int(t_q[ok].max())) if ok.any() else None

    spans = _spans(codes, t_q, ok, len(enc.dictionary))
    got: dict[str, pa.Array] = {}
    # the history's digest too: of two events at one instant the greater is the newest
    reads = [(table, cols, keep_time) for table, cols, keep_time in (
        (cold_table_name(s), [*names, DIGEST], True), (aggregates_table_name(s), aggs, False))
        if cols or keep_time]
    ages = [age] * len(reads)
    if windows is not None:  # the events in the windows of the frame's times: the history table's
        reads.append((cold_table_name(s), [*windows.fields, DIGEST], False))
        ages.append(windows.longest_us)
    # the history and the aggregates tables read side by side, each in READ_PARTS parts
    # by entity (a connection each): Postgres runs one query on one core
    dictionary = enc.dictionary
    n_ids = len(dictionary)
    # (not within a parallel read already, as a view's sources are: cores, not
    # connections, are the limit)
    split = n_ids >= PARTS_FROM and not store.in_parallel()
    step = -(-n_ids // READ_PARTS) if split else max(n_ids, 1)
    parts = [(lo, min(lo + step, n_ids)) for lo in range(0, max(n_ids, 1), step)]

    def reader(table: str, cols: list[str], part: tuple[int, int], age: int | None) -> Callable[[], pa.Table]:
        return lambda: _fetch(store, c, table, dictionary, cols, bounds, age, spans, part)

    fetched = store.parallel([reader(table, cols, part, a)
                              for (table, cols, _), a in zip(reads, ages, strict=True) for part in parts])
    hists = [_concat(fetched[i * len(parts):(i + 1) * len(parts)]) for i in range(len(reads))]
    if windows is not None:
        got.update(windows.at(hists.pop(), codes, t_q, ok))
        reads.pop()
    for (_, cols, keep_time), hist in zip(reads, hists, strict=True):
        idx = _match(hist, codes, t_q, ok, age, hist.column(DIGEST) if DIGEST in cols else None)
        take = pa.array(idx, mask=idx < 0)
        for name in cols:
            got[name] = hist.column(name).take(take)
        if keep_time:
            got[EVENT_TIME] = hist.column("__t").take(take).cast(_result_time(c))
    out = frame
    for name in columns:
        out = out.append_column(name, got[name])
    return out.append_column(EVENT_TIME, got[EVENT_TIME])


@dataclass(frozen=True)
class _Windows:
    """Request-time windows for a frame chunk: the aggregations asked for, what they
    need computed (:func:`features.aggregate.request_time.sub_spec`), the history fields
    they read and how far back from a frame time their windows reach."""

    c: CompiledSchema
    names: list[str]
    spec: Any  # features.aggregate.engine.AggSpec
    fields: list[str]
    longest_us: int

    @classmethod
    def of(cls, c: CompiledSchema, names: list[str]) -> _Windows:
        full = AggSpec.of(c.schema)
        assert full is not None  # names are aggregations of c
        spec = sub_spec(full, names)
        # a window (sliding or tumbling) at T holds events in (T - size, T]: read [T - longest, T]
        return cls(c, names, spec, fields_read(spec), spec.longest_us)

    def at(self, hist: pa.Table, codes: npt.NDArray[np.int64], t_q: npt.NDArray[np.int64],
           ok: npt.NDArray[np.bool_]) -> dict[str, pa.Array]:
        """The windows at each frame row's time ``t_q`` over ``hist`` (the history rows read
        for the chunk's entities, ``__k`` their entity code): null where not ``ok``."""
        s = self.c.schema
        entity, event_time = str(s.entity), str(s.event_time)
        k = hist.column("__k").combine_chunks().cast(pa.int64())
        cols: dict[str, Any] = {name: hist.column(name) for name in self.fields}
        cols.setdefault(entity, k)
        cols[event_time] = hist.column("__t").combine_chunks().cast(pa.timestamp("us", "UTC"))
        cols["_source"] = pa.nulls(hist.num_rows, pa.string())
        cols[DIGEST] = hist.column(DIGEST)  # ties: the greater digest is the later event
        events = dataclasses.replace(extract(self.spec, pa.table(cols)), entity=k)
        sel = np.flatnonzero(ok)
        values = at_times(self.spec, events, pa.array(codes[sel], pa.int64()), t_q[sel])
        back = np.full(len(codes), -1, dtype=np.int64)
        back[sel] = np.arange(len(sel), dtype=np.int64)
        take = pa.array(back, mask=back < 0)
        return {name: values[name].take(take).cast(declared_type(self.c, name)) for name in self.names}


def windows_at(store: Postgres, c: CompiledSchema, entity_ids: pa.Array, t_us: int,
               names: list[str], *, read: npt.NDArray[np.bool_] | None = None) -> dict[str, pa.Array]:
    """The aggregations ``names`` of ``c`` (hot or cold, any function) evaluated at one
    request time ``t_us`` (epoch µs) for each of ``entity_ids`` (their text, as online
    reads take them), over the history table's events: the computation of
    ``historical(..., windows="request_time")`` (:class:`_Windows`, one read of the
    entities' events in ``[t_us - longest window, t_us]``), one value per id in order,
    in the declared types. An id with no history (or no value of the entity's type),
    or not in ``read`` (a mask over ``entity_ids``; None: every id), reads the empty
    window without a query; a null id reads null. The online reads' computation for an
    entity whose tiles hash is absent and for the aggregations the tiles do not hold
    (``features.sdk.hot``)."""
    ids = entity_values(c, entity_ids)
    windows = _Windows.of(c, names)
    enc = ids.dictionary_encode()
    n = len(ids)
    ok = np.asarray(pc.is_valid(entity_ids)) if n else np.zeros(0, np.bool_)
    known = np.asarray(pc.is_valid(enc.indices)) if n else np.zeros(0, np.bool_)
    if read is not None:
        known = known & read
    codes = np.asarray(enc.indices.fill_null(0), dtype=np.int64)
    t_q = np.full(n, t_us, dtype=np.int64)
    spans = _spans(codes, t_q, known, len(enc.dictionary))
    bounds = (t_us, t_us) if known.any() else None
    hist = _fetch(store, c, cold_table_name(c.schema), enc.dictionary, [*windows.fields, DIGEST], bounds,
                  windows.longest_us, spans)
    # an id that is no value of the entity's type has no history: its own code, no events
    codes = np.where(known, codes, len(enc.dictionary))
    return windows.at(hist, codes, t_q, ok)


#: A chunk's history is read in this many parts by entity, side by side (a connection
#: each), once it has at least PARTS_FROM distinct entities, unless the call is one of
#: several parallel reads already (a view's sources).
READ_PARTS = 2
PARTS_FROM = 50_000


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()


def _spans(codes: npt.NDArray[np.int64], t_q: npt.NDArray[np.int64], ok: npt.NDArray[np.bool_],
           n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per entity code (``n`` of them), the earliest and the latest time of its frame
    rows that can match (``ok``): ``INT64_MAX``/``INT64_MIN`` for an entity with none."""
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, codes[ok], t_q[ok])
    np.maximum.at(last, codes[ok], t_q[ok])
    return first, last


def _micros(ts: Any) -> pa.Array:
    """Zoned times -> int64 microseconds since the epoch (finer units floored: event
    times are microseconds, so flooring keeps the as-of answer)."""
    ts = ts.combine_chunks() if isinstance(ts, pa.ChunkedArray) else ts
    if ts.type.unit == "ns":
        ts = pc.floor_temporal(ts, unit="microsecond")
    return ts.cast(pa.timestamp("us", "UTC")).cast(pa.int64())


def _result_time(c: CompiledSchema) -> pa.DataType:
    """``_event_time``'s type from epoch microseconds: naive for a naive event time, else
    UTC (a date's midnight UTC)."""
    t = c.schema.field(str(c.schema.event_time)).type
    return pa.timestamp("us", None if t.kind is TypeKind.TIMESTAMP and t.tz is None else "UTC")


def _match(hist: pa.Table, codes: npt.NDArray[np.int64], t_q: npt.NDArray[np.int64],
           ok: npt.NDArray[np.bool_], age: int | None, digest: pa.ChunkedArray | None = None
           ) -> npt.NDArray[np.int64]:
    """For each frame row, the index in ``hist`` of its entity's newest row at or before
    its time (not older than ``age`` µs), or -1; of history rows at one time, the one
    with the greatest ``digest`` (docs/schema.md, "Events at one instant")."""
    n = hist.num_rows
    idx = np.full(len(codes), -1, dtype=np.int64)
    if n == 0 or not ok.any():
        return idx
    code_h = np.asarray(hist.column("__k"), dtype=np.int64)
    t_h = np.asarray(hist.column("__t"), dtype=np.int64)
    # One merge of history and frame rows instead of a binary search per frame row (random
    # probes are cache misses): rank every time, history before frame at equal times (a
    # stable sort of history then frame), so rank_h < rank_q exactly when t_h <= t_q; sort
    # by (code, rank); each frame row's answer is the last history row before it. When
    # (code, time) fits one int64 key, one stable sort of it does both.
    m = len(codes)
    lo = min(int(t_h.min()), int(t_q.min()))
    width = max(int(t_h.max()), int(t_q.max())) - lo + 1
    code = np.concatenate([code_h, codes])
    if width * (int(code.max()) + 1) < 2**62:  # (code, time) fits one int64: one stable sort
        merged = np.argsort(code * width + (np.concatenate([t_h, t_q]) - lo), kind="stable")
    else:
        by_time = np.argsort(np.concatenate([t_h, t_q]), kind="stable")
        rank = np.empty(n + m, dtype=np.int64)
        rank[by_time] = np.arange(n + m, dtype=np.int64)
        merged = np.argsort(code * (n + m) + rank)  # unique keys: any sort
    is_h = merged < n
    if digest is not None:
        hm = merged[is_h]
        if bool(((code_h[hm][1:] == code_h[hm][:-1]) & (t_h[hm][1:] == t_h[hm][:-1])).any()):
            # events at one instant: history rows by digest within their time (a sort only
            # when there are such ties), still before the frame rows of that time
            rank = np.zeros(n + m, dtype=np.int64)
            rank[:n] = np.asarray(pc.rank(digest.combine_chunks() if isinstance(digest, pa.ChunkedArray)
                                          else digest, tiebreaker="dense").to_numpy(zero_copy_only=False))
            frame = np.r_[np.zeros(n, dtype=np.int64), np.ones(m, dtype=np.int64)]
            merged = np.lexsort((rank, frame, np.concatenate([t_h, t_q]), code))
            is_h = merged < n
    last_at = np.maximum.accumulate(np.where(is_h, np.arange(n + m, dtype=np.int64), -1))
    last = np.where(last_at >= 0, merged[np.maximum(last_at, 0)], -1)
    pos = np.empty(m, dtype=np.int64)
    pos[merged[~is_h] - n] = last[~is_h]
    hit = ok & (pos >= 0)
    row = np.maximum(pos, 0)
    hit &= code_h[row] == codes
    if age is not None:
        hit &= t_h[row] >= t_q - age
    idx[hit] = row[hit]
    return idx


def _fetch(store: Postgres, c: CompiledSchema, table: str, ids: pa.Array, cols: list[str],
           bounds: tuple[int, int] | None, age: int | None,
           spans: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None,
           part: tuple[int, int] | None = None) -> pa.Table:
    """The rows of ``table`` for the entities ``ids`` with an event time in the chunk's
    range: ``__k`` (the entity's position in ``ids``), ``__t`` (event time, epoch µs) and
    ``cols`` in their declared types.

    ``spans``: per entity of ``ids``, the earliest and latest frame time (epoch µs; an
    entity whose latest is ``INT64_MIN`` has no frame row to answer and is not read):
    only its rows at or before its latest time (and, with ``age``, not older than its
    earliest time minus ``age``) are read, the rows the join can pick. Without ``spans``
    the chunk's ``bounds`` apply to every entity. ``part``: only the entities at these
    positions of ``ids`` (``__k`` stays their position in all of ``ids``).

    Columns of fixed-width types, text and exact decimals (precision <= 18) come as one
    binary COPY of a few rows of aggregated byte strings (:func:`_binary_plan`: each
    column's values packed by Postgres' ``*send`` functions, parsed with NumPy); a
    table with other columns (lists, wider decimals) is read as CSV (:func:`_parse`)."""
    s = c.schema
    entity, event_time = str(s.entity), str(s.event_time)
    types = {name: declared_type(c, name) for name in cols}
    if bounds is None or len(ids) == 0:
        return _empty(types)
    e_type = pg_type(s.field(entity).type)
    ent, et = quote_ident(entity), quote_ident(event_time)
    lo, hi = bounds
    if spans is None:
        first = np.full(len(ids), lo, dtype=np.int64)
        last = np.full(len(ids), hi, dtype=np.int64)
    else:
        first, last = spans
    keep = last != np.iinfo(np.int64).min
    if part is not None:  # only the entities at positions [lo, hi) of ids
        keep[:part[0]] = False
        keep[part[1]:] = False
    since = None if age is None or lo - age < _YEAR_1 else _EPOCH + (lo - age) * _US
    params: list[Any] = [_EPOCH + hi * _US] + ([since] if since is not None else [])
    where = f"h.{et} <= %s{'' if since is None else f' AND h.{et} >= %s'} AND h.{et} <= s.hi"
    stage_cols: dict[str, pa.Array] = {
        "e": ids.filter(pa.array(keep)),
        "k": pa.array(np.flatnonzero(keep).astype(np.int32)),
        # the binary read's group (a column, so that ANALYZE tells the planner how few
        # there are: a hash aggregate, not a sort of every row read)
        "g": pa.array((np.flatnonzero(keep) >> _GROUP_BITS).astype(np.int32)),
        "hi": pa.array(last[keep]).cast(pa.timestamp("us", "UTC"))}
    if age is not None:  # per entity: not older than its earliest frame time minus max_age
        low = first[keep] - age
        stage_cols["lo"] = pa.array(low, mask=low < _YEAR_1).cast(pa.timestamp("us", "UTC"))
        where += f" AND (s.lo IS NULL OR h.{et} >= s.lo)"
    stage = f"_featureline_asof_span_{e_type}"
    staged = copy_csv(pa.table(stage_cols))
    plan = _binary_plan(c, types)
    if plan is not None:
        select = _binary_select(c, et, plan)
        query = (f"COPY (SELECT {select} FROM {quote_ident(table)} h JOIN {stage} s ON h.{ent} = s.e "
                 f"WHERE {where} GROUP BY s.g) TO STDOUT (FORMAT binary)")
    else:
        select = ", ".join(["s.k", f"h.{et}", *(f"h.{quote_ident(name)}" for name in types)])
        query = (f"COPY (SELECT {select} FROM {quote_ident(table)} h JOIN {stage} s ON h.{ent} = s.e "
                 f"WHERE {where}) TO STDOUT (FORMAT csv)")

    def run(conn: Any) -> bytes:
        buf = io.BytesIO()
        with conn.transaction():
            conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} (e {e_type}, k integer, g integer, "
                         "hi timestamptz, lo timestamptz) ON COMMIT DELETE ROWS")
            conn.execute("SET LOCAL jit = off")  # ~10 ms of compiling per query, for a plan this simple
            # the staged entities' hash table in memory (a 4 MB default splits a chunk's
            # million keys into batches spilled to disk): for this transaction only
            conn.execute("SET LOCAL work_mem = '256MB'")
            with conn.cursor() as cur:
                with cur.copy(f"COPY {stage} ({', '.join(stage_cols)}) FROM STDIN (FORMAT csv)") as cp:
                    cp.write(staged)
                conn.execute(f"ANALYZE {stage}")
                with cur.copy(query, params) as cp:
                    for block in cp:
                        buf.write(block)
        return buf.getvalue()

    data: bytes = store.run_postgres("the as-of query", run)
    if not data:
        return _empty(types)
    if plan is not None:
        return _parse_binary(data, c, types, plan)
    return _parse(data, c, types)


#: the binary read aggregates the rows of 2**_GROUP_BITS entities into one COPY row (a
#: byte string or two per read, well under Postgres' 1 GB limit for any history of that many)
_GROUP_BITS = 14
#: 2000-01-01 (Postgres' epoch for dates and timestamps) in epoch days and microseconds
_PG_EPOCH_DAYS = 10_957
_PG_EPOCH_US = _PG_EPOCH_DAYS * 86_400_000_000

_Decode = Callable[[npt.NDArray[Any], npt.NDArray[np.bool_], bytes], pa.Array]


@dataclass(frozen=True)
class _Packed:
    """How a column is sent and read back: its value (big-endian, ``dtype``) and its
    validity byte go into each row's fixed-width record; a text column's bytes are one
    more aggregate (``extra``); ``decode`` rebuilds the Arrow array."""

    value: str
    dtype: str
    valid: str
    decode: _Decode
    extra: str | None = None


def _send_time(c: CompiledSchema, expr: str) -> tuple[str, str]:
    """The SQL that packs event time ``expr`` (never null) as Postgres' binary value, and
    its dtype: int8 microseconds (a timestamp) or int4 days (a date) since 2000-01-01."""
    t = c.schema.field(str(c.schema.event_time)).type
    if t.kind is TypeKind.DATE:
        return f"date_send({expr})", ">i4"
    return (f"timestamptz_send({expr})" if t.tz is not None else f"timestamp_send({expr})"), ">i8"


def _binary_plan(c: CompiledSchema, types: dict[str, pa.DataType]) -> dict[str, _Packed] | None:
    """Per column, how it is packed; None when a column's type has no packed form here
    (lists, decimals wider than int64): then the whole read is CSV."""
    out: dict[str, _Packed] = {}
    for name, t in types.items():
        x = f"h.{quote_ident(name)}"
        vt = t.value_type if pa.types.is_dictionary(t) else t
        valid = f"boolsend({x} IS NOT NULL)"
        if pa.types.is_integer(vt) and (pa.types.is_signed_integer(vt) or vt.bit_width < 64):
            out[name] = _Packed(f"int8send(coalesce({x}::int8, 0))", ">i8", valid, _fixed(t))
        elif pa.types.is_floating(vt):
            out[name] = _Packed(f"float8send(coalesce({x}::float8, 0))", ">f8", valid, _fixed(t))
        elif pa.types.is_boolean(vt):
            out[name] = _Packed(f"boolsend(coalesce({x}, false))", "?", valid, _fixed(t))
        elif pa.types.is_decimal(vt) and vt.precision <= 18:
            out[name] = _Packed(f"int8send(coalesce(({x} * {10 ** vt.scale}::numeric)::int8, 0))", ">i8",
                                valid, _decimal(t))
        elif pa.types.is_date32(vt):
            out[name] = _Packed(f"date_send(coalesce({x}, 'epoch'::date))", ">i4", valid,
                                _fixed(t, _PG_EPOCH_DAYS))
        elif pa.types.is_timestamp(vt) and vt.unit != "ns":
            pg = "timestamptz" if vt.tz is not None else "timestamp"
            out[name] = _Packed(f"{pg}_send(coalesce({x}, 'epoch'::{pg}))", ">i8", valid,
                                _fixed(t, _PG_EPOCH_US))
        elif pa.types.is_string(vt) or pa.types.is_large_string(vt):
            b = f"convert_to({x}, 'UTF8')"
            out[name] = _Packed(f"int4send(coalesce(length({b}), 0))", ">i4", valid, _text(t),
                                f"string_agg(coalesce({b}, ''::bytea), '')")
        else:
            return None
    return out


def _mask(valid: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_] | None:
    return None if valid.all() else ~valid


def _fixed(t: pa.DataType, offset: int = 0) -> _Decode:
    """Fixed-width values (``offset`` added: Postgres' epoch to Arrow's) -> ``t``."""
    vt = t.value_type if pa.types.is_dictionary(t) else t

    def decode(values: npt.NDArray[Any], valid: npt.NDArray[np.bool_], extra: bytes) -> pa.Array:
        values = values.astype(values.dtype.newbyteorder("="))
        if offset:
            values = values + offset
        arr = pa.array(values, mask=_mask(valid))
        if pa.types.is_timestamp(vt):
            arr = arr.view(pa.timestamp("us", vt.tz))
        elif pa.types.is_date32(vt):
            arr = arr.cast(pa.int32()).view(pa.date32())
        if pa.types.is_dictionary(t):
            arr = arr.cast(vt).dictionary_encode()
        return arr.cast(t) if arr.type != t else arr

    return decode


def _validity(valid: npt.NDArray[np.bool_]) -> tuple[Any, int]:
    """An Arrow validity buffer (None: no nulls) and the null count."""
    if valid.all():
        return None, 0
    return pa.array(valid).buffers()[1], int(len(valid) - valid.sum())


def _decimal(t: pa.DataType) -> _Decode:
    """Unscaled int64 values -> decimal ``t`` (two's complement 128-bit words)."""
    def decode(values: npt.NDArray[Any], valid: npt.NDArray[np.bool_], extra: bytes) -> pa.Array:
        unscaled = values.astype(np.int64)
        words = np.empty((len(unscaled), 2), dtype=np.int64)
        words[:, 0] = unscaled
        words[:, 1] = unscaled >> 63  # the sign, extended
        mask, nulls = _validity(valid)
        return pa.Array.from_buffers(pa.decimal128(t.precision, t.scale), len(unscaled),
                                     [mask, pa.py_buffer(words.tobytes())], null_count=nulls)

    return decode


def _text(t: pa.DataType) -> _Decode:
    """Byte lengths and the concatenated UTF-8 bytes -> strings of type ``t``."""
    def decode(values: npt.NDArray[Any], valid: npt.NDArray[np.bool_], extra: bytes) -> pa.Array:
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(values.astype(np.int64), out=offsets[1:])
        mask, nulls = _validity(valid)
        arr = pa.Array.from_buffers(pa.large_string(), len(values),
                                    [mask, pa.py_buffer(offsets.tobytes()), pa.py_buffer(extra)],
                                    null_count=nulls)
        vt = t.value_type if pa.types.is_dictionary(t) else t
        arr = arr.cast(vt)  # string: fails past 2 GiB rather than wrapping
        return arr.dictionary_encode() if pa.types.is_dictionary(t) else arr

    return decode


def _binary_select(c: CompiledSchema, et: str, plan: dict[str, _Packed]) -> str:
    """The binary read's aggregates: one string of fixed-width records (entity position,
    event time, then each column's value and validity), then each text column's bytes."""
    record = " || ".join(["int4send(s.k)", _send_time(c, f"h.{et}")[0],
                          *(part for p in plan.values() for part in (p.value, p.valid))])
    return ", ".join([f"string_agg({record}, '')", *(p.extra for p in plan.values() if p.extra)])


def _copy_binary_rows(data: bytes) -> list[list[memoryview]]:
    """The rows of a ``COPY ... (FORMAT binary)`` stream, each a list of its fields'
    bytes (the aggregates here are never null: an empty group has no row)."""
    mv = memoryview(data)
    if bytes(mv[:11]) != b"PGCOPY\n\xff\r\n\x00":
        raise ValueError("not a binary COPY stream")
    pos = 15
    pos += 4 + int.from_bytes(mv[pos:pos + 4], "big")
    rows: list[list[memoryview]] = []
    while True:
        n = int.from_bytes(mv[pos:pos + 2], "big", signed=True)
        pos += 2
        if n == -1:
            return rows
        fields = []
        for _ in range(n):
            size = int.from_bytes(mv[pos:pos + 4], "big", signed=True)
            pos += 4
            fields.append(mv[pos:pos + max(size, 0)])  # no copy until joined
            pos += max(size, 0)
        rows.append(fields)


def _parse_binary(data: bytes, c: CompiledSchema, types: dict[str, pa.DataType],
                  plan: dict[str, _Packed]) -> pa.Table:
    """The binary read's rows -> ``__k``, ``__t`` (epoch µs) and the columns."""
    rows = _copy_binary_rows(data)
    if not rows:
        return _empty(types)
    fields = [b"".join(parts) for parts in zip(*rows, strict=True)]
    time_dtype = _send_time(c, "")[1]
    layout = [("k", ">i4"), ("t", time_dtype)]
    for i, p in enumerate(plan.values()):
        layout += [(f"v{i}", p.dtype), (f"n{i}", "?")]
    rec = np.frombuffer(fields[0], dtype=np.dtype(layout))
    k = rec["k"].astype(np.int32)
    when = rec["t"].astype(np.int64)
    when = (when + _PG_EPOCH_DAYS) * 86_400_000_000 if time_dtype == ">i4" else when + _PG_EPOCH_US
    out: dict[str, pa.Array] = {"__k": pa.array(k), "__t": pa.array(when)}
    extras = iter(fields[1:])
    for i, (name, p) in enumerate(plan.items()):
        extra = next(extras) if p.extra else b""
        out[name] = p.decode(rec[f"v{i}"], np.ascontiguousarray(rec[f"n{i}"]), extra)
    return pa.table(out)


def _text_type(t: pa.DataType) -> pa.DataType:
    """The type Postgres' CSV text of a column of type ``t`` is parsed as: timestamps in
    microseconds, UTC (the session's zone) or naive; dictionaries as their values."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", "UTC" if t.tz is not None else None)
    if pa.types.is_dictionary(t):
        return t.value_type
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
        return pa.string()  # an array literal, {0.5,1e-45}
    return t


def _parse(data: bytes, c: CompiledSchema, types: dict[str, pa.DataType]) -> pa.Table:
    """Postgres CSV -> Arrow in the declared types: nulls are unquoted empty fields, an
    empty string is ``""``; booleans ``t``/``f``; floats as Postgres writes them
    (shortest round-trip text, ``NaN``, ``Infinity``); timestamps in the session's zone,
    UTC. ``__t`` becomes epoch microseconds (a date: its midnight UTC)."""
    event = c.arrow_schema.field(str(c.schema.event_time)).type
    names = ["__k", "__t", *types]
    col_types = {"__k": pa.int32(), "__t": _text_type(event), **{n: _text_type(t) for n, t in types.items()}}
    table = pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 24),
        parse_options=pacsv.ParseOptions(newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(column_types=col_types, null_values=[""], true_values=["t"],
                                             false_values=["f"], strings_can_be_null=True,
                                             quoted_strings_can_be_null=False))
    when = table.column("__t").combine_chunks()
    if pa.types.is_date(when.type):
        micros = np.asarray(when.cast(pa.int32()), dtype=np.int64) * 86_400_000_000
    else:
        micros = np.asarray(when.cast(pa.int64()), dtype=np.int64)
    out = {"__k": table.column("__k").combine_chunks(), "__t": pa.array(micros)}
    for name, t in types.items():
        col = table.column(name).combine_chunks()
        if pa.types.is_dictionary(t):
            col = col.dictionary_encode()
        elif pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
            col = parse_list_text(col, t, POSTGRES)
        out[name] = col.cast(t) if col.type != t else col
    return pa.table(out)


def _empty(types: dict[str, pa.DataType]) -> pa.Table:
    return pa.table({"__k": pa.array([], pa.int32()), "__t": pa.array([], pa.int64()),
                     **{n: pa.array([], t) for n, t in types.items()}})


__all__ = ["CHUNK_ROWS", "as_of", "as_of_chunks", "windows_at"]
