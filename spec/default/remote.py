"""The remote prefix tier: the default table with a store shared by a fleet of nodes.

A remote copy is an offloaded copy like the disk's (``ckv`` DISK, loaded in the I/O pipeline
under the I/O cap), with one difference the table must state: the store is not the cache's.
Another node deletes or overwrites an entry, the server evicts one chunk under ``maxmemory``,
restarts without persistence, or a TTL expires, at any moment and with no guard the cache
controls (the ``remote_*`` environment actions).  What the cache controls is what it accepts: a
chunk of a remote load is used only once its MAC verifies under the fleet key
(``rload_chunk.authenticated``), checked at every read because the store may have changed since
the last one, and a remote load is done only once every chunk arrived (``rload_done.complete``).
A load that finds a chunk gone can only fail (``load_fail``): the hit is truncated and the
prefix recomputed.

Threat model, in the table's terms: the fleet key is held by the nodes' caches only.  Anyone
with write access to the store but not the key can make ``rmac`` false (delete, evict, write
garbage or another entry's bytes) and so deny a hit, never make a wrong chunk pass
(``remote_truth``: no load ever lands a forged chunk).

Ghost truth added: ``scid`` (the content the store's bytes under the block's key all belong to,
0 when gone or incomplete) and ``forged`` (chunks of the load in flight that are not the block's
content).  The mechanism added: ``remote`` (the offloaded copy is in the remote store) and
``rmac`` (the store's bytes under the block's key verify under the fleet key: what a MAC check
of a read returns).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvstate.spec.expr import AND, B2I, IMPLIES, IN, NOT, OR, array, store
from kvstate.spec.geometry import Geometry, small
from kvstate.spec.layers import DEFAULT_HIT_RULE, HitRule
from kvstate.spec.phases import CKV, Pipe
from kvstate.spec.table import Action, Completeness, Invariant, RecoveryPipelines, Scope, Table, Var

from .common import B, Fn, action, conj
from .ghosts import COPY_DISK

COMPONENT = "On-disk Prefix"

_z = lambda k, N, b: 0  # noqa: E731

REMOTE_VARS = [
    Var("remote", Scope.BLOCK, _z, doc="the offloaded copy is in the remote store (1) or local"),
    Var("rmac", Scope.BLOCK, _z, doc="the store's bytes under the block's key verify (1)"),
    Var("scid", Scope.BLOCK, _z, ghost=True, doc="content the store's bytes belong to (0: gone)"),
    Var("forged", Scope.BLOCK, _z, ghost=True, doc="chunks of the load in flight not its content"),
]


def _remote_io(s: Any, b: Any) -> Any:
    """Block ``b``'s load in flight reads the remote store."""
    return AND(s.ldpipe[b] == Pipe.IO, s.remote[b] == 1)


def _local(doc: str) -> Any:
    return conj("local", lambda s, p: NOT(_remote_io(s, p.b)), doc)


def _put(name: str, value: Fn) -> Fn:
    return lambda s, p: store(s, getattr(s, name), p.b, value(s, p))


# The store acts at any moment: the one conjunct of its actions holds in every state (the clock
# never runs backwards), and nothing the cache does can make it false.
ANYTIME = conj("anytime", lambda s, p: s.now >= 0, "the store acts on its own: no guard of ours")


def _gone(name: str, doc: str) -> Action:
    """An entry (or one of its chunks) no longer there: the store changed, the cache did not."""
    return action(
        name,
        [B],
        [ANYTIME],
        {"rmac": _put("rmac", lambda s, p: 0), "scid": _put("scid", lambda s, p: 0)},
        COMPONENT,
        doc,
    )


def environment_actions() -> list[Action]:
    """What the store does on its own: no guard the cache controls."""
    return [
        _gone("remote_delete", "another node deleted the entry (DEL), or its TTL expired"),
        _gone(
            "remote_evict_chunk",
            "the server evicted one chunk under maxmemory: the entry is partial",
        ),
        action(
            "remote_overwrite",
            [B],
            [ANYTIME],
            {
                "rmac": _put("rmac", lambda s, p: 0),
                "scid": _put("scid", lambda s, p: s.wseq + 1),
                "wseq": lambda s, p: s.wseq + 1,
            },
            COMPONENT,
            "a writer without the fleet key (or for another namespace, model or geometry) wrote "
            "other bytes under the block's key",
        ),
        action(
            "remote_restart",
            [],
            [ANYTIME],
            {
                "rmac": lambda s, p: array(s, lambda b: 0 * b),
                "scid": lambda s, p: array(s, lambda b: 0 * b),
            },
            COMPONENT,
            "the server restarted without persistence: every entry is gone",
        ),
    ]


