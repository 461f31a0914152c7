"""A real ``redis-server`` for the remote tier's tests: :mod:`kvstate.testing.redisserver`'s
server (a Unix socket in a temporary directory, no persistence, a chosen ``maxmemory``), started
and stopped by the test; and :mod:`kvstate.testing.rediscluster`'s Redis Cluster (three masters
on 127.0.0.1, free ports, no persistence), one per test module (``redis_cluster``).

Under CI (``CI=true``) a missing ``redis-server`` is a failure (``.ci/run`` installs it);
elsewhere the tests that need it skip, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kvstate.testing import rediscluster, redisserver
from kvstate.testing.redisserver import ServerMissing


def executable() -> str:
    """The ``redis-server`` binary; fails the test under CI without one, skips it elsewhere."""
    try:
        return redisserver.executable()
    except ServerMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI: {exc}")
        pytest.skip(str(exc))


class RedisServer(redisserver.RedisServer):
    """The testing module's server; a missing ``redis-server`` skips (or, under CI, fails)."""

    def __init__(self, maxmemory: str = "256mb") -> None:
        executable()
        super().__init__(maxmemory)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()


class RedisCluster(rediscluster.RedisCluster):
    """The testing module's three-master Redis Cluster on 127.0.0.1 (free ports, no
    persistence, a temporary directory); a missing ``redis-server`` skips (or, under CI,
    fails)."""

    def __init__(self, masters: int = 3) -> None:
        executable()
        super().__init__(masters)


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    """One cluster for a test module (a cluster takes about 2 s to report ``cluster_state:ok``,
    the servers' own delay before a new master takes writes); each test starts it empty
    (``FLUSHALL`` on every master)."""
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    cluster = RedisCluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def redis_cluster_empty(redis_cluster: RedisCluster) -> RedisCluster:
    for i in range(len(redis_cluster.ports)):
        redis_cluster.node(i).flushall()
    return redis_cluster
