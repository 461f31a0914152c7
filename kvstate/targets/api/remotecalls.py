"""The remote store's calls where the server refuses, errs or stalls: each fails with
``StoreUnavailable`` naming the store and the call; a call with nothing to do asks nothing.

The remote tier turns every failure of its store into a failed load or a refused write
(``impl/remotestore.py``); the remote walk met only the failures the cache absorbs, never the
store's own answers to them: a server that refuses the connection, a URL the client refuses, a
cluster URL naming a server that is none, a key of another type in the middle of a pipeline
(``WRONGTYPE``), a server that stalls past the store's ``timeout``; nor a Redis Cluster (a
store with ``cluster=True`` reads through ``MGET`` per slot and copies) whose slot moves to
another master under a client that knew it (``MOVED``).

``store_call(k)`` makes the ``k``-th call of :data:`CALLS` on the run's server (or next to it)
and compares the outcome with the store's contract (docs/remote.md; ``RedisStore``'s
docstrings): ``StoreUnavailable`` whose message names the store and the failed call, a refused
span before anything is sent (``ValueError``), the sound keys read back byte for byte after an
error reply, a stalled call failed by its timeout, before the server wakes, and a cluster's
store answering alike before and after its slot moved (a two-master cluster started for it,
:mod:`kvstate.testing.rediscluster`, about 2 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl

STALL_S = 0.6  # DEBUG SLEEP while the store's calls time out
TIMEOUT_S = 0.1  # the stalled store's timeout


def _fail(h: Any, what: str, msg: str) -> Any:
    return h.fail("remote-store", [what], f"store_call: {what}: {msg}")


def _unavailable(h: Any, what: str, call: str, fn: Callable[[], Any], url: str) -> None:
    """``fn()`` must raise StoreUnavailable naming ``url`` and ``call``."""
    from kvstate.impl.remotestore import StoreUnavailable

    try:
        got = fn()
    except StoreUnavailable as exc:
        if url not in str(exc) or call not in str(exc):
            raise _fail(
                h, what, f"{call} raised {exc!r}: it names neither {url!r} nor {call}"
            ) from exc
        return
    raise _fail(h, what, f"{call} returned {got!r}: the store must fail (StoreUnavailable)")


def _refused(h: Any, url: str) -> None:
    """Nobody listens: every call fails."""
    from kvstate.impl.remotestore import RedisStore

    what = "a server that refuses the connection"
    s = RedisStore(url, timeout=1.0, max_connections=2)
    try:
        _unavailable(
            h, what, "GET", lambda: s.read_into(["a"], memoryview(bytearray(1)), [(0, 1)]), url
        )
        _unavailable(h, what, "MGET", lambda: s.mget(["a"]), url)
        _unavailable(h, what, "SET", lambda: s.put([("a", b"x")], None), url)
        _unavailable(h, what, "SCAN", lambda: s.scan("a*"), url)
    finally:
        s.close()


def do_refused(h: Any, world: Any, prefix: str) -> None:
    _refused(h, "unix:///nonexistent-kvstate-dir/redis.sock")


def do_urls(h: Any, world: Any, prefix: str) -> None:
    """A URL the client refuses, and a cluster URL naming a server that is none."""
    from kvstate.impl.remotestore import RedisStore, StoreUnavailable

    for url, cluster in (("redis://127.0.0.1:notaport/0", False), (world.url, not world.cluster)):
        if cluster and world.url.startswith("unix:"):
            continue  # (a cluster client takes host and port: no Unix socket to try it on)
        try:
            s = RedisStore(url, timeout=1.0, max_connections=2, cluster=cluster)
        except StoreUnavailable as exc:
            if url not in str(exc):
                raise _fail(h, "a URL refused", f"{exc!r} does not name {url!r}") from exc
            continue
        s.close()
        raise _fail(h, "a URL refused", f"RedisStore({url!r}, cluster={cluster}) was built")


def do_wrongtype(h: Any, world: Any, prefix: str) -> None:
    """A key of another type between two values: the pipeline's error, then a sound read."""
    from kvstate.impl.remotestore import RedisStore

    what = "a key of another type mid-pipeline"
    r = world.admin()
    a, lst, c = f"{prefix}{{t}}:a", f"{prefix}{{t}}:l", f"{prefix}{{t}}:c"
    r.set(a, b"abc")
    r.rpush(lst, b"x")
    r.set(c, b"defg")
    s = RedisStore(world.url, timeout=5.0, max_connections=2, cluster=world.cluster)
    try:
        buf = bytearray(7)
        if not world.cluster:
            _unavailable(
                h, what, "WRONGTYPE",
                lambda: s.read_into([a, lst, c], memoryview(buf), [(0, 3), (3, 3), (3, 7)]),
                world.url,
            )  # fmt: skip
        got = s.read_into([a, c], memoryview(buf), [(0, 3), (3, 7)])
        if got != [3, 4] or bytes(buf) != b"abcdefg":
            raise _fail(h, what, f"the read after it returned {got}, {bytes(buf)!r}")
        if s.mget([]) != [] or s.read_into([], memoryview(buf), []) != []:
            raise _fail(h, what, "a call for no names answered something")
        try:
            s.read_into([a], memoryview(buf), [(5, 8)])
        except ValueError:
            pass
        else:
            raise _fail(h, what, "read_into took a span past the buffer's end")
    finally:
        s.close()
        r.delete(a, lst, c)


