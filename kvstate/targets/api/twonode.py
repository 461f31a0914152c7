"""Two nodes in two processes on one server: node B's loads and stores against node A's.

``peer`` (kvstate/targets/api/remote.py) opens node B in the harness's own process.  Here node B
is another OS process (:class:`kvstate.testing.node.NodeB`, started once per run: the world's
``node``) with its own cache on the same server, fleet key, namespace and geometry; what A
writes reaches B only through the server.  The operations, drawn in a run with a remote tier:

* ``node_b``: B opens on the server (it must adopt every entry of A's chain whose header the
  server holds), hits the chain and loads it back: a cross-node hit;
* ``node_b_race(b, kind, when)``: B's load in flight when A's entry of block ``b`` (the
  ``b``-th of those the store holds sound) changes in the store: a data chunk deleted (``kind`` 0), another writer's authentic bytes (1), an
  eviction under ``maxmemory`` (2), garbage (3) (each the remote table's store action, as the
  faults of remote.py); ``when`` 0: B paused at its first remote read before it reaches the
  server, 1: after that read was authenticated and before any chunk lands (the block it read
  may then be hit: it was read whole before the change), 2: B's read and the change race on
  a stalled server (``DEBUG SLEEP``: either order may win);
* ``node_b_store(n)``: A's ``spill(n)`` and B's spill of the same prefix at once (both
  pipelines reach a sleeping server together, where the run started the server); B then
  reopens and hits the prefix.

The three run in the scripted walks of every run with a remote tier (:func:`walks`);
``--nodes 2`` (the fuzz mode) also draws ``node_b_fuzz``, one of them with drawn arguments.

Each of B's answers is judged here, not in B: the bytes it read (:class:`Replayed`) by
:func:`~kvstate.testing.datacheck.verify_run` against the deterministic writer's content; its
hit by what the store held (a hit only over entries B adopted, and none past a block of A's
whose entry, as B adopted it, the world has ruled broken before B read it); B at rest after
its request (every pool free, nothing pinned, loaded or queued).  A finding names node B.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.harness.trace import TraceStep
from kvstate.targets.api import remote
from kvstate.targets.api.base import NAMESPACE, Harness, op
from kvstate.targets.api.declare import OpDecl, Sizes

STALL_S = 0.3  # DEBUG SLEEP while B's read and the store's change race
KINDS = ("DEL of a data chunk", "another writer's bytes", "eviction", "garbage")
WHEN = ("before its read", "after its read", "racing it on a stalled server")


def node(h: Harness) -> Any:
    """The run's node B (started with the world; again in a forked process of the run)."""
    w = remote.WORLD
    assert w is not None
    if w.node is None or w.node.pid != os.getpid():
        w.start_node()
    return w.node


def _open(h: Harness) -> tuple[Any, dict[str, str]]:
    """Node B's fresh cache on the server (A's constructor arguments but the table, writer,
    directory and pipelines, which B makes its own; a host tier the whole chain fits in), and
    the entries it adopted; a finding where it left out one of A's whose header the server
    holds."""
    n = node(h)
    kw = dict(h.open_kwargs())
    for k in ("table", "writer", "cache_dir", "executors"):
        kw.pop(k, None)
    kw["host_blocks"] = max(int(kw.get("host_blocks", 0)), h.N)
    adopted: dict[str, str] = _call(h, n, "open", kw, h.table.geometry)
    r = remote.WORLD.admin()  # type: ignore[union-attr]
    want = {
        e.key.hex()
        for b in range(h.N)
        if (e := remote._entry(h, b)) is not None and r.exists(str(e.path))
    }
    if want - set(adopted):
        raise h.fail(
            "remote-adopt",
            ["node B"],
            f"node B (pid {n.proc.pid}), opened on the server, did not adopt node A's entries "
            f"of keys {sorted(want - set(adopted))} whose headers the server holds",
        )
    h.cov.add("node B: entries adopted", len(want))
    return n, adopted


def _call(h: Harness, n: Any, *msg: Any) -> Any:
    from kvstate.testing.node import NodeError

    try:
        return n.call(*msg)
    except NodeError as exc:
        raise h.fail("node-b", [str(msg[0])], f"node B (pid {n.proc.pid}): {exc}") from exc


def _recv(h: Harness, n: Any, want: str) -> Any:
    from kvstate.testing.node import NodeError

    try:
        kind, value = n.recv()
    except NodeError as exc:
        raise h.fail("node-b", [want], f"node B (pid {n.proc.pid}): {exc}") from exc
    if kind != want:
        raise h.fail("node-b", [want], f"node B answered {kind!r}, expected {want!r}")
    return value


