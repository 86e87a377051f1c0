"""One suite every Sink runs against its real store (Postgres, Redis): no fakes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.errors import SinkUnavailable
from features.lineage import RunContext
from features.schema.parse import parse_schema
from features.sinks.base import REJECTED_ROWS_SCHEMA, Sink, WriteUnit

pytestmark = pytest.mark.services

SCHEMA = """
name: contract_items
version: 1.0.0
entity: item_id
event_time: seen_at
hot: {ttl: 1h}
fields:
  - name: item_id
    type: string
    store: [hot, cold]
    constraints: {required: true}
  - name: seen_at
    type: timestamp(us, UTC)
    store: [hot, cold]
    constraints: {required: true}
  - name: price
    type: decimal(12,2)
    store: [hot, cold]
  - name: label
    type: string
    store: hot
"""


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return compile_schema(parse_schema(SCHEMA, "contract_items.yaml"))


def _ts(day: int) -> dt.datetime:
    return dt.datetime(2024, 1, day, tzinfo=dt.UTC)


def rows(compiled: CompiledSchema, items: list[tuple[str, int, str | None, str | None]],
         run_id: str = "run-1") -> pa.Table:
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, run_id, _ts(28))
    n = len(items)
    return pa.table({
        "item_id": [i[0] for i in items],
        "seen_at": pa.array([_ts(i[1]) for i in items], pa.timestamp("us", "UTC")),
        "price": pa.array([Decimal(i[2]) if i[2] else None for i in items], pa.decimal128(12, 2)),
        "label": pa.array([i[3] for i in items], pa.string()),
        **ctx.columns(pa.array([f"file:///contract.parquet#{k}" for k in range(n)])),
    })


def rejects(compiled: CompiledSchema, n: int, run_id: str = "run-1") -> pa.Table:
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, run_id, _ts(28))
    lineage = ctx.columns(pa.array([f"file:///contract.parquet#bad{k}" for k in range(n)]))
    return pa.table({
        "_source": lineage["_source"], "row_index": pa.array(range(n), pa.int64()),
        "raw": pa.array(['{"item_id": null}'] * n),
        "errors": pa.array(['[{"rule": "item_id.not_null"}]'] * n),
        "event_time": pa.nulls(n, pa.timestamp("us", "UTC")),
        **{k: v for k, v in lineage.items() if k != "_source"},
    }, schema=REJECTED_ROWS_SCHEMA)


@pytest.fixture(params=["postgres", "redis", "redis-cluster"])
def sink_factory(
    request: pytest.FixtureRequest, settings: Settings, compiled: CompiledSchema, pg_schema: str,
    redis_prefix: str,
) -> Iterator[tuple[str, Callable[..., Sink], Callable[[], Any]]]:
    """(kind, make(url=None) -> Sink, snapshot() -> the store's content for this schema)."""
    kind = request.param
    if kind == "postgres":
        import psycopg

        from features.sinks.postgres import PostgresSink

        def make(url: str | None = None) -> Sink:
            return PostgresSink(url or settings.postgres_dsn, compiled, search_path=pg_schema,
                                retries=2, backoff_s=0.05)

        def snapshot() -> Any:
            with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as c:
                cold = c.execute('SELECT item_id, seen_at, price::text, _source FROM contract_items '
                                 'ORDER BY 1, 2').fetchall()
                rej = c.execute('SELECT _source FROM contract_items__rejects ORDER BY 1').fetchall()
            return cold, rej

        yield kind, make, snapshot
    elif kind == "redis":
        import redis

        from features.sinks.redis import RedisSink

        client = redis.Redis.from_url(settings.redis_url)

        def make(url: str | None = None) -> Sink:
            return RedisSink(url or settings.redis_url, compiled, key_prefix=redis_prefix, retries=2,
                             backoff_s=0.05)

        def snapshot() -> Any:
            keys = sorted(client.scan_iter(match=redis_prefix + "features:contract_items:{*", count=10_000))
            return {k: client.hgetall(k) for k in keys}

        yield kind, make, snapshot
        client.close()
    else:  # the local Redis Cluster: 3 primaries + 3 replicas
        from redis.cluster import ClusterNode, RedisCluster

        from features.sinks.redis import RedisSink

        cluster = request.getfixturevalue("redis_cluster")
        prefix = request.getfixturevalue("redis_cluster_prefix")
        client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in cluster.ports[:3]])

        def make(url: str | None = None) -> Sink:
            return RedisSink(url or cluster.url, compiled, key_prefix=prefix, retries=2, backoff_s=0.05)

        def snapshot() -> Any:
            keys = sorted(k for node in client.get_primaries()
                          for k in client.get_redis_connection(node).scan_iter(
                              match=prefix + "features:contract_items:{*", count=10_000))
            return {k: client.hgetall(k) for k in keys}

        yield "redis", make, snapshot
        client.close()