def do_stall(h: Any, world: Any, prefix: str) -> None:
    """The server sleeps; the store's calls fail by their timeout, before it wakes."""
    from kvstate.impl.remotestore import RedisStore

    if not world.stalls or world.cluster:
        return
    what = "a stalled server"
    s = RedisStore(world.url, timeout=TIMEOUT_S, max_connections=2)
    sleeper = threading.Thread(
        target=lambda: world.admin().execute_command("DEBUG", "SLEEP", STALL_S)
    )
    sleeper.start()
    time.sleep(0.03)  # (the server has the command: it sleeps)
    t0 = time.monotonic()
    try:
        _unavailable(
            h,
            what,
            "GET",
            lambda: s.read_into(["a"], memoryview(bytearray(1)), [(0, 1)]),
            world.url,
        )
        took = time.monotonic() - t0
        if took >= STALL_S - 0.05:
            raise _fail(h, what, f"the read failed after {took:.2f} s, once the server woke")
    finally:
        sleeper.join()
        s.close()


def do_stalled_load(h: Any, world: Any, prefix: str) -> None:
    """Node B (the store's ``timeout`` short) loads node A's chain while the server sleeps:
    every load fails by the timeout, before the server wakes, and the run serves the prompt's
    own bytes (the failed loads' blocks recomputed)."""
    import numpy as np

    from kvstate.targets.api.base import NAMESPACE
    from kvstate.targets.api.remote import _entry, _node
    from kvstate.testing.datacheck import verify_run

    if not world.stalls or world.cluster or all(_entry(h, b) is None for b in range(h.N)):
        return
    what = "a load on a stalled server"
    toks = np.array(h.tokens[: h.N * h.L + 1], dtype=np.int64)
    c = _node(h, timeout=TIMEOUT_S)
    sleeper = threading.Thread(
        target=lambda: world.admin().execute_command("DEBUG", "SLEEP", STALL_S)
    )
    try:
        loaded: list[Any] = []
        c.events.subscribe(lambda ev: loaded.append(ev) if ev.kind.value == "loaded" else None)
        sleeper.start()
        time.sleep(0.03)  # (the server has the command: it sleeps)
        t0 = time.monotonic()
        a = c.admit(c.request(toks, namespace=NAMESPACE))
        c.pipelines.drain()
        took, asleep = time.monotonic() - t0, sleeper.is_alive()
        with c.use(a) as run:
            wrong = verify_run(run, toks)
    finally:
        sleeper.join()
        c.close()
    if wrong:
        raise _fail(h, what, "node B reads wrong bytes:\n  " + "\n  ".join(wrong))
    if asleep and loaded:
        raise _fail(h, what, f"{len(loaded)} load(s) completed while the server slept")
    if took >= STALL_S - 0.05:
        raise _fail(h, what, f"the loads ended after {took:.2f} s, once the server woke")


