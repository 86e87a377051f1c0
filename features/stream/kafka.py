"""Small Kafka helpers for the demo, the tests and the benchmark (confluent-kafka).

Every confluent-kafka client featureline creates gets its configuration from
:func:`client_config`: the bootstrap servers, the user's extra librdkafka properties
(``Settings.kafka_properties``: TLS, SASL...), then featureline's own settings for that
client. Each helper here takes those ``properties`` too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from features.errors import ServiceError


def client_config(bootstrap: str, properties: Mapping[str, str] | None = None,
                  **own: Any) -> dict[str, Any]:
    """A confluent-kafka client configuration: ``bootstrap.servers``, then the user's
    ``properties`` (authentication and TLS: ``security.protocol``, ``sasl.*``, ``ssl.*``),
    then ``own``, the settings this client needs to work as documented (group id,
    idempotence, acks), which win over a property of the same name. The result holds
    credentials: never log it (``features.config.redact`` masks them)."""
    return {"bootstrap.servers": bootstrap, **(properties or {}), **own}


def ensure_topic(bootstrap: str, topic: str, *, partitions: int = 2, timeout_s: float = 30.0,
                 properties: Mapping[str, str] | None = None) -> None:
    """Create ``topic`` unless it exists (single-node: replication factor 1)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient(client_config(bootstrap, properties))
    if topic in admin.list_topics(timeout=timeout_s).topics:
        return
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout_s)
    except KafkaException as exc:
        if "TOPIC_ALREADY_EXISTS" not in str(exc):
            raise ServiceError(f"Kafka at {bootstrap}: cannot create topic {topic!r}: {exc}",
                               service="kafka") from exc


def produce(bootstrap: str, topic: str, values: Sequence[bytes | None], *,
            keys: Sequence[bytes | None] | None = None,
            headers: Sequence[list[tuple[str, str | bytes | None]] | None] | None = None,
            properties: Mapping[str, str] | None = None) -> list[tuple[int, int, int]]:
    """Send ``values`` in order; returns each record's (partition, offset, timestamp ms)
    once the broker acknowledged all of them."""
    from confluent_kafka import Producer

    producer = Producer(client_config(bootstrap, properties, **{
        "enable.idempotence": True, "linger.ms": 20, "message.max.bytes": 2_000_000}))
    positions: list[Any] = [None] * len(values)
    errors: list[str] = []

    def delivered(i: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                positions[i] = (msg.partition(), msg.offset(), msg.timestamp()[1])
        return cb

    for i, value in enumerate(values):
        key = keys[i] if keys is not None else None
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered(i),
                                 headers=headers[i] if headers is not None else None)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(60)
    if left or errors:
        raise ServiceError(f"Kafka at {bootstrap}: {left} records unacknowledged; {errors[:1]}",
                           service="kafka")
    return positions


def entity_keys(values: Sequence[bytes | None], entity: str) -> list[bytes | None]:
    """Record keys: the entity id of each JSON event (None when it has none), so all the
    events of one entity share a partition."""
    keys: list[bytes | None] = []
    for v in values:
        try:
            obj = json.loads(v) if v else None
        except (ValueError, RecursionError, UnicodeDecodeError):
            obj = None
        key = obj.get(entity) if isinstance(obj, dict) else None
        keys.append(str(key).encode() if isinstance(key, str) else None)
    return keys


def topic_size(bootstrap: str, topic: str, *, timeout_s: float = 30.0,
               properties: Mapping[str, str] | None = None) -> int:
    """Records in ``topic`` now (end minus start offsets, summed over partitions)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(client_config(bootstrap, properties, **{
        "group.id": f"featureline-size-{time.time_ns()}", "enable.auto.commit": False}))
    try:
        meta = c.list_topics(topic, timeout=timeout_s).topics[topic]
        total = 0
        for p in meta.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            total += int(high) - int(low)
        return total
    finally:
        c.close()


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 30.0,
               properties: Mapping[str, str] | None = None) -> list[Any]:
    """Every record currently in ``topic`` (from the beginning to the end offsets)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(client_config(bootstrap, properties, **{
        "group.id": f"featureline-read-{time.time_ns()}", "enable.auto.commit": False,
        "auto.offset.reset": "earliest"}))
    try:
        meta = c.list_topics(topic, timeout=timeout_s).topics[topic]
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                for p in meta.partitions}
        c.assign([TopicPartition(topic, p, 0) for p in ends])
        want = sum(ends.values())
        out: list[Any] = []
        deadline = time.time() + timeout_s
        while len(out) < want and time.time() < deadline:
            msg = c.poll(1.0)
            if msg is not None and msg.error() is None:
                out.append(msg)
        return out
    finally:
        c.close()