def cache_actions(load_done: Action) -> list[Action]:
    """What the cache does with the store: store a host copy, read a chunk, finish a load."""
    remote_io = lambda s, p: _remote_io(s, p.b)  # noqa: E731
    return [
        action(
            "rspill",
            [B],
            [conj("on_host", lambda s, p: s.ckv[p.b] == CKV.HOST)],
            {
                "ckv": _put("ckv", lambda s, p: int(CKV.DISK)),
                "remote": _put("remote", lambda s, p: 1),
                "rmac": _put("rmac", lambda s, p: 1),
                "copy": _put("copy", lambda s, p: COPY_DISK),
                "scid": _put("scid", lambda s, p: s.cid[p.b]),
            },
            COMPONENT,
            "host copy stored in the remote store, MAC'd under the fleet key, and dropped "
            "from host",
        ),
        action(
            "rload_chunk",
            [B],
            [
                conj("loading", lambda s, p: s.ckv[p.b] == CKV.LOADING),
                conj("remote_load", remote_io),
                conj("not_done", lambda s, p: s.prog[p.b] < s.k.load_steps),
                conj(
                    "authenticated",
                    lambda s, p: s.rmac[p.b] == 1,
                    "a chunk read from the store is used only once its MAC verifies, at this "
                    "read: the store may have changed since any earlier one",
                ),
            ],
            {
                "prog": _put("prog", lambda s, p: s.prog[p.b] + 1),
                "missing": _put("missing", lambda s, p: s.missing[p.b] - 1),
                "forged": _put(
                    "forged", lambda s, p: s.forged[p.b] + B2I(s.scid[p.b] != s.cid[p.b])
                ),
            },
            COMPONENT,
            "one more chunk of a remote load arrived and verified",
        ),
        replace(
            load_done,
            name="rload_done",
            guard=(
                conj("loading", lambda s, p: s.ckv[p.b] == CKV.LOADING),
                conj("remote_load", remote_io),
                conj(
                    "complete",
                    lambda s, p: s.prog[p.b] == s.k.load_steps,
                    "never serve a hit from a remote load that has not completed",
                ),
            ),
            doc="a remote load completed: as a disk load, without indexer pages",
        ),
    ]


def _with_remote(a: Action) -> Action:
    """The default actions the remote tier touches: local loads stay local; a load starts and
    fails with no forged chunk; a local spill is not remote."""
    if a.name in ("load_progress", "load_done"):
        return replace(a, guard=(*a.guard, _local("a remote load runs by rload_* instead")))
    extra: dict[str, Fn] = {}
    if a.name in ("load_start", "load_fail"):
        extra = {"forged": _put("forged", lambda s, p: 0)}
    elif a.name == "spill":
        extra = {"remote": _put("remote", lambda s, p: 0)}
    if not extra:
        return a
    return replace(a, updates={**a.updates, **extra}, modifies=a.modifies | frozenset(extra))


def remote_invariants() -> list[Invariant]:
    return [
        Invariant(
            "remote_truth",
            "no load lands a chunk that is not its block's content: whatever the store did, a "
            "forged, stale, partial or other tenant's chunk is never taken, so never served "
            "(over ghost truth)",
            "safeguard",
            per_block=lambda s, b: s.forged[b] == 0,
            protected_by=(("rload_chunk", "authenticated"),),
        ),
        Invariant(
            "remote_mechanism",
            "the mechanism implies the truth: bytes that verify under the fleet key are the "
            "block's content while its copy is remote (stored or being loaded from the store)",
            "aux",
            per_block=lambda s, b: AND(
                IN(s.remote[b], (0, 1)),
                IN(s.rmac[b], (0, 1)),
                s.scid[b] >= 0,
                s.scid[b] <= s.wseq,
                IMPLIES(
                    AND(
                        s.remote[b] == 1,
                        s.rmac[b] == 1,
                        OR(
                            s.ckv[b] == CKV.DISK,
                            AND(s.ckv[b] == CKV.LOADING, s.ldpipe[b] == Pipe.IO),
                        ),
                    ),
                    s.scid[b] == s.cid[b],
                ),
            ),
        ),
    ]


def remote_table(geometry: Geometry | None = None, hit_rule: HitRule | None = None) -> Table:
    """The default table with the remote tier: its environment and the cache's remote path."""
    from . import EQUIVALENT, actions, default_table
    from .declarations import reads
    from .invariants import invariants
    from .variables import variables

    base = default_table(geometry or small(), hit_rule)
    rule = hit_rule or DEFAULT_HIT_RULE
    acts = [_with_remote(a) for a in actions(rule)]
    load_done = next(a for a in acts if a.name == "load_done")
    added = [*cache_actions(load_done), *environment_actions()]
    assert base.completeness is not None and base.recovery is not None
    completeness: Completeness = replace(
        base.completeness,
        disturbing=(*base.completeness.disturbing, *(a.name for a in added)),
    )
    recovery: RecoveryPipelines = replace(
        base.recovery, transitions=(*base.recovery.transitions, "rload_chunk", "rload_done")
    )
    return Table.build(
        f"remote[{base.geometry.name}]",
        base.geometry,
        [*variables(), *REMOTE_VARS],
        [*acts, *added],
        [*invariants(rule), *remote_invariants()],
        rule,
        EQUIVALENT,
        reads(),
        completeness,
        base.locality,
        recovery,
        base.coverage,
    )
