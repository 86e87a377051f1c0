"""An idempotent Kafka producer an asyncio server can await.

``await producer.send(topic, messages)`` hands every message to librdkafka and returns
once the broker acknowledged all of them (``acks=all``), or raises an error that says
whether a retry can help:

- :class:`~features.errors.SinkUnavailable` (transient: the broker is down, slow, or
  moving a partition's leader; the message timed out; librdkafka's queue stayed full past
  ``queue_timeout_s``): the same request may succeed later;
- :class:`RecordRefused` (permanent: a record over the topic's ``max.message.bytes``, a
  topic the client may not write, a topic that does not exist, a record the broker cannot
  validate): the same request fails the same way, however often it is sent.

:func:`kafka_failure` is the one place that sorts librdkafka's error codes into the two.
The event loop never blocks: librdkafka's queue (bounded, ``QUEUE_MAX_KBYTES``) takes the
messages (when it is full the coroutine yields and tries again, up to ``queue_timeout_s``),
a daemon thread polls the producer, and the delivery callbacks, which run on that thread,
resolve the request's future with ``loop.call_soon_threadsafe``.

The producer is idempotent (``enable.idempotence``): librdkafka's own retries never write
a message twice or out of order within a partition. A message that failed (delivery
timeout) may still have been written; the caller answers "retry" and the stream job's
stores make the retry harmless (an event is stored once: its entity, event time and
content digest are the history's key).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException, Producer

from features.errors import SinkError, SinkUnavailable
from features.stream.kafka import client_config

#: librdkafka gives up on a message after this long (``delivery.timeout.ms``) by default
#: (``features serve --delivery-timeout``); the request then answers 503 (a broker that is
#: down is not waited for forever).
DELIVERY_TIMEOUT_MS = 15_000
#: librdkafka's queue of messages not yet acknowledged holds at most this many KiB
#: (``queue.buffering.max.kbytes``; librdkafka's own default is 1 GiB): past it ``produce``
#: raises BufferError and ``send`` waits for room, up to ``queue_timeout_s``.
QUEUE_MAX_KBYTES = 64 * 1024
#: How long ``send`` waits for room in a full queue, by default (seconds), before it gives
#: up with SinkUnavailable (the request answers 503).
QUEUE_TIMEOUT_S = 10.0
#: librdkafka error names that no retry of the same record can cure (``kafka_failure``).
#: The broker's UNKNOWN_TOPIC_OR_PART is not here: Kafka marks it retriable (a partition
#: moving); librdkafka's local ``_UNKNOWN_TOPIC`` is: the cluster's metadata has no such topic.
PERMANENT = frozenset({
    "MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD", "INVALID_TIMESTAMP",
    "TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "SASL_AUTHENTICATION_FAILED", "_AUTHENTICATION", "TOPIC_EXCEPTION", "_UNKNOWN_TOPIC", "_INVALID_ARG",
    "_INVALID_TYPE"})
#: Of those, the ones that mean "this record is too large for the topic" (HTTP 413).
TOO_LARGE = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"})
#: One message: (key, value, headers).
Message = tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]] | None]


class RecordRefused(SinkError):
    """Kafka refused a record for good: the same request fails the same way however often
    it is retried (not :class:`~features.errors.Transient`). ``topic`` is where it was
    going, ``code`` librdkafka's error name (``MSG_SIZE_TOO_LARGE``), ``too_large`` whether
    the record is over the topic's (or the client's) size limit."""

    def __init__(self, message: str, *, topic: str, code: str, address: str | None = None) -> None:
        super().__init__(message, store="kafka", address=address)
        self.topic = topic
        self.code = code
        self.too_large = code in TOO_LARGE


def _code(err: Any) -> str:
    """librdkafka's name of a KafkaError (``MSG_SIZE_TOO_LARGE``); an object that is not a
    KafkaError: its type name."""
    name = getattr(err, "name", None)
    return str(name()) if callable(name) else type(err).__name__


def is_permanent(err: Any) -> bool:
    """Whether a KafkaError is one that retrying the same record cannot cure (``PERMANENT``,
    or librdkafka calls it fatal)."""
    fatal = getattr(err, "fatal", None)
    return _code(err) in PERMANENT or (callable(fatal) and bool(fatal()))


def kafka_failure(err: Any, topic: str, address: str) -> SinkError:
    """The error a failed produce of a record to ``topic`` raises: RecordRefused for a
    permanent KafkaError (``is_permanent``), SinkUnavailable for every other one. ``err``
    is a confluent-kafka KafkaError (a delivery report's, or a KafkaException's ``args[0]``)."""
    code = _code(err)
    reason = err.str() if callable(getattr(err, "str", None)) else str(err)
    if is_permanent(err):
        if code in TOO_LARGE:
            what = (f"a record is larger than Kafka topic {topic!r} accepts (its max.message.bytes, or the "
                    f"client's message.max.bytes): {code}: {reason}")
        else:
            what = f"Kafka refused a record for topic {topic!r} for good: {code}: {reason}"
        return RecordRefused(f"{what}; retrying the same request cannot succeed", topic=topic, code=code,
                             address=address)
    return SinkUnavailable(f"Kafka at {address} could not take a record for topic {topic!r}: {code}: "
                           f"{reason}", store="kafka", address=address)


class _Pending:
    """The acknowledgements one ``send`` waits for (touched by the poll thread only)."""

    __slots__ = ("address", "error", "future", "left", "lock", "loop", "topic")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], left: int, topic: str,
                 address: str) -> None:
        self.loop = loop
        self.future = future
        self.left = left
        self.topic = topic
        self.address = address
        self.error: Any = None  # the KafkaError to report: the first permanent one, else the first
        self.lock = threading.Lock()

    def delivered(self, err: Any, msg: Any) -> None:
        """One message done (the delivery callback; ``err`` None: acknowledged)."""
        with self.lock:
            if err is not None and (self.error is None
                                    or (is_permanent(err) and not is_permanent(self.error))):
                self.error = err
            self.left -= 1
            done = self.left == 0
        if done:
            self.loop.call_soon_threadsafe(_resolve, self.future, self.error, self.topic, self.address)


def _resolve(future: asyncio.Future[None], error: Any, topic: str, address: str) -> None:
    if future.done():  # the request gave up waiting (cancelled): nothing to tell
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(kafka_failure(error, topic, address))


class AsyncProducer:
    """One confluent-kafka ``Producer`` (idempotent, ``acks=all``) shared by a worker's
    requests, polled by a daemon thread. :meth:`close` flushes what is in flight."""

    def __init__(self, bootstrap: str, properties: Mapping[str, str] | None = None, *,
                 max_message_bytes: int = 1_048_576, linger_ms: int = 5,
                 queue_timeout_s: float = QUEUE_TIMEOUT_S,
                 delivery_timeout_ms: int = DELIVERY_TIMEOUT_MS) -> None:
        self.bootstrap = bootstrap
        self.queue_timeout_s = queue_timeout_s
        self.delivery_timeout_ms = delivery_timeout_ms
        self._producer = Producer(client_config(bootstrap, properties, **{
            "enable.idempotence": True, "acks": "all", "linger.ms": linger_ms,
            "delivery.timeout.ms": delivery_timeout_ms,
            "message.max.bytes": max(max_message_bytes, 1_048_576),
            # the queue holds at least a few of the largest messages
            # librdkafka's own lines: client_config's logger (features.kafka, their levels)
            "queue.buffering.max.kbytes": max(QUEUE_MAX_KBYTES, 4 * max_message_bytes // 1024)}))
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-poll", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)

    async def send(self, topic: str, messages: Sequence[Message]) -> None:
        """Produce ``messages`` to ``topic`` and wait until the broker acknowledged each one.

        Raises RecordRefused when a record was refused for good (``kafka_failure``: the
        permanent error wins over transient ones of the same call), SinkUnavailable when
        one failed otherwise, was not acknowledged in time, or librdkafka's queue stayed
        full for ``queue_timeout_s`` (the messages not handed over by then are not sent;
        those handed over may still be delivered: a retry is harmless, see the module
        docstring)."""
        if not messages:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        pending = _Pending(loop, future, len(messages), topic, self.bootstrap)
        produce = self._producer.produce
        callback = pending.delivered
        for n, (key, value, headers) in enumerate(messages):
            deadline: float | None = None  # per message: a queue that drains, however slowly, is waited for
            while True:
                try:
                    produce(topic, value=value, key=key, headers=headers, on_delivery=callback)
                    break
                except BufferError:  # librdkafka's queue is full: let the poll thread drain it
                    if deadline is None:
                        deadline = loop.time() + self.queue_timeout_s
                    elif loop.time() > deadline:
                        future.cancel()  # the callbacks of those handed over resolve nothing now
                        raise SinkUnavailable(
                            f"Kafka at {self.bootstrap}: the producer's queue stayed full for "
                            f"{self.queue_timeout_s:g} s ({n} of {len(messages)} records handed over); the "
                            "broker is not taking records as fast as they arrive", store="kafka",
                            address=self.bootstrap) from None
                    await asyncio.sleep(0.005)
                except KafkaException as exc:  # refused before queueing (e.g. over message.max.bytes)
                    pending.delivered(exc.args[0], None)  # never handed over: no callback will come for it
                    break
        try:
            await asyncio.wait_for(asyncio.shield(future), self.delivery_timeout_ms / 1000 + 5)
        except TimeoutError:
            raise SinkUnavailable(f"Kafka at {self.bootstrap}: records not acknowledged in time",
                                  store="kafka", address=self.bootstrap) from None

    def topics(self, timeout_s: float) -> set[str]:
        """The topics the broker knows (a metadata request; blocks up to ``timeout_s``).
        Raises the client's KafkaException when the broker does not answer."""
        return set(self._producer.list_topics(timeout=timeout_s).topics)

    def close(self, timeout_s: float = 30.0) -> int:
        """Wait for every message in flight (up to ``timeout_s``), stop polling; returns how
        many were still unacknowledged."""
        left = int(self._producer.flush(timeout_s))
        self._closed.set()
        self._thread.join(5)
        return left
