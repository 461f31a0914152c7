"""The API target with a remote tier: the store's faults as operations driven through the server.

``kvstate fuzz --target kvstate-api --remote [URL]`` runs the harness over caches whose offloaded
blocks live in a Redis server (``impl/remote.py``): the server at ``URL``, or one the run starts
itself on a Unix socket in a temporary directory (:mod:`kvstate.testing.redisserver`).  Each
example's cache ("node A") keeps its entries under its own key prefix; the operations below act
on the server the way a fleet and its operators do:

* ``remote_del``: ``DEL`` of a block's entry (header and chunks) or of one chunk;
* ``remote_overwrite``: a chunk overwritten with garbage or with another entry's bytes;
* ``remote_evict``: memory pressure (``CONFIG SET maxmemory`` just above what is used, then
  filler): the server evicts keys at random, ours among them;
* ``remote_restart``: the server restarted without persistence (a run that did not start the
  server deletes this example's keys instead);
* ``remote_kill``: ``CLIENT KILL`` of every connection (the pool reconnects);
* ``remote_stall``: ``DEBUG SLEEP`` while the pipelines drain in another thread: the cache's
  lock must stay free for the calls that do not need the server;
* ``peer``: a second node (a fresh cache, same fleet key and namespace) opens on the server,
  hits the chain and reads it byte for byte (a cross-node hit), or stores it too (two writers
  of one prefix);
* ``tenant``: a node of another namespace, whose model writes other bytes, stores the chain's
  tokens on the same server: a node of ours must never be served its entries.

Each store fault is one of the remote table's store actions (``spec/default/remote.py``),
performed on the lockstep state of :class:`~kvstate.targets.api.remotecheck.RemoteOutcomes`;
the blocks whose remote copy then no longer verifies are those whose loads the world rules to
fail.  A fault is injected only where no load of the example has read its chunks and not yet
finished (the table reads a chunk at ``rload_chunk``; the tier reads them all at the load's
first step).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.harness.trace import TraceStep
from kvstate.targets.api.base import NAMESPACE, Harness, op
from kvstate.targets.api.declare import OpDecl, Sizes

FLEET_KEY = b"kvstate-api-fuzz-fleet-key-0123456789"
STALL_S = 0.5  # DEBUG SLEEP of one stall
# the cache's lock, taken again and again during a stall, answers within this (a read held
# under it holds it for most of the stall)
LOCK_BOUND_S = 0.25


@dataclass
class World:
    """The server a remote run uses; ``server`` when the run started it (then it can really
    restart it)."""

    url: str
    server: Any = None
    stalls: bool = True  # DEBUG is enabled (a server the run started)
    nodes: int = 1  # 2: node B's operations drawn too (--nodes 2), not only scripted
    node: Any = None  # node B's process (kvstate/targets/api/twonode.py), once started
    node_env: Mapping[str, str] | None = None  # its environment and folder (None: this one's)
    node_cwd: str | None = None
    cluster: bool = False  # the URL names a Redis Cluster node (the caches get cluster=True)

    def start_node(self) -> None:
        """Node B's process (kvstate/targets/api/twonode.py), started now: it imports the cache
        while this process goes on."""
        from kvstate.testing.node import NodeB

        self.node = NodeB(self.node_env, self.node_cwd)

    def admin(self) -> Any:
        """A client of the server's own commands; of a cluster, one whose server-wide faults
        (``CONFIG SET``, ``CLIENT KILL``) reach every master (:mod:`kvstate.testing.rediscluster`)."""
        import redis

        if self.cluster:
            from kvstate.testing.rediscluster import ClusterAdmin

            return ClusterAdmin(self.url)
        return redis.Redis.from_url(self.url, socket_timeout=30)


WORLD: World | None = None
_EXAMPLES = itertools.count()


@contextmanager
def remote_world(
    url: str | None = None,
    *,
    nodes: int = 1,
    node_env: Mapping[str, str] | None = None,
    node_cwd: str | None = None,
) -> Iterator[World]:
    """The remote tier's server for the harnesses made meanwhile: ``url``, or a server started
    here (raises :class:`~kvstate.testing.redisserver.ServerMissing` without one).  Node B's
    process (kvstate/targets/api/twonode.py) runs in ``node_env`` and ``node_cwd`` (None: this
    process's), started with the world and stopped with it; ``nodes=2`` draws its operations
    too."""
    global WORLD
    from kvstate.testing.redisserver import RedisServer

    server = RedisServer() if url is None else None
    world = World(url or server.url, server, stalls=server is not None)
    world.nodes, world.node_env, world.node_cwd = nodes, node_env, node_cwd
    world.admin().ping()
    if url is not None:  # (a server the run starts is one server)
        from kvstate.testing.rediscluster import is_cluster

        world.cluster = is_cluster(url)
    world.start_node()
    WORLD = world
    try:
        yield world
    finally:
        WORLD = None
        if world.node is not None:
            world.node.close()
        if server is not None:
            server.close()


def cache_kwargs() -> dict[str, Any]:
    """The cache's ``remote`` argument when a remote run is on: each example under its own key
    prefix (the examples of a run share the server)."""
    if WORLD is None:
        return {}
    from kvstate.impl.remote import RemoteConfig

    prefix = f"kvf:{os.getpid()}:{next(_EXAMPLES)}:"
    cfg = RemoteConfig(
        url=WORLD.url, key=FLEET_KEY, model="kvstate-api", prefix=prefix, cluster=WORLD.cluster
    )
    return {"remote": cfg}


def remote_of(h: Harness) -> Any:
    """The example's remote outcome check (its store state), or None without a remote tier."""
    from kvstate.targets.api.remotecheck import RemoteOutcomes

    return next((c for c in h.checks if isinstance(c, RemoteOutcomes)), None)


def checks(h: Harness) -> list[Any]:
    """kvstate/targets/api/checks.py: the remote outcome check, where the cache has a remote tier."""
    if "remote" not in h.cache_kwargs:
        return []
    from kvstate.targets.api.remotecheck import RemoteOutcomes

    return [RemoteOutcomes(h)]


def release(h: Harness) -> None:
    """The example's keys deleted (its end): the next example starts from an empty prefix."""
    cfg = h.cache_kwargs.get("remote")
    if cfg is None or WORLD is None:
        return
    r = WORLD.admin()
    names = list(r.scan_iter(match=f"{cfg.prefix}*", count=1000))
    for i in range(0, len(names), 512):
        r.delete(*names[i : i + 512])


# ---- what the store holds of node A's entries ----------------------------------------------------
def _entry(h: Harness, b: int) -> Any:
    return h.view.disk_entries.get(h.rids[b])


def _names(h: Harness, e: Any) -> tuple[str, list[str]]:
    disk = h.view.disk
    ks = [*range(len(e.chunks)), *([-1] if e.swa_section is not None else [])]
    return str(e.path), [disk.chunk_name(e, k) for k in ks]


def _quiet(h: Harness) -> bool:
    """No load has read its chunks and not yet finished (a fault now is one the table places
    between two reads)."""
    jobs = h.view.pending().get("io", [])
    return all(getattr(h.view.job("io", k), "chunks", None) is None for k in jobs)


def _ruled(h: Harness, blocks: list[int]) -> None:
    """The world: these blocks' remote copies no longer verify (the remote table's store action
    said so): their loads must fail."""
    for b in blocks:
        if _entry(h, b) is not None:  # (its entry: a stored copy, or one being loaded)
            h.corrupt[b] = "remote"


def _store_act(h: Harness, name: str, **p: int) -> None:
    _ruled(h, remote_of(h).store_acts(h, name, **p))


def _do_del(h: Harness, o: TraceStep) -> int | None:
    b, whole = o.arg("b"), o.arg("kind") == 0
    e = _entry(h, b)
    if remote_of(h) is None or e is None or not _quiet(h):
        return None
    header, chunks = _names(h, e)
    WORLD.admin().delete(*([header, *chunks] if whole else chunks[-1:]))  # type: ignore[union-attr]
    h.cov.add(f"fault remote_del_{'entry' if whole else 'chunk'}")
    _store_act(h, "remote_delete", b=b)
    return None


def _do_overwrite(h: Harness, o: TraceStep) -> int | None:
    b, other = o.arg("b"), o.arg("kind") == 1
    e = _entry(h, b)
    if remote_of(h) is None or e is None or not _quiet(h):
        return None
    r = WORLD.admin()  # type: ignore[union-attr]
    _, chunks = _names(h, e)
    size = len(r.get(chunks[0]) or b"")
    value = np.random.default_rng(len(h.steps)).bytes(max(size, 1))
    if other:  # another entry's authentic bytes (another block's, or this one's next chunk)
        donors = [
            c for x in range(h.N) if x != b and _entry(h, x) for c in _names(h, _entry(h, x))[1]
        ]
        got = r.get((donors or chunks[1:] or chunks)[0]) or value
        value = bytes(got[:size]).ljust(size, b"\0")
    r.set(chunks[0], value)
    h.cov.add(f"fault remote_overwrite_{'other_writer' if other else 'garbage'}")
    _store_act(h, "remote_overwrite", b=b)
    return None


def _do_evict(h: Harness, o: TraceStep) -> int | None:
    if remote_of(h) is None or not h.view.disk_entries or not _quiet(h):
        return None
    r = WORLD.admin()  # type: ignore[union-attr]
    limit = r.config_get("maxmemory")["maxmemory"]
    used = int(r.info("memory")["used_memory"])
    prefix = h.cache_kwargs["remote"].prefix
    try:
        r.config_set("maxmemory", str(used + 48 * 1024))
        for i in range(24):
            try:
                r.set(f"{prefix}filler:{i}", bytes(8 * 1024))
            except Exception:  # noqa: BLE001 (OOM: noeviction on a server we did not start)
                break
    finally:
        r.config_set("maxmemory", limit)
    r.delete(*(f"{prefix}filler:{i}" for i in range(24)))
    h.cov.add("fault remote_evict")
    for b in range(h.N):
        e = _entry(h, b)
        if e is not None:
            _evicted(h, r, b, e)
    return None


def _evicted(h: Harness, r: Any, b: int, e: Any) -> None:
    """What the server's eviction took of block ``b``'s entry, as the table's store action.

    A load reads the entry's data chunks, and its window section only where the load needs
    the window; the header was read when the entry was adopted.  So a data chunk gone is the
    table's ``remote_evict_chunk`` (the load fails); the header alone gone changes nothing
    this node reads (a fresh node no longer finds the entry); the window section alone gone
    fails only a load that reads it, which the table cannot tell apart, so the harness takes
    the entry's first data chunk as well: the eviction is then one every load of it meets."""
    header, chunks = _names(h, e)
    data, window = chunks[: len(e.chunks)], chunks[len(e.chunks) :]
    gone_data = r.exists(*data) != len(data) if data else False
    gone_window = bool(window) and r.exists(*window) != len(window)
    if not gone_data and not gone_window:
        if not r.exists(header):
            h.cov.add("remote: headers evicted alone")
        return
    if not gone_data and data:
        r.delete(data[0])
    h.cov.add("remote: entries evicted")
    _store_act(h, "remote_evict_chunk", b=b)


def _do_restart(h: Harness, o: TraceStep) -> int | None:
    if remote_of(h) is None or not _quiet(h):
        return None
    assert WORLD is not None
    if WORLD.server is not None:
        WORLD.server.restart()
    else:  # not our server to restart: what a restart does to this fleet, its keys gone
        release(h)
    h.cov.add("fault remote_restart")
    _store_act(h, "remote_restart")
    return None


def _do_kill(h: Harness, o: TraceStep) -> int | None:
    if remote_of(h) is None:
        return None
    WORLD.admin().client_kill_filter(_type="normal", skipme=True)  # type: ignore[union-attr]
    h.cov.add("fault remote_kill")
    return None


def _do_stall(h: Harness, o: TraceStep) -> int | None:
    """``DEBUG SLEEP`` while the pipelines drain in another thread (the drain is this call's,
    explained job step by job step); meanwhile the cache's lock is taken here: a load's read
    of the stalled server must not hold it."""
    from kvstate.targets.api.ops import _do_drain

    if remote_of(h) is None or WORLD is None or not WORLD.stalls or h.threads:
        return _do_drain(h, o)
    if not h.view.pending().get("io"):
        return _do_drain(h, o)  # nothing waits on the server: a drain
    sleeper = threading.Thread(
        target=lambda: WORLD.admin().execute_command("DEBUG", "SLEEP", STALL_S)  # type: ignore[union-attr]
    )
    sleeper.start()
    time.sleep(0.03)  # the server has the command: it sleeps
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            _do_drain(h, o)
        except BaseException as exc:  # noqa: BLE001 (re-raised below, in the harness's thread)
            errors.append(exc)

    drainer = threading.Thread(target=drain)
    drainer.start()
    waited = 0.0
    while sleeper.is_alive():  # the lock, again and again while the server sleeps
        t = time.monotonic()
        with h.view.lock:
            waited = max(waited, time.monotonic() - t)
        time.sleep(0.01)
    drainer.join()
    if errors:
        raise errors[0]
    h.cov.add("fault remote_stall")
    if waited > LOCK_BOUND_S:
        raise h.fail(
            "stall",
            ["lock"],
            f"{o.render()}: the cache's lock waited {waited:.3f} s while the server slept "
            f"{STALL_S} s (a call that does not need the server must not wait on it)",
        )
    return None


class _OtherModel:
    """Another model's KV for the same tokens: every byte differs from the test writer's."""

    def __init__(self) -> None:
        from kvstate.impl.testdata import DeterministicWriter

        self.w = DeterministicWriter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.w, name)

    def rows(self, *a: Any) -> Any:
        return self.w.rows(*a) ^ 0x5A

    def state_rows(self, *a: Any) -> Any:
        return self.w.state_rows(*a) + 1.0


