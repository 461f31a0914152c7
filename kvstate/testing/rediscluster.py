"""A throw-away Redis Cluster for the remote tier's tests and fuzz: three masters
(``--cluster-enabled yes``) on TCP at 127.0.0.1, each on a free port with its bus on another free
port (``--cluster-port``), without persistence, in a temporary directory; the 16384 slots split in
three ranges (``CLUSTER ADDSLOTSRANGE``), the nodes joined by ``CLUSTER MEET``, and ready once
every node reports ``cluster_state:ok`` and knows all three masters.  No ``redis-cli`` needed.

A cluster routes each key to the node of its hash slot, so a store that pipelines several keys
into one node (a load's reads) must keep an entry's keys in one slot: the remote tier names them
under one hash tag (:mod:`kvstate.impl.remote`).  ``tests/impl/redis_cluster.py`` is the tests'
fixture over this class.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .redisserver import executable

SLOTS = 16384


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisCluster:
    """``masters`` cluster-enabled ``redis-server`` processes sharing the slots; :attr:`url`
    names the first (the client discovers the others); :attr:`cluster` says a
    ``RemoteConfig`` on it needs ``cluster=True``."""

    cluster = True

    def __init__(self, masters: int = 3, maxmemory: str = "256mb") -> None:
        self.exe = executable()
        self.dir = Path(tempfile.mkdtemp(prefix="kvc-"))
        self.maxmemory = maxmemory
        self.ports: list[int] = []
        self.buses: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        try:
            for i in range(masters):
                self._spawn(i)
            self._form()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def _spawn(self, i: int) -> None:
        port, bus = free_port(), free_port()
        d = self.dir / str(i)
        d.mkdir()
        args = [
            self.exe, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
            "--cluster-port", str(bus), "--cluster-config-file", str(d / "nodes.conf"),
            "--save", "", "--appendonly", "no", "--dir", str(d),
            "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-random",
            "--enable-debug-command", "yes",
        ]  # fmt: skip
        self.procs.append(
            subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        self.ports.append(port)
        self.buses.append(bus)

    def node(self, i: int, **kw: Any) -> Any:
        """A plain (not cluster-aware) client of node ``i``."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.ports[i], socket_timeout=30, **kw)

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {p.returncode}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 (not accepting yet)
                pass
            time.sleep(0.02)
        raise RuntimeError(f"the Redis Cluster did not {what} within 20 s")

    def _form(self) -> None:
        n = len(self.ports)
        clients = [self.node(i) for i in range(n)]
        self._wait(lambda: all(c.ping() for c in clients), "start")
        for i, c in enumerate(clients):
            lo, hi = SLOTS * i // n, SLOTS * (i + 1) // n - 1
            c.execute_command("CLUSTER ADDSLOTSRANGE", lo, hi)
        for i, c in enumerate(clients):  # (every pair met directly: no wait for gossip)
            for port, bus in zip(self.ports[i + 1 :], self.buses[i + 1 :], strict=True):
                c.execute_command("CLUSTER MEET", "127.0.0.1", port, bus)

        def ok() -> bool:
            for c in clients:
                info = c.execute_command("CLUSTER INFO")  # (parsed into a dict)
                if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != n:
                    return False
            return True

        self._wait(ok, "form")
        for c in clients:
            c.close()

    def client(self) -> Any:
        """A cluster-aware client (``redis.cluster.RedisCluster``)."""
        from redis.cluster import RedisCluster as Client

        return Client.from_url(self.url, socket_timeout=30)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=30)
        self.procs.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def is_cluster(url: str) -> bool:
    """Whether the server at ``url`` runs in cluster mode (``INFO cluster``)."""
    import redis

    r = redis.Redis.from_url(url, socket_timeout=30)
    try:
        return bool(int(r.info("cluster").get("cluster_enabled", 0)))
    finally:
        r.close()


class ClusterAdmin:
    """A cluster-aware client (``redis.cluster.RedisCluster``) whose server-wide commands a
    fault means for the whole store reach every master: ``CONFIG SET`` (a full store refuses
    every write, not one master's) and ``CLIENT KILL`` (every connection dropped).  The rest
    is the client's own (``CONFIG GET`` and ``INFO``: its default node)."""

    def __init__(self, url: str) -> None:
        from redis.cluster import RedisCluster as Client

        self.client = Client.from_url(url, socket_timeout=30)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def config_set(self, name: str, value: Any) -> Any:
        c = self.client
        return c.execute_command("CONFIG SET", name, value, target_nodes=c.PRIMARIES)

    def client_kill_filter(self, _type: str, skipme: bool = True) -> Any:
        c = self.client
        args = ("TYPE", _type, "SKIPME", "yes" if skipme else "no")
        return c.execute_command("CLIENT KILL", *args, target_nodes=c.PRIMARIES)
