"""The remote tier on a real redis-server (issue 33): two caches ("nodes") share one server;
whatever the server or another writer does to an entry (DEL, eviction of one chunk under
maxmemory, a stall, dropped connections, a restart without persistence, another writer's bytes
or garbage in a chunk, another namespace's entry), no wrong byte is served, a failed load is
truncated and recomputed, and no block leaks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from cache_checks import check_compressed, check_tail, check_window
from redis_server import RedisServer, redis_server  # noqa: F401 (the fixture)

import kvstate.impl
from kvstate.impl import (
    DeterministicWriter,
    HeterogeneousKVCache,
    InvalidArgument,
    RemoteConfig,
    StorageError,
)
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small

G = small()
L = G.lcm_tokens
KEY = b"fleet-key-0123456789abcdef012345"
BLOCKS = 4


def config(server: RedisServer, pkg: Any = kvstate.impl, **kw: Any) -> RemoteConfig:
    fields = {"url": server.url, "key": KEY, "model": "m", "namespace": "n", **kw}
    fields.setdefault("cluster", getattr(server, "cluster", False))  # (redis_cluster.py's)
    return pkg.RemoteConfig(**fields)  # type: ignore[no-any-return]


def node(
    server: RedisServer, executors: str = "manual", pkg: Any = kvstate.impl, **kw: Any
) -> HeterogeneousKVCache:
    """A cache ("node") of package ``pkg`` (``kvstate.impl``, or a staged copy with planted
    bugs: tests/impl/test_impl_remote_bugs.py) on the server."""
    # the content the byte checks recompute, unless a test brings its own
    writer = kw.pop("writer", None) or pkg.DeterministicWriter()
    cfg = config(server, pkg, **kw)
    return pkg.HeterogeneousKVCache(G, remote=cfg, executors=executors, writer=writer)  # type: ignore[no-any-return]


def store_all(c: HeterogeneousKVCache, toks: np.ndarray) -> None:
    """Compute ``toks`` on ``c`` and push every block to the remote tier."""
    a = c.admit(c.request(toks))
    with c.use(a):
        pass
    c.tick(10)
    c.offload(100)
    c.pipelines.drain()
    assert c.spill(100) == toks.size // L


def check_run(run: Any, toks: np.ndarray) -> None:
    """Every byte the run reads is the prefix's own (whatever its hit length)."""
    if run.hit_tokens:
        check_compressed(run, toks)
        check_window(run, toks)
        check_tail(run, toks)


def no_leak(c: HeterogeneousKVCache) -> None:
    if c.pipelines.mode == "manual":
        c.pipelines.drain()
    s = c.stats()
    b = s["blocks"]
    assert s["pinned_blocks"] == 0 and s["io_inflight"] == 0 and b["loading"] == 0, s
    on_device = b["writing"] + b["ready"] + b["offloading"] + b["evicting"]
    assert s["device_free"] + on_device == c.inspect().tiers.slots.n, s


def hit_and_check(c: HeterogeneousKVCache, toks: np.ndarray) -> int:
    a = c.admit(c.request(toks))
    c.pipelines.drain()
    with c.use(a) as run:
        check_run(run, toks)
        got = run.hit_tokens
    no_leak(c)
    return int(got)


def stored(server: RedisServer, pkg: Any = kvstate.impl) -> np.ndarray:
    """Node A stores a 4-block prefix in the server and goes."""
    toks = harness_tokens(BLOCKS * L + 1)
    a = node(server, pkg=pkg)
    try:
        store_all(a, toks)
    finally:
        a.close()
    return toks


@pytest.fixture
def shared(redis_server: RedisServer) -> Iterator[tuple[RedisServer, np.ndarray]]:  # noqa: F811
    """Node A stored a 4-block prefix in the server and is gone."""
    yield redis_server, stored(redis_server)


def names(c: HeterogeneousKVCache, toks: np.ndarray, block: int) -> tuple[str, list[str]]:
    """Block ``block``'s header name and its chunks' names (the window's last, if any)."""
    view = c.inspect()
    key = c.chain(toks).keys[block]
    (entry,) = [e for e in view.disk_entries.values() if e.key == key]
    ks = [*range(len(entry.chunks)), *([-1] if entry.swa_section is not None else [])]
    return view.disk.header_name(key), [view.disk.chunk_name(entry, k) for k in ks]


def test_cross_node_hit(shared: tuple[RedisServer, np.ndarray]) -> None:
    server, toks = shared
    b = node(server)
    try:
        assert b.stats()["blocks"]["disk"] == BLOCKS
        a = b.admit(b.request(toks))
        assert a.state == "pending" and a.hit_tokens == BLOCKS * L
        b.pipelines.drain()
        with b.use(a) as run:
            assert run.hit_tokens == BLOCKS * L
            check_run(run, toks)
        no_leak(b)
        # a loaded-back entry stays in the store for the fleet's other nodes
        c = node(server)
        try:
            assert hit_and_check(c, toks) == BLOCKS * L
        finally:
            c.close()
    finally:
        b.close()


WHATS = ("entry", "chunk", "garbage", "other_writer", "short")


