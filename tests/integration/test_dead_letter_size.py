"""A dead letter always fits its topic (issue 29, item 1).

A rejected record near the schema's ``payload.max_bytes`` (default 1 MiB) quotes its
value in ``errors`` and again in ``raw``: its dead letter is over twice its size. On a
dead-letter topic with the broker's default ``max.message.bytes`` (1,048,588) the broker
refused it (``MSG_SIZE_TOO_LARGE``), ``process()`` raised, and Flink replayed the same
micro-batch on every restart. The stream's micro-batch step (``StreamProcessor``, on the
real Kafka, Postgres and Redis) must instead send a dead letter that fits the topic's
limit (read from the broker), cut down and marked with the raw record's size and
digest, while the rejects table keeps the full raw record.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from features.compile import compile_schema
from features.config import Settings
from features.lineage import new_run_id
from features.schema import parse_schema
from features.stream.core import StreamProcessor
from features.stream.kafka import read_topic

pytestmark = pytest.mark.services

SCHEMA = """
name: big_notes
version: 1.0.0
entity: note_id
event_time: ts
fields:
  - name: note_id
    type: string
    constraints: {required: true}
  - name: ts
    type: timestamp(ms, UTC)
    constraints: {required: true}
  - name: text
    type: string
    constraints: {max_length: 100, nullable: true}
"""
COMPILED = compile_schema(parse_schema(SCHEMA))
#: The broker's default max.message.bytes (a topic created without configs).
BROKER_DEFAULT = 1_048_588


def _create(bootstrap: str, name: str, config: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)


@pytest.fixture()
def topic(settings: Settings) -> Iterator[str]:
    """A stream topic name whose ``.rejects`` topic the test creates."""
    from confluent_kafka.admin import AdminClient

    name = f"t_dlsize_{uuid.uuid4().hex[:8]}"
    yield name
    AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).delete_topics([name + ".rejects"])


def _record(i: int, text: str) -> bytes:
    ts = f"2024-05-01T12:00:{i % 60:02d}.000Z"
    return json.dumps({"note_id": f"n{i}", "ts": ts, "text": text}).encode()


def _run(settings: Settings, topic: str, pg_schema: str, redis_prefix: str, values: list[bytes]) -> Any:
    proc = StreamProcessor(COMPILED, settings, run_id=new_run_id(), dead_letter_topic=topic + ".rejects",
                           search_path=pg_schema, key_prefix=redis_prefix)
    proc.open()
    try:
        n = len(values)
        outcome = proc.process(values, pa.array([topic] * n), pa.array([0] * n, pa.int32()),
                               pa.array(range(n), pa.int64()))
    finally:
        proc.close()
    return proc, outcome


def _stored_raw(settings: Settings, pg_schema: str, source: str) -> Any:
    with psycopg.connect(settings.postgres_dsn, options=f"-c search_path={pg_schema}") as conn:
        row = conn.execute("SELECT raw FROM big_notes__rejects WHERE _source = %s", (source,)).fetchone()
    assert row is not None
    return row[0]


def _canonical(obj: Any) -> bytes:
    """The raw record as canonical JSON (sorted keys, no spaces, UTF-8): what the digest covers."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def test_an_oversized_reject_sends_a_dead_letter_that_fits(settings: Settings, topic: str, pg_schema: str,
                                                           redis_prefix: str) -> None:
    _create(settings.kafka_bootstrap, topic + ".rejects", {})  # broker defaults, as featureline makes it
    huge = "x" * 700_000 + '"\\\u00e9'  # quotes, a backslash and a non-ASCII character escape too
    values = [_record(i, "short") for i in range(199)] + [_record(199, huge), _record(200, "y" * 101)]
    proc, outcome = _run(settings, topic, pg_schema, redis_prefix, values)
    assert outcome.tolist() == [0] * 199 + [1, 1]
    assert proc.stats.summary.stored == 199 and proc.stats.summary.rejected == 2
    assert proc.stats.dead_letters == 2

    letters = {m.key().decode(): m.value() for m in read_topic(settings.kafka_bootstrap, topic + ".rejects")}
    assert sorted(letters) == [f"kafka://{topic}/0/199", f"kafka://{topic}/0/200"]
    big = letters[f"kafka://{topic}/0/199"]
    assert len(big) < BROKER_DEFAULT
    letter = json.loads(big)
    assert letter["truncated"] is True
    assert letter["schema"] == "big_notes" and letter["source"] == f"kafka://{topic}/0/199"
    assert [e["rule"] for e in letter["errors"]] == ["text.max_length"]
    assert letter["raw"]["_raw_prefix"].startswith('{"note_id": "n199"')
    small = json.loads(letters[f"kafka://{topic}/0/200"])
    assert "truncated" not in small and small["raw"]["text"] == "y" * 101  # a small one stays whole

    raw = _stored_raw(settings, pg_schema, f"kafka://{topic}/0/199")
    assert raw == json.loads(_record(199, huge))  # the full record, unchanged
    assert letter["raw_sha256"] == hashlib.sha256(_canonical(raw)).hexdigest()
    assert letter["raw_bytes"] == len(_canonical(raw))
    assert letter["full_bytes"] > BROKER_DEFAULT


def test_dead_letters_fit_a_topic_with_a_lowered_limit(settings: Settings, topic: str, pg_schema: str,
                                                       redis_prefix: str) -> None:
    """The topic's own ``max.message.bytes`` (50,000 here) is read from the broker: a
    40 KB reject is cut down to it, and many small rejects are not batched past it."""
    limit = 50_000
    _create(settings.kafka_bootstrap, topic + ".rejects", {"max.message.bytes": str(limit)})
    values = [_record(i, "z" * 2000) for i in range(300)] + [_record(300, "w" * 40_000), _record(301, "ok")]
    proc, outcome = _run(settings, topic, pg_schema, redis_prefix, values)
    assert outcome.tolist() == [1] * 301 + [0]
    assert proc.stats.dead_letters == 301
    letters = {m.key().decode(): m.value() for m in read_topic(settings.kafka_bootstrap, topic + ".rejects")}
    assert len(letters) == 301
    assert all(len(v) < limit for v in letters.values())
    cut = json.loads(letters[f"kafka://{topic}/0/300"])
    assert cut["truncated"] is True
    raw = _stored_raw(settings, pg_schema, f"kafka://{topic}/0/300")
    assert raw["text"] == "w" * 40_000
    assert cut["raw_sha256"] == hashlib.sha256(_canonical(raw)).hexdigest()
    assert "truncated" not in json.loads(letters[f"kafka://{topic}/0/0"])
