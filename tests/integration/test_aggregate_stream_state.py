"""The stream's windowed aggregations (``features.aggregate.stream``, run by the stream
job's micro-batch step ``StreamProcessor.process``) against the brute-force reference,
on real Postgres and Redis, for random histories:

- cut into random micro-batches, each entity on one Kafka partition;
- with restarts (a new processor: nothing held, state read back from the stores);
- with replays (a micro-batch processed again after a restart, as after a crash);
- continuing a batch backfill of an earlier part of the history.

Afterwards the aggregation table holds exactly the reference's values over the history
without the events the stream calls late (``tests/aggregate_reference.stream_late``:
more than the allowed lateness behind their entity's newest earlier accepted event,
the backfilled events counting as accepted first), the rejects table one
``aggregation.lateness`` row per late record, and Redis each entity's newest values.
Then a backfill of everything repairs what the late events changed: every value is the
reference's over the whole history.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from aggregate_reference import (
    BASE_US,
    EVENT,
    MINUTE_US,
    SCHEMA,
    USERS,
    T,
    check_hot,
    history_table,
    one_content_per_key,
    reference,
    stream_late,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from features.aggregate.stream import KeyingError
from features.compile import CompiledSchema, compile_schema
from features.compile.layout import aggregates_key
from features.config import Settings
from features.load import load
from features.schema import parse_schema
from features.stream.core import StreamProcessor

pytestmark = pytest.mark.services

COMPILED = compile_schema(parse_schema(SCHEMA))
AGGS = [a.name for a in COMPILED.schema.aggregations.features]  # type: ignore[union-attr]
TOPIC = "clicks-test"


def _iso(us: int) -> str:
    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def _payload(e: dict[str, Any]) -> bytes:
    return json.dumps({"uid": e["uid"], "ts": _iso(e[T]), "kind": e["kind"],
                       "amount": None if e["amount"] is None else str(e["amount"]), "qty": e["qty"],
                       "score": e["score"], "item": e["item"], "temp": e.get("temp")}).encode()


def _partition(uid: str) -> int:
    return USERS.index(uid) % 2  # keyed by entity


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    events = one_content_per_key(draw(st.lists(EVENT, min_size=1, max_size=50)))
    k = draw(st.integers(0, len(events))) if draw(st.booleans()) else 0  # a backfill first?
    backfill, stream = events[:k], events[k:]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(stream) - 1, 1)), max_size=5))))
    bounds = [0, *[c for c in cuts if c < len(stream)], len(stream)]
    batches = [list(range(a, b)) for a, b in itertools.pairwise(bounds) if b > a]
    # after which micro-batches the processor restarts, and whether it then replays that batch
    restarts = draw(st.sets(st.integers(0, max(len(batches) - 1, 0))))
    replay = draw(st.booleans())
    return {"backfill": backfill, "stream": stream, "batches": batches, "restarts": restarts,
            "replay": replay}


def _processor(settings: Settings, ns: str, prefix: str, run: str, compiled: CompiledSchema = COMPILED
               ) -> StreamProcessor:
    proc = StreamProcessor(compiled, settings, run_id=run, dead_letter_topic=None, search_path=ns,
                           key_prefix=prefix)
    proc.open()
    return proc


def _process(proc: StreamProcessor, stream: list[dict[str, Any]], batch: list[int]) -> None:
    values = [_payload(stream[i]) for i in batch]
    topics = pa.array([TOPIC] * len(batch), pa.string())
    partitions = pa.array([_partition(stream[i]["uid"]) for i in batch], pa.int32())
    offsets = pa.array(batch, pa.int64())  # one offset sequence is enough: sources stay unique
    proc.process(values, topics, partitions, offsets)


def _stored(conn: Any, ns: str) -> dict[tuple[str, int], tuple[Any, ...]]:
    cols = sql.SQL(", ").join(sql.Identifier(a) for a in AGGS)
    rows = conn.execute(sql.SQL("SELECT uid, (extract(epoch FROM ts) * 1000000)::bigint, {} "
                                "FROM {}.agg_props__aggregates").format(cols, sql.Identifier(ns))).fetchall()
    return {(r[0], int(r[1])): tuple(r[2:]) for r in rows}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(case=cases())
def test_stream_values_are_the_reference_over_what_it_did_not_call_late(
        case: dict[str, Any], settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> None:
    backfill, stream, batches = case["backfill"], case["stream"], case["batches"]
    ns = f"t_aggstream_{uuid.uuid4().hex[:12]}"
    prefix = f"test:{ns}:"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    r = redis.Redis.from_url(settings.redis_url)
    tmp = tmp_path_factory.mktemp("stream")
    try:
        if backfill:
            pq.write_table(history_table(backfill), Path(tmp) / "backfill.parquet")
            load([Path(tmp) / "backfill.parquet"], COMPILED, settings, search_path=ns, key_prefix=prefix)
        proc = _processor(settings, ns, prefix, "first")
        try:
            for b, batch in enumerate(batches):
                _process(proc, stream, batch)
                if b in case["restarts"]:
                    proc.close()
                    proc = _processor(settings, ns, prefix, f"after-{b}")
                    if case["replay"]:
                        _process(proc, stream, batch)  # at least once: the batch again
        finally:
            proc.close()

        # the backfilled events count as accepted before the stream's (time order: none late)
        arrival = sorted(backfill, key=lambda e: e[T]) + stream
        late = {i - len(backfill) for i in stream_late(COMPILED.schema, arrival)}
        assert all(i >= 0 for i in late)
        kept = backfill + [e for i, e in enumerate(stream) if i not in late]
        want = reference(COMPILED.schema, kept)
        got = _stored(admin, ns)
        assert got == want
        rejects = admin.execute(sql.SQL(
            "SELECT count(*) FROM {}.agg_props__rejects WHERE errors->0->>'rule' = 'aggregation.lateness'"
        ).format(sql.Identifier(ns))).fetchone()
        assert rejects is not None and rejects[0] == len(late)
        check_hot(r, prefix, COMPILED.schema, want)
        # a backfill of everything repairs what the late events changed
        pq.write_table(history_table(backfill + stream), Path(tmp) / "all.parquet")
        load([Path(tmp) / "all.parquet"], COMPILED, settings, search_path=ns, key_prefix=prefix)
        assert _stored(admin, ns) == reference(COMPILED.schema, backfill + stream)
    finally:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def test_an_entity_on_two_partitions_is_refused_with_a_clear_error(settings: Settings, pg_schema: str,
                                                                    redis_prefix: str) -> None:
    proc = _processor(settings, pg_schema, redis_prefix, "keying")
    try:
        e = {"uid": "u1", T: BASE_US, "kind": "a", "amount": None, "qty": 1, "score": None, "item": None}
        values = [_payload(e), _payload({**e, T: BASE_US + MINUTE_US})]
        with pytest.raises(KeyingError) as err:
            proc.process(values, pa.array([TOPIC, TOPIC]), pa.array([0, 1], pa.int32()), pa.array([0, 0]))
        assert "uid 'u1' arrives on two Kafka partitions" in str(err.value)
        assert f"kafka://{TOPIC}/0 and kafka://{TOPIC}/1" in str(err.value)
        assert "record key" in str(err.value)
    finally:
        proc.close()


def test_a_micro_batch_replayed_after_a_restart_changes_nothing(settings: Settings, pg_schema: str,
                                                                 redis_prefix: str) -> None:
    """The same records again (at least once delivery after a crash): an event that was
    on time stays accepted even though the batch's later events are now stored, and its
    values are written again (a crash may have come between Postgres and Redis); a
    second record of an accepted key stays a duplicate (not late), as in the first pass."""
    e = {"uid": "u1", "kind": "a", "amount": Decimal("2.50"), "qty": 3, "score": 0.5, "item": "i1"}
    stream = [{**e, T: BASE_US}, {**e, T: BASE_US}, {**e, T: BASE_US + 100 * MINUTE_US, "qty": 4}]
    proc = _processor(settings, pg_schema, redis_prefix, "first")
    try:
        _process(proc, stream, [0, 1, 2])
        assert proc.aggregator is not None
        counts = proc.aggregator.counts
        assert (counts.accepted, counts.late, counts.duplicates) == (2, 0, 1)
    finally:
        proc.close()
    r = redis.Redis.from_url(settings.redis_url)
    key = redis_prefix + aggregates_key("agg_props", "u1")
    r.delete(key)  # as if the crash came before the Redis write
    with psycopg.connect(settings.postgres_dsn) as conn:
        before = _stored(conn, pg_schema)
    proc = _processor(settings, pg_schema, redis_prefix, "again")
    try:
        _process(proc, stream, [0, 1, 2])
        assert proc.aggregator is not None
        counts = proc.aggregator.counts
        assert (counts.accepted, counts.late, counts.duplicates) == (2, 0, 1)
    finally:
        proc.close()
    with psycopg.connect(settings.postgres_dsn) as conn:
        assert _stored(conn, pg_schema) == before == reference(COMPILED.schema, stream)
        late = conn.execute(sql.SQL("SELECT count(*) FROM {}.agg_props__rejects").format(
            sql.Identifier(pg_schema))).fetchone()
        assert late is not None and late[0] == 0
    assert int(r.hget(key, "_event_time") or 0) == BASE_US + 100 * MINUTE_US
    r.close()


def test_moments_first_and_float_sums_in_the_micro_batch(settings: Settings, pg_schema: str,
                                                         redis_prefix: str) -> None:
    """variance/stddev, a float field's fixed-point sum, mean and stddev, and first, computed
    by the stream's micro-batch step: two micro-batches, the second with an event older
    than the first's (within the lateness), then a restart (state read back from
    Postgres) and a third. Every stored value is the reference's and the hand-computed
    one; Redis holds the newest event's hot values."""
    e = {"uid": "u1", "kind": "a", "amount": None, "score": None, "item": None}
    stream = [
        {**e, T: BASE_US + 20 * MINUTE_US, "qty": 4, "temp": 0.25, "amount": Decimal("1.00")},
        {**e, T: BASE_US + 10 * MINUTE_US, "qty": 2, "temp": 1.5, "amount": Decimal("3.00")},  # older
        {**e, T: BASE_US + 30 * MINUTE_US, "qty": 9, "temp": 0.05, "score": 0.5},
    ]
    proc = _processor(settings, pg_schema, redis_prefix, "first")
    try:
        _process(proc, stream, [0])
        _process(proc, stream, [1])
    finally:
        proc.close()
    proc = _processor(settings, pg_schema, redis_prefix, "after-restart")
    try:
        _process(proc, stream, [2])
        assert proc.aggregator is not None and proc.aggregator.counts.late == 0
    finally:
        proc.close()
    with psycopg.connect(settings.postgres_dsn) as conn:
        got = _stored(conn, pg_schema)
    want = reference(COMPILED.schema, stream)
    assert got == want
    at = dict(zip(AGGS, got[("u1", BASE_US + 20 * MINUTE_US)], strict=True))
    # (the event at 10 minutes arrived after the one at 20: its value was updated in place)
    assert at["qty_first"] == 2 and at["qty_var"] == 1.0 and at["amount_std"] == 1.0
    assert at["amount_var_s"] == 2.0 and at["temp_sum"] == 1.7  # 15 + 2 tenths: 0.25 is a tie, kept at 2
    assert at["temp_mean"] == 0.875 and at["temp_std_s"] == 0.78125 ** 0.5
    newest = dict(zip(AGGS, got[("u1", BASE_US + 30 * MINUTE_US)], strict=True))
    # 0.05 is 0.05000000000000000277 in binary: 0.5 tenths and a little, so 1 tenth
    assert newest["temp_sum"] == 1.8 and newest["qty_first"] == 2 and newest["score_first"] == 0.5
    assert isinstance(newest["qty_std_hour"], float) and isinstance(newest["temp_sum"], float)
    r = redis.Redis.from_url(settings.redis_url)
    try:
        check_hot(r, redis_prefix, COMPILED.schema, want)
        hot = r.hgetall(redis_prefix + aggregates_key("agg_props", "u1"))
        assert float(hot[b"temp_sum"]) == 1.8 and int(hot[b"qty_first"]) == 2
    finally:
        r.close()


