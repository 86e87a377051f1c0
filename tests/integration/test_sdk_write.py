"""Writing from Python (``FeatureStore.write``, ``features.sdk.write``) against the real
Postgres and Redis: a DataFrame and an Arrow table go through the batch loader's core
(validation, transforms, both stores, rejects, aggregations), read back with ``online``
and ``historical``; lineage names the caller's run; the same run id and rows again change
nothing; a store that is down fails clearly and loses nothing; aggregations equal those
``features load`` computes from the same rows in a Parquet file.

Expectations come from the input rows, from Postgres and Redis read directly (psycopg,
redis-py), or from the loader run on the same rows, never from the SDK under test."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
import test_faults
from conftest import cli_environment, search_path_dsn
from test_faults import PrivateRedis

from features import FeatureStore
from features.compile import CompiledSchema
from features.compile.layout import aggregates_key, entity_key
from features.config import Settings
from features.errors import ConfigError, SinkUnavailable, SourceError
from features.load import load
from features.ops.examples import applicant_schema, applicants, click_history, clicks_schema
from features.sinks.redis import RedisSink

pytestmark = pytest.mark.services
#: the fault tests' private Redis without persistence (a test can stop and start it)
volatile_redis = test_faults.volatile_redis
ROOT = Path(__file__).resolve().parents[2]
NAME = "credit_applicant"
ENTITY, EVENT_TIME = "application_id", "submitted_at"
CLI_REDIS_DB = 11  # this file's own database (the `features load` reference), flushed before and after
LINEAGE = ("_source", "_schema_name", "_schema_version", "_schema_fingerprint", "_run_id", "_ingested_at")


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


def make_store(settings: Settings, pg_schema: str, redis_prefix: str, **kwargs: Any) -> FeatureStore:
    kwargs.setdefault("fill", False)
    return FeatureStore(redis_url=kwargs.pop("redis_url", settings.redis_url),
                        postgres_dsn=settings.postgres_dsn, schemas=ROOT / "schemas", search_path=pg_schema,
                        key_prefix=redis_prefix, **kwargs)


@pytest.fixture()
def fs(settings: Settings, pg_schema: str, redis_prefix: str) -> Iterator[FeatureStore]:
    with make_store(settings, pg_schema, redis_prefix) as store:
        yield store


def pg_rows(settings: Settings, pg_schema: str, query: str,
            params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        return conn.execute(query, params).fetchall()


def rejected_rows(settings: Settings, pg_schema: str, prefix: str) -> dict[int, list[dict[str, Any]]]:
    """The rejects table's rows of one write (by ``_source`` prefix): row -> its errors."""
    rows = pg_rows(settings, pg_schema, f"SELECT row_index, _source, errors FROM {NAME}__rejects "
                   "WHERE left(_source, %s) = %s", (len(prefix) + 1, prefix + "#"))
    for row, source, _ in rows:
        assert source == f"{prefix}#{row}"
    return {int(r[0]): r[2] for r in rows}


def valid_rows(table: pa.Table, rejected: set[int]) -> list[dict[str, Any]]:
    return [r for i, r in enumerate(table.to_pylist()) if i not in rejected]


def hot_hashes(client: redis.Redis, keys: list[str]) -> list[dict[bytes, bytes]]:
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.hgetall(k)
    return list(pipe.execute())


# --------------------------------------------------------------------------- read back