def _node(h: Harness, **cfg: Any) -> Any:
    """Another node on the server: a fresh cache of the same shape, same fleet key."""
    from dataclasses import replace

    from kvstate.impl.cache import HeterogeneousKVCache

    kw = dict(h.open_kwargs())
    writer = cfg.pop("writer", None)
    if writer is not None:
        kw["writer"] = writer
    kw["remote"] = replace(kw["remote"], **cfg)
    kw["cache_dir"] = tempfile.mkdtemp(prefix="kvstate-api-peer-")
    kw["executors"] = "manual"
    return HeterogeneousKVCache(**kw)


def _store(c: Any, toks: np.ndarray) -> None:
    """``c`` computes ``toks`` with its own writer and stores every block: the entries it found
    on the server are forgotten first (forgotten locally, left in the store), so it hits none."""
    c.drop(1 << 10)
    a = c.admit(c.request(toks, namespace=NAMESPACE))
    with c.use(a):
        pass
    c.tick(c.table.consts.lease_max)
    for _ in range(3):
        c.offload(1 << 10)
        c.pipelines.drain()
        c.spill(1 << 10)


def _do_peer(h: Harness, o: TraceStep) -> int | None:
    """Node B: a fresh cache on the server hits the chain and reads it byte for byte (and,
    ``kind=1``, first stores the chain itself: two writers of one prefix)."""
    if remote_of(h) is None:
        return None
    peer(h, o.arg("kind"))
    return None


