"""The feature SDK (``features.FeatureStore``) against the real stores the batch loader
wrote: online lookups (Redis, Postgres fallback), async, validation, fingerprint checks;
each test against one Redis server and against the local Redis Cluster."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
import redis_kinds

from features import FeatureStore
from features.compile import CompiledSchema
from features.compile.layout import entity_key
from features.config import Settings
from features.errors import ConfigError, SinkError
from features.load import load
from features.ops.examples import applicant_schema, applicants
from features.validation import validate

pytestmark = pytest.mark.services
#: each test runs against one Redis server and the local Redis Cluster (tests/redis_kinds.py)
hot_kind, settings, hot = redis_kinds.hot_kind, redis_kinds.settings, redis_kinds.hot
ROOT = Path(__file__).resolve().parents[2]
NAME = "credit_applicant"
ENTITY, EVENT_TIME = "application_id", "submitted_at"
HOT_AND_COLD = ("income_monthly", "employment_status", "debt_to_income")
HOT_ONLY = ("income_log", "employment_status_hash")
HOT = ("income_monthly", "employment_status", "income_log", "debt_to_income", "employment_status_hash")
META = ("_event_time", "_age_seconds", "_from", "_found", "_stale")
UNKNOWN = ["APP-999999999999", "not-an-id", "", "APP-{x}"]


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()







@pytest.fixture()
def loaded(tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
           redis_prefix: str) -> dict[str, tuple[Any, ...]]:
    """The example applicants loaded by the batch loader; returns the cold rows by id:
    (submitted_at, income_monthly, employment_status, debt_to_income)."""
    path = tmp_path / "applicants.parquet"
    pq.write_table(applicants(2_000, seed=11), path, row_group_size=700)
    summary = load([path], compiled, settings, search_path=pg_schema, key_prefix=redis_prefix)
    assert summary.adds_up and summary.stored > 1_900
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        rows = conn.execute(f"SELECT {ENTITY}, {EVENT_TIME}, {', '.join(HOT_AND_COLD)} "
                            "FROM credit_applicant ORDER BY 1").fetchall()
    assert len(rows) == summary.stored
    return {r[0]: tuple(r[1:]) for r in rows}


def make_store(settings: Settings, pg_schema: str, redis_prefix: str, **kwargs: Any) -> FeatureStore:
    """A store on the test's stores; without the read-through fill unless ``fill=True``
    (these tests check what the fallback serves; test_sdk_stampede.py checks the fill)."""
    kwargs.setdefault("fill", False)
    return FeatureStore(redis_url=settings.redis_url, postgres_dsn=settings.postgres_dsn,
                        schemas=kwargs.pop("schemas", ROOT / "schemas"), search_path=pg_schema,
                        key_prefix=redis_prefix, **kwargs)


@pytest.fixture()
def fs(settings: Settings, pg_schema: str, redis_prefix: str) -> Iterator[FeatureStore]:
    with make_store(settings, pg_schema, redis_prefix) as store:
        yield store




def redis_raw(hot: redis.Redis, prefix: str, ids: list[str]) -> list[dict[bytes, bytes]]:
    return [hot.hgetall(prefix + entity_key(NAME, i)) for i in ids]


def expected_rows(ids: list[Any], cold: dict[str, tuple[Any, ...]], raw: dict[str, dict[bytes, bytes]],
                  source: dict[str, str | None]) -> list[dict[str, Any]]:
    """What ``online`` must return per requested id: hot-and-cold values from the cold
    table, hot-only values parsed from the Redis text (null for Postgres rows)."""
    out = []
    for i in ids:
        key = str(i)
        src = source.get(key)
        row: dict[str, Any] = {ENTITY: key, **dict.fromkeys(HOT), "_event_time": None, "_from": src,
                               "_found": src is not None, "_stale": False}
        if src is not None:
            when, income, status, dti = cold[key]
            row.update(income_monthly=income, employment_status=status, debt_to_income=dti,
                       _event_time=when.astimezone(dt.UTC))
        if src == "redis":
            h = raw[key]
            row["income_log"] = float(h[b"income_log"]) if b"income_log" in h else None
            row["employment_status_hash"] = (int(h[b"employment_status_hash"])
                                             if b"employment_status_hash" in h else None)
            # The hot copy of the hot-and-cold columns is the same value as the cold row.
            assert h[b"income_monthly"].decode() == str(income)
            assert h[b"employment_status"].decode() == status if status is not None \
                else b"employment_status" not in h
            assert float(h[b"debt_to_income"]) == dti
            assert int(h[b"_event_time"]) == (row["_event_time"] - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) \
                // dt.timedelta(microseconds=1)
        out.append(row)
    return out


def check_online(table: pa.Table, expected: list[dict[str, Any]], before: dt.datetime,
                 after: dt.datetime, compiled: CompiledSchema) -> None:
    assert table.column_names == [ENTITY, *HOT, *META]
    types = {f.name: f.type for f in table.schema}
    assert types[ENTITY] == pa.string()
    assert types["income_monthly"] == compiled.arrow_schema.field("income_monthly").type
    assert types["income_monthly"] == pa.decimal128(18, 2)
    assert types["employment_status"] == compiled.arrow_schema.field("employment_status").type
    assert (types["income_log"], types["debt_to_income"]) == (pa.float64(), pa.float64())
    assert types["employment_status_hash"] == pa.int32()
    assert types["_event_time"] == pa.timestamp("us", "UTC")
    assert (types["_age_seconds"], types["_from"], types["_found"]) == (pa.float64(), pa.string(), pa.bool_())
    got = table.to_pylist()
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        age = g.pop("_age_seconds")
        # Decimals exactly (digits and scale), not just numerically.
        assert (str(g["income_monthly"]) if g["income_monthly"] is not None else None) == \
            (str(e["income_monthly"]) if e["income_monthly"] is not None else None)
        assert g == e
        if e["_event_time"] is None:
            assert age is None
        else:
            assert g["_event_time"].utcoffset() == dt.timedelta(0)
            assert (before - e["_event_time"]).total_seconds() - 1e-6 <= age
            assert age <= (after - e["_event_time"]).total_seconds() + 1e-6


def test_online_matches_what_the_loader_wrote(fs: FeatureStore, loaded: dict[str, tuple[Any, ...]],
                                             hot: redis.Redis, redis_prefix: str,
                                             compiled: CompiledSchema) -> None:
    stored = sorted(loaded)
    wanted = stored[::9][:150]
    ids: list[Any] = [*wanted, UNKNOWN[0], wanted[3], *UNKNOWN[1:], wanted[0], wanted[3], 42, wanted[-1]]
    raw = dict(zip(wanted, redis_raw(hot, redis_prefix, wanted), strict=True))
    assert all(raw.values())
    before = dt.datetime.now(dt.UTC)
    table = fs.online(NAME, ids)
    after = dt.datetime.now(dt.UTC)
    check_online(table, expected_rows(ids, loaded, raw, dict.fromkeys(wanted, "redis")), before, after,
                 compiled)


def without_age(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "_age_seconds"} for r in rows]


def test_small_calls_and_online_dicts_give_the_arrow_paths_rows(
        fs: FeatureStore, loaded: dict[str, tuple[Any, ...]], hot: redis.Redis, redis_prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls of at most SMALL_CALL ids found in Redis decode in Python (no Arrow); the
    rows, types and values are those of the Arrow path (a larger call), for the table and
    for ``online_dicts``; a miss, a null id or a foreign hash takes the Arrow path."""
    from features.sdk.online import SMALL_CALL

    stored = sorted(loaded)
    big = stored[:40]  # > SMALL_CALL: the Arrow path
    assert len(big) > SMALL_CALL
    reference = fs.online(NAME, big)
    for features in (None, ["debt_to_income", "income_monthly"], ["employment_status_hash"]):
        ref = fs.online(NAME, big, features)
        for start in range(0, 40, 7):
            ids = big[start:start + 7]
            small = fs.online(NAME, ids, features)
            assert small.schema == ref.schema
            assert without_age(small.to_pylist()) == without_age(ref.slice(start, len(ids)).to_pylist())
            assert without_age(fs.online_dicts(NAME, ids, features)) == without_age(small.to_pylist())
    assert without_age(fs.online_dicts(NAME, big)) == without_age(reference.to_pylist())
    # a miss, a null id, an unknown id: the Arrow path (and the fallback), the same rows
    hot.delete(redis_prefix + entity_key(NAME, stored[1]))
    mixed: list[Any] = [stored[0], stored[1], None, "APP-999999999999", stored[2]]
    table = fs.online(NAME, mixed)
    assert table.column("_from").to_pylist() == ["redis", "postgres", None, None, "redis"]
    assert without_age(fs.online_dicts(NAME, mixed)) == without_age(table.to_pylist())
    # and without hiredis, the Python reply parser reads the same replies
    now = fs.online(NAME, big)
    import features.sinks.redis_wire as wire

    monkeypatch.setattr(wire, "_hiredis", None)
    with make_store(fs_settings(fs), fs.search_path or "", redis_prefix) as plain:
        assert without_age(plain.online(NAME, big).to_pylist()) == without_age(now.to_pylist())
        assert without_age(plain.online_dicts(NAME, big[2:5])) == without_age(now.slice(2, 3).to_pylist())


