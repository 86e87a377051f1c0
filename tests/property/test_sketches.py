"""The sketches (``features.aggregate.sketches``): the documented hash, the windowed raw
parts against a naive register/sort reference, bit-identical values under every
permutation and split into parts (adversarial multisets: all equal, all distinct, heavy
skew, nulls), NaN refused, and the documented errors (distinct counts within 3 standard
errors in >= 99% of 1,000 trials; percentiles within the relative accuracy always)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from aggregate_reference import splitmix64
from hypothesis import given, settings
from hypothesis import strategies as st

from features.aggregate import sketches as sk
from features.aggregate.engine import _distinct_counts

M64 = (1 << 64) - 1


def _fnv(s: str) -> int:
    h = 0xCBF29CE484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def test_the_hash_is_the_documented_one() -> None:
    ints = [0, 1, -1, 7, 2**62, -(2**63)]
    got = sk.hash64(pa.array(ints, pa.int64())).tolist()
    assert got == [splitmix64(i & M64) for i in ints]
    assert sk.hash64(pa.array([7], pa.int32())).tolist() == got[3:4]  # widening changes nothing
    words = ["", "a", "foobar", "é"]
    assert sk.hash64(pa.array(words)).tolist() == [splitmix64(_fnv(s)) for s in words]
    assert sk.hash64(pa.array(words).dictionary_encode()).tolist() == [splitmix64(_fnv(s)) for s in words]
    f = sk.hash64(pa.array([1.5, -0.0, 0.0])).tolist()
    assert f[1] == f[2]
    assert f[0] == splitmix64(int(np.array([1.5]).view(np.uint64)[0]))


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        sk.hash64(pa.array([1.0, float("nan")]))
    with pytest.raises(ValueError, match="NaN"):
        sk.bucket_keys(np.array([1.0, np.nan]), 0.01)
    with pytest.raises(ValueError, match="inf"):
        sk.bucket_keys(np.array([np.inf]), 0.01)


def _windows(rng: np.random.Generator, n: int, entities: int, span: int, size: int) -> tuple[Any, Any, Any]:
    codes = np.sort(rng.integers(0, entities, n))
    t = np.concatenate([np.sort(rng.integers(0, span, int((codes == c).sum()))) for c in range(entities)])
    key = codes * (10 * span) + t
    lo = np.searchsorted(key, codes * (10 * span) + t - size, side="right").astype(np.int64)
    return codes.astype(np.int64), t, lo


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hll_windows_equal_the_registers_of_each_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, p = 1500, 5
    codes, _, lo = _windows(rng, n, 4, 800, 120)
    values = pa.array(rng.integers(0, 200, n), mask=rng.random(n) < 0.1)
    mask = np.asarray(values.is_valid()) & (rng.random(n) < 0.9)
    h = sk.hash64(values)
    nz, w = sk.hll_windows(codes, h, mask, lo, p)
    d = _distinct_counts(codes, h.view(np.int64), mask, lo)
    estimates = sk.hll_estimate(d, nz, w, p)
    for i in range(n):
        window = values.take(pa.array([j for j in range(lo[i], i + 1) if mask[j]], pa.int64()))
        state = sk.hll_state(window, p)
        regs = state[1].astype(np.int64)
        nzr = regs[regs > 0]
        assert (nz[i], w[i]) == (len(nzr), sum(1 << (63 - p - int(r)) for r in nzr))
        assert d[i] == len(set(sk.hash64(window).tolist()))
        assert estimates[i] == sk.hll_state_estimate(state, p)
        assert (state[0] is None) == (d[i] > sk.sparse_max(p))


@pytest.mark.parametrize("seed", [0, 1])
def test_percentile_windows_equal_a_sort_of_each_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, a, qs = 1200, 0.02, (0.0, 0.5, 0.9, 1.0)
    _, _, lo = _windows(rng, n, 3, 600, 90)
    x = np.round(rng.lognormal(0, 2, n) * rng.choice([-1, 1, 1, 1], n), 3)
    mask = rng.random(n) < 0.85
    raw = sk.percentile_windows(x, mask, lo, qs, a)
    got = sk.percentile_values(raw, a, listed=True).to_pylist()
    for i in range(n):
        window = x[lo[i]:i + 1][mask[lo[i]:i + 1]]
        if len(window) == 0:
            assert got[i] is None
            continue
        expect = [float(np.quantile(window, q, method="lower")) for q in qs]
        assert got[i] == sk.percentile_state_values(sk.percentile_state(window, a), qs, a)
        for g, e in zip(got[i], expect, strict=True):
            assert abs(g - e) <= a * abs(e) * (1 + 1e-15)
    single = sk.percentile_values(sk.percentile_windows(x, mask, lo, (0.9,), a), a, listed=False).to_pylist()
    assert single == [None if v is None else v[2] for v in got]


def _multiset(kind: str, rng: np.random.Generator, n: int) -> list[Any]:
    if kind == "all_equal":
        return [42.5] * n
    if kind == "all_distinct":
        return [float(i) * 1.37 - 50 for i in range(n)]
    if kind == "heavy_skew":  # one value most of the time, a long tail
        return [0.0 if rng.random() < 0.9 else float(rng.pareto(1.1) * 1000) for _ in range(n)]
    # nulls among values, zeros and signs
    return [None if rng.random() < 0.3 else float(rng.normal(0, 1e6)) for _ in range(n)]


KINDS = ["all_equal", "all_distinct", "heavy_skew", "with_nulls"]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(KINDS), st.integers(1, 300), st.integers(0, 2**32 - 1), st.integers(1, 6),
       st.sampled_from([4, 8, 12]), st.sampled_from([0.001, 0.01, 0.05]))
def test_every_permutation_and_split_gives_the_same_bits(kind: str, n: int, seed: int, parts: int, p: int,
                                                         a: float) -> None:
    rng = np.random.default_rng(seed)
    values = _multiset(kind, rng, n)
    qs = (0.1, 0.5, 0.9, 0.99)

    def run(vals: list[Any]) -> tuple[int, list[float | None], list[int], list[float | None]]:
        """(estimate of the merged parts, percentiles of the merged parts) and the same
        through the windowed engine (one entity, one window holding every value)."""
        cuts = np.sort(rng.integers(0, len(vals) + 1, parts - 1))
        chunks = np.split(np.arange(len(vals)), cuts)
        arr = pa.array(vals, pa.float64())
        state = sk.hll_merge([sk.hll_state(arr.take(pa.array(c, pa.int64())), p) for c in chunks][::-1], p)
        present = [v for v in vals if v is not None]
        states = [sk.percentile_state(np.array([vals[i] for i in c if vals[i] is not None], np.float64), a)
                  for c in chunks]
        merged = sk.percentile_merge(states[::-1])
        mask = np.asarray(arr.is_valid(), dtype=np.bool_)
        lo = np.zeros(len(vals), dtype=np.int64)
        zeros, h = np.zeros(len(vals), np.int64), sk.hash64(arr)
        nz, w = sk.hll_windows(zeros, h, mask, lo, p)
        d = _distinct_counts(zeros, h.view(np.int64), mask, lo)
        x = np.nan_to_num(np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.float64))
        pw = sk.percentile_values(sk.percentile_windows(x, mask, lo, qs, a), a, listed=True).to_pylist()
        assert len(present) == int(merged[1].sum())
        windowed = sk.hll_estimate(d, nz, w, p)[-1:].tolist()
        return (sk.hll_state_estimate(state, p), sk.percentile_state_values(merged, qs, a), windowed,
                pw[-1] if pw[-1] is not None else [None] * len(qs))

    first = run(values)
    assert first[0] == first[2][0]
    assert first[1] == first[3]
    for _ in range(3):
        shuffled = [values[i] for i in rng.permutation(len(values))]
        assert run(shuffled) == first  # == on floats: bit-identical (no NaN here)


@pytest.mark.parametrize("p", [8, 12])
def test_distinct_counts_within_3_standard_errors_in_99_percent_of_1000_trials(p: int) -> None:
    """1,000 trials, each a set of distinct values (cardinality log-uniform in [1, 50,000]),
    vectorised: all trials' registers at once."""
    rng = np.random.default_rng(50 + p)
    trials = 1000
    card = np.floor(np.exp(rng.uniform(0, math.log(50_000), trials))).astype(np.int64)
    trial = np.repeat(np.arange(trials), card)
    # distinct values per trial: a random start plus 0..card-1, disjoint across trials
    start = rng.integers(0, 2**40, trials) * 2**20
    values = start[trial] + (np.arange(len(trial)) - np.repeat(np.cumsum(card) - card, card))
    hashes = sk.hash64(pa.array(values, pa.int64()))
    assert len(np.unique(hashes)) == len(hashes)  # distinct values, distinct hashes: d is the cardinality
    reg, rho = sk.registers(hashes, p)
    m = 1 << p
    regs = np.zeros(trials * m, dtype=np.int64)
    np.maximum.at(regs, trial * m + reg, rho)
    regs = regs.reshape(trials, m)
    nz = (regs > 0).sum(axis=1)
    w = np.where(regs > 0, np.left_shift(np.int64(1), np.maximum(63 - p - regs, 0)), 0).sum(axis=1)
    se = sk.relative_standard_error(p)
    # the registers' estimate alone (what windows beyond 2^p / 8 distinct values store)
    raw = sk.register_estimate(nz, w, p)
    within = np.abs(raw - card) <= 3 * se * card
    assert within.mean() >= 0.99, (within.mean(), card[~within], raw[~within])
    # the stored value: exact (distinct hashes) up to 2^p / 8, the registers' beyond
    est = sk.hll_estimate(card, nz, w, p)  # d: every hash distinct (asserted above)
    assert np.all(est[card <= sk.sparse_max(p)] == card[card <= sk.sparse_max(p)])
    within = np.abs(est - card) <= 3 * se * card
    assert within.mean() >= 0.99, (within.mean(), card[~within], est[~within])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-10**6, 10**6)
                          .map(float)), min_size=1, max_size=200),
       st.sampled_from([0.001, 0.01, 0.05, 0.25]), st.floats(0, 1))
