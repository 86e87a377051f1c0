"""``last_k``'s mergeable state (``features.aggregate.lastk``): any split of an entity's
events into parts, states merged in any order and grouping, gives the engine's value
over all of them (``compute``'s raw part for the window holding every event) and the
reference's (the values newest first)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from features.aggregate.engine import _last_k
from features.aggregate.lastk import last_k_values, merge_last_k, state_last_k

EVENTS = st.lists(st.tuples(st.integers(0, 10**6), st.one_of(st.none(), st.integers(-5, 5))),
                  max_size=40, unique_by=lambda e: e[0])


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.integers(1, 64), st.randoms(use_true_random=False))
def test_merged_states_equal_the_engine_and_the_reference(events: list[tuple[int, Any]], k: int,
                                                           rnd: Any) -> None:
    newest_first = [v for _, v in sorted(events, reverse=True) if v is not None][:k]
    # the engine: the last event's window holds every event (events sorted by time)
    ordered = sorted(events)
    v = np.array([0 if x is None else x for _, x in ordered], dtype=np.int64)
    mask = np.array([x is not None for _, x in ordered], dtype=np.bool_)
    engine = _last_k(v, mask, np.zeros(len(v), dtype=np.int64), k).to_pylist()
    assert (engine[-1] if engine else []) == newest_first
    # split into random parts, states merged pairwise in a random order
    shuffled = list(events)
    rnd.shuffle(shuffled)
    cuts = sorted(rnd.sample(range(len(shuffled) + 1), min(3, len(shuffled) + 1)))
    parts = [shuffled[a:b] for a, b in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)]
    states = [state_last_k([t for t, _ in p], [x for _, x in p], k) for p in parts]
    states = [json.loads(json.dumps(s)) for s in states]  # JSON-able
    while len(states) > 1:
        i = rnd.randrange(len(states) - 1)
        states[i:i + 2] = [merge_last_k([states[i + 1], states[i]], k)]
    assert last_k_values(states[0]) == newest_first
    # merging a state with itself (overlapping tiles) changes nothing
    assert merge_last_k([states[0], states[0]], k) == states[0]
