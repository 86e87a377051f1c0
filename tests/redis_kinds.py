"""Fixtures that run a test module against one Redis server and against the local Redis
Cluster (``from redis_kinds import hot, hot_kind, settings``): ``hot_kind`` is
``redis`` or ``redis-cluster``, ``settings`` the session's settings with the cluster's
URL for the cluster runs, ``hot`` a redis-py client of that hot store."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from features.config import Settings


@pytest.fixture(params=["redis", "redis-cluster"])
def hot_kind(request: pytest.FixtureRequest) -> str:
    """Every test of the module runs against one Redis server and the local Redis Cluster."""
    return str(request.param)


@pytest.fixture()
def settings(settings: Settings, hot_kind: str, request: pytest.FixtureRequest) -> Settings:
    """The session's settings, with the cluster's URL for the cluster runs."""
    if hot_kind == "redis":
        return settings
    return dataclasses.replace(settings, redis_url=request.getfixturevalue("redis_cluster").url)


@pytest.fixture()
def hot(settings: Settings, hot_kind: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A redis-py client of the hot store (a cluster client for the cluster runs)."""
    if hot_kind == "redis":
        client: Any = redis.Redis.from_url(settings.redis_url)
    else:
        from redis.cluster import ClusterNode, RedisCluster

        ports = request.getfixturevalue("redis_cluster").ports
        client = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in ports[:3]])
    yield client
    client.close()
