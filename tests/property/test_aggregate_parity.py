"""The aggregation engine (``features.aggregate.engine.compute`` + ``finalize``) against
a brute-force reference (``tests/aggregate_reference.py``, independent of the engine),
for any input order: the reference's values for every instant of the history, and the
same values for every permutation of the input and every split of it into loads (two
different events at one (entity, event time) are both counted, ordered by content digest;
an exact copy is one event). Every function is in
the shared schema: variance/stddev over integers (squares past int64: the wide path) and
decimals, a float field's fixed-point sum, mean and stddev at scales 0, 1, 3 and 6 (exact
halves and products that round to a half), first. The stream's use of
the engine (arrival order, lateness, state read back from the stores) is tested on
real stores in ``tests/integration/test_aggregate_stream_state.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from aggregate_reference import (
    BASE_US,
    EVENT,
    MINUTE_US,
    SCHEMA,
    T,
    event_digests,
    history_table,
    one_content_per_key,
    reference,
    with_digest,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from features.aggregate.engine import AggSpec, compute, extract, finalize, raw_schema
from features.schema import parse_schema

SPEC = AggSpec.of(parse_schema(SCHEMA))


def batch(events: list[dict[str, Any]]) -> dict[Any, Any]:
    """The engine's values: {(uid, time us): values in declaration order}."""
    assert SPEC is not None
    assert SPEC is not None
    table = with_digest(SPEC.schema, history_table(events))
    table = table.append_column("_source", pa.array([f"file:///x#{i}" for i in range(len(events))]))
    inputs = extract(SPEC, table)
    result = compute(SPEC, inputs)
    keys = inputs.entity.to_pylist()
    fin = finalize(SPEC, pa.table(result.raw, schema=raw_schema(SPEC)))
    cols = [fin[n].to_pylist() for n in fin]
    assert len(result.accepted) + len(result.duplicate) == len(events)
    return {(keys[i], int(inputs.time_us[i])): tuple(c[r] for c in cols)
            for r, i in enumerate(result.accepted.tolist())}


@settings(max_examples=300, deadline=None)
@given(st.lists(EVENT, max_size=60).flatmap(lambda evs: st.tuples(st.just(evs), st.permutations(evs))))
def test_batch_equals_the_reference_in_any_order(case: tuple[list[Any], list[Any]]) -> None:
    assert SPEC is not None
    events, shuffled = case
    # keys that collide on different contents: both events count, in any order
    want_all = reference(SPEC.schema, events)
    assert batch(shuffled) == want_all == batch(events)
    assert batch(shuffled + shuffled[: len(shuffled) // 2]) == want_all  # exact copies: one event
    copies = one_content_per_key(events)
    first = {(e["uid"], e[T]): e for e in reversed(copies)}
    want = reference(SPEC.schema, copies)
    assert batch(copies) == want
    assert batch([first[(e["uid"], e[T])] for e in shuffled]) == want
    assert batch(sorted(copies, key=lambda e: (e[T], e["uid"]), reverse=True)) == want


def test_window_edges_and_duplicates_by_hand() -> None:
    assert SPEC is not None
    hour = 60 * MINUTE_US
    e = {"uid": "u", "amount": None}
    ev = [
        {**e, T: BASE_US + hour, "kind": "a", "qty": 2, "score": 2.0, "item": "x"},  # on the edge
        {**e, T: BASE_US + 2 * hour - 1000, "kind": "b", "qty": 4, "score": 0.5, "item": "y"},
        {**e, T: BASE_US + 2 * hour, "kind": "a", "qty": 1, "score": 1.0, "item": "x"},
        # another event at that instant (both count; its digest is the greater: it is the
        # newer of the two), then an event older than the others (a backfill has no
        # lateness: it counts), then an exact copy (one event)
        {**e, T: BASE_US + 2 * hour, "kind": "c", "qty": 8, "score": 9.0, "item": "z"},
        {**e, T: BASE_US, "kind": "a", "qty": 16, "score": 0.0, "item": "x"},
        {**e, T: BASE_US + 2 * hour, "kind": "a", "qty": 1, "score": 1.0, "item": "x"},
    ]
    digest = event_digests(SPEC.schema, ev)
    assert digest[3] > digest[2] and digest[5] == digest[2]
    b = batch(ev)
    assert b == reference(SPEC.schema, ev) and len(b) == 4
    names = [a.name for a in SPEC.aggregations.features]
    at_2h = dict(zip(names, b[("u", BASE_US + 2 * hour)], strict=True))
    # (2h - 1h, 2h]: the event at exactly 1h is outside the sliding 1h window; both
    # events at 2h are inside
    assert at_2h["n_1h"] == 3 and at_2h["a_1h"] == 1 and at_2h["ratio_a"] == 1 / 3
    assert at_2h["qty_sum_2h"] == 15 and at_2h["score_min"] == 0.5 and at_2h["score_last"] == 9.0
    assert at_2h["items_2h"] == 3 and at_2h["score_max"] == 9.0
    assert at_2h["score_last3"] == [9.0, 1.0, 0.5] and at_2h["score_first"] == 2.0
    # the event at 0, arriving last, counts in the 2h window of the event at 1h
    assert dict(zip(names, b[("u", BASE_US + hour)], strict=True))["qty_sum_2h"] == 18


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-2**40, 2**40)), max_size=80),  # ties too
       st.sampled_from([(1, "sliding"), (3600, "sliding"), (86_400, "tumbling"), (7, "tumbling")]))
