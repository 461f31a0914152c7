"""``kvstate.testing.redisserver``: the benches start their server from a chosen binary in a
chosen folder (a bigger machine's own build, a roomy disk), and a wrong binary is refused
before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis_server import executable

from kvstate.testing import redisserver
from kvstate.testing.redisserver import ServerMissing


def test_a_binary_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("not a program")
    with pytest.raises(ServerMissing, match="not an executable"):
        redisserver.executable(str(fake))
    with pytest.raises(ServerMissing):
        redisserver.RedisServer(exe=str(tmp_path / "missing"), root=str(tmp_path))
    assert list(tmp_path.iterdir()) == [fake]  # (no server folder made)


def test_the_server_runs_from_the_given_binary_in_the_given_folder(tmp_path: Path) -> None:
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    exe = executable()
    root = tmp_path / "servers"
    root.mkdir()
    server = redisserver.RedisServer(exe=exe, root=str(root))
    try:
        assert server.exe == exe
        assert server.dir.parent == root and server.socket.exists()
        assert server.client().ping()
    finally:
        server.close()
    assert list(root.iterdir()) == []


def test_a_deep_folder_keeps_the_socket_short(tmp_path: Path) -> None:
    """A socket path is at most 107 bytes: a deep ``root`` keeps the working folder there and
    the socket in a short folder, removed with the server (a deep CI scratch folder made the
    server exit at bind)."""
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    root = tmp_path / ("deep" * 30)
    root.mkdir()
    server = redisserver.RedisServer(exe=executable(), root=str(root))
    sockdir = server.socket.parent
    try:
        assert server.dir.parent == root and len(str(server.socket)) <= 107
        assert server.client().ping()
    finally:
        server.close()
    assert list(root.iterdir()) == [] and not sockdir.exists()
