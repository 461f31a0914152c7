"""The Redis store's read into a caller's buffer (``RedisStore.read_into``: pipelined ``GET`` s
received straight into each value's span), on a real redis-server: values placed where their
spans say, a missing or resized value reported and never placed, an error reply or a pooled
connection with a reply nobody read failing the call (and the pool usable after it), and a
load through a store without ``read_into`` (the ``mget`` fallback) serving the same bytes."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from redis_server import RedisServer, redis_server  # noqa: F401 (the fixture)
from test_impl_remote import BLOCKS, KEY, G, L, check_run, config, node, store_all

from kvstate.impl import DeterministicWriter, HeterogeneousKVCache, RemoteConfig
from kvstate.impl.remotestore import MISSING, RedisStore, StoreUnavailable
from kvstate.impl.testdata import harness_tokens

pytest.importorskip("redis")


def store(server: RedisServer) -> RedisStore:
    return RedisStore(server.url, timeout=5.0, max_connections=4)


def test_values_land_in_their_spans(redis_server: RedisServer) -> None:  # noqa: F811
    s = store(redis_server)
    rng = np.random.default_rng(1)
    # one value bigger than the reply buffer (received over many recv calls), small ones, many
    sizes = [300_000, 5, 1, 70_000, *[97] * 200]
    values = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    names = [f"t:{i}" for i in range(len(values))]
    s.put(list(zip(names, values, strict=True)), None)
    spans, lo = [], 0
    for n in sizes:
        spans.append((lo + 3, lo + 3 + n))  # (a gap before each: nothing is written there)
        lo += n + 3
    buf = bytearray(b"\xee" * lo)
    got = s.read_into(names, memoryview(buf), spans)
    assert got == sizes
    for (a, b), v in zip(spans, values, strict=True):
        assert buf[a:b] == v
        assert buf[a - 3 : a] == b"\xee" * 3
    s.close()


def test_missing_and_resized_values_are_reported_not_placed(redis_server: RedisServer) -> None:  # noqa: F811
    s = store(redis_server)
    s.put([("r:a", b"abcd"), ("r:b", b"longer than its span")], None)
    buf = bytearray(12)
    got = s.read_into(["r:gone", "r:b", "r:a"], memoryview(buf), [(0, 4), (4, 8), (8, 12)])
    assert got == [MISSING, len(b"longer than its span"), 4]
    assert buf == bytes(8) + b"abcd"
    s.close()


def test_an_error_reply_fails_the_read_and_the_pool_recovers(redis_server: RedisServer) -> None:  # noqa: F811
    s = store(redis_server)
    s.put([("e:a", b"abcd")], None)
    s.client.rpush("e:list", b"x")  # GET of a list: a WRONGTYPE error reply
    buf = bytearray(8)
    with pytest.raises(StoreUnavailable, match="WRONGTYPE"):
        s.read_into(["e:list", "e:a"], memoryview(buf), [(0, 4), (4, 8)])
    assert s.read_into(["e:a"], memoryview(buf), [(0, 4)]) == [4]
    assert buf[:4] == b"abcd"
    s.close()


def test_a_connection_with_an_unread_reply_is_never_trusted(redis_server: RedisServer) -> None:  # noqa: F811
    s = store(redis_server)
    s.put([("u:a", b"abcd")], None)
    pool = s.client.connection_pool
    conn = pool.get_connection()
    # a reply never read, which arrives only after the pool has handed the connection out
    # again (the pool's own check for unread data on it sees nothing yet): a script busy for a
    # while that returns nil, which, taken for the first GET's reply, would read as "missing"
    # and leave the real replies unread behind it
    conn.send_command("EVAL", "for i = 1, 3000000 do end return false", 0)
    pool.release(conn)
    buf = bytearray(4)
    # the stale reply is seen (the call fails, as a dropped connection does), never parsed as
    # this read's, and the connection is dropped: the next read is exact
    with pytest.raises(StoreUnavailable):
        s.read_into(["u:a"], memoryview(buf), [(0, 4)])
    buf[:] = bytes(4)
    assert s.read_into(["u:a"], memoryview(buf), [(0, 4)]) == [4]
    assert buf == b"abcd"
    s.close()


class MgetOnly:
    """A store without ``read_into`` (as an object store may be): the remote tier reads through
    ``mget`` and copies into its buffer."""

    def __init__(self, inner: RedisStore) -> None:
        self.inner = inner
        self.mgets = 0

    def mget(self, names: Sequence[str]) -> list[bytes | None]:
        self.mgets += 1
        return self.inner.mget(names)

    def put(self, items: Sequence[tuple[str, Any]], ttl: int | None) -> None:
        self.inner.put(items, ttl)

    def scan(self, pattern: str) -> Any:
        return self.inner.scan(pattern)

    def close(self) -> None:
        self.inner.close()


def test_a_store_without_read_into_serves_the_same_bytes(redis_server: RedisServer) -> None:  # noqa: F811
    toks = harness_tokens(BLOCKS * L + 1, seed=7)
    a = node(redis_server)
    store_all(a, toks)
    a.close()
    inner = MgetOnly(store(redis_server))
    base = config(redis_server)
    cfg = RemoteConfig(key=KEY, model=base.model, namespace=base.namespace, store=inner)
    b = HeterogeneousKVCache(G, remote=cfg, executors="manual", writer=DeterministicWriter())
    adm = b.admit(b.request(toks))
    b.pipelines.drain()
    with b.use(adm) as run:
        assert run.hit_tokens == BLOCKS * L
        check_run(run, toks)
    assert inner.mgets >= BLOCKS
    b.close()


def test_a_stalled_server_fails_the_read_after_the_timeout(redis_server: RedisServer) -> None:  # noqa: F811
    s = RedisStore(redis_server.url, timeout=0.5, max_connections=4)
    s.put([("s:a", b"x" * 100_000)], None)
    sleeper = threading.Thread(
        target=lambda: redis_server.client().execute_command("DEBUG", "SLEEP", 2)
    )
    sleeper.start()
    time.sleep(0.2)
    buf = bytearray(100_000)
    t = time.monotonic()
    with pytest.raises(StoreUnavailable):
        s.read_into(["s:a"], memoryview(buf), [(0, 100_000)])
    took = time.monotonic() - t
    sleeper.join()
    assert took < 1.5, f"the read waited {took:.2f} s on a stalled server (timeout 0.5 s)"
    assert s.read_into(["s:a"], memoryview(buf), [(0, 100_000)]) == [100_000]
    assert buf == b"x" * 100_000
    # the pooled connections keep Python's timeout for the client's other calls
    for conn in s.client.connection_pool._available_connections:
        if conn._sock is not None:
            assert conn._sock.gettimeout() == 0.5
    s.close()
