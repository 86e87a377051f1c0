"""One row's finalize in Python values (``features.aggregate.one_row.finalize_row``)
equals the vectorised ``finalize``'s row, value and type (a Decimal's exponent
included), on random raw parts of every function and field type it computes itself, on
empty windows, and through the fallback for the functions it leaves to ``finalize``; a
one-entity read of the tiles (``tiles.row_at``) equals the several-entity read's row."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from features.aggregate.engine import RAW_PARTS, AggSpec, extract, finalize
from features.aggregate.one_row import finalize_row
from features.aggregate.tilepack import pack_summary_set
from features.aggregate.tiles import EntityTiles, TileSpec, build, fields_to_read, row_at, values_at
from features.compile import compile_schema
from features.lineage import DIGEST
from features.schema import parse_schema

FIELDS = {"i32": "int32", "i64": "int64", "f32": "float32", "f64": "float64", "dec": "decimal(12,2)",
          "dec0": "decimal(18,0)"}
SCHEMA = """
name: rows
version: 1.0.0
entity: card
event_time: ts
fields:
  - {name: card, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(us, UTC)", constraints: {required: true}}
%s
aggregations:
  allowed_lateness: 1h
  features:
    - {name: n, function: count, window: 2h, store: [hot]}
    - {name: kinds, function: count_distinct, of: i32, window: 2h, store: [hot]}
%s
"""


def schema_text(extra: str = "") -> str:
    fields = "\n".join(f"  - {{name: {n}, type: \"{t}\", constraints: {{nullable: true}}}}"
                       for n, t in FIELDS.items())
    aggs = []
    for n in FIELDS:
        for f in ("sum", "mean", "min", "max", "first", "last"):
            scale = ", scale: 3" if n.startswith("f") and f in ("sum", "mean") else ""
            aggs.append(f"    - {{name: {f}_{n}, function: {f}, of: {n}{scale}, window: 2h, store: [hot]}}")
    return SCHEMA % (fields, "\n".join(aggs) + extra)


SPEC = AggSpec.of(compile_schema(parse_schema(schema_text())).schema)
assert SPEC is not None
#: with a ratio and a stddev: finalize_row leaves the row to the vectorised finalize
OTHER = AggSpec.of(compile_schema(parse_schema(schema_text(
    "\n    - {name: sd, function: stddev, of: i64, window: 2h, store: [hot]}"
    "\n    - {name: per, function: ratio, numerator: sum_dec, denominator: n, on_zero: -1.0, store: [hot]}"
))).schema)
assert OTHER is not None


#: the values a raw part may take: a value of the field's type for min/max/first/last
#: (float32 values exactly representable, decimals within their precision), any int64
#: for sums (a decimal sum's precision is 38)
VALUES: dict[str, list[Any]] = {
    "f32": [0.0, -0.0, 2.5, -3.75, float(np.float32(0.1)), float(np.float32(-1e30))],
    "f64": [0.0, -0.0, 1e-7, 2.5, -3.75, 0.1, 1e300, -5e-324],
    "i32": [0, 1, -1, 2**31 - 1, -2**31],
    "dec": [0, 1, -1, 12345, 10**12 - 1, -(10**12 - 1)],
    "dec0": [0, 7, -7, 10**18 - 1],
    "sum": [0, 1, -1, 5, 12345, -987654321, 2**53 + 1, 2**62, -2**63],
}


def random_raw(spec: AggSpec, rng: np.random.Generator) -> dict[str, tuple[Any, bool]]:
    """Raw parts as ``tiles._one`` gives them: ints (a float field's min/max/first/last a
    float), each valid or not; counts sometimes 0 (an empty window)."""
    raw: dict[str, tuple[Any, bool]] = {}
    for agg in spec.windowed:
        if agg.function == "stddev":  # consistent moments: none, or the values 1 and 2 (n, Σx, Σx²)
            n, sx, ss = [(0, 0, 0), (2, 3, 5)][int(rng.integers(2))]
            raw.update({f"{agg.name}.n": (n, True), f"{agg.name}.s": (sx, True),
                        f"{agg.name}.ss_hi": (0, True), f"{agg.name}.ss_lo": (ss, True)})
            continue
        for part in RAW_PARTS[agg.function]:
            if part in ("n", "d"):
                pool = [0, 1, 2, 3, 7, 10**6]
            elif part == "v":
                assert agg.of is not None
                pool = VALUES.get(agg.of, VALUES["sum"])
            else:
                pool = VALUES["sum"]
            raw[f"{agg.name}.{part}"] = (pool[int(rng.integers(len(pool)))], bool(rng.random() < 0.8))
    return raw


def vectorised(spec: AggSpec, raw: dict[str, tuple[Any, bool]]) -> dict[str, Any]:
    arrays = {k: (np.asarray([v]), np.asarray([ok])) for k, (v, ok) in raw.items()}
    return {k: col.to_pylist()[0] for k, col in finalize(spec, arrays).items()}


def same(a: Any, b: Any) -> bool:
    """Equal value and type (repr: a Decimal's exponent, a float's sign of zero)."""
    return type(a) is type(b) and repr(a) == repr(b)


@pytest.mark.parametrize("seed", range(40))
def test_one_row_equals_the_vectorised_finalize(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for spec in (SPEC, OTHER):
        assert spec is not None
        raw = random_raw(spec, rng)
        got, want = finalize_row(spec, raw), vectorised(spec, raw)
        assert list(got) == list(want)
        bad = {k: (got[k], want[k]) for k in want if not same(got[k], want[k])}
        assert not bad, bad


def test_an_empty_window_in_one_row() -> None:
    assert SPEC is not None
    raw = {f"{a.name}.{p}": ((0, True) if p in ("n", "s", "d") else (0, False))
           for a in SPEC.windowed for p in RAW_PARTS[a.function]}
    got = finalize_row(SPEC, raw)
    assert got == vectorised(SPEC, raw)
    assert got["n"] == 0 and got["mean_i64"] is None and got["max_f64"] is None
    assert repr(got["sum_dec"]) == "Decimal('0.00')" and got["sum_f32"] == 0.0


# --------------------------------------------------------------------------- the tiles' one-entity read

TILES = """
name: one
version: 1.0.0
entity: card
event_time: ts
fields:
  - {name: card, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(us, UTC)", constraints: {required: true}}
  - {name: kind, type: string, constraints: {nullable: true}}
  - {name: amount, type: "decimal(12,2)", constraints: {nullable: true}}
  - {name: score, type: float64, constraints: {nullable: true}}
  - {name: qty, type: int32, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 1h
  features:
    - {name: n_2h, function: count, window: 2h, store: [hot]}
    - {name: a_2h, function: count, where: {kind: a}, window: 2h, store: [hot]}
    - {name: amount_sum, function: sum, of: amount, window: 2h, store: [hot]}
    - {name: amount_mean, function: mean, of: amount, window: 90m, store: [hot]}
    - {name: amount_max, function: max, of: amount, where: {kind: b}, window: 2h, store: [hot]}
    - {name: score_min, function: min, of: score, window: 2h, store: [hot]}
    - {name: score_first, function: first, of: score, window: 2h, store: [hot]}
    - {name: score_last, function: last, of: score, window: {size: 1h, type: tumbling}, store: [hot]}
    - {name: score_sum, function: sum, of: score, scale: 2, window: 2h, store: [hot]}
    - {name: score_mean, function: mean, of: score, where: {kind: a}, window: 30m, store: [hot]}
    - {name: qty_last, function: last, of: qty, window: 2h, store: [hot]}
    - {name: qty_min, function: min, of: qty, window: 45m, store: [hot]}
    - {name: ratio, function: ratio, numerator: a_2h, denominator: n_2h, on_zero: 0.0, store: [hot]}
"""
ONE = TileSpec.of(AggSpec.of(compile_schema(parse_schema(TILES)).schema))
assert ONE is not None and ONE.simple
MIN = 60_000_000
T0 = 1_767_225_600_000_000


def history(rng: np.random.Generator, n: int) -> pa.Table:
    from decimal import Decimal

    ts = T0 + rng.integers(0, 5 * 60 * MIN, n)
    ts = np.where(rng.random(n) < 0.5, ts // MIN * MIN, ts)  # on minutes (and tile edges) too
    ts[: n // 4] = ts[n // 4: 2 * (n // 4)]  # ties at one instant
    null = rng.random(n) < 0.15
    return pa.table({
        "card": pa.array(rng.choice(["c1", "c2"], n)), "ts": pa.array(ts, pa.timestamp("us", "UTC")),
        "kind": pa.array([None if x == "-" else x for x in rng.choice(["a", "b", "-"], n)]),
        "amount": pa.array([None if z else Decimal(int(v)).scaleb(-2) for v, z in
                            zip(rng.integers(-10**6, 10**6, n), null, strict=True)], pa.decimal128(12, 2)),
        "score": pa.array(np.where(null[::-1], np.nan, rng.normal(0, 100, n).round(3)), from_pandas=True),
        "qty": pa.array(rng.integers(-1000, 1000, n).astype(np.int32), mask=rng.random(n) < 0.1),
        "_source": pa.array(["test"] * n),
        DIGEST: pa.array([f"{int(x):016x}" for x in rng.integers(0, 2**62, n)])})


def read_back(tspec: TileSpec, rows: Any, t_us: int) -> dict[str, EntityTiles]:
    """What a read at ``t_us`` fetches of the built tiles ``rows``, per entity."""
    _, edges = fields_to_read(tspec, t_us)
    held = {e: EntityTiles(None, None, {}) for e in ("c1", "c2")}
    summaries: dict[str, tuple[list[int], list[bytes]]] = {e: ([], []) for e in held}
    for e, s, summary, evs in zip(rows.entity.to_pylist(), rows.start_us.tolist(),
                                  rows.summary.to_pylist(), rows.events.to_pylist(), strict=True):
        summaries[e][0].append(s)  # every tile's summary in the one packed field, as Redis holds it
        summaries[e][1].append(summary)
        if s in edges:
            held[e].events[s] = evs
    for e, (starts, blobs) in summaries.items():
        held[e].summaries = pack_summary_set(starts, blobs) or None
    return held


@pytest.mark.parametrize("seed", range(12))
def test_a_one_entity_read_equals_the_read_of_several(seed: int) -> None:
    """``row_at`` (one entity: contiguous sums, edge pieces from the events, one-row
    finalize) equals that entity's row of ``values_at`` over two entities (the general
    merge, the vectorised finalize), at request times inside, between and after the events."""
    assert ONE is not None
    rng = np.random.default_rng(seed)
    table = history(rng, int(rng.integers(1, 60)))
    inputs = extract(ONE.spec, table)
    rows = build(ONE, inputs, np.ones(len(inputs), np.bool_))
    times = [T0 - 1, T0 + 6 * 60 * MIN, *(T0 + rng.integers(0, 6 * 60 * MIN, 6)).tolist(),
             *(int(t) for t in rng.choice(np.asarray(inputs.time_us), 3))]
    for t_us in times:
        held = read_back(ONE, rows, t_us)
        both = {k: v.to_pylist() for k, v in values_at(ONE, [held["c1"], held["c2"]], t_us).items()}
        for i, e in enumerate(("c1", "c2")):
            got = row_at(ONE, held[e], t_us)
            assert got is not None
            want = {k: v[i] for k, v in both.items()}
            bad = {k: (got[k], want[k]) for k in want if not same(got[k], want[k])}
            assert not bad, (t_us, e, bad)


SKETCHED = TileSpec.of(AggSpec.of(compile_schema(parse_schema(TILES + """\
    - {name: kinds_approx, function: approx_count_distinct, of: kind, window: 2h, store: [hot]}
    - {name: score_pcts, function: approx_percentile, of: score, q: [0.5, 0.9], window: 90m, store: [hot]}
    - {name: kinds_per_event, function: ratio, numerator: kinds_approx, denominator: n_2h, on_zero: 0.0,
       store: [hot]}
""")).schema))


@pytest.mark.parametrize("seed", range(4))
def test_a_one_entity_read_with_sketches_takes_the_general_read(seed: int) -> None:
    """Sketches in the tiles: ``row_at`` declines (None: the caller takes ``values_at``),
    and ``values_at`` of one entity equals its row of the read of several."""
    assert SKETCHED is not None and not SKETCHED.simple
    rng = np.random.default_rng(seed)
    table = history(rng, int(rng.integers(1, 60)))
    inputs = extract(SKETCHED.spec, table)
    rows = build(SKETCHED, inputs, np.ones(len(inputs), np.bool_))
    seen = False
    for t_us in [T0 + 6 * 60 * MIN, *(int(t) for t in rng.choice(np.asarray(inputs.time_us), 3))]:
        held = read_back(SKETCHED, rows, t_us)
        both = {k: v.to_pylist() for k, v in values_at(SKETCHED, [held["c1"], held["c2"]], t_us).items()}
        seen |= any(v is not None and v != 0 for v in both["kinds_approx"] + both["score_pcts"])
        for i, e in enumerate(("c1", "c2")):
            assert row_at(SKETCHED, held[e], t_us) is None
            got = {k: v.to_pylist()[0] for k, v in values_at(SKETCHED, [held[e]], t_us).items()}
            want = {k: v[i] for k, v in both.items()}
            bad = {k: (got[k], want[k]) for k in want if not same(got[k], want[k])}
            assert not bad, (t_us, e, bad)
    assert seen  # not vacuous: some window holds a sketch's value


@pytest.mark.parametrize("seed", range(4))
def test_a_one_entity_read_of_counts_takes_the_fast_read_beside_a_sketch(seed: int) -> None:
    """The fast read is judged on the aggregations requested, not on the whole schema: in
    tiles holding sketches and a ratio, ``row_at`` of counts, sums, means, min/max,
    first/last (a subset, in any order) gives exactly those columns, equal to the general
    read of several entities; a subset naming a sketch or the ratio declines."""
    assert SKETCHED is not None and not SKETCHED.simple
    names = ("score_last", "n_2h", "amount_mean", "amount_max", "score_sum", "a_2h")
    assert SKETCHED.one_for(names) is not None
    assert SKETCHED.one_for(("n_2h", "kinds_approx")) is None
    assert SKETCHED.one_for(("kinds_per_event",)) is None
    assert SKETCHED.one_for(("no_such",)) is None
    rng = np.random.default_rng(100 + seed)
    table = history(rng, int(rng.integers(1, 60)))
    inputs = extract(SKETCHED.spec, table)
    rows = build(SKETCHED, inputs, np.ones(len(inputs), np.bool_))
    nonzero = False
    for t_us in [T0 - 1, T0 + 6 * 60 * MIN, *(T0 + rng.integers(0, 6 * 60 * MIN, 3)).tolist(),
                 *(int(t) for t in rng.choice(np.asarray(inputs.time_us), 3))]:
        held = read_back(SKETCHED, rows, t_us)
        both = {k: v.to_pylist() for k, v in values_at(SKETCHED, [held["c1"], held["c2"]], t_us).items()}
        for i, e in enumerate(("c1", "c2")):
            got = row_at(SKETCHED, held[e], t_us, names)
            assert got is not None and sorted(got) == sorted(names)
            assert row_at(SKETCHED, held[e], t_us, ("n_2h", "score_pcts")) is None
            bad = {k: (got[k], both[k][i]) for k in names if not same(got[k], both[k][i])}
            assert not bad, (t_us, e, bad)
            nonzero |= got["n_2h"] > 0
    assert nonzero  # not vacuous: some window holds events
