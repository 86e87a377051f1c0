"""``features.aggregate.moments`` against Python's own integers and Decimals: the float
fixed point (exact value rounded half to even), the window sums of squares (int64 and
the wide path), the exact numerator ``n * ss - s^2`` rounded once, and the tile states."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from features.aggregate import moments

BIG = st.integers(-(2**61) // 64, 2**61 // 64)


def fixed_ref(x: float, scale: int) -> int:
    return int((Decimal(x) * Decimal(10) ** scale).to_integral_value(ROUND_HALF_EVEN))


#: values whose product with 10^scale rounds to a half in double precision, ties, tiny ones
TRICKY = [5e-7, 1.5e-6, 2.5e-6, -5e-7, 0.5, 1.5, 2.5, -2.5, 0.25, 0.35, 1e-7, 5e-324, -0.0, 0.1, 0.2, 0.3,
          1.0000005, 123.4565, 4503599.6273704955]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e9, 1e9), st.sampled_from(TRICKY),
                          st.integers(-4000, 4000).map(lambda k: k / 4)), max_size=40),
       st.integers(0, 6))
def test_fixed_point_is_the_exact_value_rounded_half_to_even(xs: list[float], scale: int) -> None:
    xs = [x for x in xs if abs(x) * 10**scale < 2**51]
    v = np.array(xs, dtype=np.float64)
    got = moments.fixed_point(v, np.ones(len(v), np.bool_), scale, "agg").tolist()
    assert got == [fixed_ref(x, scale) for x in xs]


def test_fixed_point_corrects_a_rounded_product_and_refuses_what_does_not_fit() -> None:
    # 5e-7 is just below 0.5e-6 in binary, 5e-7 * 1e6 rounds to 0.5: the exact value rounds to 0
    assert 5e-7 * 1e6 == 0.5
    assert moments.fixed_point(np.array([5e-7, 1.5e-6, 2.5]), np.ones(3, np.bool_), 6, "a").tolist() == [
        fixed_ref(5e-7, 6), fixed_ref(1.5e-6, 6), 2_500_000]
    assert moments.fixed_point(np.array([0.5, 1.5, 2.5, -0.5]), np.ones(4, np.bool_), 0, "a").tolist() == [
        0, 2, 2, 0]
    # not counted: never read
    assert moments.fixed_point(np.array([np.nan, 1e300]), np.zeros(2, np.bool_), 6, "a").tolist() == [0, 0]
    with pytest.raises(OverflowError, match=r"aggregation t_sum \(sum of t\): value 10000000000.0 "
                                            r"does not fit scale 6 .* declare a smaller scale on the "
                                            r"aggregation \(scale: 5 keeps"):
        moments.fixed_point(np.array([1.0, 1e10]), np.ones(2, np.bool_), 6, "aggregation t_sum (sum of t)")
    with pytest.raises(OverflowError, match="not a finite number"):
        moments.fixed_point(np.array([np.nan]), np.ones(1, np.bool_), 6, "a")


def _windows(n: int, data: st.DataObject) -> np.ndarray:
    lo = sorted(data.draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=n, max_size=n)))
    return np.minimum(np.array(lo, dtype=np.int64), np.arange(n))


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from([st.integers(-1000, 1000), st.integers(-(2**31), 2**31), BIG]))
def test_window_moments_and_variance_are_exact(data: st.DataObject, values: st.SearchStrategy[int]) -> None:
    xs = data.draw(st.lists(values, max_size=60))
    n = len(xs)
    x = np.array(xs, dtype=np.int64)
    lo = _windows(n, data)
    pos = np.arange(n)
    ss_hi, ss_lo = moments.window_squares(x, lo, max(n, 1))
    cnt = (pos - lo + 1).astype(np.int64)
    s = np.array([sum(xs[lo[i]: i + 1]) for i in range(n)], dtype=np.int64)
    for i in range(n):
        want = sum(v * v for v in xs[lo[i]: i + 1])
        assert (int(ss_hi[i]) << 62) + int(ss_lo[i]) == want
        assert 0 <= ss_lo[i] < 2**62
    num = moments.numerator(cnt, s, ss_hi, ss_lo)
    for i in range(n):
        exact = int(cnt[i]) * ((int(ss_hi[i]) << 62) + int(ss_lo[i])) - int(s[i]) ** 2
        assert num[i] == float(exact)  # Python's int -> float is correctly rounded
    for sample in (False, True):
        var, null = moments.variance(cnt, s, ss_hi, ss_lo, 2, sample=sample)
        for i in range(n):
            c = int(cnt[i])
            if sample and c < 2:
                assert null[i]
                continue
            exact = c * sum(v * v for v in xs[lo[i]: i + 1]) - sum(xs[lo[i]: i + 1]) ** 2
            assert var[i] == float(exact) / float(c * (c - 1) if sample else c * c) / 1e4


def _limbs(values: list[int]) -> np.ndarray:
    return np.array([[(v >> (31 * k)) & ((1 << 31) - 1) for v in values] for k in range(5)], dtype=np.int64)


#: around powers of two and at the ties of a double's 53 bits, with and without a low bit
EDGES = st.builds(lambda k, d, low: max(0, (1 << k) + d * (1 << max(k - 53, 0)) + low),
                  st.integers(0, 154), st.integers(-2, 2), st.sampled_from([-1, 0, 1]))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 2**155 - 1), EDGES), min_size=1, max_size=20))
def test_wide_integers_round_to_the_nearest_double(values: list[int]) -> None:
    values = [v for v in values if v < 2**155]
    assert moments._to_float(_limbs(values)).tolist() == [float(v) for v in values]


def test_numerator_rounds_once_where_two_roundings_would_not() -> None:
    # 2^100 + 2^47 + 1: its top 53 bits end in a tie that only the lowest bit breaks
    exact = (1 << 100) + (1 << 47) + 1
    limbs = np.array([[(exact >> (31 * k)) & ((1 << 31) - 1)] for k in range(5)], dtype=np.int64)
    assert moments._to_float(limbs)[0] == float(exact) != float((1 << 100) + (1 << 47))
    assert moments._to_float(np.zeros((5, 1), np.int64))[0] == 0.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(BIG, max_size=20), max_size=6))
def test_tile_states_merge_to_the_raw_parts_of_all_their_events(tiles: list[list[int]]) -> None:
    import json

    states = [json.loads(json.dumps(moments.state(t))) for t in tiles]  # JSON-able
    for st_ in states:
        assert all(-(2**63) <= v < 2**63 for v in st_)
    merged = moments.merge(states)
    everything = [v for t in tiles for v in t]
    assert merged["n"] == len(everything) and merged["s"] == sum(everything)
    assert (merged["ss_hi"] << 62) + merged["ss_lo"] == sum(v * v for v in everything)
    # and finalize as the engine does
    parts = [np.array([merged[p]], dtype=np.int64) for p in moments.PARTS]
    var, null = moments.variance(*parts, 0, sample=False)
    if everything:
        n = len(everything)
        exact = n * sum(v * v for v in everything) - sum(everything) ** 2
        assert not null[0] and var[0] == float(exact) / float(n * n)
        assert math.isfinite(var[0])
    else:
        assert null[0]


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from([BIG, st.floats(-1e6, 1e6)]))
def test_first_states_merge_to_the_oldest_value(data: st.DataObject,
                                                values: st.SearchStrategy[object]) -> None:
    import itertools
    import json

    events = data.draw(st.lists(st.tuples(st.integers(0, 10**12), values), max_size=30,
                                unique_by=lambda e: e[0]))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(events)), max_size=4)))
    bounds = [0, *cuts, len(events)]
    tiles = [events[a:b] for a, b in itertools.pairwise(bounds)]
    states = [json.loads(json.dumps(moments.first_state([e[0] for e in t], np.array([e[1] for e in t]))
                                    if t else None)) for t in tiles]
    got = moments.merge_first(states)["v"]
    assert got == (min(events)[1] if events else None)
