"""A real ``redis-server`` for the remote tier's tests: :mod:`kvstate.testing.redisserver`'s
server (a Unix socket in a temporary directory, no persistence, a chosen ``maxmemory``), started
and stopped by the test.

Under CI (``CI=true``) a missing ``redis-server`` is a failure (``.ci/run`` installs it);
elsewhere the tests that need it skip, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kvstate.testing import redisserver
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
