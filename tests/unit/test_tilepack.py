"""The binary tile layout (``features.aggregate.tilepack``): packed summaries and events
unpack to what was packed, and a read of packed tiles (``tiles.values_at``) equals the
engine's request-time values (``features.aggregate.request_time.at_times``) for an empty
entity, one event, ties at one instant (the greater digest is the newer) and nulls."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from features.aggregate.engine import AggSpec, extract
from features.aggregate.request_time import at_times
from features.aggregate.tilepack import pack_summary_set, unpack_events, unpack_summaries, variable_parts
from features.aggregate.tiles import EntityTiles, TileSpec, build, fields_to_read, group_raw, values_at
from features.compile import compile_schema
from features.lineage import DIGEST
from features.schema import parse_schema

SCHEMA = """
name: packed
version: 1.0.0
entity: card
event_time: ts
fields:
  - {name: card, type: string, constraints: {required: true}}
  - {name: ts, type: "timestamp(us, UTC)", constraints: {required: true}}
  - {name: kind, type: string, constraints: {nullable: true}}
  - {name: amount, type: "decimal(12,2)", constraints: {nullable: true}}
  - {name: score, type: float64, constraints: {nullable: true}}
aggregations:
  allowed_lateness: 1h
  features:
    - {name: n_2h, function: count, window: 2h, store: [hot]}
    - {name: a_2h, function: count, where: {kind: a}, window: 2h, store: [hot]}
    - {name: amount_sum, function: sum, of: amount, window: 2h, store: [hot]}
    - {name: amount_mean, function: mean, of: amount, window: 90m, store: [hot]}
    - {name: amount_std, function: stddev, of: amount, window: 2h, store: [hot]}
    - {name: score_max, function: max, of: score, window: 2h, store: [hot]}
    - {name: score_min, function: min, of: score, where: {kind: a}, window: 2h, store: [hot]}
    - {name: score_first, function: first, of: score, window: 2h, store: [hot]}
    - {name: score_last, function: last, of: score, window: {size: 1h, type: tumbling}, store: [hot]}
    - {name: score_sum, function: sum, of: score, scale: 2, window: 2h, store: [hot]}
    - {name: last3, function: last_k, of: score, k: 3, window: 2h, store: [hot]}
    - {name: kinds, function: count_distinct, of: kind, window: 2h, store: [hot]}