def _move(cl: Any, slot: int) -> None:
    """``slot`` (and its keys) moved to the other master: clients that knew it get ``MOVED``."""
    from kvstate.testing.rediscluster import SLOTS

    src = slot * 2 // SLOTS
    dst = 1 - src
    a, b = cl.node(src), cl.node(dst)
    try:
        a_id, b_id = a.execute_command("CLUSTER MYID"), b.execute_command("CLUSTER MYID")
        b.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", a_id)
        a.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", b_id)
        keys = a.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
        if keys:
            a.execute_command("MIGRATE", "127.0.0.1", cl.ports[dst], "", 0, 5000, "KEYS", *keys)
        for c in (a, b):
            c.execute_command("CLUSTER SETSLOT", slot, "NODE", b_id)
    finally:
        a.close()
        b.close()


def do_cluster(h: Any, world: Any, prefix: str) -> None:
    """A store on a Redis Cluster of two masters (the run's server is none): values read back
    (into the caller's spans: one missing, one of another size), listed and fetched; then the
    entry's slot moved to the other master and every call again, through ``MOVED``."""
    from redis.crc import key_slot

    from kvstate.impl.remotestore import MISSING, RedisStore
    from kvstate.testing.rediscluster import RedisCluster

    if world.cluster:
        return  # (the run's server is a cluster: every call of the walk goes through it)
    what = "a Redis Cluster's store"
    names = [f"{prefix}{{c}}:{i}" for i in range(3)]
    vals = [b"abc", b"defgh"]
    cl = RedisCluster(masters=2)
    try:
        s = RedisStore(cl.url, timeout=5.0, max_connections=4, cluster=True)
        try:
            s.put(list(zip(names, vals, strict=False)), None)
            for when in ("", " after MOVED"):
                if when:
                    _move(cl, key_slot(names[0].encode()))
                buf = bytearray([0xA5]) * 11
                got = s.read_into(names, memoryview(buf), [(0, 3), (3, 6), (6, 11)])
                if got != [3, 5, MISSING] or bytes(buf) != b"abc" + b"\xa5" * 8:
                    raise _fail(h, what, f"read_into{when} gave {got}, {bytes(buf)!r}")
                if s.mget(names) != [*vals, None]:
                    raise _fail(h, what, f"mget{when} gave {s.mget(names)}")
                if sorted(s.scan(f"{prefix}{{c}}:*")) != names[:2]:
                    raise _fail(h, what, f"scan{when} listed {sorted(s.scan(prefix + '*'))}")
        finally:
            s.close()
    finally:
        cl.close()


CALLS: tuple[tuple[str, Callable[[Any, Any, str], None]], ...] = (
    ("a server that refuses the connection", do_refused),
    ("a URL the client refuses", do_urls),
    ("a key of another type mid-pipeline", do_wrongtype),
    ("a stalled server", do_stall),
    ("a Redis Cluster's store, and MOVED", do_cluster),
    ("a load on a stalled server", do_stalled_load),
)


def do_store_call(h: Any, o: Any) -> int | None:
    from kvstate.targets.api.remote import WORLD, remote_of

    if remote_of(h) is None or WORLD is None:
        return None
    name, call = CALLS[o.arg("k") % len(CALLS)]
    call(h, WORLD, h.cache_kwargs["remote"].prefix)
    h.cov.add(f"remote: store calls checked ({name})")
    return None


# only in a run with a remote tier (registry.REMOTE_ONLY), scripted (the ci walk's draws unmoved)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "store_call",
        do_store_call,
        "read",
        lambda s: {"k": st.integers(0, len(CALLS) - 1)},
        rule=False,
    ),
)


def walks(to_disk: list[Any]) -> dict[str, list[Any]]:
    """Scripted (kvstate/targets/api/witnesses.py, in a run with a remote tier): every call;
    the stalled load once node A's blocks are in the store."""
    from kvstate.targets.api.base import op

    k = len(CALLS) - 1  # (a load on a stalled server)
    return {
        "remote: the store's calls refused, erring, stalled": [
            op("store_call", k=j) for j in range(k)
        ],
        "remote: a load on a stalled server": [*to_disk, op("store_call", k=k)],
    }
