"""A remote load driven one table action at a time, the store acting between the actions; and a
chunk the store holds at another size.

The remote walk ran every load as a job: its first step reads all the entry's chunks in one
pipeline (``RemoteTier.read_block``).  A load driven action by action (``test_hooks().act``,
what step-by-step engines call: :mod:`kvstate.targets.api.stepwise` over a directory) reads
each chunk at its own ``load_progress`` (``RemoteTier.read_chunk``, into a buffer of its own)
and the window's section before ``load_done`` (``read_swa``), without the cache's lock; so the
store may change between two chunks of one load, which the remote table allows (its store
actions between two ``rload_chunk`` s).

``ract_step(b)``: the next action of block ``b``'s load (``load_done`` where the guard allows
it, else ``load_progress``).  The scripted walks run a recovery so, the store doing one of
:data:`WORLDS` before the actions of one round: nothing, the entry deleted (``remote_del``, the
table's ``remote_delete``: the load must fail at its next read), or every connection dropped
(``remote_kill``: the pool reconnects, the load goes on).
The harness explains the call as it explains a job's step, and the remote table's lockstep
check (:mod:`kvstate.targets.api.remotecheck`) whether the chunk that landed may have.

``remote_resize(b)``: a chunk of ``b``'s entry replaced by a value one byte short (the table's
``remote_overwrite``: a writer put other bytes under the key): a load of it must fail, never
place a value of another size.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvstate.spec.phases import CKV, Pipe
from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl

# the store's doing before a round of actions (its operations: kvstate/targets/api/remote.py)
WORLDS: tuple[tuple[str, Callable[[int], list[Any]]], ...] = (
    ("nothing", lambda b: []),
    ("the entry deleted", lambda b: [op("remote_del", b=b, kind=0)]),
    ("connections dropped", lambda b: [op("remote_kill")]),
)


def do_ract_step(h: Any, o: Any) -> int | None:
    """``ract_step(b)``: the next action of block ``b``'s load through ``act``."""
    from kvstate.impl.errors import CorruptEntry
    from kvstate.targets.api.remote import remote_of
    from kvstate.targets.api.stepwise import _load

    b = o.arg("b")
    job = _load(h, b)
    if job is None or remote_of(h) is None:
        return None
    rid = h.rids[b]
    action = "load_done" if h.view.can("load_done", rid) else "load_progress"
    m = h.view.meta
    prog = m.prog[rid]
    try:
        h.hooks.act(action, rid)
    except CorruptEntry:
        pass  # the load failed (load_fail), as a job's runner absorbs it
    if m.ckv[rid] == CKV.LOADING and h.view.load_job(rid) is job and m.prog[rid] == prog:
        raise h.fail(
            "act-step",
            [action],
            f"{o.render()}: {action} left the load where it was (record {rid} LOADING at chunk "
            f"{prog}): an allowed action acts, a failed read fails the load",
        )
    where = "remote" if job.pipe is Pipe.IO else "host"
    failed = m.ckv[rid] != CKV.LOADING and action == "load_progress"
    h.cov.add(f"act {action} of a {where} load{' (failed)' if failed else ''}")
    return None


def do_remote_resize(h: Any, o: Any) -> int | None:
    """``remote_resize(b)``: a chunk of ``b``'s entry one byte short on the server."""
    from kvstate.targets.api.remote import WORLD, _entry, _names, _quiet, _store_act, remote_of

    b = o.arg("b")
    e = _entry(h, b)
    if remote_of(h) is None or e is None or not _quiet(h):
        return None
    r = WORLD.admin()  # type: ignore[union-attr]
    _, chunks = _names(h, e)
    value = r.get(chunks[-1])
    if not value:
        return None
    r.set(chunks[-1], value[:-1])
    h.cov.add("fault remote_resize")
    _store_act(h, "remote_overwrite", b=b)
    return None


# only in a run with a remote tier (registry.REMOTE_ONLY), scripted (the ci walk's draws unmoved)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "ract_step",
        do_ract_step,
        "step",
        lambda s: {"b": s.block},
        rule=False,
    ),
    OpDecl(
        "remote_resize",
        do_remote_resize,
        "fault",
        lambda s: {"b": s.block},
        faults=("remote_resize",),
        rule=False,
    ),
)


def walks(
    N: int, full: int, short: list[Any], to_disk: list[Any], hit: list[Any]
) -> dict[str, list[Any]]:
    """Scripted (kvstate/targets/api/witnesses.py, in a run with a remote tier): a recovery of
    stored blocks (with their windows: ``short``) action by action, the store acting before the
    actions of one round each way; a chunk cut short, then a hit."""
    out = {
        f"a remote recovery action by action ({WORLDS[k][0]}, round {r})": [
            *short,
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            *[
                x
                for j in range(3 * N)
                for x in (*(WORLDS[k][1](j % N) if j // N == r else []), op("ract_step", b=j % N))
            ],
            op("drain"),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ]
        for k in range(len(WORLDS))
        for r in ((0, 2) if k == 1 else (0,))
    }
    out["remote: a chunk one byte short"] = [
        *short,
        op("remote_resize", b=0),
        *hit,
        op("finish", i=1),
    ]
    return out
