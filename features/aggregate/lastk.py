"""``last_k``'s mergeable state, for request-time tiles (pure Python, JSON-able).

The state of a set of events is their ``k`` newest (event time, value) pairs with a
value, newest first: ``{"t": [time_us, ...], "v": [value, ...]}``. Two states of disjoint
(or overlapping: an event is one time of one entity, so a repeated time is the same
event) sets merge into the ``k`` newest pairs of their union, whatever the order or the
grouping of the merges: the result is the engine's raw part ``<agg>.v`` over the union
(``features.aggregate.engine._last_k``), the values newest first.

One event per (entity, event time): the times of one entity's events are distinct, so
"newest" is always defined; a state merges events of one entity only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

State = dict[str, list[Any]]


def state_last_k(times: Sequence[int], values: Sequence[int | float | None], k: int) -> State:
    """The state of the events ``(times[i], values[i])`` (any order; null values do not
    count): the ``k`` newest with a value, newest first."""
    pairs = sorted(((int(t), v) for t, v in zip(times, values, strict=True) if v is not None),
                   key=lambda p: p[0], reverse=True)
    return _state(_unique(pairs)[:k])


def merge_last_k(states: Iterable[State], k: int) -> State:
    """The state of the union of the states' events: the ``k`` newest pairs."""
    pairs = [(int(t), v) for s in states for t, v in zip(s["t"], s["v"], strict=True)]
    pairs.sort(key=lambda p: p[0], reverse=True)
    return _state(_unique(pairs)[:k])


def last_k_values(state: State) -> list[Any]:
    """The aggregation's value (its raw part): the state's values, newest first."""
    return list(state["v"])


def _unique(pairs: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    for t, v in pairs:  # sorted newest first: a repeated time is the same event
        if not out or out[-1][0] != t:
            out.append((t, v))
    return out


def _state(pairs: list[tuple[int, Any]]) -> State:
    return {"t": [t for t, _ in pairs], "v": [v for _, v in pairs]}


__all__ = ["State", "last_k_values", "merge_last_k", "state_last_k"]