def test_window_starts_by_time_offsets_and_by_ranks_agree_with_a_scan(
        events: list[tuple[int, int]], window: tuple[int, str]) -> None:
    from features.aggregate.engine import _Positions
    from features.schema.model import Aggregation, Window

    events.sort()
    codes = np.array([e[0] for e in events], dtype=np.int64)
    t = np.array([e[1] for e in events], dtype=np.int64)
    agg = Aggregation(name="x", function="count", store=frozenset({"cold"}),
                      window=Window(size_s=window[0], kind=window[1]))  # type: ignore[arg-type]
    size = window[0] * 1_000_000
    want = []
    for i, (c, ti) in enumerate(events):
        start = ti - size if window[1] == "sliding" else ti // size * size
        inside = [j for j in range(i + 1) if events[j][0] == c
                  and (events[j][1] > start if window[1] == "sliding" else events[j][1] >= start)]
        want.append(inside[0])
    for ranks in (False, True):
        assert _Positions(codes, t, ranks=ranks).window_starts(agg).tolist() == want


def test_moments_first_and_float_fixed_point_by_hand() -> None:
    """variance/stddev (population and sample), a float field's sum, mean and stddev in
    fixed point (scale 1: 0.25 is 2.5 tenths, a tie, kept as 2), and first."""
    assert SPEC is not None
    e = {"uid": "u", "kind": "a", "amount": None, "score": None, "item": None}
    ev = [
        {**e, T: BASE_US + 20 * MINUTE_US, "qty": None, "temp": 1.5},
        {**e, T: BASE_US, "qty": 2, "temp": 0.25},
        {**e, T: BASE_US + 10 * MINUTE_US, "qty": 4, "temp": None},
    ]
    b = batch(ev)
    assert b == reference(SPEC.schema, ev)
    names = [a.name for a in SPEC.aggregations.features]
    at = dict(zip(names, b[("u", BASE_US + 20 * MINUTE_US)], strict=True))
    assert at["qty_first"] == 2 and at["score_first"] is None and at["amount_std"] is None
    assert at["qty_var"] == 1.0 and at["qty_std_hour"] == 2 ** 0.5
    assert at["temp_sum"] == 1.7 and at["temp_mean"] == 0.875
    assert at["temp_std_s"] == 0.78125 ** 0.5  # (2 * (250² + 1500²) - 1750²) / (2 * 1) / 10^6
    first = dict(zip(names, b[("u", BASE_US)], strict=True))
    assert first["qty_std_hour"] is None and first["qty_var"] == 0.0 and first["temp_sum"] == 0.2


def test_a_float_value_beyond_the_fixed_point_is_a_clear_error() -> None:
    import pytest

    assert SPEC is not None
    ev = [{"uid": "u", T: BASE_US, "kind": "a", "amount": None, "qty": None, "score": None, "item": None,
           "temp": 1e11}]
    # temp_sum keeps tenths (scale 1: fits), temp_mean millionths (scale 6: does not)
    with pytest.raises(OverflowError, match=r"aggregation temp_mean \(mean of temp\): value 100000000000.0 "
                                            r"does not fit scale 6 .*scale: 4 keeps"):
        batch(ev)


def test_sums_are_bounded_per_window_not_per_batch() -> None:
    """The exactness bound of sums (and Σx of variance) is on the largest window: prefix sums
    may wrap in int64, their differences stay exact. Two events of 2^61 two hours apart
    each sum alone (the batch's total would not fit); within one window they are refused."""
    import pytest

    text = """
name: big
version: 1.0.0
entity: k
event_time: ts
fields:
  - {name: k, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(ms, UTC)", constraints: {required: true}}
  - {name: v, type: int64, constraints: {required: true}}
aggregations:
  features:
    - {name: v_sum, function: sum, of: v, window: 1h, store: cold}
    - {name: v_var, function: variance, of: v, window: 1h, store: cold}
"""
    spec = AggSpec.of(parse_schema(text))
    assert spec is not None

    def run(minutes: list[int]) -> list[Any]:
        times = pa.array([BASE_US // 1000 + m * 60_000 for m in minutes], pa.timestamp("ms", "UTC"))
        table = pa.table({"k": ["a"] * len(minutes), "ts": times,
                          "v": pa.array([2**61] * len(minutes), pa.int64()),
                          "_source": pa.array(["file:///x"] * len(minutes)),
                          "_digest": pa.array([f"{m:016x}" for m in minutes])})
        result = compute(spec, extract(spec, table))
        fin = finalize(spec, pa.table(result.raw, schema=raw_schema(spec)))
        return list(zip(fin["v_sum"].to_pylist(), fin["v_var"].to_pylist(), strict=True))

    assert run([0, 120]) == [(2**61, 0.0), (2**61, 0.0)]
    with pytest.raises(OverflowError, match="aggregation v_sum: the sums could overflow 64-bit integers"):
        run([0, 30])
