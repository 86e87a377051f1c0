"""``FeatureStore.historical`` is a point-in-time (as-of) join: checked against a
brute-force Python reference on random histories, against the real Postgres.

Reference, for each query row ``(entity, ts)``: among the stored rows of that entity
with ``event_time <= ts`` (and ``>= ts - max_age`` when given), the one with the greatest
event time, of several at that time the one with the greatest content digest; none ->
nulls. Histories have ties (query times equal to event times and to each other, several
different events of one entity at one time), gaps, entities without history, and are
written in a shuffled order over several write units.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.kernels.digest import digests
from features.lineage import RunContext
from features.schema.parse import parse_schema
from features.sdk.store import FeatureStore
from features.sinks.base import REJECTED_ROWS_SCHEMA, WriteUnit
from features.sinks.postgres import PostgresSink

pytestmark = pytest.mark.services

SCHEMA = """
name: pit_items
version: 1.0.0
entity: item_id
event_time: seen_at
fields:
  - name: item_id
    type: string
    store: cold
    constraints: {required: true}
  - name: seen_at
    type: timestamp(us, Europe/Berlin)
    store: cold
    constraints: {required: true}
  - name: price
    type: decimal(12,2)
    store: cold
  - name: score
    type: float64
    store: cold
  - name: label
    type: string
    store: cold
"""

UTC = dt.UTC
BASE = dt.datetime(2024, 3, 31, 0, 0, 30, tzinfo=UTC)  # the night Europe/Berlin goes to summer time
ENTITIES = ("a", "b", "c", "d", "", "ñ,\"q\"\n")
FEATURES = ("price", "score", "label")
ZONES = ("UTC", "America/New_York", "Asia/Kolkata", "Europe/Berlin")


@dataclass(frozen=True)
class Row:
    entity: str
    t: dt.datetime
    price: Decimal | None
    score: float | None
    label: str | None


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return compile_schema(parse_schema(SCHEMA, "pit_items.yaml"))


@pytest.fixture()
def store(tmp_path: Path, settings: Settings, pg_schema: str,
          compiled: CompiledSchema) -> Iterator[tuple[FeatureStore, PostgresSink, Any]]:
    """A FeatureStore, an open PostgresSink and a connection on the test's own Postgres schema."""
    import psycopg

    (tmp_path / "pit_items.yaml").write_text(SCHEMA)
    sink = PostgresSink(settings.postgres_dsn, compiled, search_path=pg_schema, retries=2, backoff_s=0.05)
    sink.open()  # applies the DDL (cold table + featureline_schemas row)
    fs = FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn, schemas=tmp_path,
                      search_path=pg_schema)
    conn = psycopg.connect(settings.postgres_dsn, autocommit=True, options=f"-c search_path={pg_schema}")
    try:
        yield fs, sink, conn
    finally:
        conn.close()
        fs.close()
        sink.close()


def _table(compiled: CompiledSchema, rows: list[Row], tag: str) -> pa.Table:
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run-pit",
                     dt.datetime(2025, 1, 1, tzinfo=UTC))
    berlin = ZoneInfo("Europe/Berlin")
    return pa.table({
        "item_id": pa.array([r.entity for r in rows], pa.string()),
        "seen_at": pa.array([r.t.astimezone(berlin) for r in rows], pa.timestamp("us", "Europe/Berlin")),
        "price": pa.array([r.price for r in rows], pa.decimal128(12, 2)),
        "score": pa.array([r.score for r in rows], pa.float64()),
        "label": pa.array([r.label for r in rows], pa.string()),
        **ctx.columns(pa.array([f"file:///pit.parquet#{tag}-{k}" for k in range(len(rows))], pa.string())),
    })


def write_history(sink: PostgresSink, compiled: CompiledSchema, rows: list[Row], units: int) -> None:
    """``rows`` (already shuffled) into the cold table, split into ``units`` write units."""
    bounds = np.linspace(0, len(rows), units + 1).astype(int)
    for k in range(units):
        part = rows[bounds[k]:bounds[k + 1]]
        res = sink.write(WriteUnit(_table(compiled, part, str(k)), REJECTED_ROWS_SCHEMA.empty_table(), None,
                                   len(part)))
        assert (res.stored, res.already_present) == (len(part), 0)