def test_percentiles_are_within_the_relative_accuracy_always(xs: list[float], a: float, q: float) -> None:
    x = np.array(xs, dtype=np.float64)
    exact = float(np.sort(x)[math.floor(q * (len(x) - 1))])
    (got,) = sk.percentile_state_values(sk.percentile_state(x, a), (q,), a)
    assert got is not None
    assert abs(got - exact) <= a * abs(exact) * (1 + 2**-52)
    assert (got > 0) == (exact > 0) and (got < 0) == (exact < 0)


def test_bucket_keys_are_exact_and_ordered() -> None:
    a = 0.01
    b = sk.buckets_per_octave(a)
    assert b == 50 and 1 / (2 * b + 1) <= a
    x = np.array([-1e300, -3.0, -5e-324, 0.0, -0.0, 5e-324, 1.0, 1.0 + 1 / 50, 2.0, 1.7e308,
                  np.finfo(np.float64).max])
    k = sk.bucket_keys(x, a)
    assert list(k[[3, 4]]) == [0, 0]
    assert np.all(np.diff(k[[0, 1, 2, 3, 5, 6, 7, 8, 9]]) > 0)
    assert k[7] - k[6] == 1 and k[8] - k[6] == b  # 1, 1 + 1/B, 2: one bucket, one octave apart
    v = sk.bucket_values(k, a)
    assert np.all(np.isfinite(v)) and np.all(np.abs(v - x) <= a * np.abs(x))  # the top bucket clamped