def fs_settings(fs: FeatureStore) -> Settings:
    return Settings(redis_url=fs.redis_url, postgres_dsn=fs.postgres_dsn)


def test_a_lost_postgres_connection_is_reopened_and_driver_errors_are_translated(
        fs: FeatureStore, settings: Settings, loaded: dict[str, tuple[Any, ...]], hot: Any,
        redis_prefix: str) -> None:
    """The server ends the SDK's backend (a restart, a failover, an idle-session timeout):
    the next fallback read and the next ``historical`` reopen the connection once and
    answer; a driver error reaches the caller as the package's SinkError, not raw."""
    first, second = sorted(loaded)[:2]
    hot.delete(redis_prefix + entity_key(NAME, first), redis_prefix + entity_key(NAME, second))
    entity_df = pa.table({ENTITY: [first], "timestamp": pa.array([dt.datetime(2100, 1, 1, tzinfo=dt.UTC)],
                                                                 pa.timestamp("us", "UTC"))})
    with make_store(fs_settings(fs), fs.search_path or "", redis_prefix) as store:
        assert store.online(NAME, [first]).column("_from").to_pylist() == ["postgres"]
        for call in (lambda: store.online(NAME, [second]).column("_from").to_pylist() == ["postgres"],
                     lambda: store.historical(NAME, entity_df, ["income_monthly"]).column(
                         "income_monthly").to_pylist() == [loaded[first][1]]):
            pid = store.connections.postgres().info.backend_pid
            with psycopg.connect(settings.postgres_dsn, autocommit=True) as admin:
                assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
            assert call()
            assert store.connections.postgres().info.backend_pid != pid
        # a max_age longer than any time span is no limit (the lateral join of issue 30 let
        # Postgres refuse q.t - max_age before 4713 BC; the NumPy join clamps it)
        forever = store.historical(NAME, entity_df, ["income_monthly"],
                                   max_age=dt.timedelta(days=999_999_999))
        assert forever.to_pylist() == store.historical(NAME, entity_df, ["income_monthly"]).to_pylist()
        # the staging table is refused
        store.connections.postgres().execute("SET default_transaction_read_only = on")
        with pytest.raises(SinkError, match="Postgres refused the as-of query"):
            store.historical(NAME, entity_df, ["income_monthly"])


