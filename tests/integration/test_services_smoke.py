"""Round trips against the real local services (`features dev up`): no fakes."""

from __future__ import annotations

import json
import time

import pytest

from features.config import Settings

pytestmark = pytest.mark.services


def test_redis_hash_round_trip(settings: Settings, redis_prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    key = f"{redis_prefix}{{entity-1}}"
    client.hset(key, mapping={"income": "1234.50", "status": "employed"})
    client.expire(key, 60)
    assert client.hgetall(key) == {b"income": b"1234.50", b"status": b"employed"}
    assert 0 < client.ttl(key) <= 60


def test_postgres_create_insert_select(pg_conn: object, pg_schema: str) -> None:
    import psycopg

    assert isinstance(pg_conn, psycopg.Connection)
    pg_conn.execute("CREATE TABLE smoke (id bigint PRIMARY KEY, amount numeric(18,2) NOT NULL)")
    pg_conn.execute("INSERT INTO smoke VALUES (1, 10.25), (2, 0.01)")
    rows = pg_conn.execute("SELECT id, amount::text FROM smoke ORDER BY id").fetchall()
    assert rows == [(1, "10.25"), (2, "0.01")]
    where = pg_conn.execute("SELECT table_schema FROM information_schema.tables "
                            "WHERE table_name = 'smoke'").fetchall()
    assert where == [(pg_schema,)]


def _produce(settings: Settings, topic: str, payloads: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i, payload in enumerate(payloads):
        producer.produce(topic, value=payload, key=str(i).encode())
    assert producer.flush(20) == 0, "not every message was delivered"


def test_kafka_produce_consume(settings: Settings, kafka_topic: str) -> None:
    from confluent_kafka import Consumer

    sent = [json.dumps({"n": i}).encode() for i in range(25)]
    _produce(settings, kafka_topic, sent)
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": kafka_topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([kafka_topic])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    finally:
        consumer.close()
    assert got == sent


@pytest.mark.flink
def test_pyflink_reads_topic_through_connector(settings: Settings, kafka_topic: str, tmp_path) -> None:
    """A bounded PyFlink job on the local mini-cluster reads the topic via the Kafka connector."""
    import subprocess
    import sys
    from pathlib import Path

    sent = [json.dumps({"n": i}).encode() for i in range(40)]
    _produce(settings, kafka_topic, sent)
    out = tmp_path / "out.jsonl"
    script = Path(__file__).with_name("flink_read_topic.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--bootstrap", settings.kafka_bootstrap, "--topic", kafka_topic,
         "--out", str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["value"] for r in records) == sorted(p.decode() for p in sent)
    assert {r["topic"] for r in records} == {kafka_topic}
    assert sorted(r["offset"] for r in records) == list(range(40))


@pytest.mark.flink
def test_pyflink_job_fails_when_broker_is_unreachable(tmp_path) -> None:
    """The smoke job above really talks to a broker: pointed at a closed port it fails."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(__file__).with_name("flink_read_topic.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--bootstrap", f"127.0.0.1:{port}", "--topic", "absent",
         "--out", str(tmp_path / "out.jsonl")],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode != 0
    assert "TimeoutException" in proc.stderr, proc.stderr[-2000:]
