"""An idempotent Kafka producer an asyncio server can await.

``await producer.send(topic, messages)`` hands every message to librdkafka and returns
once the broker acknowledged all of them (``acks=all``), or raises
:class:`~features.errors.SinkUnavailable` when one of them failed or the wait ran out.
The event loop never blocks: librdkafka's queue takes the messages (when it is full the
coroutine yields and tries again), a daemon thread polls the producer, and the delivery
callbacks, which run on that thread, resolve the request's future with
``loop.call_soon_threadsafe``.

The producer is idempotent (``enable.idempotence``): librdkafka's own retries never write
a message twice or out of order within a partition. A message that failed (delivery
timeout) may still have been written; the caller answers "retry" and the stream job's
stores make the retry harmless (first write of an (entity, event time) wins).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from features.errors import SinkUnavailable

#: librdkafka gives up on a message after this long (``delivery.timeout.ms``); the
#: request then answers 503 (a broker that is down is not waited for forever).
DELIVERY_TIMEOUT_MS = 15_000
#: One message: (key, value, headers).
Message = tuple[bytes | None, bytes, list[tuple[str, str | bytes | None]] | None]


class _Pending:
    """The acknowledgements one ``send`` waits for (touched by the poll thread only)."""

    __slots__ = ("error", "future", "left", "lock", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[None], left: int) -> None:
        self.loop = loop
        self.future = future
        self.left = left
        self.error: str | None = None
        self.lock = threading.Lock()

    def delivered(self, err: Any, msg: Any) -> None:
        """One message done (the delivery callback; ``err`` None: acknowledged)."""
        with self.lock:
            if err is not None and self.error is None:
                self.error = str(err)
            self.left -= 1
            done = self.left == 0
        if done:
            self.loop.call_soon_threadsafe(_resolve, self.future, self.error)


def _resolve(future: asyncio.Future[None], error: str | None) -> None:
    if future.done():  # the request gave up waiting (cancelled): nothing to tell
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(SinkUnavailable(f"Kafka refused a record: {error}", store="kafka"))


class AsyncProducer:
    """One confluent-kafka ``Producer`` (idempotent, ``acks=all``) shared by a worker's
    requests, polled by a daemon thread. :meth:`close` flushes what is in flight."""

    def __init__(self, bootstrap: str, properties: Mapping[str, str] | None = None, *,
                 max_message_bytes: int = 1_048_576, linger_ms: int = 5) -> None:
        from confluent_kafka import Producer

        from features.stream.kafka import client_config

        self.bootstrap = bootstrap
        self._producer = Producer(client_config(bootstrap, properties, **{
            "enable.idempotence": True, "acks": "all", "linger.ms": linger_ms,
            "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
            "message.max.bytes": max(max_message_bytes, 1_048_576),
            # librdkafka's own lines through logging (JSON with --log-format json), not raw stderr
            "logger": logging.getLogger("features.serve.kafka")}))
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-poll", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)

    async def send(self, topic: str, messages: Sequence[Message]) -> None:
        """Produce ``messages`` to ``topic`` and wait until the broker acknowledged each one.
        SinkUnavailable when one was refused or not acknowledged in time."""
        if not messages:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        pending = _Pending(loop, future, len(messages))
        produce = self._producer.produce
        callback = pending.delivered
        for key, value, headers in messages:
            while True:
                try:
                    produce(topic, value=value, key=key, headers=headers, on_delivery=callback)
                    break
                except BufferError:  # librdkafka's queue is full: let the poll thread drain it
                    await asyncio.sleep(0.005)
                except Exception as exc:  # KafkaException (e.g. message too large): no retry helps
                    pending.delivered(exc, None)  # never handed over: no callback will come for it
                    break
        try:
            await asyncio.wait_for(asyncio.shield(future), DELIVERY_TIMEOUT_MS / 1000 + 5)
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
