"""Loading the same files again, on real Postgres and Redis: with nothing lost it stores
and rewrites nothing (the Redis hashes, aggregate ones included, keep the ``_run_id`` of
the run that wrote them); after Redis lost everything (every key of the load, its ledger
included: what a ``FLUSHDB`` does to it) the re-load writes Redis again and its summary
says that is a restore (text and JSON), with the values of the whole history.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
import redis
from aggregate_reference import MINUTE_US, SCHEMA, T, check_hot, history_table, random_history, reference
from psycopg import sql

from features.compile import compile_schema
from features.compile.postgres import rejects_table_name
from features.config import Settings
from features.load import load, render_summary
from features.pipeline.summary import RunSummary
from features.schema import parse_schema

pytestmark = pytest.mark.services

COMPILED = compile_schema(parse_schema(SCHEMA))


@pytest.fixture()
def stores(settings: Settings) -> Iterator[tuple[str, str, redis.Redis]]:
    """(Postgres schema, Redis key prefix, client) of this test alone, removed after it."""
    ns = f"t_reload_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(settings.postgres_dsn, autocommit=True)
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(ns)))
    client = redis.Redis.from_url(settings.redis_url)
    prefix = f"test:{ns}:"
    try:
        yield ns, prefix, client
    finally:
        admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(ns)))
        admin.close()
        lose_everything(client, prefix)
        client.close()


def lose_everything(client: redis.Redis, prefix: str) -> int:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    return int(client.delete(*keys)) if keys else 0


def hashes(client: redis.Redis, prefix: str) -> dict[bytes, dict[bytes, bytes]]:
    """Every hash the load wrote (entity, aggregates and request-time tiles hashes), field by field."""
    return {k: client.hgetall(k) for k in client.scan_iter(match=f"{prefix}features:*", count=1000)
            if client.type(k) == b"hash"}


def without_run(h: dict[bytes, dict[bytes, bytes]]) -> dict[bytes, dict[bytes, bytes]]:
    return {k: {f: v for f, v in fields.items() if f not in (b"_run_id", b"_ingested_at")}
            for k, fields in h.items()}


def text(summary: RunSummary) -> str:
    return render_summary(summary, rejects_table=rejects_table_name(COMPILED.schema))


def _first_load(tmp_path: Path, settings: Settings, ns: str, prefix: str, client: redis.Redis
                ) -> tuple[list[dict[str, Any]], list[Path], dict[bytes, dict[bytes, bytes]]]:
    """600 events of 4 entities in two files, loaded once: (events, files, the hashes)."""
    events = random_history(random.Random(30), 600, users=4, minutes=540)
    paths = []
    for i, part in enumerate((events[::2], events[1::2])):
        paths.append(tmp_path / f"part{i}.parquet")
        pq.write_table(history_table(part), paths[-1], row_group_size=100)
    first = load(paths, COMPILED, settings, search_path=ns, key_prefix=prefix)
    assert first.adds_up and first.stored == len(events)
    written = hashes(client, prefix)
    assert len([k for k in written if b"__aggregates:" in k]) == 4
    assert len([k for k in written if b"__tiles:" in k]) == 4 and len(written) == 12
    assert {h[b"_run_id"] for k, h in written.items() if b"__tiles:" not in k} == {first.run_id.encode()}
    check_hot(client, prefix, COMPILED.schema, reference(COMPILED.schema, events))
    return events, paths, written


def test_a_reload_rewrites_no_hash_and_a_change_is_the_changing_runs(
        tmp_path: Path, settings: Settings, stores: tuple[str, str, redis.Redis]) -> None:
    """The second load of the same files recomputes the aggregations of their entities
    (from the history) and stored nothing: it rewrote every aggregates hash with its own
    ``_run_id`` (``redis entities 4``); now the hashes stay as they were, byte for byte."""
    ns, prefix, client = stores
    events, paths, written = _first_load(tmp_path, settings, ns, prefix, client)
    again = load(paths, COMPILED, settings, search_path=ns, key_prefix=prefix)
    assert (again.stored, again.already_present) == (0, len(events))
    assert again.sinks["redis"].written == 0
    assert again.aggregations is not None
    assert (again.aggregations["rows_written"], again.aggregations["hot_written"]) == (0, 0)
    assert hashes(client, prefix) == written  # _run_id and _ingested_at included
    assert "redis entities 0," in text(again)

    # a later event of one entity: only that entity's hashes change, by the run that changed them
    late = {**next(e for e in events if e["uid"] == "user-0"), T: max(e[T] for e in events) + MINUTE_US}
    extra = tmp_path / "later.parquet"
    pq.write_table(history_table([late]), extra)
    later = load([*paths, extra], COMPILED, settings, search_path=ns, key_prefix=prefix)
    assert later.stored == 1
    assert later.aggregations is not None and later.aggregations["hot_written"] == 1
    now = hashes(client, prefix)
    changed = {k for k in now if now[k] != written[k]}
    assert changed == {k for k in now if b"{user-0}" in k} and len(changed) == 3  # tiles too
    assert {now[k][b"_run_id"] for k in changed if b"__tiles:" not in k} == {later.run_id.encode()}
    check_hot(client, prefix, COMPILED.schema, reference(COMPILED.schema, [*events, late]))


def test_after_a_redis_loss_the_reload_says_what_it_restored(
        tmp_path: Path, settings: Settings, stores: tuple[str, str, redis.Redis]) -> None:
    """Redis loses every key of the load (its ledger too); Postgres holds everything. The
    same files restore Redis: the headline said only ``stored 0`` beside ``redis: wrote
    N``; now it says what was restored, in the text and the JSON summary."""
    ns, prefix, client = stores
    events, paths, written = _first_load(tmp_path, settings, ns, prefix, client)
    nothing = load(paths, COMPILED, settings, search_path=ns, key_prefix=prefix)
    assert nothing.restored == 0 and nothing.as_dict()["restored"] == 0 and "restored" not in text(nothing)

    assert lose_everything(client, prefix) > len(written)  # the hashes and the ledger
    restore = load(paths, COMPILED, settings, search_path=ns, key_prefix=prefix)
    assert restore.adds_up and (restore.stored, restore.already_present) == (0, len(events))
    redis_stats = restore.sinks["redis"]
    assert redis_stats.written > 0 and redis_stats.restored == redis_stats.written == restore.restored
    assert restore.sinks["postgres"].restored == 0
    assert restore.aggregations is not None
    assert restore.aggregations["rows_written"] == 0
    assert restore.aggregations["hot_written"] == restore.aggregations["hot_restored"] == 4
    got = restore.as_dict()
    assert got["restored"] == got["sinks"]["redis"]["restored"] == redis_stats.restored
    assert got["aggregations"]["hot_restored"] == 4
    lines = text(restore).splitlines()
    assert lines[1].startswith(f"  read {len(events):,} = stored 0 + rejected 0 + already present")
    assert lines[2] == (f"  restored {redis_stats.restored:,} rows into redis that postgres already held "
                        "(redis had lost them, e.g. a FLUSHDB)")
    redis_line = f"  redis: wrote {redis_stats.written:,} ({redis_stats.restored:,} restored), "
    assert any(line.startswith(redis_line) for line in lines)
    assert any("redis entities 4 (4 restored)," in line for line in lines)
    restored = hashes(client, prefix)
    assert without_run(restored) == without_run(written)  # the same values and lineage (and tiles)
    assert {h[b"_run_id"] for k, h in restored.items() if b"__tiles:" not in k} == {restore.run_id.encode()}
    check_hot(client, prefix, COMPILED.schema, reference(COMPILED.schema, events))
    # and once restored, the next re-load restores nothing again
    after = load(paths, COMPILED, settings, search_path=ns, key_prefix=prefix)
    assert (after.restored, after.sinks["redis"].written) == (0, 0) and hashes(client, prefix) == restored
