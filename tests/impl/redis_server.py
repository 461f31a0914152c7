"""A real ``redis-server`` for the remote tier's tests: on a Unix socket in a temporary
directory, without persistence, with a chosen ``maxmemory``; started and stopped by the test.

Under CI (``CI=true``) a missing ``redis-server`` is a failure (``.ci/run`` installs it);
elsewhere the tests that need it skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def executable() -> str:
    exe = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )
    if exe is None:
        why = "redis-server is not installed (apt-get install -y redis-server)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI: {why}")
        pytest.skip(why)
    return exe


class RedisServer:
    """One server process; ``restart`` starts a fresh one on the same socket (no persistence:
    every key is gone)."""

    def __init__(self, maxmemory: str = "256mb") -> None:
        self.exe = executable()
        self.dir = Path(tempfile.mkdtemp(prefix="kvr-"))  # short: a socket path is <= 107 bytes
        self.socket = self.dir / "redis.sock"
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--dir",
                str(self.dir),
                "--maxmemory",
                self.maxmemory,
                "--maxmemory-policy",
                "allkeys-random",
                "--enable-debug-command",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.socket.exists():
                try:
                    if self.client().ping():
                        return
                except Exception:  # noqa: BLE001 (not accepting yet)
                    pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start within 20 s")

    def client(self, **kw: Any) -> Any:
        import redis

        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=30, **kw)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc = None
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    server = RedisServer()
    try:
        yield server
    finally:
        server.close()