def test_online_feature_subset_and_empty_request(fs: FeatureStore,
                                                 loaded: dict[str, tuple[Any, ...]]) -> None:
    some = sorted(loaded)[:3]
    table = fs.online(NAME, [some[1], "APP-999999999999", some[0]], ["debt_to_income", "income_log"])
    assert table.column_names == [ENTITY, "debt_to_income", "income_log", *META]
    assert table.column("debt_to_income").to_pylist() == [loaded[some[1]][3], None, loaded[some[0]][3]]
    assert table.column("_found").to_pylist() == [True, False, True]
    empty = fs.online(NAME, [])
    assert empty.num_rows == 0 and empty.column_names == [ENTITY, *HOT, *META]
    with pytest.raises(ConfigError, match="score_bucket"):  # a cold-only feature is not in Redis
        fs.online(NAME, some, ["score_bucket"])


def test_a_mistyped_name_gets_a_did_you_mean(fs: FeatureStore, loaded: dict[str, tuple[Any, ...]]) -> None:
    """A feature (or schema) name that is not there is refused with the closest one it
    has; a feature of the other store says which call reads it. The stores are untouched
    by the refused calls: the next good call still reads the loaded rows."""
    some = sorted(loaded)[:2]
    with pytest.raises(ConfigError, match=r"no feature\(s\) 'debt_to_incme' \(did you mean "
                       r"'debt_to_income'\?\) in the hot store \(Redis\); it has: income_monthly,") as online:
        fs.online(NAME, some, ["income_log", "debt_to_incme"])
    assert online.value.key == "features"
    with pytest.raises(ConfigError, match=r"'income_lg' \(did you mean 'income_log'\?\)"):
        fs.online_dicts(NAME, some, ["income_lg"])
    with pytest.raises(ConfigError, match=r"'score_bucket' \(only in the cold store: FeatureStore.historical "
                       r"reads it\)"):
        fs.online(NAME, some, ["score_bucket"])
    entity_df = pa.table({ENTITY: some, "timestamp": pa.array([loaded[i][0] for i in some],
                                                                pa.timestamp("us", "UTC"))})
    with pytest.raises(ConfigError, match=r"'income_monthy' \(did you mean 'income_monthly'\?\) in the cold"):
        fs.historical(NAME, entity_df, ["income_monthy"])
    with pytest.raises(ConfigError, match=r"'income_log' \(only in the hot store: FeatureStore.online reads"):
        fs.historical(NAME, entity_df, ["income_log"])
    with pytest.raises(ConfigError, match=r"'wholly_unlike' in the hot store"):  # nothing close: no guess
        fs.online(NAME, some, ["wholly_unlike"])
    with pytest.raises(ConfigError, match=r"no schema named 'credit_aplicant' \(did you mean 'credit_app"):
        fs.online("credit_aplicant", some)
    assert fs.online(NAME, some, ["debt_to_income"]).column("debt_to_income").to_pylist() == [
        loaded[i][3] for i in some]