@pytest.mark.parametrize("kind", ["pandas", "arrow"])
def test_a_dataframe_and_an_arrow_table_are_written_and_read_back_online_and_historical(
        kind: str, fs: FeatureStore, settings: Settings, pg_schema: str) -> None:
    table = applicants(1_500, seed=21, first_id=5 * 10**9)
    data = table.to_pandas() if kind == "pandas" else table
    summary = fs.write(NAME, data, run_id=f"nb-{kind}")
    assert summary.adds_up and summary.rows == 1_500 and summary.already_present == 0
    assert summary.rejected > 0 and summary.stored + summary.rejected == 1_500
    rejected = rejected_rows(settings, pg_schema, f"python://nb-{kind}")
    assert len(rejected) == summary.rejected
    want = valid_rows(table, set(rejected))
    assert len(want) == summary.stored
    ids = [r[ENTITY] for r in want]

    online = fs.online(NAME, ids, ["income_monthly", "employment_status"])
    assert online.column("_found").to_pylist() == [True] * len(ids)
    assert online.column("_from").to_pylist() == ["redis"] * len(ids)
    assert online.column("income_monthly").to_pylist() == [r["income_monthly"] for r in want]
    assert online.column("employment_status").to_pylist() == [r["employment_status"] for r in want]
    assert online.column("_event_time").to_pylist() == [r[EVENT_TIME] for r in want]

    times = [r[EVENT_TIME] for r in want]
    at = fs.historical(NAME, pa.table({ENTITY: ids, "timestamp": pa.array(times, pa.timestamp("us", "UTC"))}),
                       ["income_monthly", "debt_to_income"])
    assert at.column("income_monthly").to_pylist() == [r["income_monthly"] for r in want]
    assert at.column("_event_time").to_pylist() == times
    before = fs.historical(NAME, pa.table({ENTITY: ids, "timestamp": pa.array(
        [t - dt.timedelta(microseconds=1) for t in times], pa.timestamp("us", "UTC"))}), ["income_monthly"])
    assert before.column("_event_time").null_count == len(ids)  # before the only event: nothing


def test_a_write_to_a_redis_cluster_is_read_back_and_idempotent(
        settings: Settings, pg_schema: str, redis_cluster: Any, redis_cluster_prefix: str) -> None:
    table = applicants(800, seed=30)
    cluster = dataclasses.replace(settings, redis_url=redis_cluster.url)
    with make_store(cluster, pg_schema, redis_cluster_prefix) as fs:
        first = fs.write(NAME, table, run_id="on-a-cluster")
        again = fs.write(NAME, table, run_id="on-a-cluster")
        assert first.adds_up and first.stored + first.rejected == 800 and first.already_present == 0
        assert (again.stored, again.rejected, again.already_present) == (0, 0, 800)
        want = valid_rows(table, set(rejected_rows(settings, pg_schema, "python://on-a-cluster")))
        online = fs.online(NAME, [r[ENTITY] for r in want], ["income_monthly"])
    assert online.column("_from").to_pylist() == ["redis"] * len(want) == ["redis"] * first.stored
    assert online.column("income_monthly").to_pylist() == [r["income_monthly"] for r in want]


def test_the_stores_hold_what_the_loader_stores_for_the_same_rows_in_parquet(
        tmp_path: Path, fs: FeatureStore, settings: Settings, pg_schema: str, second_pg_schema: str,
        redis_prefix: str, compiled: CompiledSchema) -> None:
    """The same core: the features (transforms included) and the rejects' errors that
    fs.write stores equal what the batch loader stores for the same rows in a Parquet file."""
    table = applicants(1_200, seed=22)
    summary = fs.write(NAME, table, run_id="same-core")
    path = tmp_path / "a.parquet"
    pq.write_table(table, path)
    loaded = load([path], compiled, settings, search_path=second_pg_schema, key_prefix=redis_prefix + "ref:")
    assert (summary.rows, summary.stored, summary.rejected) == (loaded.read, loaded.stored, loaded.rejected)
    cols = ", ".join(sorted(_cold_columns(settings, pg_schema) - set(LINEAGE)))
    mine = pg_rows(settings, pg_schema, f"SELECT {cols} FROM {NAME} ORDER BY {ENTITY}, {EVENT_TIME}")
    ref = pg_rows(settings, second_pg_schema, f"SELECT {cols} FROM {NAME} ORDER BY {ENTITY}, {EVENT_TIME}")
    assert mine == ref and len(mine) == summary.stored
    errors = "SELECT row_index, errors, raw FROM credit_applicant__rejects ORDER BY row_index"
    assert pg_rows(settings, pg_schema, errors) == pg_rows(settings, second_pg_schema, errors)
    # the hot hashes too, but for their lineage
    client = redis.Redis.from_url(settings.redis_url)
    ids = sorted(r[0] for r in pg_rows(settings, pg_schema, f"SELECT DISTINCT {ENTITY} FROM {NAME}"))
    drop = {c.encode() for c in LINEAGE}

    def values(prefix: str) -> list[dict[bytes, bytes]]:
        return [{k: v for k, v in h.items() if k not in drop}
                for h in hot_hashes(client, [prefix + entity_key(NAME, i) for i in ids])]

    assert values(redis_prefix) == values(redis_prefix + "ref:") and all(values(redis_prefix))
    client.close()


