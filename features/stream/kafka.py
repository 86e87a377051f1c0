"""Small Kafka helpers for the demo, the tests and the benchmark, and the dead-letter
topic's size limit (confluent-kafka).

Every confluent-kafka client featureline creates gets its configuration from
:func:`client_config`: the bootstrap servers, the user's extra librdkafka properties
(``Settings.kafka_properties``: TLS, SASL...), then featureline's own settings for that
client. Each helper here takes those ``properties`` too.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from features.config import Settings
from features.errors import ServiceError, SinkError
from features.sinks.dead_letter import BROKER_DEFAULT_MAX_MESSAGE_BYTES, DEAD_LETTER_MIN_BYTES

log = logging.getLogger("features.kafka")


class LibrdkafkaLog:
    """What a confluent-kafka client's ``logger`` setting calls for each of librdkafka's
    own log lines, instead of librdkafka writing them raw to stderr
    (``%6|<time>|BGQUEUE|rdkafka#producer-3| ...``): they become records of ``logger``
    (``features.kafka``, so ``--log-format json`` keeps them JSON), at their syslog
    level as confluent-kafka maps it (emerg..crit CRITICAL, err ERROR, warning WARNING),
    except that notice and info lines (both INFO there) are DEBUG: a normal run is quiet.

    confluent-kafka hands the lines over when the application polls the client
    (``poll``, ``flush``, a consumer's ``poll`` and ``close``): an AdminClient must be
    polled too, or its lines are dropped with it."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, msg: str, *args: Any) -> None:
        """One line: confluent-kafka calls ``log(level, "%s [%s] %s", facility, client, text)``."""
        self.logger.log(logging.DEBUG if level < logging.WARNING else level, msg, *args)


#: The one ``logger`` of every client :func:`client_config` configures.
LIBRDKAFKA_LOG = LibrdkafkaLog(log)


def client_config(bootstrap: str, properties: Mapping[str, str] | None = None,
                  **own: Any) -> dict[str, Any]:
    """A confluent-kafka client configuration: ``bootstrap.servers`` and ``logger``
    (librdkafka's lines through featureline's logging: :class:`LibrdkafkaLog`), then the
    user's ``properties`` (authentication and TLS: ``security.protocol``, ``sasl.*``,
    ``ssl.*``), then ``own``, the settings this client needs to work as documented (group
    id, idempotence, acks), which win over a property of the same name. The result holds
    credentials: never log it (``features.config.redact`` masks them)."""
    return {"bootstrap.servers": bootstrap, "logger": LIBRDKAFKA_LOG, **(properties or {}), **own}


def ensure_topic(bootstrap: str, topic: str, *, partitions: int = 2, timeout_s: float = 30.0,
                 properties: Mapping[str, str] | None = None) -> None:
    """Create ``topic`` unless it exists (single-node: replication factor 1):
    :func:`create_topic` with its outcome ignored."""
    create_topic(bootstrap, topic, partitions=partitions, timeout_s=timeout_s, properties=properties)


#: What :func:`create_topic` found or did: ``created``; ``exists`` (with the partitions
#: asked for); ``exists-other-partitions`` (left as it is: Kafka can add partitions but
#: that moves entities to other partitions, so featureline never does it for you).
TopicOutcome = Literal["created", "exists", "exists-other-partitions"]


def unreachable(bootstrap: str, exc: BaseException | str) -> ServiceError:
    """The error for a broker that does not answer: names ``bootstrap`` and where it
    came from (``FEATURES_KAFKA_BOOTSTRAP``, ``kafka_bootstrap``)."""
    return ServiceError(f"Kafka at {bootstrap} is unreachable ({exc}); the address is the "
                        "kafka_bootstrap setting (FEATURES_KAFKA_BOOTSTRAP, featureline.toml); "
                        "`features dev up` starts the local one", service="kafka")


def topic_partitions(bootstrap: str, *, timeout_s: float = 10.0,
                     properties: Mapping[str, str] | None = None) -> dict[str, int]:
    """Every topic the broker lists (internal ones, ``__consumer_offsets``, included) and
    its partition count. Raises :class:`ServiceError` (:func:`unreachable`) when no broker
    answers within ``timeout_s`` seconds."""
    admin = AdminClient(client_config(bootstrap, properties))
    try:
        meta = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        # its log lines (one "Connect ... failed" per attempt) are dropped with it: the
        # error says the same once
        raise unreachable(bootstrap, exc.args[0] if exc.args else exc) from exc
    admin.poll(0)  # deliver its log lines (LibrdkafkaLog)
    return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}


def create_topic(bootstrap: str, topic: str, *, partitions: int, timeout_s: float = 10.0,
                 properties: Mapping[str, str] | None = None) -> tuple[TopicOutcome, int]:
    """Create ``topic`` with ``partitions`` partitions (replication factor 1: the local
    single-node broker; ``properties`` carry TLS/SASL for another) unless it exists.

    Returns the outcome and the topic's partition count now. Idempotent: an existing
    topic is reported, never altered (not even with another partition count), and a
    topic another client created meanwhile counts as existing. Raises
    :class:`ServiceError` when the broker is unreachable (:func:`unreachable`) or
    refuses (an ACL, an invalid name, more partitions than it allows), naming it."""
    have = topic_partitions(bootstrap, timeout_s=timeout_s, properties=properties).get(topic)
    if have is None:
        admin = AdminClient(client_config(bootstrap, properties))
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)],
                                request_timeout=timeout_s)[topic].result(timeout_s)
            return "created", partitions
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ServiceError(f"Kafka at {bootstrap}: cannot create topic {topic!r}: {exc}",
                                   service="kafka") from exc
        finally:
            admin.poll(0)  # deliver its log lines (LibrdkafkaLog)
        have = topic_partitions(bootstrap, timeout_s=timeout_s, properties=properties).get(topic, partitions)
    return ("exists" if have == partitions else "exists-other-partitions"), have


