"""A stream replayed after a restart gives every record the first pass's verdict.

After a crash the stream job resumes from its last checkpoint and replays records the
first pass already applied; the aggregator then reads each entity's state back from
Postgres, which holds only the events within the horizon of the entity's newest one.
An entity that jumped beyond the horizon after a replayed record has none of the events
that record was judged against in its state: the replay must still call late what the
first pass called late, keep accepted what it accepted, and write the same values,
rejects and request-time tiles as a run without the restart (``features.aggregate.stream``,
"Replays"). Real Postgres and Redis, the micro-batch step of the stream job
(``StreamProcessor.process``), no Flink.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import redis
from aggregate_reference import (
    BASE_US,
    EVENT,
    MINUTE_US,
    USERS,
    T,
    one_content_per_key,
    reference,
    stream_late,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from test_aggregate_stream_state import AGGS, COMPILED, _process, _processor

from features.compile.layout import aggregates_key, tiles_key
from features.config import Settings

pytestmark = pytest.mark.services

HOUR_US = 60 * MINUTE_US
DAY_US = 24 * HOUR_US


@contextmanager
def _space(settings: Settings) -> Iterator[tuple[str, str]]:
    """A fresh Postgres schema and Redis key prefix, dropped afterwards."""
    ns = f"t_replay_{uuid.uuid4().hex[:12]}"
    prefix = f"test:{ns}:"
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
        r = redis.Redis.from_url(settings.redis_url)
        try:
            yield ns, prefix
        finally:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
            keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                r.delete(*keys)
            r.close()


def _run(settings: Settings, ns: str, prefix: str, stream: list[dict[str, Any]],
         passes: list[list[list[int]]]) -> None:
    """Each pass a fresh processor (a restart: nothing held) over its micro-batches."""
    for k, batches in enumerate(passes):
        proc = _processor(settings, ns, prefix, "run" if k == 0 else f"restart-{k}")
        try:
            for batch in batches:
                _process(proc, stream, batch)
        finally:
            proc.close()


def _state(settings: Settings, ns: str, prefix: str, stream: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything the aggregations stored: values and lineage source per row, the late
    rejects' sources, the hot values and the tiles of every entity."""
    with psycopg.connect(settings.postgres_dsn) as conn:
        cols = sql.SQL(", ").join(sql.Identifier(a) for a in AGGS)
        rows = conn.execute(sql.SQL("SELECT uid, (extract(epoch FROM ts) * 1000000)::bigint, {}, _source "
                                    "FROM {}.agg_props__aggregates").format(
            cols, sql.Identifier(ns))).fetchall()
        late = conn.execute(sql.SQL("SELECT _source FROM {}.agg_props__rejects "
                                    "WHERE errors->0->>'rule' = 'aggregation.lateness'").format(
            sql.Identifier(ns))).fetchall()
    r = redis.Redis.from_url(settings.redis_url)
    try:
        hot, tiles = {}, {}
        for uid in sorted({e["uid"] for e in stream}):
            h = r.hgetall(prefix + aggregates_key("agg_props", uid))
            hot[uid] = {k: v for k, v in h.items() if not k.startswith(b"_") or k == b"_event_time"}
            tiles[uid] = r.hgetall(prefix + tiles_key("agg_props", uid))
    finally:
        r.close()
    return {"values": {(x[0], int(x[1])): tuple(x[2:-1]) for x in rows},
            "sources": {(x[0], int(x[1])): x[-1] for x in rows},
            "late": sorted(x[0] for x in late), "hot": hot, "tiles": tiles}


def _want(stream: list[dict[str, Any]]) -> tuple[dict[tuple[str, int], tuple[Any, ...]], set[int]]:
    late = stream_late(COMPILED.schema, stream)
    return reference(COMPILED.schema, [e for i, e in enumerate(stream) if i not in late]), late


def _event(t: int, qty: int, **more: Any) -> dict[str, Any]:
    return {"uid": "u1", T: t, "kind": "a", "amount": Decimal("2.50"), "qty": qty, "score": 0.5,
            "item": f"i{qty}", **more}