def peer(h: Harness, kind: int, **cfg: Any) -> None:
    """:func:`_do_peer`, node B's ``RemoteConfig`` fields replaced by ``cfg``."""
    from kvstate.testing.datacheck import verify_run

    toks = np.array(h.tokens[: h.N * h.L + 1], dtype=np.int64)
    c = _node(h, **cfg)
    try:
        _adopted(h, c)
        if kind == 1:
            _store(c, toks)
            h.cov.add("remote: second writer stores")
            c.close()
            c = _node(h, **cfg)
        loaded: list[Any] = []
        c.events.subscribe(lambda ev: loaded.append(ev) if ev.kind.value == "loaded" else None)
        a = c.admit(c.request(toks, namespace=NAMESPACE))
        c.pipelines.drain()
        with c.use(a) as run:
            wrong = verify_run(run, toks)
            hit = run.hit_tokens
        c.pipelines.drain()
        s = c.stats()
        leak = s["pinned_blocks"] or s["io_inflight"] or s["blocks"]["loading"]
    finally:
        c.close()
    h.cov.add("reads checked")
    if wrong:
        raise h.fail("data", ["peer"], "node B reads wrong bytes:\n  " + "\n  ".join(wrong))
    if leak:
        raise h.fail("accounting", ["peer"], f"node B left blocks held after its request: {s}")
    if hit:
        h.cov.add("remote: cross-node hits")
        h.cov.add("remote: cross-node restores", len(loaded))


