"""The Flink Kafka SQL connector jar the stream job loads (``pipeline.jars``): where
``features dev up`` puts it (:class:`features.ops.dev.services.FlinkConnector` fetches
it) and where the job finds it."""

from __future__ import annotations

from pathlib import Path

from features.config import cache_home
from features.errors import ServiceError

KAFKA_CONNECTOR_ARTIFACT = "flink-sql-connector-kafka"


def flink_jars() -> Path:
    """The Flink Kafka connector jar."""
    return cache_home() / "flink-jars"


def connector_jar() -> Path | None:
    """The newest connector jar in :func:`flink_jars`; None when there is none."""
    jars = sorted(flink_jars().glob(f"{KAFKA_CONNECTOR_ARTIFACT}-*.jar"))
    return jars[-1] if jars else None


def kafka_connector_jar() -> Path:
    """The Flink Kafka connector jar; raises ServiceError when ``features dev up`` has not run."""
    jar = connector_jar()
    if jar is None:
        raise ServiceError(f"no Flink Kafka connector jar under {flink_jars()}: run `features dev up`",
                           service="flink-connector")
    return jar
