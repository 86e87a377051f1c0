"""``features load --workers N``: N processes, one shard of the entities each, give
exactly what one process gives (both stores, rejects with their row numbers, lineage,
aggregations), re-run exactly, and survive a killed worker with a re-run."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis
from psycopg import sql
from test_batch_load import _env, pg_snapshot, redis_snapshot

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.load import load, render_summary
from features.ops.examples import applicant_schema, applicants
from features.schema import parse_schema
from features.sources.parquet import ParquetSource, entity_shards

pytestmark = pytest.mark.services
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return applicant_schema()


def write_files(tmp: Path, rows: int, files: int = 3, seed: int = 21) -> list[Path]:
    """The same ids in every file, shuffled, with other event times: newest-wins decides."""
    paths = []
    for i in range(files):
        table = applicants(rows, seed=seed + i, first_id=10**9)
        order = list(range(rows))
        random.Random(seed + i).shuffle(order)
        paths.append(tmp / f"part-{i}.parquet")
        pq.write_table(table.take(pa.array(order)), paths[-1], row_group_size=900)
    return paths


def test_every_row_of_one_entity_lands_in_one_shard_whatever_its_representation(
        compiled: CompiledSchema) -> None:
    ids = ["APP-000000000001", "APP-000000000002", None, "APP-000000000001", "bad id"] * 40
    batch = pa.RecordBatch.from_pydict({"application_id": ids})
    shards = entity_shards(batch, compiled, 3)
    by_id: dict[Any, set[int]] = {}
    for i, s in zip(ids, shards.tolist(), strict=True):
        by_id.setdefault(i, set()).add(s)
    assert all(len(v) == 1 for k, v in by_id.items() if k is not None)
    assert set(shards.tolist()) <= {0, 1, 2}
    assert len(by_id[None]) > 1  # no entity: spread by row number


def test_shards_partition_the_rows_with_their_file_row_numbers(tmp_path: Path,
                                                                compiled: CompiledSchema) -> None:
    (path,) = write_files(tmp_path, 2_000, files=1)
    whole = [(sb.lineage.row_uris().to_pylist(), sb.batch.num_rows) for sb in
             ParquetSource([path], compiled, batch_rows=700).batches()]
    uris = [u for us, _ in whole for u in us]
    parts = [sb for i in range(3) for sb in ParquetSource([path], compiled, batch_rows=700,
                                                           shard=(i, 3)).batches()]
    got = [u for sb in parts for u in sb.lineage.row_uris().to_pylist()]
    assert sorted(got) == sorted(uris) and len(got) == len(set(got)) == 2_000
    assert len({sb.lineage.unit for sb in parts}) == len(parts)  # units of their own
    table = pq.read_table(path)
    for sb in parts[:4]:  # each row is the file's row its lineage names
        rows = [int(u.rsplit("#", 1)[1]) for u in sb.lineage.row_uris().to_pylist()]
        assert sb.batch.column("application_id").to_pylist() == \
            table.column("application_id").take(pa.array(rows, pa.int64())).to_pylist()


def test_two_workers_give_what_one_process_gives_and_rerun_exactly(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, second_pg_schema: str,
        redis_prefix: str) -> None:
    paths = write_files(tmp_path, 3_000)
    prefix_2 = redis_prefix + "w2:"
    one = load(paths, compiled, settings, batch_rows=1_000, search_path=pg_schema, key_prefix=redis_prefix)
    two = load(paths, compiled, settings, batch_rows=1_000, search_path=second_pg_schema, key_prefix=prefix_2,
               workers=2)
    counts = ("read", "stored", "rejected", "already_present")
    assert [getattr(two, k) for k in counts] == [getattr(one, k) for k in counts]
    assert two.adds_up and two.by_rule == one.by_rule and two.stored > 2_000
    # the same rows, rejects (row numbers and raw values included) and hot hashes
    assert pg_snapshot(settings, second_pg_schema) == pg_snapshot(settings, pg_schema)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        assert redis_snapshot(client, prefix_2) == redis_snapshot(client, redis_prefix)
        again = load(paths, compiled, settings, batch_rows=1_000, search_path=second_pg_schema,
                     key_prefix=prefix_2, workers=2)
        assert again.stored == 0 and again.rejected == 0 and again.skipped_units == again.units
        assert again.already_present == one.read
        assert redis_snapshot(client, prefix_2) == redis_snapshot(client, redis_prefix)
    finally:
        client.close()
    assert pg_snapshot(settings, second_pg_schema) == pg_snapshot(settings, pg_schema)


def test_rejects_are_counted_one_way_whatever_the_shard_count_and_the_printed_query_returns_them(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str,
        redis_prefix: str) -> None:
    """Issue 45, item 6: a reject the table already holds (an earlier run read its row) is
    ``already present`` whatever the shard count, as a valid row the cold store holds;
    ``rejected`` is what the run stored, under its run id, so the query the summary prints
    returns exactly that many rows (and ``by_rule`` counts their errors)."""
    first, second = write_files(tmp_path, 1_200, files=2, seed=40)
    kw: dict[str, Any] = {"batch_rows": 500, "search_path": pg_schema, "key_prefix": redis_prefix}
    one = load([first], compiled, settings, **kw)
    both = load([first, second], compiled, settings, workers=2, **kw)  # other shards, other units
    again = load([first, second], compiled, settings, workers=3, **kw)
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        def rejects(where: str, *params: Any) -> tuple[int, int]:
            row = conn.execute(f"SELECT count(*), coalesce(sum(jsonb_array_length(errors)), 0) "
                               f"FROM credit_applicant__rejects WHERE {where}", params).fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

        second_rejects = rejects("left(_source, %s) = %s", len(second.as_uri()) + 1, second.as_uri() + "#")
        assert one.rejected > 0 and second_rejects[0] > 0
        assert rejects("true")[0] == one.rejected + second_rejects[0]  # each stored once
        for s in (one, both, again):
            assert s.adds_up and s.read == s.stored + s.rejected + s.already_present
            assert rejects("_run_id = %s", s.run_id) == (s.rejected, sum(s.by_rule.values()))
            printed = render_summary(s, rejects_table="credit_applicant__rejects")
            query = re.search(r"\((SELECT .*)\)$", printed, re.M)
            assert (query is not None) == (s.rejected > 0), printed
            if query is not None:
                assert len(conn.execute(query.group(1)).fetchall()) == s.rejected
    # the first file's rows, rejects included, are already present for the 2-worker run
    assert (both.rejected, both.already_present) == (second_rejects[0], one.read)
    assert (again.stored, again.rejected, again.already_present) == (0, 0, 2_400) and not again.by_rule


def test_aggregations_with_three_workers_equal_the_reference(tmp_path: Path, settings: Settings,
                                                             pg_schema: str, redis_prefix: str) -> None:

    from aggregate_reference import (
        BASE_US,
        MINUTE_US,
        SCHEMA,
        T,
        check_hot,
        history_table,
        random_history,
        reference,
    )

    agg = compile_schema(parse_schema(SCHEMA))
    rng = random.Random(8)
    events = random_history(rng, 2_000, users=40, minutes=900)
    rng.shuffle(events)
    cut = BASE_US + 450 * MINUTE_US  # two loads, the later half first
    for i, rows in enumerate([[e for e in events if e[T] >= cut], [e for e in events if e[T] < cut]]):
        path = tmp_path / f"load{i}.parquet"
        pq.write_table(history_table(rows), path, row_group_size=300)
        s = load([path], agg, settings, search_path=pg_schema, key_prefix=redis_prefix, workers=3)
        assert s.adds_up and s.aggregations is not None and s.aggregations["adds_up"]
    want = reference(agg.schema, events)
    names = [a.name for a in agg.schema.aggregations.features]  # type: ignore[union-attr]
    with psycopg.connect(settings.postgres_dsn) as conn:
        got_rows = conn.execute(sql.SQL("SELECT uid, ts, {} FROM {}.agg_props__aggregates").format(
            sql.SQL(", ").join(sql.Identifier(n) for n in names), sql.Identifier(pg_schema))).fetchall()
    got = {(u, int(ts.timestamp()) * 1_000_000 + ts.microsecond): tuple(v) for u, ts, *v in got_rows}
    assert len(got) == len(got_rows) and got == want
    client = redis.Redis.from_url(settings.redis_url)
    try:
        check_hot(client, redis_prefix, agg.schema, want)
    finally:
        client.close()


def test_a_worker_killed_mid_run_fails_the_run_and_a_rerun_ends_exact(
        tmp_path: Path, settings: Settings, compiled: CompiledSchema, pg_schema: str, second_pg_schema: str,
        redis_prefix: str) -> None:
    paths = write_files(tmp_path, 8_000, files=2)
    load(paths, compiled, settings, batch_rows=500, search_path=pg_schema, key_prefix=redis_prefix)
    # the CLI has no key prefix: the workers' Redis writes go to a database of their own
    env = _env(settings, second_pg_schema, 11)
    db_url = env["FEATURES_REDIS_URL"]
    cli = [sys.executable, "-m", "features.cli", "load", "--schema", "credit_applicant", "--workers", "2",
           "--batch-rows", "500", "--json", *map(str, paths)]
    redis.Redis.from_url(db_url).flushdb()
    proc = subprocess.Popen(cli, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    ledger = f"features:{compiled.name}:__ledger__"
    client = redis.Redis.from_url(db_url)
    try:
        deadline = time.monotonic() + 120
        while client.scard(ledger) < 4 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the load ended before a worker could be killed: make it longer"
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        workers = [int(c) for c in children
                   if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert workers, children
        os.kill(workers[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, (proc.returncode, err[-2000:])  # a clear failure, not a hang
        assert b"died" in err and b"run the same command again" in err, err[-2000:]
        rerun = subprocess.run(cli, env=env, cwd=ROOT, capture_output=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        reference_pg = pg_snapshot(settings, pg_schema)
        assert pg_snapshot(settings, second_pg_schema) == reference_pg
        single = redis.Redis.from_url(settings.redis_url)
        try:
            assert redis_snapshot(client, "") == redis_snapshot(single, redis_prefix)
        finally:
            single.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        client.flushdb()
        client.close()
