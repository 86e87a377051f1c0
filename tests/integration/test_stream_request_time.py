"""The stream's micro-batch writes the request-time window tiles (issue 49 step c):
``StreamProcessor.process`` (the step the Flink job runs) on real Kafka-shaped records,
real Postgres and Redis, then ``FeatureStore.online(..., windows="request_time", at=T)``
equals ``historical(..., windows="request_time")`` and the brute-force reference
(``reference_at``, ``tests/aggregate_reference.py``) at request times in bursts, on
events, 1 µs either side, on tile boundaries, long after the last event, before the first:

- every function of the shared schema served hot (the sketches and a ratio of one
  included: ``HOT_SCHEMA``);
- random histories (ties at one instant with different contents included), optionally
  a backfill of a part first, the rest shuffled (so events arrive late, within the
  allowed lateness: they update the tiles they fall in) and cut into micro-batches;
- restarts (a new processor: nothing held, state read back from Postgres) and replays
  of a micro-batch after one: the tiles hashes after the replay are byte for byte the
  ones before it (complete tiles, never deltas);
- an event more than the allowed lateness behind is left out of the tiles (as out of
  the stored values), until a backfill of the range rewrites them.
"""

from __future__ import annotations

import itertools
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from aggregate_reference import BASE_US, EVENT, MINUTE_US, USERS, T, history_table, reference_at
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_aggregate_stream_state import _process, _processor
from test_online_request_time import (
    AGGS,
    COMPILED,
    HOT_SCHEMA,
    TILE,
    at,
    check_request_times,
    hot_stores,
    rows_of,
)

from features import FeatureStore
from features.compile.layout import tiles_key
from features.config import Settings
from features.load import load

pytestmark = pytest.mark.services

HOUR = 60 * MINUTE_US
DAY = 24 * HOUR


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    """A history, the part a backfill loads first, the stream's arrival order (any
    permutation), its micro-batches, restarts and replays, and request times around it."""
    events = draw(st.lists(EVENT, min_size=1, max_size=40))
    k = draw(st.integers(0, len(events))) if draw(st.booleans()) else 0
    backfill, stream = events[:k], draw(st.permutations(events[k:]))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(stream) - 1, 1)), max_size=6))))
    bounds = [0, *[c for c in cuts if c < len(stream)], len(stream)]
    batches = [list(range(a, b)) for a, b in itertools.pairwise(bounds) if b > a]
    restarts = draw(st.sets(st.integers(0, max(len(batches) - 1, 0))))
    near = [e[T] + d for e in events for d in (0, -1, 1, HOUR, HOUR + 1, 2 * HOUR, 90 * MINUTE_US)]
    edges = [BASE_US + i * TILE + d for i in range(-1, 20) for d in (-1, 0, 1)]
    fixed = [BASE_US - DAY, BASE_US - 1, BASE_US + 2 * HOUR, BASE_US + 7 * DAY, BASE_US + DAY + 1]
    t = st.one_of(st.sampled_from(near + fixed), st.sampled_from(edges),
                  st.integers(BASE_US - HOUR, BASE_US + 12 * HOUR))
    times = draw(st.lists(t, min_size=1, max_size=6, unique=True))
    return {"events": events, "backfill": backfill, "stream": stream, "batches": batches,
            "restarts": restarts, "replay": draw(st.booleans()), "times": times}