def test_unreachable_store_raises_sink_unavailable_naming_the_address(sink_factory: Any,
                                                                      request: pytest.FixtureRequest) -> None:
    kind, make, _ = sink_factory
    cluster = request.node.callspec.params["sink_factory"] == "redis-cluster"
    url = ("postgresql://featureline:featureline@127.0.0.1:1/featureline" if kind == "postgres"
           else "redis+cluster://127.0.0.1:1" if cluster else "redis://127.0.0.1:1/0")
    sink = make(url)
    with pytest.raises(SinkUnavailable) as info:
        sink.open()
    assert info.value.store == kind
    assert "127.0.0.1:1" in str(info.value)


def test_writing_a_unit_twice_changes_nothing(sink_factory: Any, compiled: CompiledSchema) -> None:
    _kind, make, snapshot = sink_factory
    sink = make()
    sink.open()
    try:
        unit = WriteUnit(rows(compiled, [("a", 1, "1.50", "x"), ("b", 2, None, None)]), rejects(compiled, 1),
                         None, 3)
        first = sink.write(unit)
        assert first.stored == 2
        before = snapshot()
        second = sink.write(unit)
        assert second.stored == 0 and second.already_present == 2
        assert snapshot() == before
    finally:
        sink.close()


def test_chunked_input_with_empty_chunks_is_written_exactly(sink_factory: Any,
                                                          compiled: CompiledSchema) -> None:
    """Tables built by concatenation can start with an empty chunk (a micro-batch with
    no decode failures); pyarrow 16's write_csv garbles those, so the sinks must not."""
    _kind, make, snapshot = sink_factory
    good = rows(compiled, [("a", 1, "1.50", "x"), ("b", 2, None, None)])
    bad = rejects(compiled, 2)
    unit = WriteUnit(pa.concat_tables([good.slice(0, 0), good]), pa.concat_tables([bad.slice(0, 0), bad]),
                     None, 4)
    sink = make()
    sink.open()
    try:
        assert sink.write(unit).stored == 2
        content = snapshot()
        if isinstance(content, tuple):  # postgres: (cold rows, rejects)
            cold, rej = content
            assert [(r[0], r[2]) for r in cold] == [("a", "1.50"), ("b", None)]
            assert [r[0] for r in rej] == ["file:///contract.parquet#bad0", "file:///contract.parquet#bad1"]
        else:
            assert len(content) == 2
    finally:
        sink.close()


def test_ledger_unit_is_committed_once(sink_factory: Any, compiled: CompiledSchema) -> None:
    _kind, make, snapshot = sink_factory
    sink = make()
    sink.open()
    try:
        unit = WriteUnit(rows(compiled, [("a", 1, "1.50", "x")]), rejects(compiled, 0), "file-1/rg0", 1)
        assert "file-1/rg0" not in sink.committed_units()
        sink.write(unit)
        assert "file-1/rg0" in sink.committed_units()
        before = snapshot()
        again = sink.write(unit)
        assert again.stored == 0
        assert snapshot() == before
    finally:
        sink.close()