def _adopted(h: Harness, c: Any) -> None:
    """Node B, opened on the server, adopted every entry of node A's chain whose header the
    server holds: an entry is read at its header when a node opens (``RemoteTier.scan``), and
    a header that is there, whole and authentic (nothing here writes a header but the tier)
    must not be refused.  A node that adopts nothing never hits, and a hit is not required of
    node B otherwise."""
    r = WORLD.admin()  # type: ignore[union-attr]
    held = {str(e.path) for e in c.inspect().disk_entries.values()}
    want = {
        str(e.path) for b in range(h.N) if (e := _entry(h, b)) is not None and r.exists(str(e.path))
    }
    if want - held:
        raise h.fail(
            "remote-adopt",
            ["peer"],
            f"node B, opened on the server, did not adopt node A's entries {sorted(want - held)} "
            "whose headers the server holds",
        )
    h.cov.add("remote: entries adopted by node B", len(want))


def _do_tenant(h: Harness, o: TraceStep) -> int | None:
    """A node of another namespace (another model's bytes) stores the chain's tokens."""
    if remote_of(h) is None:
        return None
    toks = np.array(h.tokens[: h.N * h.L + 1], dtype=np.int64)
    c = _node(h, namespace="another-tenant", writer=_OtherModel())
    try:
        _store(c, toks)
    finally:
        c.close()
    h.cov.add("fault remote_tenant")
    return None