def _tiles(client: redis.Redis, prefix: str) -> dict[str, dict[bytes, bytes]]:
    """Every tiles hash, whole."""
    out = {}
    for u in USERS:
        key = prefix + tiles_key("agg_props", u)
        out[key] = dict(client.hgetall(key))  # type: ignore[arg-type]
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=cases())
def test_stream_tiles_read_at_request_time_equal_historical_and_the_reference(
        case: dict[str, Any], settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    backfill, stream = case["backfill"], case["stream"]
    tmp = tmp_path_factory.mktemp("srt")
    client = redis.Redis.from_url(settings.redis_url)
    with hot_stores(settings, tmp, "stream_rt") as (ns, prefix, fs):
        if backfill:
            pq.write_table(history_table(backfill), tmp / "backfill.parquet")
            assert load([tmp / "backfill.parquet"], COMPILED, settings, search_path=ns,
                        key_prefix=prefix).adds_up
        proc = _processor(settings, ns, prefix, "first", COMPILED)
        tiles_written = 0
        try:
            for b, batch in enumerate(case["batches"]):
                _process(proc, stream, batch)
                if b in case["restarts"]:
                    assert proc.aggregator is not None and proc.aggregator.counts.late == 0
                    tiles_written += proc.aggregator.counts.tiles_written
                    proc.close()
                    proc = _processor(settings, ns, prefix, f"after-{b}", COMPILED)
                    if case["replay"]:  # at least once: the batch again, state read back
                        before = _tiles(client, prefix)
                        _process(proc, stream, batch)
                        assert _tiles(client, prefix) == before
            assert proc.aggregator is not None and proc.aggregator.counts.late == 0
            tiles_written += proc.aggregator.counts.tiles_written
            assert (tiles_written > 0) == bool(stream)
        finally:
            proc.close()
            client.close()
        check_request_times(fs, case["events"], case["times"])


LATE_SCHEMA = HOT_SCHEMA.replace("allowed_lateness: 2d", "allowed_lateness: 30m")


def test_an_event_beyond_the_lateness_stays_out_of_the_tiles_until_a_backfill(
        settings: Settings, tmp_path: Path, pg_schema: str, redis_prefix: str) -> None:
    """Two micro-batches: the second brings an event 10 min late (within the 30-min
    lateness: counted, in the tile it falls in) and one 2 h late (rejected: out of the
    tiles as of the stored values, though in the history, which ``historical`` reads).
    A backfill of everything then rewrites the tiles: online equals historical again."""
    from features.compile import compile_schema
    from features.schema import parse_schema

    assert "allowed_lateness: 30m" in LATE_SCHEMA
    c = compile_schema(parse_schema(LATE_SCHEMA))
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "agg_props.yaml").write_text(LATE_SCHEMA)
    e = {"uid": "u1", "kind": "a", "amount": Decimal("1.00"), "qty": 1, "score": 0.5, "item": "i1",
         "temp": 1.0}
    stream = [{**e, T: BASE_US + 180 * MINUTE_US}, {**e, T: BASE_US + 170 * MINUTE_US, "qty": 2},
              {**e, T: BASE_US + 60 * MINUTE_US, "qty": 4}, {**e, T: BASE_US + 190 * MINUTE_US, "qty": 8}]
    proc = _processor(settings, pg_schema, redis_prefix, "late", c)
    try:
        _process(proc, stream, [0])
        _process(proc, stream, [1, 2, 3])
        assert proc.aggregator is not None
        assert (proc.aggregator.counts.accepted, proc.aggregator.counts.late) == (3, 1)
    finally:
        proc.close()
    kept = [stream[0], stream[1], stream[3]]
    times = [BASE_US + 190 * MINUTE_US, BASE_US + 200 * MINUTE_US, BASE_US + 170 * MINUTE_US,
             BASE_US + 230 * MINUTE_US + 1, BASE_US + 10 * HOUR]
    names = ["n_1h", "qty_first", "amount_day", "qty_max_hour", "qty_sum_2h"]
    with FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                      schemas=tmp_path / "schemas", search_path=pg_schema, key_prefix=redis_prefix) as fs:
        idx = [AGGS.index(x) for x in names]
        for t in times:
            got = fs.online("agg_props", ["u1"], names, windows="request_time", at=at(t))
            want = reference_at(c.schema, kept, [("u1", t)])[0]
            assert [got.column(x)[0].as_py() for x in names] == [want[i] for i in idx], t
        t = BASE_US + 190 * MINUTE_US
        got = fs.online("agg_props", ["u1"], ["n_1h", "qty_sum_2h"], windows="request_time", at=at(t))
        assert (got.column("n_1h")[0].as_py(), got.column("qty_sum_2h")[0].as_py()) == (3, 1 + 2 + 8)
        # a backfill of everything includes the rejected event: online equals historical again
        pq.write_table(history_table(stream), tmp_path / "all.parquet")
        assert load([tmp_path / "all.parquet"], c, settings, search_path=pg_schema,
                    key_prefix=redis_prefix).adds_up
        stamp = pa.array([t], pa.int64()).cast(pa.timestamp("us", "UTC"))
        frame = pa.table({"uid": ["u1"], "timestamp": stamp})
        want = reference_at(c.schema, stream, [("u1", t)])
        assert rows_of(fs.online("agg_props", ["u1"], AGGS, windows="request_time", at=at(t))) == want
        assert rows_of(fs.historical("agg_props", frame, AGGS, windows="request_time")) == want