def test_a_tie_with_an_aggregated_instant_after_a_restart_skips_nothing(settings: Settings, pg_schema: str,
                                                                        redis_prefix: str) -> None:
    """A restarted processor reads an entity's state back from Postgres while the
    micro-batch's history rows are written. Its records, in chunks of one: two new events
    of u1, then one at the instant of the event u1 was aggregated at before the restart
    (a tie, other content), then records of u2, so that the tie's history row is stored
    before the micro-batch is planned. Read back after that row, the tie counted as applied
    (its instant holds an aggregation row) and its offset as u1's highest applied one: the
    two records before it were skipped as replays, their values never written."""
    e = {"uid": "u1", "kind": "a", "amount": None, "score": None, "item": None, "temp": None}
    stream = [{**e, T: BASE_US + 60 * MINUTE_US, "qty": 1},
              {**e, T: BASE_US + 70 * MINUTE_US, "qty": 2}, {**e, T: BASE_US + 80 * MINUTE_US, "qty": 4},
              {**e, T: BASE_US + 60 * MINUTE_US, "qty": 8},
              *({**e, "uid": "u2", T: BASE_US + m * MINUTE_US, "qty": m} for m in range(5))]
    proc = _processor(settings, pg_schema, redis_prefix, "first")
    try:
        _process(proc, stream, [0])
    finally:
        proc.close()
    proc = StreamProcessor(COMPILED, settings, run_id="after-restart", dead_letter_topic=None,
                           search_path=pg_schema, key_prefix=redis_prefix, chunk_records=1)
    proc.open()
    try:
        _process(proc, stream, list(range(1, len(stream))))
        assert proc.aggregator is not None
        assert (proc.aggregator.counts.accepted, proc.aggregator.counts.late) == (len(stream) - 1, 0)
    finally:
        proc.close()
    with psycopg.connect(settings.postgres_dsn) as conn:
        got = _stored(conn, pg_schema)
    assert {k for k in got if k[0] == "u1"} == {("u1", BASE_US + m * MINUTE_US) for m in (60, 70, 80)}
    at = {m: dict(zip(AGGS, got[("u1", BASE_US + m * MINUTE_US)], strict=True)) for m in (70, 80)}
    assert (at[70]["n_1h"], at[80]["n_1h"], at[80]["qty_sum_2h"]) == (3, 4, 1 + 2 + 4 + 8)
