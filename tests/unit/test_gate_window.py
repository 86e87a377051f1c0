"""The sliding window of the stream's breaker and the HTTP ingest (``GateWindow``),
without services: the record that trips a gate depends on the records alone, never on
how they are cut into micro-batches, and equals a direct evaluation of each window."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest

from features.compile import CompiledSchema, compile_schema
from features.errors import SchemaError
from features.pipeline.gates import (
    DEFAULT_WINDOW_MIN_RECORDS,
    DEFAULT_WINDOW_RECORDS,
    GateCounts,
    GateWindow,
    evaluate,
    window_sizes,
)
from features.schema import parse_schema

BASE = """
name: logs
version: 1.0.0
entity: id
event_time: t
fields:
  - {name: id, type: int64, constraints: {required: true}}
  - {name: t, type: timestamp(us), constraints: {required: true}}
  - {name: x, type: float64, constraints: {max: 100, min: 0}}
"""


def gated(quality: str) -> CompiledSchema:
    return compile_schema(parse_schema(BASE + quality))


Records = tuple[npt.NDArray[np.bool_], list[list[str]]]


def records(n: int, seed: int, burst: tuple[int, int] | None = None) -> Records:
    """``n`` records: each rejected with a low rate, by x.max or x.min or both, and every
    record of ``burst`` (start, stop) rejected by x.max."""
    rng = np.random.default_rng(seed)
    rules: list[list[str]] = []
    for i in range(n):
        r = rng.random()
        hit = ["x.max"] if r < 0.04 else ["x.min"] if r < 0.07 else ["x.max", "x.min"] if r < 0.08 else []
        if burst is not None and burst[0] <= i < burst[1]:
            hit = ["x.max"]
        rules.append(hit)
    return np.array([bool(h) for h in rules]), rules


def feed(window: GateWindow, recs: Records, cuts: list[int]) -> tuple[int | None, list[int]]:
    """Feed ``recs`` cut at ``cuts``; returns the global index of the tripping record (None:
    none) and the sizes of the micro-batches judged."""
    flags, rules = recs
    bounds = [0, *cuts, len(flags)]
    for a, b in itertools.pairwise(bounds):
        rows = np.array([i - a for i in range(a, b) for _ in rules[i]], dtype=np.int64)
        ids = pa.array([r for i in range(a, b) for r in rules[i]], pa.string())
        check = window.observe(flags[a:b], rows, ids)
        if check.tripped:
            assert check.position is not None
            return a + check.position, bounds
    return None, bounds


def reference(c: CompiledSchema, recs: Records) -> int | None:
    """The first record whose window (the last N records up to it, once at least the
    minimum) breaches a fail gate, by evaluate() over each window directly."""
    flags, rules = recs
    size, least = window_sizes(c)
    for i in range(len(flags)):
        lo = max(0, i + 1 - size)
        if i + 1 - lo < least:
            continue
        by_rule: Counter[str] = Counter(r for j in range(lo, i + 1) for r in rules[j])
        verdict = evaluate(c, GateCounts(i + 1 - lo, int(flags[lo:i + 1].sum()), by_rule), rates_only=True)
        if verdict.failed:
            return i
    return None


@pytest.mark.parametrize("quality", [
    "quality:\n  max_reject_rate: 0.2\n  window_records: 200\n  window_min_records: 50\n",
    "quality:\n  max_rule_rate:\n    x.max: 0.1\n  window_records: 300\n  window_min_records: 300\n",
    "quality:\n  max_reject_rate: {limit: 0.01, on_breach: warn}\n  max_rule_rate:\n    x.min: 0.12\n"
    "    x.max: 0.15\n",
])
def test_the_tripping_record_is_the_same_however_the_records_are_cut(quality: str) -> None:
    c = gated(quality)
    recs = records(3000, seed=5, burst=(1900, 2100))
    want = reference(c, recs)
    assert want is not None and 1900 <= want < 2100, want
    rng = np.random.default_rng(1)
    for cuts in ([], [1], list(range(7, 3000, 7)), list(range(1000, 3000, 1000)),
                 sorted({int(x) for x in rng.integers(1, 3000, 40)}), [want], [want + 1]):
        got, _ = feed(GateWindow(c), recs, cuts)
        assert got == want, (cuts[:5], got, want)


def test_clean_records_never_trip_and_the_window_slides_past_an_old_burst() -> None:
    c = gated("quality:\n  max_reject_rate: 0.3\n  window_records: 100\n  window_min_records: 100\n")
    recs = records(2000, seed=2)
    assert reference(c, recs) is None
    assert feed(GateWindow(c), recs, list(range(50, 2000, 50)))[0] is None
    # 10 more bad records in a window of 100 records (about 8 rejected anyway): under 30%
    recs = records(2000, seed=2, burst=(1000, 1010))
    assert reference(c, recs) is None and feed(GateWindow(c), recs, [1000, 1010])[0] is None


def test_a_minimum_of_records_before_a_gate_may_trip() -> None:
    c = gated("quality:\n  max_reject_rate: 0.1\n  window_min_records: 10\n")
    w = GateWindow(c)
    # one bad record of two: 50% > 10%, but the window holds 2 < 10 records
    check = w.observe(np.array([True, False]), np.array([0]), pa.array(["x.max"]))
    assert not check.tripped and check.verdict is None
    check = w.observe(np.zeros(7, dtype=np.bool_), np.zeros(0, np.int64), pa.array([], pa.string()))
    assert not check.tripped and check.verdict is None          # 9 records
    check = w.observe(np.array([False]), np.zeros(0, np.int64), pa.array([], pa.string()))
    assert not check.tripped and check.verdict is not None       # 10 records: 1 of 10 = 10%, the limit
    assert check.verdict.results[0].measured == 0.1
    check = w.observe(np.array([True]), np.array([0]), pa.array(["x.min"]))
    assert check.tripped and check.verdict is not None          # 2 of 11 > 10%
    assert check.verdict.failed[0].rows == 2 and check.verdict.counts.read == 11


def test_warn_gates_report_without_tripping_and_the_verdict_names_the_rate() -> None:
    c = gated("quality:\n  on_breach: warn\n  owner: team-x\n  max_reject_rate: 0.2\n  window_records: 50\n"
              "  window_min_records: 50\n")
    w = GateWindow(c)
    flags = np.array([i % 2 == 0 for i in range(100)])
    rows = np.flatnonzero(flags).astype(np.int64)
    check = w.observe(flags, rows, pa.array(["x.max"] * len(rows)))
    assert not check.tripped and check.breached and check.position == 49   # the first full window
    assert check.verdict is not None and check.verdict.owner == "team-x"
    (r,) = check.verdict.warned
    assert r.measured == 0.5 and r.rows == 25 and check.verdict.counts.read == 50
    assert check.verdict.top_reasons() == [("x.max", 25)]
    assert w.seen == 100   # a warn-only micro-batch is added to the window


def test_a_tripping_micro_batch_is_not_added_to_the_window() -> None:
    c = gated("quality:\n  max_reject_rate: 0.5\n  window_records: 10\n  window_min_records: 4\n")
    w = GateWindow(c)
    w.observe(np.zeros(6, dtype=np.bool_), np.zeros(0, np.int64), pa.array([], pa.string()))
    bad = np.ones(8, dtype=np.bool_)
    check = w.observe(bad, np.arange(8, dtype=np.int64), pa.array(["x.min"] * 8))
    # the window at record k of this batch: the last 10 of 6 clean + (k+1) bad; at k = 4, 5 of
    # 10 (50%, the limit); at k = 5, 6 of 10 > 50%
    assert check.tripped and check.position == 5 and check.window == 10
    assert check.verdict is not None and check.verdict.counts.rejected == 6
    assert w.seen == 6
    # the same micro-batch again (a restart replays it) trips at the same record
    assert w.observe(bad, np.arange(8, dtype=np.int64), pa.array(["x.min"] * 8)).position == 5


def test_window_sizes_defaults_and_section_errors() -> None:
    assert window_sizes(gated("quality:\n  max_reject_rate: 0.1\n")) == (DEFAULT_WINDOW_RECORDS,
                                                                        DEFAULT_WINDOW_MIN_RECORDS)
    assert window_sizes(gated("quality:\n  max_reject_rate: 0.1\n  window_records: 30\n")) == (30, 30)
    with pytest.raises(SchemaError, match="window_min_records"):
        gated("quality:\n  max_reject_rate: 0.1\n  window_records: 30\n  window_min_records: 31\n")
    with pytest.raises(SchemaError, match="window_records"):
        gated("quality:\n  max_reject_rate: 0.1\n  window_records: 0\n")


def test_window_fields_keep_the_gates_fingerprint_of_a_section_without_them() -> None:
    a = gated("quality:\n  max_reject_rate: 0.1\n")
    b = gated("quality:\n  max_reject_rate: 0.1\n  window_records: 500\n")
    assert a.fingerprint == b.fingerprint             # not a data version
    assert a.gates_fingerprint != b.gates_fingerprint  # but a gate edit