def vanished_or_rewritten(server: RedisServer, what: str, pkg: Any = kvstate.impl) -> None:
    """DEL of an entry (its header and chunks) or of one chunk, garbage or another writer's
    authentic chunk of the same length in its place, a truncated chunk: the load of that block
    fails, the hit is truncated before it and recomputed, never served."""
    toks = stored(server, pkg)
    b = node(server, pkg=pkg)
    try:
        r = server.client()
        header, chunks = names(b, toks, 2)
        _, other = names(b, toks, 1)
        size = len(r.get(chunks[0]))
        if what == "entry":
            r.delete(header, *chunks)
        elif what == "chunk":
            r.delete(chunks[0])
        elif what == "garbage":
            r.set(chunks[0], bytes(size))
        elif what == "other_writer":
            r.set(chunks[0], r.get(other[0])[:size].ljust(size, b"\0"))
        else:
            r.set(chunks[0], r.get(chunks[0])[:-1])
        assert hit_and_check(b, toks) < BLOCKS * L  # (to the last window kept before it)
    finally:
        b.close()


@pytest.mark.parametrize("what", WHATS)
def test_a_vanished_or_rewritten_chunk_truncates_the_hit(
    redis_server: RedisServer,  # noqa: F811
    what: str,
) -> None:
    vanished_or_rewritten(redis_server, what)


def test_eviction_under_maxmemory(shared: tuple[RedisServer, np.ndarray]) -> None:
    """The server evicts keys (one chunk at a time, at random) once over maxmemory: whatever
    went, the hit stops before the first block with a chunk gone, and nothing leaks."""
    server, toks = shared
    b = node(server)
    try:
        r = server.client()
        before = r.dbsize()
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory", str(used + 64 * 1024))
        for i in range(64):  # filler past the limit: the server evicts, ours among them
            r.set(f"filler:{i}", bytes(8 * 1024))
        stats = r.info("stats")
        assert int(stats["evicted_keys"]) > 0
        assert r.dbsize() < before + 64
        got = hit_and_check(b, toks)
        assert got % L == 0 and got <= BLOCKS * L
    finally:
        b.close()


def test_restart_without_persistence(shared: tuple[RedisServer, np.ndarray]) -> None:
    server, toks = shared
    b = node(server)
    try:
        server.restart()
        assert server.client().dbsize() == 0
        assert hit_and_check(b, toks) == 0  # every load fails: recomputed from scratch
        # and the pool reconnected: what it stores now another node hits
        other = harness_tokens(BLOCKS * L + 1, seed=7)
        store_all(b, other)
        c = node(server)
        try:
            assert hit_and_check(c, other) == BLOCKS * L
        finally:
            c.close()
    finally:
        b.close()


def test_client_kill_drops_connections(shared: tuple[RedisServer, np.ndarray]) -> None:
    server, toks = shared
    b = node(server)
    try:
        r = server.client()
        r.client_kill_filter(_type="normal", skipme=True)
        got = hit_and_check(b, toks)  # a reconnect, or a failed load: never a wrong byte
        assert got in (0, BLOCKS * L) or got % L == 0
        r.client_kill_filter(_type="normal", skipme=True)
        c = node(server)
        try:
            assert hit_and_check(c, toks) == BLOCKS * L
        finally:
            c.close()
    finally:
        b.close()


class OtherModel(DeterministicWriter):
    """Another model's KV for the same tokens: every byte differs."""

    def rows(self, *a: Any) -> torch.Tensor:
        return super().rows(*a) ^ 0x5A

    def state_rows(self, *a: Any) -> torch.Tensor:
        return super().state_rows(*a) + 1.0


def test_another_namespace_s_entry_is_never_served(redis_server: RedisServer) -> None:  # noqa: F811
    another_namespace(redis_server)


def another_namespace(server: RedisServer, pkg: Any = kvstate.impl) -> None:
    """Two deployments (another namespace's KV: another LoRA set, say) share one server and one
    fleet key: neither adopts the other's entries; one copied under the other's name fails its
    header check."""
    toks = harness_tokens(BLOCKS * L + 1)
    a = node(server, pkg=pkg, namespace="tenant-a", writer=OtherModel())
    try:
        store_all(a, toks)
        a_names = [names(a, toks, k) for k in range(BLOCKS)]
    finally:
        a.close()
    b = node(server, pkg=pkg, namespace="tenant-b")
    try:
        assert b.stats()["blocks"]["disk"] == 0
        assert hit_and_check(b, toks) == 0
        r = server.client()
        view = b.inspect()
        for k, (header, _) in enumerate(a_names):
            mine = view.disk.header_name(b.chain(toks).keys[k])
            r.set(mine, r.get(header))
        with pytest.raises(Exception, match="another geometry, model or namespace|not at"):
            view.disk.parse(mine, r.get(mine))
    finally:
        b.close()
    c = node(server, pkg=pkg, namespace="tenant-b")  # a node opened after the copy
    try:
        assert c.stats()["blocks"]["disk"] == 0
        assert hit_and_check(c, toks) == 0
    finally:
        c.close()


