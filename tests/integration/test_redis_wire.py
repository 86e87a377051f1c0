"""The Redis sink's wire format against a real server: MessagePack strings of every
header width, units larger than one chunk, and a server that loses the script in the
middle of a unit (NOSCRIPT), with the newest-wins rule and the counts still exact."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
import redis

from features.compile import CompiledSchema, compile_schema
from features.config import Settings
from features.kernels.digest import digests
from features.lineage import RunContext
from features.schema.parse import parse_schema
from features.sinks import redis as redis_sink
from features.sinks.base import WriteUnit
from features.sinks.redis import RedisSink

pytestmark = pytest.mark.services

SCHEMA = """
name: wire_items
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
  - name: label
    type: string
    store: hot
"""


@pytest.fixture(scope="module")
def compiled() -> CompiledSchema:
    return compile_schema(parse_schema(SCHEMA, "wire_items.yaml"))


@pytest.fixture()
def client(settings: Settings) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(settings.redis_url)
    yield c
    c.close()


EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _unit(compiled: CompiledSchema, items: list[tuple[str, int, str | None]]) -> WriteUnit:
    """Rows (entity, event second, label) with lineage."""
    ctx = RunContext(compiled.name, compiled.schema.version_str, compiled.fingerprint, "run-w",
                     dt.datetime(2024, 6, 1, tzinfo=dt.UTC))
    n = len(items)
    table = pa.table({
        "item_id": [i[0] for i in items],
        "seen_at": pa.array([EPOCH + dt.timedelta(seconds=i[1]) for i in items], pa.timestamp("us", "UTC")),
        "label": pa.array([i[2] for i in items], pa.string()),
        **ctx.columns(pa.array([f"file:///wire.parquet#{k}" for k in range(n)])),
    })
    return WriteUnit(table, pa.table({}), None, n)


def _sink(settings: Settings, compiled: CompiledSchema, prefix: str) -> RedisSink:
    sink = RedisSink(settings.redis_url, compiled, key_prefix=prefix, retries=2, backoff_s=0.05)
    sink.open()
    return sink


def _labels(client: redis.Redis, prefix: str, n: int) -> dict[str, Any]:
    keys = list(client.scan_iter(match=prefix + "features:wire_items:{*", count=10_000))
    assert len(keys) == n
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.hget(k, "label")
    return {k.decode().split("{", 1)[1][:-1]: v for k, v in zip(keys, pipe.execute(), strict=True)}


def test_values_of_every_msgpack_header_width_land_byte_exact(settings: Settings, compiled: CompiledSchema,
                                                              client: redis.Redis, redis_prefix: str) -> None:
    # fixstr (< 32 bytes), str8 (< 256), str16 (< 65536), str32; lengths in bytes, not characters
    lengths = [0, 1, 31, 32, 255, 256, 65_535, 65_536, 200_000]
    labels: list[str | None] = ["x" * n for n in lengths]
    labels += ["é" * 16, "é" * 128, "✓" * 30_000, None, "\x00\r\n$*"]
    sink = _sink(settings, compiled, redis_prefix)
    try:
        result = sink.write(_unit(compiled, [(f"e{i}", 1, label) for i, label in enumerate(labels)]))
    finally:
        sink.close()
    assert result.stored == len(labels) and result.already_present == 0
    key = redis_prefix + "features:wire_items:{e1}"
    assert 3600 - 60 < client.ttl(key) <= 3600, "the schema's TTL (1h) starts at the write"
    got = _labels(client, redis_prefix, len(labels))
    for i, label in enumerate(labels):
        want = None if label is None else label.encode()
        assert got[f"e{i}"] == want, f"label {i} ({len(label or '')} chars)"


def test_a_unit_of_many_chunks_is_written_once_and_counted_exactly(
        settings: Settings, compiled: CompiledSchema, client: redis.Redis, redis_prefix: str) -> None:
    n = 2 * redis_sink._ROWS_PER_CHUNK + 1_000  # three chunks, two of them at the server at once
    # entity k % 30_000: the first 30,000 rows are new, the rest are newer (written) or older (kept)
    items = [(f"e{k % 30_000}", k if k % 2 else -k, f"v{k}") for k in range(n)]
    sink = _sink(settings, compiled, redis_prefix)
    try:
        first = sink.write(_unit(compiled, items))
        again = sink.write(_unit(compiled, items))
    finally:
        sink.close()
    newest: dict[str, tuple[int, str]] = {}
    written = 0
    for entity, t, label in items:
        if entity not in newest or t > newest[entity][0]:
            newest[entity] = (t, label)
            written += 1
    assert first.stored == written and first.already_present == n - written
    assert again.stored == 0 and again.already_present == n
    got = _labels(client, redis_prefix, len(newest))
    assert got == {e: label.encode() for e, (_, label) in newest.items()}


def test_script_lost_mid_unit_is_reloaded_and_the_rest_replayed_in_order(
        settings: Settings, compiled: CompiledSchema, client: redis.Redis, redis_prefix: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SCRIPT FLUSH after the first chunk went out (what a restart does to a persistent
    server): later calls answer NOSCRIPT; the sink loads the script and sends every call
    from the first refused one again. Equal event times keep the greater content digest:
    an entity written in chunk 1 and again, same time, another label, in chunk 3 keeps the
    label whose digest is greater (replayed in order, each call decided once)."""
    chunk = redis_sink._ROWS_PER_CHUNK
    n = 3 * chunk
    items = [(f"e{k}", 10, f"first{k}") for k in range(chunk)]                   # chunk 1
    items += [(f"f{k}", 10, f"only{k}") for k in range(chunk)]                   # chunk 2
    items += [(f"e{k}", 10, f"second{k}") for k in range(chunk // 2)]             # chunk 3: same key & time
    items += [(f"e{k}", 11, f"newer{k}") for k in range(chunk // 2, chunk)]       # chunk 3: newer
    real_iter = redis_sink._UnitCalls.__iter__
    flushed: list[int] = []

    def flush_after_first(self: Any) -> Iterator[list[bytes]]:
        for i, part in enumerate(real_iter(self)):
            yield part
            if i == 0 and not flushed:
                flushed.append(1)
                client.script_flush()

    monkeypatch.setattr(redis_sink._UnitCalls, "__iter__", flush_after_first)
    sink = _sink(settings, compiled, redis_prefix)
    try:
        result = sink.write(_unit(compiled, items))
    finally:
        sink.close()
    assert flushed, "the script was never flushed: the test did not test anything"
    rows = _unit(compiled, items).rows
    digest = digests(rows, compiled.schema).to_pylist()
    second_wins = [digest[2 * chunk + k] > digest[k] for k in range(chunk // 2)]
    assert 0 < sum(second_wins) < chunk // 2
    assert result.stored == 2 * chunk + chunk // 2 + sum(second_wins)
    assert result.already_present == n - result.stored
    got = _labels(client, redis_prefix, 2 * chunk)
    for k in range(chunk):
        want = (f"second{k}" if second_wins[k] else f"first{k}") if k < chunk // 2 else f"newer{k}"
        assert got[f"e{k}"] == want.encode()
        assert got[f"f{k}"] == f"only{k}".encode()


def test_an_older_event_is_refused_and_does_not_extend_the_ttl(
        settings: Settings, compiled: CompiledSchema, client: redis.Redis, redis_prefix: str) -> None:
    key = redis_prefix + "features:wire_items:{a}"
    sink = _sink(settings, compiled, redis_prefix)
    try:
        assert sink.write(_unit(compiled, [("a", 100, "new")])).stored == 1
        client.pexpire(key, 100_000)
        older = sink.write(_unit(compiled, [("a", 50, "old")]))
        assert older.stored == 0 and older.already_present == 1
        assert client.hget(key, "label") == b"new" and 0 < client.pttl(key) <= 100_000
        newer = sink.write(_unit(compiled, [("a", 200, None)]))
        assert newer.stored == 1
        assert client.hget(key, "label") is None, "a null value is an absent field, not the old value"
        assert client.ttl(key) > 3000, "an accepted write restarts the TTL"
    finally:
        sink.close()