def _kinds(s: Sizes) -> Mapping[str, Any]:
    return {"b": s.block, "kind": st.integers(0, 1)}


def _kind(s: Sizes) -> Mapping[str, Any]:
    return {"kind": st.integers(0, 1)}


# the operations of this module, each declared once (kvstate/targets/api/declare.py); drawn only
# when the run has a remote tier (registry.REMOTE_ONLY)
DECLS: tuple[OpDecl, ...] = (
    OpDecl("remote_del", _do_del, "fault", _kinds, faults=("remote_del_entry", "remote_del_chunk")),
    OpDecl(
        "remote_overwrite",
        _do_overwrite,
        "fault",
        _kinds,
        faults=("remote_overwrite_garbage", "remote_overwrite_other_writer"),
    ),
    OpDecl("remote_evict", _do_evict, "fault", faults=("remote_evict",)),
    OpDecl("remote_restart", _do_restart, "fault", faults=("remote_restart",)),
    OpDecl("remote_kill", _do_kill, "fault", faults=("remote_kill",)),
    OpDecl("remote_stall", _do_stall, "drain", faults=("remote_stall",)),
    OpDecl("peer", _do_peer, "fault", _kind),
    OpDecl("tenant", _do_tenant, "fault", faults=("remote_tenant",)),
)


def walks(
    N: int, L: int, lease_max: int, to_disk: list[TraceStep], hit: list[TraceStep]
) -> dict[str, list[TraceStep]]:
    """Scripted walks (kvstate/targets/api/witnesses.py): every block stored in the server, each
    store fault, then a hit that loads them back; node B's hits (also over an explicit
    ``ChunkStore``: kvstate/targets/api/remoteargs.py)."""

    end = [op("finish", i=1)]
    then = lambda *fault: [*to_disk, *fault, *hit, *end]  # noqa: E731
    return {
        "remote: a chunk deleted": then(op("remote_del", b=1, kind=1)),
        "remote: an entry deleted": then(op("remote_del", b=2, kind=0)),
        "remote: garbage in a chunk": then(op("remote_overwrite", b=1, kind=0)),
        "remote: another writer's chunk": then(op("remote_overwrite", b=2, kind=1)),
        "remote: eviction under maxmemory": then(op("remote_evict")),
        "remote: a restart without persistence": then(op("remote_restart")),
        "remote: dropped connections": then(op("remote_kill")),
        "remote: a stall during loads": [
            *to_disk,
            *hit[:2],
            op("remote_stall"),
            *hit[3:],
            *end,
        ],
        "remote: a cross-node hit": [*to_disk, op("peer", kind=0)],
        "remote: two writers, then a hit": [*to_disk, op("peer", kind=1), *hit, *end],
        "remote: another tenant's entries": [*to_disk, op("tenant"), op("peer", kind=0)],
        "remote: a node over an explicit ChunkStore": [*to_disk, op("peer_store")],
    }