def topic_max_message_bytes(bootstrap: str, topic: str, *, timeout_s: float = 15.0,
                            properties: Mapping[str, str] | None = None) -> int:
    """The largest record batch (bytes) the broker accepts on ``topic``: the topic's
    effective ``max.message.bytes`` (its own setting, else the broker's default).

    A topic that does not exist yet gets the broker's ``message.max.bytes`` when it is
    created on first use; when the broker refuses to describe either (no DescribeConfigs
    permission, an old broker) this returns :data:`BROKER_DEFAULT_MAX_MESSAGE_BYTES` and
    logs a warning. Raises nothing: a broker that is down fails the producer instead."""
    admin = AdminClient(client_config(bootstrap, properties))

    def described(kind: str, name: str, key: str) -> int:
        resource = ConfigResource(kind, name)
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
        return int(entries[key].value)

    reasons: list[str] = []
    try:
        try:
            return described("topic", topic, "max.message.bytes")
        except Exception as exc:  # KafkaException (unknown topic, denied) or a timeout: ask the broker
            reasons.append(f"topic {topic!r}: {exc}")
        try:
            broker = min(admin.list_topics(timeout=timeout_s).brokers)
            return described("broker", str(broker), "message.max.bytes")
        except Exception as exc:  # as above: fall back to Kafka's default
            reasons.append(f"broker: {exc}")
    finally:
        admin.poll(0)  # deliver its log lines (LibrdkafkaLog)
    log.warning("Kafka at %s: cannot read the max.message.bytes of %r (%s); assuming %d", bootstrap,
                topic, "; ".join(reasons), BROKER_DEFAULT_MAX_MESSAGE_BYTES)
    return BROKER_DEFAULT_MAX_MESSAGE_BYTES


def dead_letter_limit(settings: Settings, topic: str, producer_max: int, *, timeout_s: float = 15.0) -> int:
    """The size every dead letter for ``topic`` must stay under: the smaller of the topic's
    effective ``max.message.bytes`` (asked of the broker) and ``producer_max`` (the
    producer's ``message.max.bytes``). SinkError when that leaves no room for a letter
    (:data:`DEAD_LETTER_MIN_BYTES`). The stream job and ``features serve`` both ask it
    once at start (a broker that does not answer within ``timeout_s``: the broker default
    is assumed, with a warning)."""
    topic_max = topic_max_message_bytes(settings.kafka_bootstrap, topic, properties=settings.kafka_properties,
                                        timeout_s=timeout_s)
    limit = min(topic_max, producer_max)
    if limit < DEAD_LETTER_MIN_BYTES:
        raise SinkError(f"dead-letter topic {topic!r} accepts records of at most {topic_max} bytes "
                        f"(max.message.bytes): at least {DEAD_LETTER_MIN_BYTES} needed",
                        store="kafka", address=settings.kafka_bootstrap)
    return limit


def produce(bootstrap: str, topic: str, values: Sequence[bytes | None], *,
            keys: Sequence[bytes | None] | None = None,
            headers: Sequence[list[tuple[str, str | bytes | None]] | None] | None = None,
            properties: Mapping[str, str] | None = None) -> list[tuple[int, int, int]]:
    """Send ``values`` in order; returns each record's (partition, offset, timestamp ms)
    once the broker acknowledged all of them."""
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
    """Record keys: the entity id of each JSON event, so all the events of one entity
    share a partition. ``entity`` is the JSON key (the entity field's input name). A
    string id is keyed by its UTF-8 bytes, an integer one by its decimal digits (the bytes
    ``features serve`` keys a validated row with); None when the value is not JSON, not an
    object, or its id is absent, null or of another kind (such a record is still a
    record: the stream rejects it with its reasons)."""
    keys: list[bytes | None] = []
    for v in values:
        try:
            obj = json.loads(v) if v else None
        except (ValueError, RecursionError, UnicodeDecodeError):
            obj = None
        key = obj.get(entity) if isinstance(obj, dict) else None
        keyed = isinstance(key, str) or (isinstance(key, int) and not isinstance(key, bool))
        keys.append(str(key).encode() if keyed else None)
    return keys