def test_a_stalled_server_delays_only_what_needs_it(redis_server: RedisServer) -> None:  # noqa: F811
    stalled(redis_server)


def asleep(server: RedisServer, seconds: float) -> tuple[threading.Thread, float]:
    """``DEBUG SLEEP seconds`` sent on a thread of its own; returns (that thread, a time the stall
    surely lasts until) once the server is asleep: a ``PING`` on another connection goes
    unanswered for 0.25 s.  Each answered ``PING`` was served before the stall began, so the
    stall ends no earlier than the last one's send time plus ``seconds`` (whatever the machine's
    scheduling delays: a wait of fixed length assumed the command had reached the server)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    sleeper = threading.Thread(
        target=lambda: server.client().execute_command("DEBUG", "SLEEP", seconds)
    )
    probe = redis.Redis(  # (no retries: a timed-out PING is the answer)
        unix_socket_path=str(server.socket), socket_timeout=0.25, retry=Retry(NoBackoff(), 0)
    )
    answered = start = time.monotonic()
    sleeper.start()
    try:
        while True:
            sent = time.monotonic()
            try:
                probe.ping()
            except redis.TimeoutError:
                return sleeper, answered + seconds
            answered = sent
            assert sent - start < 30, "the server never went to sleep"
            time.sleep(0.01)
    finally:
        probe.close()


def stalled(server: RedisServer, pkg: Any = kvstate.impl) -> None:
    """``DEBUG SLEEP`` stalls the server for 4 s while a remote load is in flight: requests that
    do not need the server (a prompt computed from scratch) are not delayed by it; the load
    finishes (or fails) after the stall, never serving a wrong byte.  The requests start once
    the server is asleep and the load's read has begun (:func:`asleep`, and a wrapper on the
    tier's ``read_block``), and must end inside the stall: an operation held behind the stalled
    read waits out the rest of the stall (over 2 s), so the bound is 1 s: far above scheduling
    noise on a loaded 2-core machine, far below the stall."""
    toks = stored(server, pkg)
    b = node(server, executors="threads", pkg=pkg, timeout=10.0)
    reading = threading.Event()
    try:
        real = b.test_hooks().replace_disk_method("read_block", None)

        def read_block(*args: Any) -> Any:
            reading.set()
            return real(*args)

        b.test_hooks().replace_disk_method("read_block", read_block)
        sleeper, until = asleep(server, 4.0)
        waiting = b.admit(b.request(toks))  # its loads wait on the server
        assert reading.wait(timeout=2.0), "the remote load never started its read"
        worst = 0.0
        for s in range(5):
            other = harness_tokens(2 * L + 1, seed=100 + s)
            t = time.monotonic()
            a = b.admit(b.request(other))
            with b.use(a) as run:
                assert run.hit_tokens == 0
            worst = max(worst, time.monotonic() - t)
        assert worst < 1.0, f"an operation that does not need the server took {worst:.3f} s"
        assert time.monotonic() < until, "the requests did not all run inside the stall"
        sleeper.join()
        waiting.wait(30)
        with b.use(waiting) as run:
            check_run(run, toks)
    finally:
        b.close()


def test_bad_remote_configuration_is_refused(redis_server: RedisServer) -> None:  # noqa: F811
    for bad, match in (
        ({"key": b"short"}, "16 to 64 bytes"),
        ({"url": "localhost"}, "URL"),
        ({"url": None}, "exactly one of url and store"),
        ({"ttl": 0}, "ttl"),
        ({"timeout": -1}, "timeout"),
        ({"max_connections": 0}, "max_connections"),
        ({"namespace": "a\0b"}, "namespace"),
    ):
        with pytest.raises(InvalidArgument, match=match):
            config(redis_server, **bad)
    with pytest.raises(InvalidArgument, match="RemoteConfig"):
        HeterogeneousKVCache(G, remote="redis://x", executors="manual")  # type: ignore[arg-type]
    gone = f"unix://{redis_server.dir}/nobody.sock"
    with pytest.raises(StorageError, match="remote store"):
        HeterogeneousKVCache(
            G, remote=RemoteConfig(url=gone, key=KEY, timeout=0.5), executors="manual"
        )


def cap_counts_remote_loads(server: RedisServer, pkg: Any = kvstate.impl) -> None:
    """Remote loads run in the I/O pipeline under the admission cap: a 4-block remote hit has
    at most ``io_cap`` loads in flight, each counted, the rest queued until one ends."""
    toks = stored(server, pkg)
    b = node(server, pkg=pkg)
    try:
        cap = b.table.consts.io_cap
        a = b.admit(b.request(toks))
        io = [j for name, j in b.inspect().jobs() if name == "io"]
        assert 0 < len(io) <= cap < BLOCKS, (len(io), cap)
        assert b.stats()["io_inflight"] == len(io)
        b.pipelines.drain()
        with b.use(a) as run:
            assert run.hit_tokens == BLOCKS * L
            check_run(run, toks)
        no_leak(b)
    finally:
        b.close()


def test_the_cap_counts_remote_loads(redis_server: RedisServer) -> None:  # noqa: F811
    cap_counts_remote_loads(redis_server)
