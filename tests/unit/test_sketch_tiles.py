"""The sketches' tile states (``features.aggregate.sketch_tiles``, issue 49): packed
states unpack to what was packed (each HyperLogLog mode: the exact list, sparse and
dense registers; percentile bucket codes at the extremes of every accuracy), and merging
the states of any cut of a window's events into tiles and edge pieces gives the engine's
value (``features.aggregate.request_time.at_times``): the exact-while-small list's
switch to registers included."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tilepack import SCHEMA as PACKED
from test_tilepack import engine as engine_at
from test_tilepack import read as read_tiles

from features.aggregate.engine import AggSpec, extract
from features.aggregate.sketch_tiles import (
    CODE_OFFSET,
    code_keys,
    decode,
    hll_raw,
    hll_states,
    key_codes,
    percentile_keys,
    percentile_states,
)
from features.aggregate.sketches import (
    bucket_keys,
    hash64,
    hll_estimate,
    hll_state,
    hll_state_estimate,
    percentile_state,
    registers,
    sparse_max,
)
from features.aggregate.tilepack import sketch_parts, unpack_summaries, variable_parts
from features.aggregate.tiles import TileSpec, build
from features.compile import compile_schema
from features.lineage import DIGEST
from features.schema import parse_schema
from features.schema.model import Aggregation

#: test_tilepack's schema (every other function) with an int64 field and the sketches
SCHEMA = PACKED.replace(
    "  - {name: score, type: float64, constraints: {nullable: true}}\n",
    "  - {name: score, type: float64, constraints: {nullable: true}}\n"
    "  - {name: qty, type: int64, constraints: {nullable: true}}\n") + """\
    - {name: kinds_approx, function: approx_count_distinct, of: kind, precision: 4, window: 2h, store: [hot]}
    - {name: qty_approx, function: approx_count_distinct, of: qty, where: {kind: [a, b]}, precision: 5,
       window: {size: 1h, type: tumbling}, store: [hot]}
    - {name: amount_p50, function: approx_percentile, of: amount, q: 0.5, window: 90m, store: [hot]}
    - {name: score_pcts, function: approx_percentile, of: score, q: [0, 0.25, 0.9, 1],
       relative_accuracy: 0.05, window: 2h, store: [hot]}
    - {name: qty_p99, function: approx_percentile, of: qty, q: 0.99, where: {kind: a}, window: 2h,
       store: [hot]}
    - {name: kinds_per_event, function: ratio, numerator: kinds_approx, denominator: n_2h, on_zero: -1.0,
       store: [hot]}