def test_older_event_never_replaces_newer(sink_factory: Any, compiled: CompiledSchema) -> None:
    kind, make, snapshot = sink_factory
    sink = make()
    sink.open()
    try:
        sink.write(WriteUnit(rows(compiled, [("a", 5, "5.00", "new")]), rejects(compiled, 0), None, 1))
        sink.write(WriteUnit(rows(compiled, [("a", 3, "3.00", "old")]), rejects(compiled, 0), None, 1))
        state = snapshot()
        if kind == "postgres":
            cold, _ = state
            assert [(r[0], r[1].day, r[2]) for r in cold] == [("a", 3, "3.00"), ("a", 5, "5.00")]  # history
        else:
            (hot,) = state.values()
            assert hot[b"price"] == b"5.00" and hot[b"label"] == b"new"
    finally:
        sink.close()


def test_equal_event_times_keep_every_event_and_the_greater_digest_is_newest(
        sink_factory: Any, compiled: CompiledSchema) -> None:
    """Two different events at one (entity, event time): Postgres keeps both, Redis the one
    with the greater content digest, in either order; an exact copy is one event."""
    from features.kernels.digest import digests

    kind, make, snapshot = sink_factory
    sink = make()
    sink.open()
    try:
        two = rows(compiled, [("a", 5, "1.00", "first"), ("a", 5, "2.00", "second")])
        d = digests(two, compiled.schema).to_pylist()
        newest = "1.00" if d[0] > d[1] else "2.00"
        res = sink.write(WriteUnit(two.slice(1), rejects(compiled, 0), None, 1))
        assert (res.stored, res.already_present) == (1, 0)
        copy = rows(compiled, [("a", 5, "1.00", "first"), ("a", 5, "1.00", "first")], run_id="run-2")
        res = sink.write(WriteUnit(copy, rejects(compiled, 0), None, 2))
        stored = 1 if kind == "postgres" else int(newest == "1.00")  # Redis: only a newer event
        assert (res.stored, res.already_present) == (stored, 2 - stored)
        state = snapshot()
        if kind == "postgres":
            assert sorted(r[2] for r in state[0]) == ["1.00", "2.00"]
        else:
            (hot,) = state.values()
            assert hot[b"price"] == newest.encode()
            assert hot[b"_digest"] == max(d).encode()
    finally:
        sink.close()


FLOATS = """
name: contract_floats
version: 1.0.0
entity: item_id
event_time: seen_at
fields:
  - name: item_id
    type: string
    constraints: {required: true}
  - name: seen_at
    type: timestamp(us, UTC)
    constraints: {required: true}
  - name: score
    type: float64
    constraints: {min: 0}
"""


def test_rejected_nan_inf_and_nul_inputs_are_stored_with_valid_json(settings: Settings,
                                                                      pg_schema: str) -> None:
    """NaN/inf/NUL are rejected, and the reject row's raw JSON must still be valid jsonb."""
    import json

    import psycopg

    from features.lineage import BatchLineage
    from features.pipeline.prepare import process_batch
    from features.sinks.postgres import PostgresSink
    from features.sources.base import SourceBatch

    floats = compile_schema(parse_schema(FLOATS, "contract_floats.yaml"))
    batch = pa.RecordBatch.from_pydict({
        "item_id": ["a", "b", "c", "d", "e\x00"],
        "seen_at": pa.array([_ts(1)] * 5, pa.timestamp("us", "UTC")),
        "score": [1.5, float("nan"), float("inf"), -1.0, 2.0],
    })
    ctx = RunContext(floats.name, "1.0.0", floats.fingerprint, "run-nan", _ts(28))
    prepared = process_batch(SourceBatch(batch, BatchLineage("file:///nan.parquet", 0, 5, "u0")), floats,
                             None, ctx, _ts(28))
    assert (prepared.rows.num_rows, prepared.rejected_rows) == (1, 4)
    sink = PostgresSink(settings.postgres_dsn, floats, search_path=pg_schema)
    sink.open()
    try:
        res = sink.write(WriteUnit(prepared.rows, prepared.rejects, "u0", 5))
    finally:
        sink.close()
    assert (res.stored, res.rejects_stored) == (1, 4)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        raws = conn.execute("SELECT raw->>'score', errors FROM contract_floats__rejects "
                            "ORDER BY row_index").fetchall()
        nul = conn.execute("SELECT raw->>'item_id' FROM contract_floats__rejects "
                           "WHERE row_index = 4").fetchone()
    assert [r[0] for r in raws] == ["nan", "inf", "-1.0", "2.0"]
    assert nul == ("e\\u0000",)  # the NUL kept as text; Postgres cannot store the character
    assert [e["rule"] for e in raws[3][1]] == ["item_id.type"]
    assert [e["rule"] for e in raws[0][1]] == ["score.nan"]
    assert [e["rule"] for e in raws[1][1]] == ["score.type"]
    assert json.loads(json.dumps(raws[2][1]))[0]["rule"] == "score.min"


