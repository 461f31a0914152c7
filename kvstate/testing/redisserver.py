"""A throw-away ``redis-server`` for the remote tier's fuzz and benches: on a Unix socket in a
temporary directory, without persistence (``--save '' --appendonly no``), with a chosen
``maxmemory`` and ``DEBUG`` enabled (the fuzz stalls the server with ``DEBUG SLEEP``).

The fuzz drives the store's faults through the server itself, and a restart without persistence
is a real one (the process killed and started again on the same socket), so the fuzz starts its
own server unless it is pointed at one (``--remote URL``).  ``tests/impl/redis_server.py`` is the
tests' fixture over this class.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


def _short_tmp() -> str:
    """The system's temporary folder when its path leaves room for a socket, else ``/tmp``."""
    tmp = tempfile.gettempdir()
    return tmp if len(os.fsencode(tmp)) <= 60 else "/tmp"


class ServerMissing(RuntimeError):
    """``redis-server`` is not installed (``apt-get install -y redis-server``)."""


def executable(path: str | None = None) -> str:
    """The ``redis-server`` binary (``path``, else the one on ``PATH``); raises
    :class:`ServerMissing` when there is none."""
    if path is not None:
        if not os.access(path, os.X_OK):
            raise ServerMissing(f"{path} is not an executable redis-server")
        return path
    exe = shutil.which("redis-server")
    if exe is None and os.path.exists("/usr/bin/redis-server"):
        exe = "/usr/bin/redis-server"
    if exe is None:
        raise ServerMissing("redis-server is not installed (apt-get install -y redis-server)")
    return exe


class RedisServer:
    """One server process; :meth:`restart` starts a fresh one on the same socket (no
    persistence: every key is gone)."""

    def __init__(
        self, maxmemory: str = "256mb", *, exe: str | None = None, root: str | None = None
    ) -> None:
        """``exe``: the binary (default: ``redis-server`` on ``PATH``); ``root``: the folder
        its temporary directory (socket, working directory) is made in (default: the
        system's temporary folder)."""
        self.exe = executable(exe)
        self.dir = Path(tempfile.mkdtemp(prefix="kvr-", dir=root))
        # A Unix socket's path is at most 107 bytes: a deep ``root`` (a test's tmp_path, a
        # scratch disk's mount) keeps the working folder there and the socket in a short one.
        self._sockdir: Path | None = None
        self.socket = self.dir / "redis.sock"
        if len(os.fsencode(self.socket)) > _SOCKET_PATH_MAX:
            self._sockdir = Path(tempfile.mkdtemp(prefix="kvr-", dir=_short_tmp()))
            self.socket = self._sockdir / "redis.sock"
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> None:
        args = [
            self.exe, "--port", "0", "--save", "", "--appendonly", "no",
            "--unixsocket", str(self.socket), "--unixsocketperm", "700", "--dir", str(self.dir),
            "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-random",
            "--enable-debug-command", "yes",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        if self._sockdir is not None:
            shutil.rmtree(self._sockdir, ignore_errors=True)