def reference(history: list[Row], queries: list[tuple[str, dt.datetime]],
              max_age: dt.timedelta | None, digest: list[str]) -> list[Row | None]:
    """``digest``: each history row's content digest (the tie-break at one event time)."""
    out: list[Row | None] = []
    for entity, ts in queries:
        best: tuple[dt.datetime, str, Row] | None = None
        for r, d in zip(history, digest, strict=True):
            if r.entity != entity or r.t > ts or (max_age is not None and r.t < ts - max_age):
                continue
            if best is None or (r.t, d) > best[:2]:
                best = (r.t, d, r)
        out.append(None if best is None else best[2])
    return out


def check(got: pa.Table, entity_df: pa.Table, expected: list[Row | None]) -> None:
    n = entity_df.num_rows
    assert got.num_rows == n
    assert got.column_names == [*entity_df.column_names, *FEATURES, "_event_time"]
    # The input columns come back as they went in, in input order.
    for name in entity_df.column_names:
        assert got.column(name).combine_chunks().equals(entity_df.column(name).combine_chunks()), name
    assert got.schema.field("price").type == pa.decimal128(12, 2)
    assert got.schema.field("score").type == pa.float64()
    assert got.schema.field("label").type == pa.string()
    assert got.schema.field("_event_time").type == pa.timestamp("us", "UTC")
    prices = got.column("price").to_pylist()
    # Decimals exactly: same digits and scale, not just numerically equal.
    assert [None if p is None else str(p) for p in prices] == \
        [None if e is None or e.price is None else str(e.price) for e in expected]
    assert got.column("score").to_pylist() == [None if e is None else e.score for e in expected]
    assert got.column("label").to_pylist() == [None if e is None else e.label for e in expected]
    times = got.column("_event_time").to_pylist()
    assert all(t is None or t.utcoffset() == dt.timedelta(0) for t in times)
    assert times == [None if e is None else e.t for e in expected]


# --- strategies -----------------------------------------------------------------------------

_micros = st.integers(0, 40).map(lambda s: s * 1_000_000) | st.integers(0, 40_000_000)
_price = st.none() | st.integers(-10**10 + 1, 10**10 - 1).map(lambda c: Decimal(c).scaleb(-2))
_score = st.none() | st.floats(allow_nan=False, allow_infinity=False)
_label = st.none() | st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=8)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    with_history = draw(st.lists(st.sampled_from(ENTITIES), unique=True, max_size=len(ENTITIES) - 1))
    history: list[Row] = []
    for e in with_history:
        offsets = draw(st.lists(_micros, min_size=1, max_size=8))  # repeats: events at one time
        for off in offsets:
            row = Row(e, BASE + dt.timedelta(microseconds=off), draw(_price), draw(_score), draw(_label))
            if row not in history:  # an exact copy is one event
                history.append(row)
    event_times = [r.t for r in history]
    when = st.one_of(
        st.sampled_from(event_times) if event_times else st.nothing(),           # tie with an event
        (st.sampled_from(event_times) if event_times else st.just(BASE)).flatmap(  # just around one
            lambda t: st.sampled_from([t - dt.timedelta(microseconds=1), t + dt.timedelta(microseconds=1)])),
        _micros.map(lambda us: BASE + dt.timedelta(microseconds=us)),              # anywhere, in gaps
        st.sampled_from([BASE - dt.timedelta(days=1), BASE + dt.timedelta(days=365),  # before/after all
                         dt.datetime(1900, 1, 1, tzinfo=UTC), dt.datetime(2200, 1, 1, tzinfo=UTC)]),
    )
    queries = draw(st.lists(st.tuples(st.sampled_from((*ENTITIES, "zz-unknown")), when), max_size=30))
    max_age = draw(st.none() | st.sampled_from([0, 1, 5]).map(lambda s: dt.timedelta(seconds=s))
                   | st.integers(0, 12_000_000).map(lambda us: dt.timedelta(microseconds=us)))
    if max_age is not None and history:  # exactly at the max_age bound of some event
        queries += [(r.entity, r.t + max_age) for r in draw(st.lists(st.sampled_from(history), max_size=4))]
    if queries and draw(st.booleans()):  # the same (entity, ts) several times
        queries += draw(st.lists(st.sampled_from(queries), max_size=5))
    queries = draw(st.permutations(queries))
    return {
        "history": history,
        "queries": queries,
        "order": draw(st.randoms(use_true_random=False)),
        "units": draw(st.integers(1, 4)),
        "zone": draw(st.sampled_from(ZONES)),
        "max_age": max_age,
        "input": draw(st.sampled_from(["arrow", "chunked", "pandas"])),
    }