def test_online_falls_back_to_postgres(fs: FeatureStore, settings: Settings, pg_schema: str,
                                      loaded: dict[str, tuple[Any, ...]], hot: redis.Redis, redis_prefix: str,
                                      compiled: CompiledSchema) -> None:
    stored = sorted(loaded)
    in_redis, evicted = stored[:40:2], stored[1:40:2]
    assert hot.delete(*[redis_prefix + entity_key(NAME, i) for i in evicted]) == len(evicted)
    ids: list[Any] = [*in_redis, *evicted, "APP-999999999999", evicted[0], in_redis[0], evicted[0]]
    raw = dict(zip(in_redis, redis_raw(hot, redis_prefix, in_redis), strict=True))
    source: dict[str, str | None] = {**dict.fromkeys(in_redis, "redis"), **dict.fromkeys(evicted, "postgres")}

    before = dt.datetime.now(dt.UTC)
    table = fs.online(NAME, ids)
    after = dt.datetime.now(dt.UTC)
    check_online(table, expected_rows(ids, loaded, raw, source), before, after, compiled)

    # max_age applies to fallback rows only: the example events are from 2023.
    before = dt.datetime.now(dt.UTC)
    long_ago = fs.online(NAME, ids, max_age=dt.timedelta(days=365 * 100))
    after = dt.datetime.now(dt.UTC)
    check_online(long_ago, expected_rows(ids, loaded, raw, source), before, after, compiled)
    only_redis = dict.fromkeys(in_redis, "redis")
    for kwargs in ({"fallback": False}, {"max_age": dt.timedelta(days=1)}):
        before = dt.datetime.now(dt.UTC)
        table = fs.online(NAME, ids, **kwargs)
        after = dt.datetime.now(dt.UTC)
        check_online(table, expected_rows(ids, loaded, raw, only_redis), before, after, compiled)

    # The store-wide defaults, overridable per call.
    with make_store(settings, pg_schema, redis_prefix, fallback=False) as no_fallback:
        assert no_fallback.online(NAME, evicted).column("_found").to_pylist() == [False] * len(evicted)
        assert no_fallback.online(NAME, evicted, fallback=True).column("_from").to_pylist() == \
            ["postgres"] * len(evicted)
    with make_store(settings, pg_schema, redis_prefix, max_age=dt.timedelta(hours=1)) as fresh_only:
        assert fresh_only.online(NAME, evicted).column("_found").to_pylist() == [False] * len(evicted)
        assert fresh_only.online(NAME, evicted, max_age=dt.timedelta(days=36_500)).column(
            "_found").to_pylist() == [True] * len(evicted)
    # A zero max_age is a bound, not "no bound".
    assert fs.online(NAME, evicted, max_age=dt.timedelta(0)).column("_found").to_pylist() == \
        [False] * len(evicted)