"""
SPEC = AggSpec.of(compile_schema(parse_schema(SCHEMA)).schema)
assert SPEC is not None
TSPEC = TileSpec.of(SPEC)
assert TSPEC is not None
#: only counts, sums, means, min/max, first/last: a one-entity read takes its own path (tiles._one)
SIMPLE = TileSpec.of(AggSpec.of(compile_schema(parse_schema("\n".join(
    line for line in SCHEMA.splitlines() if not any(x in line for x in ("stddev", "last_k", "count_distinct"))
))).schema))
assert SIMPLE is not None and SIMPLE.simple and not TSPEC.simple
MIN = 60_000_000
T0 = 1_767_225_600_000_000


def events(rows: list[tuple[str, int, str | None, str | None, float | None, str]]) -> pa.Table:
    cards, ts, kinds, amounts, scores, digests = zip(*rows, strict=True)
    from decimal import Decimal

    return pa.table({
        "card": pa.array(cards), "ts": pa.array(ts, pa.timestamp("us", "UTC")), "kind": pa.array(kinds),
        "amount": pa.array([Decimal(a) if a is not None else None for a in amounts], pa.decimal128(12, 2)),
        "score": pa.array(scores, pa.float64()), "_source": pa.array(["test"] * len(rows)),
        DIGEST: pa.array(digests)})


def read(table: pa.Table, entities: list[str], t_us: int, tspec: TileSpec | None = TSPEC
         ) -> dict[str, list[Any]]:
    """Build the tiles of ``table``, keep them as Redis would (by entity, tile start) and read at ``t_us``."""
    assert tspec is not None
    inputs = extract(tspec.spec, table)
    rows = build(tspec, inputs, np.ones(len(inputs), np.bool_))
    _, edges = fields_to_read(tspec, t_us)
    summaries: dict[str, tuple[list[int], list[bytes]]] = {e: ([], []) for e in entities}
    held: dict[str, EntityTiles] = {e: EntityTiles(None, None, {}) for e in entities}
    for e, s, summary, evs in zip(rows.entity.to_pylist(), rows.start_us.tolist(), rows.summary.to_pylist(),
                                  rows.events.to_pylist(), strict=True):
        if e not in held:
            continue
        # every tile's summary, as the hash's one packed field holds them (the read picks its range)
        summaries[e][0].append(s)
        summaries[e][1].append(summary)
        if s in edges:
            held[e].events[s] = evs
    for e, (starts, blobs) in summaries.items():
        held[e].summaries = pack_summary_set(starts, blobs) or None
    got = values_at(tspec, [held[e] for e in entities], t_us)
    return {k: v.to_pylist() for k, v in got.items()}


def engine(table: pa.Table, entities: list[str], t_us: int, tspec: TileSpec | None = TSPEC
           ) -> dict[str, list[Any]]:
    assert tspec is not None
    got = at_times(tspec.spec, extract(tspec.spec, table), pa.array(entities),
                   np.full(len(entities), t_us, np.int64))
    return {k: v.to_pylist() for k, v in got.items()}


HISTORY = [
    ("c1", T0 + 5 * MIN, "a", "10.50", 1.5, "00000000000000a1"),
    ("c1", T0 + 5 * MIN, "b", "-3.25", 7.25, "00000000000000a2"),   # a tie: the newer (greater digest)
    ("c1", T0 + 5 * MIN, "a", "10.50", 1.5, "00000000000000a1"),    # an exact copy: once
    ("c1", T0 + 40 * MIN, None, None, None, "00000000000000b1"),    # nulls: counted by n_2h only
    ("c1", T0 + 70 * MIN, "a", "2.00", -4.0, "00000000000000c1"),
    ("c1", T0 + 71 * MIN, "", "1.00", 0.125, "00000000000000c2"),   # an empty text is a distinct value
    ("c2", T0 + 30 * MIN, "b", "99.99", 3.0, "00000000000000d1"),   # one event
]


@pytest.mark.parametrize("t_us", [T0 - 1, T0 + 5 * MIN, T0 + 5 * MIN - 1, T0 + 39 * MIN, T0 + 70 * MIN,
                                  T0 + 71 * MIN, T0 + 2 * 60 * MIN + 5 * MIN, T0 + 2 * 60 * MIN + 5 * MIN - 1,
                                  T0 + 3 * 60 * MIN, T0 + 10 * 60 * MIN])
def test_a_read_of_packed_tiles_equals_the_engine(t_us: int) -> None:
    table = events(HISTORY)
    ids = ["c1", "c2", "nobody"]
    history = events([e for i, e in enumerate(HISTORY) if i != 2])  # at_times reads the history: no copy
    assert read(table, ids, t_us) == engine(history, ids, t_us)
    for one in ids:  # one entity per read (its own reductions) as several
        assert read(table, [one], t_us) == engine(history, [one], t_us), one
        assert read(table, [one], t_us, SIMPLE) == engine(history, [one], t_us, SIMPLE), one
    assert read(table, ids, t_us, SIMPLE) == engine(history, ids, t_us, SIMPLE)


def test_an_entity_with_no_tiles_reads_the_empty_window() -> None:
    assert TSPEC is not None
    got = {k: v.to_pylist() for k, v in values_at(TSPEC, [EntityTiles(None, None, {})], T0).items()}
    assert got["n_2h"] == [0] and got["amount_sum"][0] == 0 and got["score_sum"] == [0.0]
    assert got["amount_mean"] == [None] and got["score_max"] == [None] and got["score_first"] == [None]
    assert got["last3"] == [[]] and got["kinds"] == [0]
    assert values_at(TSPEC, [], T0)["n_2h"].to_pylist() == []


def test_summaries_and_events_round_trip() -> None:
    assert TSPEC is not None
    table = events(HISTORY)
    inputs = extract(TSPEC.spec, table)
    rows = build(TSPEC, inputs, np.ones(len(inputs), np.bool_))
    layout = TSPEC.layout
    # every tile's summary unpacks to group_raw's raw parts of the tile's events
    codes = np.asarray(pa.compute.cast(pa.compute.equal(inputs.entity, "c2"), pa.int64()))
    tile = inputs.time_us // TSPEC.size_us
    groups = codes * 10**12 + tile
    keep = np.array([0, 1, 3, 4, 5, 6])  # the exact copy left out
    _, want = group_raw(TSPEC, inputs.take(keep), groups[keep])
    got = unpack_summaries(layout, rows.summary.to_pylist())
    for k, part in enumerate(layout.fixed):
        col = want.column(part).to_pylist()
        vals = got.ints[:, k].view(np.float64) if layout.floats[k] else got.ints[:, k]
        assert [v if ok else None for v, ok in zip(vals.tolist(), got.valid[:, k], strict=True)] == col, part
    tails = [variable_parts(layout, t) for t in got.tails]
    want_sets = [sorted(x) for x in want.column("kinds.set").to_pylist()]
    assert [sorted(t["kinds.set"]) for t in tails] == want_sets
    assert [[float(x) for x in t["last3.v"]] for t in tails] == want.column("last3.v").to_pylist()
    # the events, sorted by time then digest, with their values and masks
    c1 = [unpack_events(layout, s, blob) for e, s, blob in zip(
        rows.entity.to_pylist(), rows.start_us.tolist(), rows.events.to_pylist(), strict=True) if e == "c1"]

    def column(get: Any) -> list[Any]:
        return [x for evs in c1 for x in list(get(evs))]

    assert column(lambda e: e.time_us) == [T0 + 5 * MIN, T0 + 5 * MIN, T0 + 40 * MIN, T0 + 70 * MIN,
                                           T0 + 71 * MIN]
    assert column(lambda e: e.values[layout.value_of["score_max"]]) == [1.5, 7.25, 0.0, -4.0, 0.125]
    assert column(lambda e: e.masks[layout.mask_of["score_max"]]) == [True, True, False, True, True]
    assert column(lambda e: e.masks[layout.mask_of["a_2h"]]) == [True, False, False, True, False]
    assert layout.mask_of["n_2h"] == -1
    assert column(lambda e: e.values[layout.value_of["amount_sum"]]) == [1050, -325, 0, 200, 100]
    assert column(lambda e: e.keys[layout.key_of["kinds"]]) == ["a", "b", "", "a", ""]
    # sum, mean and stddev of one field share one value column and one mask
    assert len(layout.values) == 2 and layout.value_of["amount_sum"] == layout.value_of["amount_std"]


def test_the_packed_layout_changed_the_signature() -> None:
    """A hash written in the text layout (signature without the layout version) is rewritten."""
    assert TSPEC is not None
    import hashlib

    held = [(a.name, a.function, a.of, a.where, a.k, a.scale) for a in TSPEC.spec.windowed]
    text_layout = hashlib.sha256(repr((TSPEC.parts, TSPEC.size_us, held)).encode()).hexdigest()[:16]
    assert TSPEC.signature != text_layout
    assert TSPEC.layout.row_bytes == 8 * 3 + len(TSPEC.layout.masks)  # time, amount, score; masks