def _tokens(h: Harness) -> np.ndarray:
    return np.array(h.tokens[: h.N * h.L + 1], dtype=np.int64)


def _bound(
    h: Harness,
    adopted: Mapping[str, str],
    exempt: AbstractSet[int],
    broken: AbstractSet[int] = frozenset(),
) -> int:
    """The most blocks B may hit: none past a block of which it adopted no entry, nor past one
    whose entry, as B adopted it, was broken before B read it: A's own (same nonce) that the
    world ruled broken, or one A does not hold that the race broke (``broken``); ``exempt``:
    blocks B read before the change."""
    for b in range(h.N):
        key = h.chain.keys[b].hex()
        if key not in adopted:
            return b
        e = remote._entry(h, b)
        mine = e is not None and adopted[key] == e.nonce.hex()
        ruled = mine and h.corrupt.get(b) == "remote" or b in broken
        if ruled and b not in exempt:
            return b
    return h.N


def _judge(
    h: Harness,
    n: Any,
    res: dict[str, Any],
    adopted: Mapping[str, str],
    exempt: AbstractSet[int],
    broken: AbstractSet[int] = frozenset(),
) -> None:
    """Node B's answer to ``use``: its hit within what the store held, its bytes the writer's,
    B at rest afterwards."""
    from kvstate.testing.datacheck import verify_run
    from kvstate.testing.node import Replayed

    who = f"node B (pid {n.proc.pid})"
    hit, most = res["hit_tokens"], _bound(h, adopted, exempt, broken) * h.L
    wrong = verify_run(Replayed(h.cache, hit, res["blocks"], res["reads"]), _tokens(h))
    h.cov.add("node B: reads checked")
    over = (
        f"{who} hit {hit} tokens, past a block whose entry it could not load whole and "
        f"authentic: at most {most} (blocks ruled broken before its read: "
        f"{sorted({b for b, k in h.corrupt.items() if k == 'remote'} | broken - exempt)})"
    )
    if wrong:
        raise h.fail(
            "data",
            ["node B"],
            f"{who} reads wrong bytes:\n  " + "\n  ".join(wrong) + ("\n" + over) * (hit > most),
        )
    if hit > most:
        raise h.fail("node-b-hit", ["hit"], over)
    rest = res["rest"]
    leaks = [
        f"{k}: {free} free of {size}" for k, (free, size) in rest["pools"].items() if free != size
    ]
    leaks += [f"{k}: {v}" for k, v in rest["held"].items() if v]
    if leaks:
        raise h.fail("leak", ["node B"], f"{who} at rest after its request: " + ", ".join(leaks))
    h.cov.add("node B: quiescence checks")
    if hit:
        h.cov.add("node B: cross-node hits")
    h.cov.add("node B: restores", res["loaded"])
    h.cov.add("node B: loads failed", res["load_failed"])


def _do_node_b(h: Harness, o: TraceStep) -> int | None:
    """B opens on the server and hits A's chain: a cross-node hit, judged here."""
    if remote.remote_of(h) is None or h.threads:
        return None
    n, adopted = _open(h)
    try:
        res = _call(h, n, "use", _tokens(h), NAMESPACE, None)
        _judge(h, n, res, adopted, set())
    finally:
        _call(h, n, "close")
    return None


def _damage(h: Harness, b: int, kind: int, adopted: Mapping[str, str]) -> tuple[set[int], set[int]]:
    """The entry of block ``b`` that B adopted changed in the store (KINDS[kind]): (the blocks
    whose entries of A's the world then rules broken: A's lockstep learns it through the remote
    table's store action; the blocks whose entry, one A does not hold, was broken here)."""
    key = h.chain.keys[b]
    nonce = adopted.get(key.hex())
    e = remote._entry(h, b)
    if kind != 2 and nonce is not None and (e is None or e.nonce.hex() != nonce):
        _break_other(h, key, nonce, kind, adopted)
        return set(), {b}
    before = {x for x, k in h.corrupt.items() if k == "remote"}
    if kind == 0 and e is not None:
        _, chunks = remote._names(h, e)
        remote.WORLD.admin().delete(chunks[0])  # type: ignore[union-attr]  # (a data chunk)
        h.cov.add("fault remote_del_chunk")
        remote._store_act(h, "remote_delete", b=b)
    elif kind in (1, 3):
        remote._do_overwrite(h, op("remote_overwrite", b=b, kind=int(kind == 1)))
    elif kind == 2:
        remote._do_evict(h, op("remote_evict"))
    return {x for x, k in h.corrupt.items() if k == "remote"} - before, set()