def test_online_async_gives_the_same_table(fs: FeatureStore, loaded: dict[str, tuple[Any, ...]],
                                          hot: redis.Redis, redis_prefix: str) -> None:
    stored = sorted(loaded)
    hot.delete(*[redis_prefix + entity_key(NAME, i) for i in stored[:5]])  # some fallback rows too
    ids: list[Any] = [*stored[:30], "APP-999999999999", stored[2], stored[10]]

    async def both() -> tuple[pa.Table, pa.Table]:
        a = await fs.online_async(NAME, ids)
        b = await fs.online_async(NAME, ids, ["debt_to_income"], fallback=False)
        await fs.aclose()
        return a, b

    got, subset = asyncio.run(both())
    want = fs.online(NAME, ids)
    assert got.drop_columns(["_age_seconds"]).equals(want.drop_columns(["_age_seconds"]))
    assert got.column("_from").to_pylist()[:6] == ["postgres"] * 5 + ["redis"]
    assert subset.drop_columns(["_age_seconds"]).equals(
        fs.online(NAME, ids, ["debt_to_income"], fallback=False).drop_columns(["_age_seconds"]))


def test_validate_dicts_arrow_and_pandas_agree(fs: FeatureStore, compiled: CompiledSchema) -> None:
    table = applicants(3_000, seed=5, invalid_share=0.1)
    want = validate(table, compiled).counts
    assert want.rejected_rows > 100 and want.valid_rows > 2_000
    for rows in (table.to_pylist(), table, table.to_batches()[0], table.to_pandas()):
        got = fs.validate(NAME, rows).counts
        expect = want if len(rows) == table.num_rows else validate(rows, compiled).counts
        assert (got.input_rows, got.valid_rows, got.rejected_rows, dict(got.by_rule)) == \
            (expect.input_rows, expect.valid_rows, expect.rejected_rows, dict(expect.by_rule)), type(rows)
    one = fs.validate(NAME, [{ENTITY: "APP-000000000001", EVENT_TIME: dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
                              "income_monthly": Decimal("0.00"), "age": 30, "requested_amount": "500.00"}])
    assert one.counts.rejected_rows == 1 and "income_monthly.min" in one.counts.by_rule


def test_a_store_written_with_another_schema_version_raises(
        fs: FeatureStore, settings: Settings, pg_schema: str, redis_prefix: str,
        loaded: dict[str, tuple[Any, ...]], compiled: CompiledSchema) -> None:
    first = sorted(loaded)[0]
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        conn.execute("UPDATE featureline_schemas SET version = '9.9.9', fingerprint = %s "
                     "WHERE schema_name = %s", ("f" * 64, NAME))
    entity_df = pa.table({ENTITY: [first], "timestamp": pa.array([dt.datetime(2030, 1, 1, tzinfo=dt.UTC)],
                                                                 pa.timestamp("us", "UTC"))})
    calls = [
        lambda s: s.online(NAME, [first, "APP-999999999999"]),  # the unknown id takes the fallback
        lambda s: s.historical(NAME, entity_df),
    ]
    for call in calls:
        with make_store(settings, pg_schema, redis_prefix) as fresh:
            with pytest.raises(SinkError) as info:
                call(fresh)
        message = str(info.value)
        assert "9.9.9" in message and "3.2.1" in message
        assert "ffffffffffff" in message and compiled.fingerprint[:12] in message
    # Without a fallback the Redis lookup needs no Postgres.
    assert fs.online(NAME, [first], fallback=False).column("_found").to_pylist() == [True]