def _cold_columns(settings: Settings, pg_schema: str) -> set[str]:
    rows = pg_rows(settings, pg_schema, "SELECT column_name FROM information_schema.columns "
                   "WHERE table_schema = %s AND table_name = %s", (pg_schema, NAME))
    return {r[0] for r in rows}


# --------------------------------------------------------------------------- rejects and counts


def test_bad_rows_are_rejected_with_field_level_messages_kept_in_the_rejects_table(
        fs: FeatureStore, settings: Settings, pg_schema: str) -> None:
    good = applicants(6, seed=23, invalid_share=0.0).to_pylist()
    rows = [dict(r) for r in good]
    rows[1]["income_monthly"] = Decimal("0.00")
    rows[3]["application_id"] = "APP-42"
    rows[3]["age"] = 15
    table = pa.Table.from_pylist(rows, schema=applicants(1, seed=23).schema)
    summary = fs.write(NAME, table, run_id="bad-rows")
    assert (summary.rows, summary.stored, summary.rejected, summary.already_present) == (6, 4, 2, 0)
    assert summary.adds_up
    assert [(r.row, r.source) for r in summary.rejects] == [(1, "python://bad-rows#1"), (3, "python://bad-rows#3")]
    assert summary.rejects[0].messages == [
        "field income_monthly violates constraint min: got 0.00, expected >= 0.01"]
    assert sorted(summary.rejects[1].messages) == [
        "field age violates constraint min: got 15, expected >= 18",
        "field application_id violates constraint pattern: got 'APP-42', expected a full match of "
        "^APP-[0-9]{12}$"]
    stored = pg_rows(settings, pg_schema, "SELECT row_index, _source, _run_id, errors, "
                     f"raw->>'application_id' FROM {NAME}__rejects ORDER BY row_index")
    assert [(r[0], r[1], r[2], r[4]) for r in stored] == [
        (1, "python://bad-rows#1", "bad-rows", rows[1][ENTITY]),
        (3, "python://bad-rows#3", "bad-rows", "APP-42")]
    assert {(e["field"], e["rule"]) for e in stored[1][3]} == {("application_id", "application_id.pattern"),
                                                               ("age", "age.min")}
    # counts add up in the stores too: the valid rows are stored, the others are rejects
    assert pg_rows(settings, pg_schema, f"SELECT count(*) FROM {NAME} WHERE _run_id = 'bad-rows'") == [(4,)]
    assert summary.run is not None and summary.run.by_rule["income_monthly.min"] == 1


def test_a_table_whose_columns_can_never_fit_is_refused_before_anything_is_written(
        fs: FeatureStore, settings: Settings, pg_schema: str) -> None:
    table = applicants(10, seed=24)
    with pytest.raises(SourceError, match="missing required column 'application_id'"):
        fs.write(NAME, table.drop_columns([ENTITY]), run_id="no-ids")
    bad = table.set_column(table.schema.get_field_index("age"), "age", pa.array(["x"] * 10))
    with pytest.raises(SourceError, match=r"column 'age' has type string"):
        fs.write(NAME, bad, run_id="text-ages")
    with pytest.raises(ConfigError, match=r"pyarrow\.Table"):
        fs.write(NAME, table.to_pylist(), run_id="a-list")
    with pytest.raises(ConfigError, match="run_id"):
        fs.write(NAME, table, run_id="two#parts")
    assert pg_rows(settings, pg_schema, "SELECT to_regclass(%s)", (f'"{pg_schema}".{NAME}',)) == [(None,)]


# --------------------------------------------------------------------------- lineage and idempotence