def _pg_sink(settings: Settings, compiled: CompiledSchema, pg_schema: str, cls: Any = None) -> Any:
    from features.sinks.postgres import PostgresSink

    return (cls or PostgresSink)(settings.postgres_dsn, compiled, search_path=pg_schema, retries=2,
                                 backoff_s=0.05)


def _cold(settings: Settings, pg_schema: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as c:
        return c.execute("SELECT item_id, seen_at, price::text, _source FROM contract_items ORDER BY 1, 2, 4"
                         ).fetchall()


def test_stream_unit_skips_stored_keys_and_keeps_the_first_of_a_unit(
        settings: Settings, compiled: CompiledSchema, pg_schema: str) -> None:
    """A unit without a ledger key (a stream micro-batch) looks its events up and COPYs
    only the new ones: a stored event (an exact copy) keeps its row, the first of two
    copies in the unit is stored, and another event at a stored (entity, time) is new."""
    sink = _pg_sink(settings, compiled, pg_schema)
    sink.open()
    try:
        sink.write(WriteUnit(rows(compiled, [("a", 1, "1.00", None), ("b", 2, "2.00", None)]),
                             rejects(compiled, 0), None, 2))
        unit = rows(compiled, [("b", 2, "2.00", None), ("c", 3, "3.00", None), ("c", 3, "3.00", None),
                               ("c", 3, "3.33", None), ("a", 1, "8.88", None), ("d", 4, None, None)],
                    run_id="run-2")
        res = sink.write(WriteUnit(unit, rejects(compiled, 2), None, 8))
        assert (res.stored, res.already_present, res.rejects_stored) == (4, 2, 2)
        cold = _cold(settings, pg_schema)
        assert sorted((r[0], r[2]) for r in cold) == [
            ("a", "1.00"), ("a", "8.88"), ("b", "2.00"), ("c", "3.00"), ("c", "3.33"), ("d", None)]
        assert [r[3] for r in cold if r[0] == "b"] == ["file:///contract.parquet#1"]  # the stored copy stays
        again = sink.write(WriteUnit(unit, rejects(compiled, 2), None, 8))  # a replay: nothing new
        assert (again.stored, again.already_present, again.rejects_stored) == (0, 6, 0)
        assert _cold(settings, pg_schema) == cold
    finally:
        sink.close()


def test_stream_unit_whose_key_another_writer_stored_meanwhile_falls_back_exactly(
        settings: Settings, compiled: CompiledSchema, pg_schema: str) -> None:
    """Between the key lookup and the COPY another writer stores one of the unit's events:
    the COPY fails on the key (inside a savepoint) and the unit is inserted row by row with
    ON CONFLICT, so the other writer's row stays and every other row is stored once."""
    import psycopg

    from features.kernels.digest import digests
    from features.sinks.postgres import PostgresSink

    class Racing(PostgresSink):
        raced = 0

        def _copy(self, conn: Any, table: str, columns: tuple[str, ...], data: pa.Table) -> None:
            if table == self.table and not self.raced:
                self.raced += 1
                other = rows(compiled, [("y", 2, "2.00", None)], run_id="other-writer")
                with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}",
                                     autocommit=True) as c:
                    with c.cursor().copy("COPY contract_items (item_id, seen_at, price, _digest, _source, "
                                         "_schema_name, _schema_version, _schema_fingerprint, _run_id, "
                                         "_ingested_at) FROM STDIN") as copy:
                        r = other.to_pylist()[0]
                        copy.write_row([r["item_id"], r["seen_at"], r["price"],
                                        digests(other, compiled.schema)[0].as_py(), "file:///other#0",
                                        r["_schema_name"], r["_schema_version"], r["_schema_fingerprint"],
                                        r["_run_id"], r["_ingested_at"]])
            super()._copy(conn, table, columns, data)

    sink = _pg_sink(settings, compiled, pg_schema, Racing)
    sink.open()
    try:
        unit = rows(compiled, [("x", 1, "1.00", None), ("y", 2, "2.00", None), ("z", 3, "3.00", None)])
        res = sink.write(WriteUnit(unit, rejects(compiled, 0), None, 3))
        assert sink.raced == 1
        assert (res.stored, res.already_present) == (2, 1)
        assert [(r[0], r[2], r[3]) for r in _cold(settings, pg_schema)] == [
            ("x", "1.00", "file:///contract.parquet#0"), ("y", "2.00", "file:///other#0"),
            ("z", "3.00", "file:///contract.parquet#2")]
    finally:
        sink.close()