"""
SPEC = AggSpec.of(compile_schema(parse_schema(SCHEMA)).schema)
assert SPEC is not None
TSPEC = TileSpec.of(SPEC)
assert TSPEC is not None
MIN = 60_000_000
T0 = 1_767_225_600_000_000


def agg(name: str) -> Aggregation:
    assert SPEC is not None
    return next(a for a in SPEC.aggregations.features if a.name == name)


# --------------------------------------------------------------------------- packing


@pytest.mark.parametrize("p", [4, 6, 12])
def test_hyperloglog_states_round_trip_in_each_mode(p: int) -> None:
    """Groups of 0, 1, ``2^p / 8`` and ``2^p / 8 + 1`` distinct values, and many (sparse
    registers, then dense), with duplicates: the exact list is the sorted distinct hashes,
    the registers those of ``sketches.hll_state``; sizes as documented."""
    m = 1 << p
    rng = np.random.default_rng(p)
    sizes = [0, 1, sparse_max(p), sparse_max(p) + 1, m // 6, 4 * m]
    values = [rng.integers(-2**62, 2**62, size, dtype=np.int64) for size in sizes]
    values = [np.concatenate([v, v[: len(v) // 3]]) for v in values]  # duplicates
    row = np.concatenate([np.full(len(v), i, np.int64) for i, v in enumerate(values)])
    h = hash64(pa.array(np.concatenate(values)))
    packed = hll_states(row, h, len(values), p).to_pylist()
    a = Aggregation(name="x", function="approx_count_distinct", store=frozenset({"hot"}), of="v", precision=p)
    modes = []
    for v, blob in zip(values, packed, strict=True):
        hashes, regs = decode(a, blob)
        want_hashes, want_regs = hll_state(pa.array(v), p)
        if want_hashes is not None:
            assert blob[0] == 0 and regs is None and hashes.tolist() == want_hashes.tolist()
            assert len(blob) == 1 + 8 * len(want_hashes)
        else:
            assert hashes is None and regs.tolist() == want_regs.tolist()
            nz = int(np.count_nonzero(want_regs))
            assert (blob[0], len(blob)) == ((1, 1 + 4 * nz) if 4 * nz < m else (2, 1 + m))
        modes.append(blob[0])
    assert modes[:3] == [0, 0, 0] and modes[3] in (1, 2) and modes[5] == 2
    assert modes[4] == (1 if p == 12 else 0 if p == 4 else modes[4])  # p = 12: 682 distinct, sparse


def test_percentile_codes_keep_the_keys_and_their_order() -> None:
    """Every finite double at the finest and the coarsest accuracy: the packed code fits
    an int32, maps back to its key and orders as keys do."""
    tiny = np.nextafter(0.0, 1.0)
    x = np.array([0.0, -0.0, tiny, -tiny, 2.2250738585072014e-308, 1e-300, 0.5, 1.0, 3.0, 1e300,
                  np.finfo(np.float64).max, -np.finfo(np.float64).max, -1.0, -7.5])
    for a in (0.001, 0.01, 0.25):
        keys = bucket_keys(x, a)
        codes = key_codes(keys)
        assert (np.abs(codes) < 2**31).all() and ((codes == 0) == (keys == 0)).all()
        assert code_keys(codes).tolist() == keys.tolist()
        assert (np.argsort(codes, kind="stable") == np.argsort(keys, kind="stable")).all()
    assert CODE_OFFSET == 2**21


def test_percentile_states_round_trip() -> None:
    rng = np.random.default_rng(7)
    xs = [np.zeros(0), np.array([0.0, -0.0, 5.0]), rng.normal(0, 1e6, 5000), rng.integers(-3, 3, 200) * 1.0]
    row = np.concatenate([np.full(len(v), i, np.int64) for i, v in enumerate(xs)])
    keys = bucket_keys(np.concatenate(xs), 0.01)
    a = Aggregation(name="x", function="approx_percentile", store=frozenset({"hot"}), of="v", q=0.5,
                    relative_accuracy=0.01)
    for v, blob in zip(xs, percentile_states(row, keys, len(xs)).to_pylist(), strict=True):
        got_keys, got_counts = decode(a, blob)
        want_keys, want_counts = percentile_state(v, 0.01)
        assert got_keys.tolist() == want_keys.tolist() and got_counts.tolist() == want_counts.tolist()
        assert len(blob) == 8 * len(want_keys)


def test_summaries_hold_the_sketch_states_beside_the_other_parts() -> None:
    """The sketch states sit between the fixed parts and the text parts: each unpacks
    to the state of the tile's counted events, and the text parts still read back."""
    assert TSPEC is not None
    table = events(HISTORY)
    inputs = extract(TSPEC.spec, table)
    rows = build(TSPEC, inputs, np.ones(len(inputs), np.bool_))
    layout = TSPEC.layout
    assert layout.sketches == ("kinds_approx.hll", "qty_approx.hll", "amount_p50.pct", "score_pcts.pct",
                               "qty_p99.pct")
    got = unpack_summaries(layout, rows.summary.to_pylist())
    entity, start = rows.entity.to_pylist(), rows.start_us.tolist()
    for i, tail in enumerate(got.tails):
        states, _ = sketch_parts(layout, tail)
        mine = [r for r in HISTORY[:-1]
                if r[0] == entity[i] and r[1] // TSPEC.size_us * TSPEC.size_us == start[i]]
        kinds = pa.array(sorted({r[2] for r in mine if r[2] is not None}))
        assert decode(agg("kinds_approx"), states["kinds_approx.hll"])[0].tolist() == \
            hll_state(kinds, 4)[0].tolist()  # type: ignore[union-attr]
        scores = np.array([r[5] for r in mine if r[5] is not None], np.float64)
        k, c = decode(agg("score_pcts"), states["score_pcts.pct"])
        wk, wc = percentile_state(scores, 0.05)
        assert k.tolist() == wk.tolist() and c.tolist() == wc.tolist()
        texts = variable_parts(layout, tail)
        assert sorted(texts["kinds.set"]) == sorted(kinds.to_pylist())


# --------------------------------------------------------------------------- reading


def events(rows: list[tuple[str, int, str | None, str | None, int | None, float | None, str]]) -> pa.Table:
    cards, ts, kinds, amounts, qtys, scores, digests = zip(*rows, strict=True)
    return pa.table({
        "card": pa.array(cards), "ts": pa.array(ts, pa.timestamp("us", "UTC")), "kind": pa.array(kinds),
        "amount": pa.array([Decimal(a) if a is not None else None for a in amounts], pa.decimal128(12, 2)),
        "qty": pa.array(qtys, pa.int64()), "score": pa.array(scores, pa.float64()),
        "_source": pa.array(["test"] * len(rows)), DIGEST: pa.array(digests)})


def read(table: pa.Table, entities: list[str], t_us: int) -> dict[str, list[Any]]:
    return read_tiles(table, entities, t_us, TSPEC)


def engine(table: pa.Table, entities: list[str], t_us: int) -> dict[str, list[Any]]:
    return engine_at(table, entities, t_us, TSPEC)


HISTORY = [
    ("c1", T0 + 5 * MIN, "a", "10.50", 3, 1.5, "00000000000000a1"),
    ("c1", T0 + 5 * MIN, "b", "-3.25", 4, 7.25, "00000000000000a2"),   # a tie
    ("c1", T0 + 20 * MIN, "c", "0.00", None, -0.0, "00000000000000a3"),
    ("c1", T0 + 40 * MIN, None, None, None, None, "00000000000000b1"),  # nulls: counted by n_2h only
    ("c1", T0 + 41 * MIN, "d", "7.00", 9, 1e12, "00000000000000b2"),
    ("c1", T0 + 70 * MIN, "a", "2.00", 3, -4.0, "00000000000000c1"),
    ("c1", T0 + 71 * MIN, "", "1.00", -2**63, 0.125, "00000000000000c2"),  # an empty text is a value
    ("c2", T0 + 30 * MIN, "b", "99.99", 2**63 - 1, 3.0, "00000000000000d1"),
    ("c1", T0 + 5 * MIN, "a", "10.50", 3, 1.5, "00000000000000a1"),    # an exact copy: once
]


@pytest.mark.parametrize("t_us", [T0 - 1, T0 + 5 * MIN, T0 + 20 * MIN, T0 + 41 * MIN, T0 + 70 * MIN,
                                  T0 + 71 * MIN, T0 + 125 * MIN - 1, T0 + 125 * MIN, T0 + 4 * 60 * MIN])
def test_a_read_of_sketch_tiles_equals_the_engine(t_us: int) -> None:
    """kinds_approx (p = 4: exact up to 2 distinct kinds, registers beyond) and the
    percentiles, several entities in one read and one at a time."""
    ids = ["c1", "c2", "nobody"]
    history = events(HISTORY[:-1])
    assert read(events(HISTORY), ids, t_us) == engine(history, ids, t_us)
    for one in ids:
        assert read(events(HISTORY), [one], t_us) == engine(history, [one], t_us), one


@settings(max_examples=60, deadline=None)
@given(data=st.data(), p=st.sampled_from([4, 5, 6]))
def test_merging_any_cut_of_the_states_is_the_state_of_all(data: st.DataObject, p: int) -> None:
    """Values around the exact-while-small limit, cut into tile states (packed) and edge
    pieces (hash lists) in any way: the merged raw parts give the value of the state of
    all the values, and the registers of every cut are those of all."""
    limit = sparse_max(p)
    pool = data.draw(st.integers(1, 4 * limit + 3))
    values = data.draw(st.lists(st.integers(0, pool), max_size=6 * limit))
    cut = data.draw(st.lists(st.integers(0, 4), min_size=len(values), max_size=len(values)))
    h = hash64(pa.array(values, pa.int64())) if values else np.zeros(0, np.uint64)
    a = Aggregation(name="x", function="approx_count_distinct", store=frozenset({"hot"}), of="v", precision=p)
    groups = np.asarray(cut, np.int64)
    tiles = groups < 3   # groups 0..2: packed tile states; 3, 4: edge pieces' hash lists
    packed = hll_states(groups[tiles], h[tiles], 3, p).to_pylist()
    states = [decode(a, b) for b in packed] + [(np.unique(h[groups == g]), None) for g in (3, 4)]
    d, nz, w = hll_raw(states, p)
    whole = hll_state(pa.array(values, pa.int64()), p)
    assert int(hll_estimate(np.array([d]), np.array([nz]), np.array([w]), p)[0]) == \
        hll_state_estimate(whole, p)
    if whole[0] is None:  # registers: nz, w are the registers' own
        regs = np.zeros(1 << p, np.int64)
        reg, rho = registers(np.unique(h), p)
        np.maximum.at(regs, reg, rho)
        assert nz == int(np.count_nonzero(regs))
        assert w == int(sum(1 << (63 - p - int(r)) for r in regs if r > 0))
    else:
        assert d == len(np.unique(h))


def test_percentile_keys_of_merged_states() -> None:
    """The bucket of rank floor(q (n - 1)) of the merged counts; None without values."""
    assert percentile_keys([], (0.5,)) is None
    assert percentile_keys([(np.zeros(0, np.int64), np.zeros(0, np.int64))], (0.5,)) is None
    x = np.array([5.0, 1.0, 3.0, 3.0, 2.0, 100.0])
    states = [percentile_state(x[:2], 0.01), percentile_state(x[2:], 0.01)]
    want = [bucket_keys(np.sort(x), 0.01)[int(np.floor(q * 5))] for q in (0, 0.5, 0.99, 1)]
    assert percentile_keys(states, (0, 0.5, 0.99, 1)) == [int(k) for k in want]