def test_lineage_names_the_callers_run_or_a_generated_one_that_is_returned(
        fs: FeatureStore, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    table = applicants(300, seed=25, invalid_share=0.0)
    named = fs.write(NAME, table.slice(0, 150), run_id="pipeline-2026-12-04", source="orders")
    generated = fs.write(NAME, table.slice(150))
    assert named.run_id == "pipeline-2026-12-04" and named.source == "python://pipeline-2026-12-04/orders"
    assert generated.run_id and generated.run_id != named.run_id
    assert generated.source == f"python://{generated.run_id}"
    rows = pg_rows(settings, pg_schema, f"SELECT {ENTITY}, _source, _run_id, _schema_name, _schema_version "
                   f"FROM {NAME}")
    by_id = {r[0]: r[1:] for r in rows}
    ids = table.column(ENTITY).to_pylist()
    version = fs.schema(NAME).schema.version_str
    for i, entity in enumerate(ids):
        if i < 150:
            want = (f"python://pipeline-2026-12-04/orders#{i}", "pipeline-2026-12-04", NAME, version)
        else:
            want = (f"python://{generated.run_id}#{i - 150}", generated.run_id, NAME, version)
        assert by_id[entity] == want
    client = redis.Redis.from_url(settings.redis_url)
    hashes = hot_hashes(client, [redis_prefix + entity_key(NAME, i) for i in ids])
    client.close()
    assert [(h[b"_source"].decode(), h[b"_run_id"].decode()) for h in hashes] == [
        (by_id[e][0], by_id[e][1]) for e in ids]


def test_writing_the_same_rows_again_with_the_same_run_id_changes_nothing(
        fs: FeatureStore, settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    table = applicants(2_000, seed=26)
    first = fs.write(NAME, table, run_id="twice")
    snapshot = "SELECT *, xmin::text FROM {} ORDER BY 1, 2"
    cold = pg_rows(settings, pg_schema, snapshot.format(NAME))
    rejects = pg_rows(settings, pg_schema, snapshot.format(f"{NAME}__rejects"))
    client = redis.Redis.from_url(settings.redis_url)
    keys = sorted(k.decode() for k in client.scan_iter(match=redis_prefix + "*", count=10_000))
    hot = [client.dump(k) for k in keys]  # hashes and the ledger's set, as serialised by Redis
    # again, as a DataFrame chunked otherwise: the same rows
    again = fs.write(NAME, pa.concat_tables([table.slice(0, 700), table.slice(700)]), run_id="twice")
    assert again.adds_up and (again.rows, again.stored, again.rejected, again.already_present) == (
        2_000, 0, 0, 2_000)
    assert first.adds_up and first.stored + first.rejected == 2_000
    assert pg_rows(settings, pg_schema, snapshot.format(NAME)) == cold  # xmin: not even rewritten
    assert pg_rows(settings, pg_schema, snapshot.format(f"{NAME}__rejects")) == rejects
    assert sorted(k.decode() for k in client.scan_iter(match=redis_prefix + "*", count=10_000)) == keys
    assert [client.dump(k) for k in keys] == hot
    client.close()
    # other rows under the same run id are refused (their rejects would share _source URIs) ...
    with pytest.raises(ConfigError, match="already wrote other rows"):
        fs.write(NAME, applicants(50, seed=27, first_id=7 * 10**9), run_id="twice")
    # ... and go in under a name of their own
    other = fs.write(NAME, applicants(50, seed=27, first_id=7 * 10**9), run_id="twice", source="more")
    assert other.adds_up and other.stored + other.rejected == 50 and other.already_present == 0


def test_the_same_rows_written_again_under_another_run_id_keep_their_rejects_once(
        fs: FeatureStore, settings: Settings, pg_schema: str) -> None:
    """Issue 45, item 9: a retry without the run id (a fresh one), or under another run id
    and source, finds the table's rejects stored (one content digest) and counts them
    ``already present`` as it counts the valid rows; nothing is stored twice."""
    table = applicants(2_000, seed=31)
    first = fs.write(NAME, table)
    retry = fs.write(NAME, table)  # no run id: a fresh one
    named = fs.write(NAME, pa.concat_tables([table.slice(0, 900), table.slice(900)]), run_id="other",
                     source="copy")
    assert first.rejected > 0 and first.stored + first.rejected == 2_000 and first.already_present == 0
    for again in (retry, named):
        assert again.run_id != first.run_id
        assert again.adds_up and (again.stored, again.rejected, again.already_present) == (0, 0, 2_000)
        assert again.rejects == ()
    assert pg_rows(settings, pg_schema, f"SELECT count(*) FROM {NAME}__rejects") == [(first.rejected,)]
    assert pg_rows(settings, pg_schema, f"SELECT count(*), min(_run_id) FROM {NAME}__rejects "
                   "WHERE left(_source, %s) = %s", (len(first.source) + 1, first.source + "#")) == [
        (first.rejected, first.run_id)]
    assert pg_rows(settings, pg_schema, f"SELECT count(*) FROM {NAME}") == [(first.stored,)]
    # other rows are another table: their rejects are stored
    more = fs.write(NAME, applicants(300, seed=32, first_id=8 * 10**9))
    assert more.rejected > 0 and pg_rows(settings, pg_schema, f"SELECT count(*) FROM {NAME}__rejects") == [
        (first.rejected + more.rejected,)]


# --------------------------------------------------------------------------- stores down


def test_a_store_down_at_start_fails_clearly_and_writes_nothing(
        settings: Settings, pg_schema: str, redis_prefix: str) -> None:
    table = applicants(100, seed=28)
    redis_down = make_store(settings, pg_schema, redis_prefix, redis_url="redis://127.0.0.1:1/0", timeout_s=2)
    with redis_down, pytest.raises(SinkUnavailable, match=r"Redis unreachable at 127\.0\.0\.1:1"):
        redis_down.write(NAME, table, run_id="down")
    assert pg_rows(settings, pg_schema, "SELECT to_regclass(%s)", (f'"{pg_schema}".{NAME}',)) == [(None,)]
    with FeatureStore(redis_url=settings.redis_url, schemas=ROOT / "schemas", search_path=pg_schema,
                      postgres_dsn="postgresql://featureline:featureline@127.0.0.1:1/featureline") as down, \
            pytest.raises(SinkUnavailable, match=r"Postgres unreachable at 127\.0\.0\.1:1"):
        down.write(NAME, table, run_id="down")
    client = redis.Redis.from_url(settings.redis_url)
    assert list(client.scan_iter(match=redis_prefix + "*")) == []
    client.close()


def test_redis_lost_during_a_write_fails_naming_the_run_and_the_same_call_again_loses_nothing(
        settings: Settings, pg_schema: str, volatile_redis: PrivateRedis,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis stops after the stores opened and stays down past the sink's retries: the
    write raises SinkUnavailable naming the (generated) run id; Postgres committed its
    units. Redis back (empty), the same table written again with that run id: Postgres
    skips every unit (its ledger), Redis gets every row: nothing lost, nothing twice."""
    table = applicants(1_000, seed=29)
    real_write = RedisSink.write
    stopped: list[bool] = []

    def stop_then_write(self: RedisSink, unit: Any) -> Any:
        if not stopped:
            stopped.append(True)
            volatile_redis.stop()
        return real_write(self, unit)

    monkeypatch.setattr(RedisSink, "write", stop_then_write)
    with make_store(settings, pg_schema, "", redis_url=volatile_redis.url, timeout_s=2) as fs:
        with pytest.raises(SinkUnavailable) as info:
            fs.write(NAME, table)
        monkeypatch.undo()
        message = str(info.value)
        assert f"127.0.0.1:{volatile_redis.port}" in message
        assert "write the same table again with run_id=" in message
        run_id = message.split("run_id='", 1)[1].split("'", 1)[0]
        held = pg_rows(settings, pg_schema, f"SELECT count(*) FROM {NAME} WHERE _run_id = %s",
                       (run_id,))[0][0]
        volatile_redis.start()
        again = fs.write(NAME, table, run_id=run_id)
        assert again.adds_up and again.rows == 1_000
        assert again.stored == 0 and again.already_present + again.rejected == 1_000
        assert again.run is not None and again.run.sinks["postgres"].skipped_units == again.run.units
        stored = pg_rows(settings, pg_schema, f"SELECT {ENTITY} FROM {NAME}")
        assert len(stored) == held == 1_000 - len(rejected_rows(settings, pg_schema, f"python://{run_id}"))
        ids = sorted(r[0] for r in stored)
        online = fs.online(NAME, ids, ["income_monthly"])
        assert online.column("_from").to_pylist() == ["redis"] * len(ids)


# --------------------------------------------------------------------------- aggregations


def test_aggregations_equal_those_features_load_computes_from_the_same_rows_in_parquet(
        tmp_path: Path, settings: Settings, pg_schema: str, second_pg_schema: str, redis_prefix: str) -> None:
    """The clicks schema's windows: written from Python in two tables (one run, two
    sources), and loaded from one Parquet file with the `features load` CLI; the
    ``clicks__aggregates`` rows, the hot aggregate hashes and what ``online`` serves agree."""
    c = clicks_schema()
    history = click_history(6_000, users=60)
    path = tmp_path / "clicks.parquet"
    pq.write_table(history, path)
    with cli_environment(settings, second_pg_schema, CLI_REDIS_DB) as env:
        proc = subprocess.run([sys.executable, "-m", "features.cli", "load", "--schema", "clicks",
                               "--no-progress", str(path)], env=env, capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr
        assert "[adds up]" in proc.stdout
        ref_url = env["FEATURES_REDIS_URL"]
        with make_store(settings, pg_schema, redis_prefix) as fs:
            half = history.num_rows // 2
            parts = [fs.write("clicks", history.slice(0, half).to_pandas(), run_id="clicks-run", source="a"),
                     fs.write("clicks", history.slice(half), run_id="clicks-run", source="b")]
            for part in parts:
                assert part.adds_up and part.aggregations is not None and part.aggregations["adds_up"]
        assert c.schema.aggregations is not None
        hot = [a.name for a in c.schema.aggregations.features if "hot" in a.store]
        cold = [a.name for a in c.schema.aggregations.features if "cold" in a.store]
        query = f"SELECT user_id, event_time, {', '.join(cold)} FROM clicks__aggregates ORDER BY 1, 2"
        mine, ref = pg_rows(settings, pg_schema, query), pg_rows(settings, second_pg_schema, query)
        assert len(mine) > 4_000 and mine == ref
        users = sorted({r[0] for r in mine})
        drop = {x.encode() for x in LINEAGE}
        client, ref_client = redis.Redis.from_url(settings.redis_url), redis.Redis.from_url(ref_url)
        got = [{k: v for k, v in h.items() if k not in drop}
               for h in hot_hashes(client, [redis_prefix + aggregates_key("clicks", u) for u in users])]
        want = [{k: v for k, v in h.items() if k not in drop}
                for h in hot_hashes(ref_client, [aggregates_key("clicks", u) for u in users])]
        client.close()
        ref_client.close()
        assert got == want and all(got)
        with make_store(settings, pg_schema, redis_prefix) as fs, \
                FeatureStore(redis_url=ref_url, schemas=ROOT / "schemas", fill=False,
                             postgres_dsn=search_path_dsn(settings.postgres_dsn,
                                                          second_pg_schema)) as reference:
            assert fs.online("clicks", users, hot, windows="event").drop_columns(["_age_seconds"]).equals(
                reference.online("clicks", users, hot, windows="event").drop_columns(["_age_seconds"]))
            frame = pa.table({"user_id": [r[0] for r in ref[::7]], "timestamp": pa.array(
                [r[1] for r in ref[::7]], pa.timestamp("us", "UTC"))})
            assert fs.historical("clicks", frame, cold, windows="event").equals(
                reference.historical("clicks", frame, cold, windows="event"))
            # and the windows at those times (the default), from each store's history
            assert fs.historical("clicks", frame, cold).equals(reference.historical("clicks", frame, cold))