#: u1: A and Y on time, X more than the lateness (30 min) behind Y, then Z two days on:
#: beyond the horizon (30 min + the longest window, 1 day), so a restart reads back Z alone
JUMP = [_event(BASE_US + 9 * HOUR_US, 1),                          # 0 A
        _event(BASE_US + 9 * HOUR_US + 30 * MINUTE_US, 2),         # 1 Y: A in its 1 h windows
        _event(BASE_US + 8 * HOUR_US + 30 * MINUTE_US, 3),         # 2 X: 60 min behind Y, late
        _event(BASE_US + 3 * DAY_US, 4)]                           # 3 Z


@pytest.mark.parametrize("passes", [
    # the restart replays X (and Z): Y, before the checkpoint, is not read back
    [[[0, 1], [2], [3]], [[2], [3]]],
    # the restart replays Y, then X in another micro-batch: neither is read back
    [[[0], [1], [2], [3]], [[1], [2], [3]]],
    # re-cut: the replay's micro-batches differ from the first pass's
    [[[0, 1, 2, 3]], [[1], [2, 3]]],
    # the first pass crashed after X's micro-batch: Z is new after the restart
    [[[0, 1], [2]], [[1, 2], [3]]],
], ids=["replay-late", "replay-accepted-then-late", "re-cut", "crash-before-the-jump"])
def test_a_replay_after_the_entity_jumped_beyond_the_horizon_keeps_the_first_verdicts(
        settings: Settings, passes: list[list[list[int]]]) -> None:
    want, late = _want(JUMP)
    assert late == {2}
    assert want[("u1", JUMP[1][T])][0] == 2  # Y's n_1h counts A: a read-back without A gets it wrong
    with _space(settings) as (ns, prefix):
        _run(settings, ns, prefix, JUMP, [[[0, 1, 2, 3]]])
        straight = _state(settings, ns, prefix, JUMP)
    with _space(settings) as (ns, prefix):
        _run(settings, ns, prefix, JUMP, passes)
        restarted = _state(settings, ns, prefix, JUMP)
    assert restarted["values"] == want == straight["values"]
    assert restarted["late"] == straight["late"] == ["kafka://clicks-test/0/2"]
    assert restarted["sources"] == straight["sources"]
    assert restarted["hot"] == straight["hot"]
    assert restarted["tiles"] == straight["tiles"]


@st.composite
def jumpy(draw: st.DrawFn) -> dict[str, Any]:
    """A random history whose entities jump beyond the horizon now and then, cut into
    micro-batches at random; a restart after a random micro-batch that replays from a
    random earlier record, cut at random again."""
    events: list[dict[str, Any]] = []
    shift = {uid: 0 for uid in USERS}
    for e in draw(st.lists(EVENT, min_size=2, max_size=30)):
        if draw(st.integers(0, 5)) == 0:
            shift[e["uid"]] += draw(st.sampled_from([2 * DAY_US, 3 * DAY_US]))
        events.append({**e, T: e[T] + shift[e["uid"]]})
    events = one_content_per_key(events)
    n = len(events)
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=6))))
    bounds = [0, *cuts, n]
    batches = [list(range(a, b)) for a, b in itertools.pairwise(bounds) if b > a]
    crash = draw(st.integers(1, len(batches)))        # the first pass applied these batches
    applied = bounds[crash]
    start = draw(st.integers(0, applied - 1))         # the checkpoint: replay from here
    recuts = sorted(set(draw(st.lists(st.integers(start + 1, max(n - 1, start + 1)), max_size=6))))
    rb = [start, *[c for c in recuts if start < c < n], n]
    replay = [list(range(a, b)) for a, b in itertools.pairwise(rb) if b > a]
    return {"events": events, "first": batches[:crash], "replay": replay, "all": batches}


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=jumpy())
def test_a_restart_from_any_point_equals_the_uninterrupted_run(case: dict[str, Any],
                                                              settings: Settings) -> None:
    events = case["events"]
    want, late = _want(events)
    with _space(settings) as (ns, prefix):
        _run(settings, ns, prefix, events, [case["all"]])
        straight = _state(settings, ns, prefix, events)
    with _space(settings) as (ns, prefix):
        _run(settings, ns, prefix, events, [case["first"], case["replay"]])
        restarted = _state(settings, ns, prefix, events)
    assert straight["values"] == want
    assert restarted["values"] == want
    assert len(restarted["late"]) == len(late)
    assert restarted["late"] == straight["late"]
    assert restarted["sources"] == straight["sources"]
    assert restarted["hot"] == straight["hot"]
    assert restarted["tiles"] == straight["tiles"]