def _break_other(h: Harness, key: bytes, nonce: str, kind: int, adopted: Mapping[str, str]) -> None:
    """An entry A does not hold (another writer's, or one A has forgotten) broken at its first
    data chunk: deleted, another entry's authentic chunk, or garbage."""
    r = remote.WORLD.admin()  # type: ignore[union-attr]
    base = h.view.disk.header_name(key)[:-2]  # (the header's name without ":h")
    name = f"{base}:{nonce}:0"
    if kind == 0:
        r.delete(name)
        h.cov.add("fault remote_del_chunk")
        return
    size = max(len(r.get(name) or b""), 1)
    value = np.random.default_rng(len(h.steps)).bytes(size)
    if kind == 1:
        donors = [
            f"{h.view.disk.header_name(bytes.fromhex(k))[:-2]}:{v}:0"
            for k, v in adopted.items()
            if k != key.hex()
        ]
        got = r.get(donors[0]) if donors else None
        value = bytes(got[:size]).ljust(size, b"\0") if got else value
    r.set(name, value)
    h.cov.add(f"fault remote_overwrite_{'other_writer' if kind == 1 else 'garbage'}")


def _do_race(h: Harness, o: TraceStep) -> int | None:
    """B's load in flight while A's entry of block ``b`` changes (see the module's docstring)."""
    if remote.remote_of(h) is None or h.threads or not remote._quiet(h):
        return None
    kind, when = o.arg("kind"), o.arg("when")
    w = remote.WORLD
    assert w is not None
    if when == 2 and not w.stalls:
        when = 0  # (a server the run did not start: no DEBUG)
    n, adopted = _open(h)
    # the ``b``-th of the blocks whose entry B adopted and the world has not ruled broken (a
    # drawn block without one would change nothing B reads)
    sound = [x for x in range(h.N) if h.chain.keys[x].hex() in adopted and x not in h.corrupt]
    b = sound[o.arg("b") % len(sound)] if sound else o.arg("b")
    broken: set[int] = set()
    try:
        if when < 2:
            n.send("use", _tokens(h), NAMESPACE, ("before", "after")[when])
            kind_, value = n.recv()
            if kind_ == "ok":  # B read nothing remote (nothing to load): no pause came
                res = value
                exempt: set[int] = set()
            else:
                if kind_ != "paused":
                    raise h.fail("node-b", ["pause"], f"node B answered {kind_!r} at its read")
                h.cov.add("node B: loads paused at a read")
                blocks = {k.hex(): x for x, k in enumerate(h.chain.keys)}
                read = blocks.get(value[1]) if when == 1 else None
                target = b if read is None else read
                changed, broken = _damage(h, target, kind, adopted)
                exempt = {target} if when == 1 else set()
                if changed or broken:
                    h.cov.add(f"node B: loads paused {WHEN[when]}, the store changed")
                n.send("resume")
                res = _recv(h, n, "ok")
        else:
            sleeper = threading.Thread(
                target=lambda: w.admin().execute_command("DEBUG", "SLEEP", STALL_S)
            )
            sleeper.start()
            time.sleep(0.03)  # the server has the command: it sleeps
            n.send("use", _tokens(h), NAMESPACE, None)
            time.sleep(0.05)  # B's first read waits on the sleeping server
            changed, broken = _damage(h, b, kind, adopted)
            exempt = changed | broken  # (either order may win: B may read it whole)
            sleeper.join()
            res = _recv(h, n, "ok")
            if exempt:
                h.cov.add("node B: reads racing a change on a stalled server")
        _judge(h, n, res, adopted, exempt, broken)
    finally:
        _call(h, n, "close")
    return None


def _do_store(h: Harness, o: TraceStep) -> int | None:
    """``spill(n)`` of A while B spills the same prefix: both writers at once (on a sleeping
    server where the run started it); then B reopens and hits the prefix."""
    if remote.remote_of(h) is None or h.threads:
        h.returned = h.cache.spill(o.arg("n"))
        return None
    w = remote.WORLD
    assert w is not None
    n, _ = _open(h)
    try:
        n.send("store", _tokens(h), NAMESPACE)
        _recv(h, n, "ready")
        sleeper = None
        if w.stalls:
            sleeper = threading.Thread(
                target=lambda: w.admin().execute_command("DEBUG", "SLEEP", STALL_S)
            )
            sleeper.start()
            time.sleep(0.03)
        n.send("go")
        try:
            h.returned = h.cache.spill(o.arg("n"))
        finally:
            if sleeper is not None:
                sleeper.join()
            stored = _recv(h, n, "ok")
        h.cov.add("node B: stores at once with node A")
        h.cov.add("node B: blocks stored", int(stored["spilled"]))
    finally:
        _call(h, n, "close")
    n, adopted = _open(h)  # afterwards: B hits the prefix with the right bytes, or recomputes
    try:
        res = _call(h, n, "use", _tokens(h), NAMESPACE, None)
        _judge(h, n, res, adopted, set())
    finally:
        _call(h, n, "close")
    return None


