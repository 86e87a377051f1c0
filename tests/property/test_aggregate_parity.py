"""The batch engine (vectorised) and the stream engine (KeyState, event by event) give
identical aggregation values, late and duplicate verdicts for any arrival order."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from features.aggregate.engine import AggSpec, KeyState, compute, contributions, extract, finalize, raw_schema
from features.schema import parse_schema

SCHEMA = """
name: agg_props
version: 1.0.0
entity: uid
event_time: ts
fields:
  - {name: uid, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(ms, UTC)", constraints: {required: true}}
  - {name: kind, type: enum, values: [a, b, c], constraints: {required: true}}
  - {name: amount, type: "decimal(10,2)", constraints: {nullable: true}}
  - {name: qty, type: int32, constraints: {nullable: true}}
  - {name: score, type: float64, constraints: {nullable: true}}
  - {name: item, type: string, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 30m
  features:
    - {name: n_1h, function: count, window: 1h, store: cold}
    - {name: a_1h, function: count, where: {kind: a}, window: 1h, store: cold}
    - {name: ratio_a, function: ratio, numerator: a_1h, denominator: n_1h, on_zero: -1.0, store: cold}
    - {name: qty_sum_2h, function: sum, of: qty, window: 2h, store: cold}
    - {name: amount_mean_1h, function: mean, of: amount, where: {kind: [a, b]}, window: 1h, store: cold}
    - {name: amount_day, function: sum, of: amount, window: {size: 1d, type: tumbling}, store: cold}
    - {name: score_min, function: min, of: score, window: 1h, store: cold}
    - {name: score_max, function: max, of: score, window: 3h, store: cold}
    - {name: qty_max_hour, function: max, of: qty, window: {size: 1h, type: tumbling}, store: cold}
    - {name: score_last, function: last, of: score, window: 1h, store: cold}
    - {name: items_2h, function: count_distinct, of: item, window: 2h, store: cold}
    - {name: qty_count, function: count, of: qty, window: 90m, store: cold}
"""
SPEC = AggSpec.of(parse_schema(SCHEMA))
BASE = dt.datetime(2026, 3, 1, 23, 0, tzinfo=dt.UTC)
MIN = 60_000  # ms


def _table(events: list[dict[str, Any]]) -> pa.Table:
    return pa.table({
        "uid": pa.array([e["user"] for e in events], pa.string()),
        "ts": pa.array([BASE + dt.timedelta(milliseconds=e["ms"]) for e in events],
                       pa.timestamp("ms", "UTC")),
        "kind": pa.array([e["kind"] for e in events], pa.string()),
        "amount": pa.array([e["amount"] for e in events], pa.decimal128(10, 2)),
        "qty": pa.array([e["qty"] for e in events], pa.int32()),
        "score": pa.array([e["score"] for e in events], pa.float64()),
        "item": pa.array([e["item"] for e in events], pa.string()),
        "_source": pa.array([f"file:///x#{i}" for i in range(len(events))], pa.string()),
    })


def both(events: list[dict[str, Any]]) -> tuple[dict[Any, Any], dict[Any, Any]]:
    assert SPEC is not None
    inputs = extract(SPEC, _table(events))
    batch = compute(SPEC, inputs)
    keys = inputs.entity.to_pylist()
    fin = finalize(SPEC, pa.table(batch.raw, schema=raw_schema(SPEC)))
    names = list(fin)
    cols = [fin[n].to_pylist() for n in names]
    b: dict[Any, Any] = {("late", i): True for i in batch.late.tolist()}
    b.update({("dup", i): True for i in batch.duplicate.tolist()})
    for r, i in enumerate(batch.accepted.tolist()):
        b[(keys[i], int(inputs.time_us[i]))] = tuple(c[r] for c in cols)
    # the stream: event by event, per key, emissions upserted (last one wins)
    states: dict[str, KeyState] = {}
    emitted: dict[Any, list[Any]] = {}
    s: dict[Any, Any] = {}
    for i, contrib in enumerate(contributions(SPEC, inputs)):
        key = keys[i]
        out = states.setdefault(key, KeyState()).add(SPEC, int(inputs.time_us[i]), f"file:///x#{i}", contrib)
        if out == "late":
            s[("late", i)] = True
        elif out == "duplicate":
            s[("dup", i)] = True
        else:
            for t, _src, raw in out:
                emitted[(key, t)] = raw
    if emitted:
        rk = list(emitted)
        rows = [emitted[k] for k in rk]
        rs = raw_schema(SPEC)
        raw_t = pa.table({f.name: pa.array([r[j] for r in rows], f.type) for j, f in enumerate(rs)})
        fin_s = finalize(SPEC, raw_t)
        scols = [fin_s[n].to_pylist() for n in names]
        for r, k in enumerate(rk):
            s[k] = tuple(c[r] for c in scols)
    return b, s


event = st.fixed_dictionaries({
    "user": st.sampled_from(["u1", "u2", "u3"]),
    "ms": st.one_of(st.integers(0, 6 * 60 * MIN), st.sampled_from([0, 60 * MIN, 120 * MIN, 60 * MIN - 1])),
    "kind": st.sampled_from(["a", "b", "c"]),
    "amount": st.one_of(st.none(), st.decimals(min_value=Decimal("-500"), max_value=Decimal("99999"),
                                               places=2, allow_nan=False, allow_infinity=False)),
    "qty": st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)),
    "score": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False, width=64)),
    "item": st.one_of(st.none(), st.sampled_from(["i1", "i2", "i3", "i4"])),
})


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=60))
def test_batch_and_stream_engines_agree(events: list[dict[str, Any]]) -> None:
    b, s = both(events)
    assert b == s


def test_window_edges_lateness_and_duplicates_by_hand() -> None:
    hour = 60 * MIN
    ev = [
        {"user": "u", "ms": hour, "kind": "a", "amount": None, "qty": 2, "score": 2.0, "item": "x"},  # edge
        {"user": "u", "ms": 2 * hour - 1, "kind": "b", "amount": None, "qty": 4, "score": 0.5, "item": "y"},
        {"user": "u", "ms": 2 * hour, "kind": "a", "amount": None, "qty": 1, "score": 1.0, "item": "x"},
        # a duplicate (same user and time), then a late event
        {"user": "u", "ms": 2 * hour, "kind": "c", "amount": None, "qty": 8, "score": 9.0, "item": "z"},
        {"user": "u", "ms": 0, "kind": "a", "amount": None, "qty": 16, "score": 0.0, "item": "x"},
    ]
    b, s = both(ev)
    assert b == s
    assert b[("dup", 3)] and b[("late", 4)]
    names = list(SPEC.aggregations.features) if SPEC else []
    at_2h = dict(zip([a.name for a in names], b[("u", int((BASE.timestamp() * 1000 + 2 * hour) * 1000))],
                     strict=True))
    # (2h - 1h, 2h]: the event at exactly 1h is outside the sliding 1h window
    assert at_2h["n_1h"] == 2 and at_2h["a_1h"] == 1 and at_2h["ratio_a"] == 0.5
    assert at_2h["qty_sum_2h"] == 7 and at_2h["score_min"] == 0.5 and at_2h["score_last"] == 1.0
    assert at_2h["items_2h"] == 2 and at_2h["score_max"] == 2.0
