"""Windows at request time (``features.aggregate.request_time.at_times``) against the
brute-force reference (``tests/aggregate_reference.py``: ``reference_at``, a plain scan per
request): random histories of the shared schema (every function, both window kinds,
``where`` filters), random request times inside bursts, exactly on an event, one
microsecond either side of one, exactly a window's size after one, on a tumbling
bucket's edge, before the first event and long after the last; any order of the events
and any request order give the same values; a request at an event's time reads the
event's own (``compute``) value."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from aggregate_reference import (
    BASE_US,
    EVENT,
    MINUTE_US,
    SCHEMA,
    USERS,
    T,
    event_digests,
    history_table,
    reference,
    reference_at,
    with_digest,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from features.aggregate.engine import AggSpec, extract
from features.aggregate.request_time import at_times, needed, sub_spec
from features.schema import parse_schema

SPEC = AggSpec.of(parse_schema(SCHEMA))
HOUR = 60 * MINUTE_US
DAY = 24 * HOUR


def engine_at(events: list[dict[str, Any]], requests: list[tuple[str, int]],
              spec: AggSpec | None = SPEC) -> list[tuple[Any, ...]]:
    assert spec is not None
    sources = pa.array([f"file:///x#{i}" for i in range(len(events))])
    assert SPEC is not None
    table = with_digest(SPEC.schema, history_table(events)).append_column("_source", sources)
    # the history: every distinct event, once per (uid, time, digest) (as the history table keeps)
    seen: set[tuple[str, int, str]] = set()
    keep = []
    for i, (e, d) in enumerate(zip(events, event_digests(SPEC.schema, events), strict=True)):
        if (e["uid"], e[T], d) not in seen:
            seen.add((e["uid"], e[T], d))
            keep.append(i)
    inputs = extract(spec, table.take(pa.array(keep, pa.int64())))
    out = at_times(spec, inputs, pa.array([u for u, _ in requests], pa.string()),
                   pa.array([t for _, t in requests], pa.int64()).to_numpy())
    cols = [out[a.name].to_pylist() for a in spec.aggregations.features]
    return [tuple(c[i] for c in cols) for i in range(len(requests))]


def request_times(events: list[dict[str, Any]]) -> st.SearchStrategy[list[tuple[str, int]]]:
    """Request times near the events (on one, 1 µs either side, a window size after,
    between two) and far from them (before the first, a day and a week after the last),
    on a tumbling bucket edge, for any user."""
    near = [e[T] + d for e in events for d in (0, -1, 1, HOUR, HOUR + 1, 2 * HOUR, 90 * MINUTE_US)]
    fixed = [BASE_US - DAY, BASE_US - 1, BASE_US + 2 * HOUR,  # 00:00 UTC: the tumbling day's edge
             BASE_US + 2 * HOUR - 1, BASE_US + 10 * HOUR, BASE_US + 7 * DAY, BASE_US + 30 * MINUTE_US]
    t = st.one_of(st.sampled_from(near + fixed), st.integers(BASE_US - HOUR, BASE_US + 12 * HOUR))
    return st.lists(st.tuples(st.sampled_from([*USERS, "nobody"]), t), max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENT, max_size=50).flatmap(
    lambda evs: st.tuples(st.just(evs), st.permutations(evs), request_times(evs))))
def test_at_times_equals_the_reference(case: tuple[list[Any], list[Any], list[tuple[str, int]]]) -> None:
    assert SPEC is not None
    events, shuffled, requests = case
    want = reference_at(SPEC.schema, events, requests)
    assert engine_at(events, requests) == want
    # every distinct event is kept (the tie rule): any order gives the same values
    assert engine_at(shuffled, requests) == want
    assert engine_at(events, requests[::-1]) == want[::-1]


@settings(max_examples=100, deadline=None)
@given(st.lists(EVENT, max_size=50))
def test_a_request_at_an_event_reads_its_own_value(events: list[dict[str, Any]]) -> None:
    assert SPEC is not None
    per_event = reference(SPEC.schema, events)
    keys = list(per_event)
    assert engine_at(events, keys) == [per_event[k] for k in keys]


def test_decay_and_the_empty_window_by_hand() -> None:
    assert SPEC is not None
    e = {"uid": "u1", "kind": "a", "amount": None, "item": "x", "temp": 1.5}
    events = [{**e, T: BASE_US + i * MINUTE_US, "qty": i, "score": float(i)} for i in range(3)]
    names = [a.name for a in SPEC.aggregations.features]
    burst, quiet, never = engine_at(events, [("u1", BASE_US + 2 * MINUTE_US), ("u1", BASE_US + 7 * DAY),
                                             ("u2", BASE_US)])
    got = dict(zip(names, burst, strict=True))
    assert got["n_1h"] == 3 and got["qty_sum_2h"] == 3 and got["score_last3"] == [2.0, 1.0, 0.0]
    assert got["qty_first"] == 0 and got["score_min"] == 0.0 and got["temp_sum"] == 4.5
    for row in (quiet, never):  # a week later the windows are empty: counts 0, sums 0, the rest null
        v = dict(zip(names, row, strict=True))
        assert v["n_1h"] == 0 and v["a_1h"] == 0 and v["items_2h"] == 0 and v["qty_count"] == 0
        assert v["qty_sum_2h"] == 0 and v["temp_sum"] == 0.0 and v["amount_day"] == 0
        assert v["ratio_a"] == -1.0  # on_zero
        assert v["score_last3"] == [] and v["qty_last2_day"] == []
        for name in ("amount_mean_1h", "score_min", "score_max", "score_last", "qty_var", "qty_first",
                     "temp_mean", "amount_std", "qty_max_hour"):
            assert v[name] is None, name
    assert engine_at([], [("u1", BASE_US)]) == [never]


def test_a_sub_spec_computes_what_its_names_need() -> None:
    assert SPEC is not None
    sub = sub_spec(SPEC, ["ratio_a", "score_max"])
    assert [a.name for a in needed(SPEC, ["ratio_a"])] == ["n_1h", "a_1h", "ratio_a"]
    events = [{"uid": "u1", T: BASE_US + i * MINUTE_US, "kind": "ab"[i % 2], "amount": None, "qty": None,
               "score": float(i), "item": None, "temp": None} for i in range(5)]
    full = dict(zip([a.name for a in SPEC.aggregations.features],
                    engine_at(events, [("u1", BASE_US + HOUR)])[0], strict=True))
    part = dict(zip([a.name for a in sub.aggregations.features],
                    engine_at(events, [("u1", BASE_US + HOUR)], sub)[0], strict=True))
    assert part == {k: full[k] for k in part} and part["ratio_a"] == 2 / 4