def _do_fuzz(h: Harness, o: TraceStep) -> int | None:
    """``--nodes 2``'s drawn operation: one of the three above (``which``), its arguments drawn
    with it; the store is explained as A's ``spill``."""
    which = o.arg("which")
    if which == 0:
        return _do_node_b(h, o)
    if which == 1:
        return _do_race(h, o)
    h.call_override = "spill"
    return _do_store(h, o)


def _race_args(s: Sizes) -> Mapping[str, Any]:
    return {"b": s.block, "kind": st.integers(0, len(KINDS) - 1), "when": st.integers(0, 2)}


# the operations of this module, each declared once (kvstate/targets/api/declare.py), all of them
# only in a run with a remote tier (registry.REMOTE_ONLY): the three in the scripted walks (never
# drawn: node B's start and each of its caches cost the ci walk), and ``node_b_fuzz``, drawn
# where the run has two nodes (``--nodes 2``: :data:`FUZZ`)
DECLS: tuple[OpDecl, ...] = (
    OpDecl("node_b", _do_node_b, "fault", rule=False),
    OpDecl("node_b_race", _do_race, "fault", _race_args, rule=False),
    OpDecl("node_b_store", _do_store, "spill", lambda s: {"n": st.integers(0, s.N)}, rule=False),
    OpDecl(
        "node_b_fuzz",
        _do_fuzz,
        "fault",
        lambda s: {**_race_args(s), "which": st.integers(0, 2), "n": st.integers(0, s.N)},
    ),
)
FUZZ = frozenset({"node_b_fuzz"})  # drawn only with --nodes 2 (registry.drawn_ops)


def walks(
    N: int, to_host: list[TraceStep], to_disk: list[TraceStep], hit: list[TraceStep]
) -> dict[str, list[TraceStep]]:
    """Scripted (kvstate/targets/api/witnesses.py, in a run with a remote tier; four walks, the
    ci walk's share kept to seconds): B's load paused before its read while A's chunk is
    deleted, then A's hit; a cross-node hit, then B paused before its read while another
    writer's bytes replace a chunk, and after its read while the chunk it read is deleted; its
    read racing a DEL on a stalled server; A and B storing the prefix at once, then A's hit."""
    end = [op("finish", i=1)]
    return {
        "two nodes: a chunk deleted while node B's load waits to read": [
            *to_disk,
            op("node_b_race", b=1, kind=0, when=0),
            *hit,
            *end,
        ],
        "two nodes: a cross-node hit; another writer's bytes before B's read, a DEL after it": [
            *to_disk,
            op("node_b"),
            op("node_b_race", b=N - 1, kind=1, when=0),
            op("node_b_race", b=0, kind=0, when=1),
        ],
        "two nodes: node B's read and a DEL race on a stalled server": [
            *to_disk,
            op("node_b_race", b=1, kind=0, when=2),
        ],
        "two nodes: both store the prefix at once": [
            *to_host,
            op("node_b_store", n=N),
            *hit,
            *end,
        ],
    }


def summary_line(c: Mapping[str, int]) -> str:
    """The run's figures of node B (kvstate/targets/api/run.py's summary), or ""."""
    if not c.get("node B: reads checked"):
        return ""
    changed = sum(c[f"node B: loads paused {w}, the store changed"] for w in WHEN[:2])
    return (
        "  two nodes (node B in its own process): "
        f"cross-node hits {c['node B: cross-node hits']}, "
        f"restores in node B {c['node B: restores']}, its loads failed "
        f"{c['node B: loads failed']}, entries adopted {c['node B: entries adopted']}, "
        f"loads paused at a read {c['node B: loads paused at a read']} (the store changed "
        f"meanwhile {changed}), reads racing a change on a stalled server "
        f"{c['node B: reads racing a change on a stalled server']}, stores at once "
        f"{c['node B: stores at once with node A']}; wrong bytes 0 "
        f"({c['node B: reads checked']} reads checked), leaked blocks in node B 0 "
        f"({c['node B: quiescence checks']} quiescence checks)"
    )