def _run_counts(settings: Settings, pg_schema: str) -> dict[str, tuple[Any, ...]]:
    """run -> (kind, units, read, stored, already present, rejected, history rows of the run)."""
    import psycopg

    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as c:
        return {r[0]: r[1:] for r in c.execute(
            "SELECT run_id, kind, units, read, stored, already_present, rejected, "
            "(SELECT count(*) FROM contract_items h WHERE h._run_id = n.run_id) "
            "FROM featureline_run_counts n WHERE schema_name = 'contract_items' ORDER BY 1").fetchall()}


def test_a_counted_stream_unit_adds_its_counts_to_its_run_in_its_transaction(
        settings: Settings, compiled: CompiledSchema, pg_schema: str) -> None:
    """A counted unit without a ledger key (a stream micro-batch) adds read, stored, already
    present and rejected to its run's ``featureline_run_counts`` row: a replay counts its
    rows and rejects already present, a write whose transaction rolled back (a lost
    connection, retried) counts once, an uncounted unit (a rollback's or an upgrade's
    rewrite) counts nothing, and stored is what the history holds of the run."""
    import psycopg

    from features.sinks.postgres import PostgresSink

    class LosingOnce(PostgresSink):
        lost = 0

        def _insert_rejects(self, conn: Any, data: pa.Table) -> Any:
            out = super()._insert_rejects(conn, data)
            if self.lost == 0:  # after the rows and rejects went in: the transaction rolls back
                self.lost += 1
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return out

    sink = _pg_sink(settings, compiled, pg_schema, LosingOnce)
    sink.open()
    try:
        first = rows(compiled, [("a", 1, "1.00", None), ("b", 2, "2.00", None), ("b", 2, "2.00", None)],
                     run_id="s1")
        res = sink.write(WriteUnit(first, rejects(compiled, 1, "s1"), None, 4, counted="stream"))
        assert sink.lost == 1 and (res.stored, res.already_present, res.rejects_stored) == (2, 1, 1)
        assert _run_counts(settings, pg_schema) == {"s1": ("stream", 1, 4, 2, 1, 1, 2)}
        # a replay of the same records (a restart from a checkpoint before them): nothing stored
        sink.write(WriteUnit(first, rejects(compiled, 1, "s1"), None, 4, counted="stream"))
        assert _run_counts(settings, pg_schema) == {"s1": ("stream", 2, 8, 2, 5, 1, 2)}
        # a later run reading some of the same records and a new one
        second = rows(compiled, [("a", 1, "1.00", None), ("c", 3, "3.00", None)], run_id="s2")
        sink.write(WriteUnit(second, rejects(compiled, 1, "s2"), None, 3, counted="stream"))
        # not counted: a write outside any run's count (the rollback's, the upgrade's)
        sink.write(WriteUnit(rows(compiled, [("d", 4, "4.00", None)], run_id="rewrite"),
                             rejects(compiled, 0, "rewrite"), None, 1))
        counts = _run_counts(settings, pg_schema)
        assert counts == {"s1": ("stream", 2, 8, 2, 5, 1, 2), "s2": ("stream", 1, 3, 1, 2, 0, 1)}
        for _, _, read, stored, present, rejected, history in counts.values():
            assert read == stored + present + rejected and stored == history
    finally:
        sink.close()