def test_redis_hashes_of_another_schema_or_encoding_raise(
        settings: Settings, pg_schema: str, redis_prefix: str, loaded: dict[str, tuple[Any, ...]],
        hot: redis.Redis, compiled: CompiledSchema) -> None:
    first, second = sorted(loaded)[:2]
    key = redis_prefix + entity_key(NAME, first)
    hot.hset(key, "_schema_fingerprint", "f" * 64)
    with make_store(settings, pg_schema, redis_prefix) as fresh:
        assert fresh.online(NAME, [second]).column("_found").to_pylist() == [True]
        with pytest.raises(SinkError) as info:
            fresh.online(NAME, [second, first])
        with pytest.raises(SinkError, match="ffffffffffff"):  # the small-call path checks the same
            fresh.online_dicts(NAME, [first])
    assert info.value.store == "redis"
    assert "ffffffffffff" in str(info.value) and compiled.fingerprint[:12] in str(info.value)
    hot.hset(key, mapping={"_schema_fingerprint": compiled.fingerprint, "_enc": "2"})
    with make_store(settings, pg_schema, redis_prefix) as fresh, pytest.raises(SinkError, match="encoding"):
        fresh.online(NAME, [first])


def test_historical_over_loaded_rows(fs: FeatureStore, loaded: dict[str, tuple[Any, ...]]) -> None:
    """The loader's cold rows through historical(): at the event time -> that row; a
    microsecond before -> nothing (each example id has one event)."""
    ids = sorted(loaded)[:50]
    times = [loaded[i][0] for i in ids]
    us = dt.timedelta(microseconds=1)
    entity_df = pa.table({ENTITY: ids + ids, "timestamp": pa.array(times + [t - us for t in times],
                                                                    pa.timestamp("us", "UTC"))})
    got = fs.historical(NAME, entity_df, ["income_monthly", "debt_to_income", "score_bucket"])
    assert got.column_names == [ENTITY, "timestamp", "income_monthly", "debt_to_income", "score_bucket",
                                "_event_time"]
    assert got.column("income_monthly").to_pylist() == [loaded[i][1] for i in ids] + [None] * len(ids)
    assert got.column("_event_time").to_pylist() == times + [None] * len(ids)
    with pytest.raises(ConfigError, match="income_log"):  # hot-only: not in the cold store
        fs.historical(NAME, entity_df, ["income_log"])
    with pytest.raises(ConfigError, match="time zone"):
        naive = entity_df.column(1).cast(pa.timestamp("us"))
        fs.historical(NAME, entity_df.set_column(1, "timestamp", naive))


ZONED = """
name: sdk_zoned
version: 1.0.0
entity: item_id
event_time: seen_at
fields:
  - name: item_id
    type: string
    store: [hot, cold]
    constraints: {required: true}
  - name: seen_at
    type: EVENT_TYPE
    store: [hot, cold]
    constraints: {required: true}
  - name: price
    type: decimal(12,2)
    store: [hot, cold]
"""