def test_historical_equals_brute_force_reference(store: tuple[FeatureStore, PostgresSink, Any],
                                                 compiled: CompiledSchema) -> None:
    fs, sink, conn = store

    @hsettings(max_examples=25, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(scenarios())
    def run(case: dict[str, Any]) -> None:
        conn.execute("TRUNCATE pit_items")
        history: list[Row] = list(case["history"])
        case["order"].shuffle(history)  # out-of-order inserts
        if history:
            write_history(sink, compiled, history, min(case["units"], len(history)))
        zone = case["zone"]
        queries: list[tuple[str, dt.datetime]] = case["queries"]
        entity_df = pa.table({
            "item_id": pa.array([q[0] for q in queries], pa.string()),
            "timestamp": pa.array([q[1].astimezone(ZoneInfo(zone)) for q in queries],
                                  pa.timestamp("us", zone)),
            "row": pa.array(range(len(queries)), pa.int64()),
        })
        given_df: Any = entity_df
        if case["input"] == "chunked":  # an empty first chunk, then pieces
            half = entity_df.num_rows // 2
            given_df = pa.concat_tables([entity_df.slice(0, 0), entity_df.slice(0, half),
                                         entity_df.slice(half)])
        elif case["input"] == "pandas":
            given_df = entity_df.to_pandas()
        got = fs.historical("pit_items", given_df, max_age=case["max_age"])
        if case["input"] == "pandas":  # pandas carries times in ns: compare what the pandas input became
            entity_df = pa.Table.from_pandas(given_df, preserve_index=False)
        digest = digests(_table(compiled, case["history"], "d"), compiled.schema).to_pylist()
        check(got, entity_df, reference(case["history"], queries, case["max_age"], digest))

    run()


def test_historical_feature_subset_and_custom_timestamp_column(
        store: tuple[FeatureStore, PostgresSink, Any], compiled: CompiledSchema) -> None:
    fs, sink, _ = store
    t = [BASE + dt.timedelta(seconds=s) for s in range(3)]
    history = [Row("a", t[2], Decimal("3.00"), 3.0, "late"), Row("a", t[0], Decimal("1.10"), None, "first")]
    write_history(sink, compiled, history, 2)
    entity_df = pa.table({"item_id": ["a", "a", "b"],
                          "as_of": pa.array([t[1], t[2], t[2]], pa.timestamp("us", "UTC"))})
    got = fs.historical("pit_items", entity_df, ["label"], timestamp_column="as_of")
    assert got.column_names == ["item_id", "as_of", "label", "_event_time"]
    assert got.column("label").to_pylist() == ["first", "late", None]
    assert got.column("_event_time").to_pylist() == [t[0], t[2], None]


@pytest.mark.slow
def test_historical_120k_rows_against_200k_history(store: tuple[FeatureStore, PostgresSink, Any],
                                                   compiled: CompiledSchema) -> None:
    """A training-set sized request: one COPY + one query, not a round trip per row. The
    result is checked row by row against a vectorised as-of reference (searchsorted)."""
    fs, sink, _ = store
    rng = np.random.default_rng(7)
    n_entities, n_history, n_queries = 40_000, 200_000, 120_000
    span = 30 * 86_400 * 10**6  # a month, in microseconds
    base_us = int(BASE.timestamp()) * 10**6
    # History: unique (entity, time) keys, in random order, over several write units.
    ent = rng.integers(0, n_entities, n_history)
    off = rng.integers(0, span // 1_000_000, n_history) * 1_000_000 + rng.integers(0, 3, n_history)
    key = ent.astype(np.int64) * span * 2 + off
    key, first = np.unique(key, return_index=True)
    ent, off = ent[first], off[first]
    perm = rng.permutation(len(key))
    ent, off, key = ent[perm], off[perm], key[perm]
    n = len(key)
    names = pc.binary_join_element_wise("E", pc.cast(pa.array(ent), pa.string()), "")
    cents = rng.integers(-10**9, 10**9, n).tolist()
    price = pa.array([Decimal(c).scaleb(-2) if c % 10 else None for c in cents], pa.decimal128(12, 2))
    score = pa.array(rng.normal(size=n), pa.float64(), mask=rng.random(n) < 0.1)
    label = pc.binary_join_element_wise("L", pc.cast(pa.array(rng.integers(0, 1000, n)), pa.string()), "")
    seen = pa.array(base_us + off, pa.int64()).view(pa.timestamp("us", "UTC"))
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run-big",
                     dt.datetime(2025, 1, 1, tzinfo=UTC))
    hist = pa.table({"item_id": names, "seen_at": seen.cast(pa.timestamp("us", "Europe/Berlin")),
                     "price": price, "score": score, "label": label,
                     **ctx.columns(pc.binary_join_element_wise(
                         "file:///big.parquet#", pc.cast(pa.array(np.arange(n)), pa.string()), ""))})
    for lo in range(0, n, 50_000):
        part = hist.slice(lo, 50_000)
        sink.write(WriteUnit(part, REJECTED_ROWS_SCHEMA.empty_table(), None, part.num_rows))

    # Queries: known entities (some before their first event), ties with event times, unknowns.
    q_ent = rng.integers(0, n_entities + 500, n_queries)  # ids >= n_entities have no history
    q_off = rng.integers(-86_400 * 10**6, span + 86_400 * 10**6, n_queries)
    tie = rng.random(n_queries) < 0.2
    pick = rng.integers(0, n, n_queries)
    q_ent[tie], q_off[tie] = ent[pick[tie]], off[pick[tie]]
    q_names = pc.binary_join_element_wise("E", pc.cast(pa.array(q_ent), pa.string()), "")
    entity_df = pa.table({"item_id": q_names, "timestamp": pa.array(base_us + q_off, pa.int64()).view(
        pa.timestamp("us", "UTC")).cast(pa.timestamp("us", "Asia/Tokyo"))})

    t0 = time.perf_counter()
    got = fs.historical("pit_items", entity_df)
    print(f"\nhistorical: {n_queries:,} entity rows against {n:,} history rows in "
          f"{time.perf_counter() - t0:.2f}s")

    # Vectorised reference: sort the history by (entity, time); the as-of row is the last
    # key <= (entity, ts), if it has the same entity.
    order = np.argsort(key, kind="stable")
    skey = key[order]
    q_key = q_ent.astype(np.int64) * span * 2 + q_off
    pos = np.searchsorted(skey, q_key, side="right") - 1
    ok = (pos >= 0) & (q_ent < n_entities)
    ok[ok] = ent[order[pos[ok]]] == q_ent[ok]
    rows_at = np.where(ok, order[np.maximum(pos, 0)], 0)
    mask = pa.array(~ok)

    def expect(col: pa.Array) -> pa.Array:
        taken = col.take(pa.array(rows_at))
        return pc.if_else(mask, pa.scalar(None, taken.type), taken)

    assert got.num_rows == n_queries
    assert got.column("item_id").combine_chunks().equals(q_names)
    assert got.column("price").combine_chunks().equals(expect(price))
    assert got.column("score").combine_chunks().equals(expect(score))
    assert got.column("label").combine_chunks().equals(expect(label))
    assert got.column("_event_time").combine_chunks().equals(expect(seen))
    assert 0.1 < float(np.mean(ok)) < 0.99  # the reference exercises both hits and misses