def topic_size(bootstrap: str, topic: str, *, timeout_s: float = 30.0,
               properties: Mapping[str, str] | None = None) -> int:
    """Records in ``topic`` now (end minus start offsets, summed over partitions)."""
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


@dataclass(frozen=True)
class PartitionLag:
    """One partition of a consumer group's topic: its end offset (the next offset a
    producer writes) and the offset the group committed (None: none committed)."""

    partition: int
    end: int
    committed: int | None

    @property
    def lag(self) -> int | None:
        """Records behind the end: end - committed (None without a commit)."""
        return None if self.committed is None else max(self.end - self.committed, 0)


@dataclass(frozen=True)
class GroupLag:
    """A consumer group's lag on one topic, per partition (``partitions``, in partition
    order), and the group's state as the broker describes it (``state``: ``STABLE``,
    ``EMPTY``, ``DEAD``, ... or ``UNKNOWN``; ``members``: its active members). A Flink
    Kafka source assigns its partitions itself: its group has no members while the job
    runs, and its committed offsets are those of its last completed checkpoint."""

    group: str
    topic: str
    state: str
    members: int
    partitions: tuple[PartitionLag, ...]

    @property
    def committed(self) -> bool:
        """Whether the group committed an offset on any partition of the topic."""
        return any(p.committed is not None for p in self.partitions)

    @property
    def total(self) -> int:
        """Records behind, summed over the partitions with a commit."""
        return sum(p.lag or 0 for p in self.partitions)


def consumer_lag(bootstrap: str, group: str, topic: str, *, timeout_s: float = 2.0,
                 properties: Mapping[str, str] | None = None) -> GroupLag:
    """``group``'s committed offsets on every partition of ``topic`` against the
    partitions' end offsets, and the group's state: one admin client, the topic described
    (``DescribeTopicPartitions``: unlike a metadata request it never auto-creates the
    topic), then the group's offsets, the end offsets and the group's description asked
    at once.

    A group that committed nothing on the topic (unknown, or deleted) comes back with
    ``committed`` None on each partition, never an error. Raises :class:`ServiceError`
    when no broker answers within ``timeout_s`` seconds (:func:`unreachable`), when
    ``topic`` does not exist, or when the broker refuses a request (an ACL), naming it."""
    admin = AdminClient(client_config(bootstrap, properties))
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic]
        parts = sorted(p.id for p in described.result(timeout_s).partitions)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if getattr(error, "code", lambda: None)() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            admin.poll(0)  # deliver its log lines (LibrdkafkaLog)
            raise ServiceError(f"Kafka at {bootstrap}: no topic {topic!r}", service="kafka") from exc
        # its log lines (one "Connect ... failed" per attempt) are dropped with it: the
        # error says the same once
        raise unreachable(bootstrap, error or exc) from exc
    except concurrent.futures.TimeoutError as exc:
        raise unreachable(bootstrap, f"no answer in {timeout_s:g} s") from exc
    try:
        offsets = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in parts])],
            request_timeout=timeout_s)[group]
        end = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        latest = admin.list_offsets({TopicPartition(topic, p): end for p in parts},
                                    request_timeout=timeout_s)
        group_desc = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group]
        try:
            committed = {tp.partition: tp.offset for tp in offsets.result(timeout_s).topic_partitions
                         if tp.error is None and tp.offset >= 0}
            ends = {tp.partition: f.result(timeout_s).offset for tp, f in latest.items()}
        except Exception as exc:  # KafkaException or a future's timeout: the request failed
            raise ServiceError(f"Kafka at {bootstrap}: cannot read the offsets of group {group!r} on "
                               f"topic {topic!r}: {exc}", service="kafka") from exc
        try:
            desc = group_desc.result(timeout_s)
            state, members = desc.state.name, len(desc.members)
        except Exception:  # Kafka 4 may answer GROUP_ID_NOT_FOUND for a group it does not know
            state, members = "UNKNOWN", 0
    finally:
        admin.poll(0)  # deliver its log lines (LibrdkafkaLog)
    return GroupLag(group, topic, state, members,
                    tuple(PartitionLag(p, int(ends[p]), committed.get(p)) for p in parts))