@pytest.mark.parametrize("event_type", ["timestamp(us, Europe/Berlin)", "date"])
def test_online_event_time_is_utc_for_redis_and_fallback_rows(
        event_type: str, tmp_path: Path, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    """``_event_time`` is timestamp(us, UTC) whatever the schema's event time type (a
    zoned timestamp in another zone, a date), for Redis rows and fallback rows alike."""
    from features.compile import compile_schema
    from features.lineage import RunContext
    from features.schema.parse import parse_schema
    from features.sinks.base import REJECTED_ROWS_SCHEMA, WriteUnit
    from features.sinks.postgres import PostgresSink
    from features.sinks.redis import RedisSink

    text = ZONED.replace("EVENT_TYPE", event_type)
    (tmp_path / "sdk_zoned.yaml").write_text(text)
    c = compile_schema(parse_schema(text, "sdk_zoned.yaml"))
    when = dt.datetime(2024, 7, 1, tzinfo=dt.UTC)  # midnight UTC: 02:00 in Berlin, also a date
    ctx = RunContext(c.name, "1.0.0", c.fingerprint, "run-zoned", when)
    rows = pa.table({"item_id": ["a", "b"],
                     "seen_at": pa.array([when, when], pa.timestamp("us", "UTC")).cast(
                         c.arrow_schema.field("seen_at").type),
                     "price": pa.array([Decimal("1.10"), Decimal("2.20")], pa.decimal128(12, 2)),
                     **ctx.columns(pa.array(["file:///z#0", "file:///z#1"]))})
    pg = PostgresSink(settings.postgres_dsn, c, search_path=pg_schema)
    hot = RedisSink(settings.redis_url, c, key_prefix=redis_prefix)
    for sink, part in ((pg, rows), (hot, rows.slice(0, 1))):  # "b" only in Postgres
        sink.open()
        try:
            sink.write(WriteUnit(part, REJECTED_ROWS_SCHEMA.empty_table(), None, part.num_rows))
        finally:
            sink.close()
    with make_store(settings, pg_schema, redis_prefix, schemas=tmp_path) as store:
        cases = [(["a"], ["redis"], ["1.10"]), (["b"], ["postgres"], ["2.20"]),
                 (["a", "b", "c"], ["redis", "postgres", None], ["1.10", "2.20", None])]
        for ids, sources, prices in cases:
            table = store.online("sdk_zoned", ids)
            assert table.schema.field("_event_time").type == pa.timestamp("us", "UTC"), ids
            assert table.column("_from").to_pylist() == sources
            assert table.column("_event_time").to_pylist() == [when if s else None for s in sources]
            assert [str(p) if p is not None else None for p in table.column("price").to_pylist()] == prices


def test_unreachable_redis_raises_sink_unavailable_sync_and_async(settings: Settings, pg_schema: str) -> None:
    from features.errors import SinkUnavailable

    store = FeatureStore(redis_url="redis://127.0.0.1:1/0", postgres_dsn=settings.postgres_dsn,
                         schemas=ROOT / "schemas", search_path=pg_schema, timeout_s=2)
    with pytest.raises(SinkUnavailable) as sync_info:
        store.online(NAME, ["APP-000000000001"])

    async def lookup() -> None:
        try:
            await store.online_async(NAME, ["APP-000000000001"])
        finally:
            await store.aclose()

    with pytest.raises(SinkUnavailable) as async_info:
        asyncio.run(lookup())
    for info in (sync_info, async_info):
        assert info.value.store == "redis" and "127.0.0.1:1" in str(info.value)


def test_empty_database_null_ids_and_column_clashes(fs: FeatureStore) -> None:
    """Nothing loaded into the test's schema yet: online finds nothing (never raises for
    an id), historical names the missing table; a null id is a not-found row; an entity_df
    that already has a result column is refused."""
    from features.errors import ConfigError, SinkError

    got = fs.online("credit_applicant", ["APP-000000000001", None])
    assert got.column("_found").to_pylist() == [False, False]
    assert got.column("application_id").to_pylist() == ["APP-000000000001", None]
    stamp = pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", "UTC"))
    with pytest.raises(SinkError, match="no table for schema 'credit_applicant'"):
        fs.historical("credit_applicant", pa.table({"application_id": ["x"], "timestamp": stamp}))
    with pytest.raises(ConfigError, match="already has column"):
        fs.historical("credit_applicant", pa.table({"application_id": ["x"], "timestamp": stamp,
                                                    "income_monthly": [1]}), ["income_monthly"])
