"""The batch engine's count_distinct (O(n log n), ``features.aggregate.engine._distinct_counts``)
equals a brute-force count over every window, for random entities, values, contribution
masks and window starts (sliding and tumbling shapes, empty and one-event windows)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from features.aggregate.engine import _distinct_counts


@st.composite
def histories(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    sizes = draw(st.lists(st.integers(1, 40), min_size=1, max_size=6))
    codes, vcodes, mask, lo = [], [], [], []
    start = 0
    for e, size in enumerate(sizes):
        values = draw(st.integers(1, 6))
        window = draw(st.integers(1, size + 2))
        tumbling = draw(st.booleans())
        for i in range(size):
            codes.append(e)
            vcodes.append(draw(st.integers(0, values - 1)))
            mask.append(draw(st.integers(0, 4)) > 0)
            # a window start inside the entity, never decreasing: sliding (the last `window`
            # events) or tumbling (buckets of `window` events)
            lo.append(start + (i // window) * window if tumbling else start + max(0, i - window + 1))
        start += size
    return (np.asarray(codes, np.int64), np.asarray(vcodes, np.int64), np.asarray(mask, np.bool_),
            np.asarray(lo, np.int64))


def _brute(vcodes: np.ndarray, mask: np.ndarray, lo: np.ndarray) -> list[int]:
    return [len({int(vcodes[j]) for j in range(int(lo[i]), i + 1) if mask[j]}) for i in range(len(vcodes))]


@settings(max_examples=400, deadline=None)
@given(histories())
def test_count_distinct_equals_brute_force(h: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
    codes, vcodes, mask, lo = h
    assert _distinct_counts(codes, vcodes, mask, lo).tolist() == _brute(vcodes, mask, lo)


def test_count_distinct_by_hand() -> None:
    codes = np.array([0, 0, 0, 0, 1, 1], np.int64)
    vcodes = np.array([5, 5, 7, 5, 5, 8], np.int64)
    mask = np.array([True, True, True, False, True, True])
    lo = np.array([0, 0, 1, 2, 4, 4], np.int64)
    # windows: {5}, {5,5}, {5,7}, {7,(5 not contributing)}, {5}, {5,8}
    assert _distinct_counts(codes, vcodes, mask, lo).tolist() == [1, 1, 2, 1, 1, 2]
