"""The default table's ghost truth: what is really stored, and each action's effect on it."""

from __future__ import annotations

from typing import Any

from kvstate.spec.expr import AND, ITE, MAX, store
from kvstate.spec.phases import Fmt, Pipe
from kvstate.spec.table import Action, Scope, Var

from .common import Fn

# ---- ghost truth ---------------------------------------------------------------------------
# What is really stored, recorded by the effects themselves and never read by a guard (checked at
# load time): the safeguards are stated over these, the mechanism (ver/iver, gen, phases, prog)
# stays in the guards, and the proofs show the mechanism implies the truth.  An identity is a
# fresh number (wseq + 1) handed out when content is written; 0 means "none".
_G, _BL, _RB = Scope.GLOBAL, Scope.BLOCK, Scope.REQ_BLOCK
_z = lambda k, N, b: 0  # noqa: E731
GHOSTS = [
    Var("wseq", _G, _z, ghost=True, doc="identities handed out so far"),
    Var("occ", _BL, _z, ghost=True, doc="identity of the slot's occupant (0: free)"),
    Var("cid", _BL, _z, ghost=True, doc="identity of the compressed KV content (0: unwritten)"),
    Var("icid", _BL, _z, ghost=True, doc="content the indexer page was built from (0: none)"),
    Var("wocc", _BL, _z, ghost=True, doc="occupant the SWA window rows were built from"),
    Var("tcid", _BL, _z, ghost=True, doc="content the saved compressor state belongs to"),
    Var("missing", _BL, _z, ghost=True, doc="chunks of the block's copy not yet transferred"),
    Var(
        "at",
        _BL,
        lambda k, N, b: b,
        ghost=True,
        address=True,
        doc="address where the block's bytes are",
    ),  # fmt: skip
    Var("form", _BL, lambda k, N, b: int(Fmt.PRIMARY), ghost=True, doc="form of the bytes stored"),
    Var("promised", _BL, _z, ghost=True, doc="residency promised to the scheduler until"),
    Var("copy", _BL, _z, ghost=True, doc="tier holding the block's offloaded copy (COPY_*)"),
    Var(
        "pending", _BL, _z, ghost=True, doc="uncompressed rows appended since the last compression"
    ),
    Var("pcid", _RB, _z, ghost=True, doc="content identities the validated hit names"),
    Var("reading", Scope.REQ, _z, ghost=True, doc="tokens the request computes from (0: none)"),
]


# ``copy``: where the block's offloaded copy really is (what a load reads, what a crash keeps)
COPY_NONE, COPY_HOST, COPY_DISK = 0, 1, 2


def fresh(s: Any) -> Any:
    """The next content identity (the effect also bumps ``wseq``)."""
    return s.wseq + 1


def put(name: str, value: Fn) -> Fn:
    """Ghost update: block variable ``name`` at the acting block gets ``value(s, p)``."""
    return lambda s, p: store(s, getattr(s, name), p.b, value(s, p))


def cleared(*names: str) -> dict[str, Fn]:
    """A freed slot: no occupant, no content, nothing built from it."""
    return {n: put(n, lambda s, p: 0) for n in names}


FREED = ("occ", "cid", "icid", "wocc", "tcid", "pending")


def _ghost_effects() -> dict[str, dict[str, Fn]]:
    """What each action really does to the stored content (the ghost truth's updates)."""
    io = lambda s, p: s.ldpipe[p.b] == Pipe.IO  # noqa: E731
    bump = {"wseq": lambda s, p: s.wseq + 1}
    return {
        "allocate": {
            **bump,
            "pending": put("pending", lambda s, p: 1),
            "at": put("at", lambda s, p: p.a),
            "occ": put("occ", lambda s, p: fresh(s)),
            "cid": put("cid", lambda s, p: 0),
            "form": put("form", lambda s, p: p.f),
        },
        "commit": {
            **bump,
            "cid": put("cid", lambda s, p: fresh(s)),
            "wocc": put("wocc", lambda s, p: s.occ[p.b]),
        },
        "discard": cleared(*FREED),
        "seal": {
            **bump,
            "pending": put("pending", lambda s, p: 0),
            "cid": put("cid", lambda s, p: fresh(s)),
            "tcid": put("tcid", lambda s, p: fresh(s)),
        },
        "slide": {"wocc": put("wocc", lambda s, p: 0)},
        "index_update": {"icid": put("icid", lambda s, p: s.cid[p.b])},
        "rebuild_done": {"icid": put("icid", lambda s, p: s.cid[p.b])},
        "load_start": {"missing": put("missing", lambda s, p: s.k.load_steps)},
        "load_progress": {"missing": put("missing", lambda s, p: s.missing[p.b] - 1)},
        "load_done": {
            "copy": put("copy", lambda s, p: COPY_NONE),
            "at": put("at", lambda s, p: p.a),
            "form": put("form", lambda s, p: ITE(io(s, p), p.f, s.form[p.b])),
            "icid": put("icid", lambda s, p: ITE(io(s, p), 0, s.icid[p.b])),
            "wocc": put(
                "wocc",
                lambda s, p: ITE(AND(io(s, p), not s.k.swa_restored_from_disk), 0, s.wocc[p.b]),
            ),
        },
        "load_fail": {"missing": put("missing", lambda s, p: 0)},
        "offload_done": {"copy": put("copy", lambda s, p: COPY_HOST)},
        "spill": {"copy": put("copy", lambda s, p: COPY_DISK)},
        "drop": {**cleared(*FREED), "copy": put("copy", lambda s, p: COPY_NONE)},
        "evict_done": cleared(*FREED),
        "touch": {
            "promised": put("promised", lambda s, p: MAX(s.promised[p.b], s.now + p.t)),
        },
        "validate": {"pcid": lambda s, p: s.cid},
        "use": {"reading": lambda s, p: s.req(p.r).hit},
        "release": {"reading": lambda s, p: 0},
        "abort": {"reading": lambda s, p: 0},
    }


def with_ghosts(a: Action) -> Action:
    extra = _ghost_effects().get(a.name, {})
    if not extra:
        return a
    return Action(
        a.name,
        a.params,
        a.guard,
        {**a.updates, **extra},
        a.modifies | frozenset(extra),
        a.component,
        a.doc,
    )
