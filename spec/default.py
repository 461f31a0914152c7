"""The default transition table for a DeepSeek-V4-style heterogeneous KV cache.

The abstract state follows one shared prefix chain of LCM blocks (block ``b`` covers tokens
``[b*L, (b+1)*L)``) through the five cache states, plus the requests that hit it, the recovery
pipelines and one captured CUDA graph.  Every guard conjunct is named: the proofs cite them, the
anti-vacuity checks drop them, and seeded-bug variants are derived by removing one.

Read it as the allocator's contract; ``ARCHITECTURE.md`` explains how each reader derives its
own form (guards, Z3 terms, Hypothesis rules, phase graphs, the implementation's hit search).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .expr import AND, B2I, CDIV, IMPLIES, IN, ITE, MAX, NOT, OR, array, store
from .geometry import Geometry, small
from .layers import DEFAULT_HIT_RULE, HitRule
from .phases import CKV, Fmt, Graph, Indexer, Pipe, Req, Swa, Tail
from .table import (
    Action,
    Completeness,
    Conjunct,
    Invariant,
    Locality,
    Param,
    ParamKind,
    PinnedCoverage,
    ReadSafety,
    RecoveryPipelines,
    Scope,
    Table,
    Var,
)

Fn = Callable[..., Any]

B = Param("b", ParamKind.BLOCK)
R = Param("r", ParamKind.REQ)
H = Param("h", ParamKind.TOKENS)
A = Param("a", ParamKind.ADDR)
T = Param("t", ParamKind.TICKS)
F = Param("f", ParamKind.FMT)

ON_DEVICE = (CKV.WRITING, CKV.READY, CKV.OFFLOADING, CKV.LOADING, CKV.EVICTING)
HOLDS_PINS = (Req.PINNED, Req.VALIDATED, Req.USING)
CHECKED = (Req.VALIDATED, Req.USING)
ACTIVE = (Req.WAITING, Req.MATCHED, Req.PINNED, Req.VALIDATED, Req.USING, Req.RECOMPUTE)


def _c(name: str, fn: Fn, doc: str = "") -> Conjunct:
    return Conjunct(name, fn, doc)


def action(
    name: str,
    params: Iterable[Param],
    guard: Iterable[Conjunct],
    updates: dict[str, Fn],
    modifies: Iterable[str],
    component: str,
    doc: str = "",
) -> Action:
    return Action(name, tuple(params), tuple(guard), updates, frozenset(modifies), component, doc)


def covers(s: Any, b: Any, tokens: Any) -> Any:
    """Block ``b`` holds some of the first ``tokens`` tokens."""
    return b * s.k.L < tokens


def unpinned(s: Any, p: Any) -> Any:
    return s.ref[p.b] == 0


def lease_expired(s: Any, p: Any) -> Any:
    return s.lease[p.b] <= s.now


def moved_graph(s: Any, p: Any) -> Any:
    """A captured graph recorded the block's old address: moving the buffer to ``p.a`` makes it
    stale (shared by every action that may place a block in another device slot)."""
    return ITE(AND(s.graph == Graph.CAPTURED, p.a != s.addr[p.b]), int(Graph.STALE), s.graph)


def release_pins(s: Any, p: Any) -> Any:
    pinned = s.req(p.r).pinned
    return array(s, lambda b: s.ref[b] - B2I(covers(s, b, pinned)))


GIVE_UP_FRAME = ("phase", "ref", "pinned", "hit")


def give_up_pins(next_phase: Req) -> dict[str, Fn]:
    """Updates shared by release, abort and downgrade: drop every pin, forget the hit."""
    return {
        "phase": lambda s, p: int(next_phase),
        "ref": release_pins,
        "pinned": lambda s, p: 0,
        "hit": lambda s, p: 0,
    }


def pinned_blocks_total(s: Any) -> Any:
    total: Any = 0
    for r in range(s.k.R):
        total = total + CDIV(s.req(r).pinned, s.k.L)
    return total


def _vars() -> list[Var]:
    G, BL, RQ, RB = Scope.GLOBAL, Scope.BLOCK, Scope.REQ, Scope.REQ_BLOCK
    z = lambda k, N, b: 0  # noqa: E731
    return [
        Var("now", G, z, nonneg=True, doc="scheduler clock, in ticks"),
        Var("graph", G, lambda k, N, b: int(Graph.NONE), Graph, doc="captured CUDA graph"),
        Var("io_inflight", G, z, doc="disk loads in the I/O pipeline (a counter)"),
        Var("nfree", G, lambda k, N, b: N, doc="blocks in phase FREE (a counter)"),
        Var("ckv", BL, lambda k, N, b: int(CKV.FREE), CKV, doc="Compressed KV phase"),
        Var("gen", BL, z, doc="generation: bumped when the slot is reallocated"),
        Var("ref", BL, z, doc="reference count (pins held by requests)"),
        Var("ver", BL, z, doc="version of the compressed KV content"),
        Var("idx", BL, lambda k, N, b: int(Indexer.ABSENT), Indexer, doc="Indexer State phase"),
        Var("iver", BL, z, doc="compressed-KV version the indexer page was built from"),
        Var(
            "tail",
            BL,
            lambda k, N, b: int(Tail.NONE),
            Tail,
            doc="Uncompressed Tail at the boundary after b",
        ),
        Var("swa", BL, lambda k, N, b: int(Swa.NULL), Swa, doc="SWA Window block"),
        Var("lease", BL, z, doc="residency lease: resident until this tick"),
        Var(
            "addr",
            BL,
            lambda k, N, b: b,
            address=True,
            doc="device address of the block's state buffer",
        ),  # fmt: skip
        Var(
            "gaddr",
            BL,
            lambda k, N, b: b,
            address=True,
            doc="address the captured graph recorded",
        ),  # fmt: skip
        Var("prog", BL, lambda k, N, b: k.load_steps, doc="load progress; load_steps = complete"),
        Var("fmt", BL, lambda k, N, b: int(Fmt.PRIMARY), Fmt, doc="stored block form (kernel ABI)"),
        Var(
            "ldpipe",
            BL,
            lambda k, N, b: int(Pipe.NONE),
            Pipe,
            doc="pipeline of the block's transfer job",
        ),
        Var(
            "ixpipe",
            BL,
            lambda k, N, b: int(Pipe.NONE),
            Pipe,
            doc="pipeline of the block's indexer job",
        ),
        Var("phase", RQ, lambda k, N, b: int(Req.IDLE), Req, doc="request phase"),
        Var("hit", RQ, z, doc="candidate / validated hit length, tokens"),
        Var("pinned", RQ, z, doc="tokens whose blocks this request pins ([0, pinned))"),
        Var("deadline", RQ, z, doc="tick by which the request finishes"),
        Var("pgen", RB, z, doc="state_data_ptrs: generation recorded at validation"),
        Var("paddr", RB, z, address=True, doc="state_data_ptrs: address recorded at validation"),
        *GHOSTS,
    ]


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


def _actions(hit_rule: HitRule) -> list[Action]:
    acts: list[Action] = [
        # ---- Compressed KV: write path ---------------------------------------------------
        action(
            "allocate",
            [B, A, F],
            [_c("free", lambda s, p: s.ckv[p.b] == CKV.FREE)],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.WRITING)),
                "addr": lambda s, p: store(s, s.addr, p.b, p.a),
                "graph": moved_graph,
                "gen": lambda s, p: store(s, s.gen, p.b, s.gen[p.b] + 1),
                "tail": lambda s, p: store(s, s.tail, p.b, int(Tail.OPEN)),
                "swa": lambda s, p: store(s, s.swa, p.b, int(Swa.NULL)),
                "idx": lambda s, p: store(s, s.idx, p.b, int(Indexer.ABSENT)),
                "fmt": lambda s, p: store(s, s.fmt, p.b, p.f),
                "nfree": lambda s, p: s.nfree - 1,
            },
            ["ckv", "addr", "graph", "gen", "tail", "swa", "idx", "fmt", "nfree"],
            "Compressed KV",
            "take a free device slot (any: the allocator chooses, a; a moved buffer makes the "
            "graph stale) for new tokens in the form the writer produces (f); a new generation",
        ),
        action(
            "commit",
            [B],
            [_c("writing", lambda s, p: s.ckv[p.b] == CKV.WRITING)],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.READY)),
                "ver": lambda s, p: store(s, s.ver, p.b, s.ver[p.b] + 1),
                "swa": lambda s, p: store(s, s.swa, p.b, int(Swa.VALID)),
            },
            ["ckv", "ver", "swa"],
            "Compressed KV",
            "prefill wrote the block: new content version",
        ),
        action(
            "discard",
            [B],
            [
                _c("writing", lambda s, p: s.ckv[p.b] == CKV.WRITING),
                _c("unpinned", unpinned),
            ],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.FREE)),
                "tail": lambda s, p: store(s, s.tail, p.b, int(Tail.NONE)),
                "nfree": lambda s, p: s.nfree + 1,
            },
            ["ckv", "tail", "nfree"],
            "Compressed KV",
            "the writer was aborted mid-prefill: free the slot",
        ),
        # ---- Uncompressed Tail -----------------------------------------------------------
        action(
            "seal",
            [B],
            [
                _c("open", lambda s, p: s.tail[p.b] == Tail.OPEN),
                _c("committed", lambda s, p: s.ckv[p.b] == CKV.READY),
                _c("unpinned", unpinned, "a shared (pinned) block is immutable"),
            ],
            {
                "tail": lambda s, p: store(s, s.tail, p.b, int(Tail.SEALED)),
                "ver": lambda s, p: store(s, s.ver, p.b, s.ver[p.b] + 1),
            },
            ["tail", "ver"],
            "Uncompressed Tail",
            "compression fired at the boundary: the tail's rows become compressed entries (a new "
            "content version, so the indexer is stale until updated) and the state there is saved",
        ),
        # ---- SWA Window ------------------------------------------------------------------
        action(
            "slide",
            [B],
            [
                _c("valid", lambda s, p: s.swa[p.b] == Swa.VALID),
                _c("unpinned", unpinned, "a pinned hit still needs its window"),
            ],
            {"swa": lambda s, p: store(s, s.swa, p.b, int(Swa.NULL))},
            ["swa"],
            "SWA Window",
            "the window moved past the block: it becomes the null block",
        ),
        # ---- Indexer State ---------------------------------------------------------------
        action(
            "index_update",
            [B],
            [
                _c("committed", lambda s, p: s.ckv[p.b] == CKV.READY),
                _c("no_job", lambda s, p: s.idx[p.b] != Indexer.REBUILDING),
            ],
            {
                "idx": lambda s, p: store(s, s.idx, p.b, int(Indexer.PRESENT)),
                "iver": lambda s, p: store(s, s.iver, p.b, s.ver[p.b]),
            },
            ["idx", "iver"],
            "Indexer State",
            "inline indexer write alongside the compressed KV",
        ),
        action(
            "rebuild_start",
            [B],
            [
                _c(
                    "needed",
                    lambda s, p: OR(
                        s.idx[p.b] == Indexer.ABSENT,
                        AND(s.idx[p.b] == Indexer.PRESENT, s.iver[p.b] != s.ver[p.b]),
                    ),
                ),
                _c(
                    "kv_on_device",
                    lambda s, p: s.ckv[p.b] == CKV.READY,
                    "a CPU job never waits on an I/O job: its input must be resident",
                ),
            ],
            {
                "idx": lambda s, p: store(s, s.idx, p.b, int(Indexer.REBUILDING)),
                "ixpipe": lambda s, p: store(s, s.ixpipe, p.b, int(Pipe.CPU)),
            },
            ["idx", "ixpipe"],
            "Indexer State",
            "queue an indexer rebuild in the CPU pipeline",
        ),
        action(
            "rebuild_done",
            [B],
            [_c("rebuilding", lambda s, p: s.idx[p.b] == Indexer.REBUILDING)],
            {
                "idx": lambda s, p: store(s, s.idx, p.b, int(Indexer.PRESENT)),
                "iver": lambda s, p: store(s, s.iver, p.b, s.ver[p.b]),
                "ixpipe": lambda s, p: store(s, s.ixpipe, p.b, int(Pipe.NONE)),
            },
            ["idx", "iver", "ixpipe"],
            "Indexer State",
            "the rebuilt keys match the current version",
        ),
        # ---- offload: device -> host -> disk --------------------------------------------
        action(
            "offload",
            [B],
            [
                _c("committed", lambda s, p: s.ckv[p.b] == CKV.READY),
                _c(
                    "unpinned",
                    unpinned,
                    "a checked hit reads the device copy: do not start moving it",
                ),
            ],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.OFFLOADING)),
                "ldpipe": lambda s, p: store(s, s.ldpipe, p.b, int(Pipe.DMA)),
            },
            ["ckv", "ldpipe"],
            "On-disk Prefix",
            "copy to host in the DMA pipeline (device copy stays)",
        ),
        action(
            "offload_done",
            [B],
            [
                _c("offloading", lambda s, p: s.ckv[p.b] == CKV.OFFLOADING),
                _c("unpinned", unpinned),
                _c("lease_expired", lease_expired),
                _c("no_cpu_job", lambda s, p: s.idx[p.b] != Indexer.REBUILDING),
            ],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.HOST)),
                "ldpipe": lambda s, p: store(s, s.ldpipe, p.b, int(Pipe.NONE)),
            },
            ["ckv", "ldpipe"],
            "On-disk Prefix",
            "host copy complete; the device slot is released",
        ),
        action(
            "offload_cancel",
            [B],
            [_c("offloading", lambda s, p: s.ckv[p.b] == CKV.OFFLOADING)],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.READY)),
                "ldpipe": lambda s, p: store(s, s.ldpipe, p.b, int(Pipe.NONE)),
            },
            ["ckv", "ldpipe"],
            "On-disk Prefix",
            "a pinned block stays on device: keep the device copy",
        ),
        action(
            "spill",
            [B],
            [_c("on_host", lambda s, p: s.ckv[p.b] == CKV.HOST)],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.DISK)),
            },
            ["ckv"],
            "On-disk Prefix",
            "host copy written to disk (atomically) and dropped from host",
        ),
        # ---- recovery: load back to device -----------------------------------------------
        action(
            "load_start",
            [B],
            [
                _c("offloaded", lambda s, p: IN(s.ckv[p.b], (CKV.HOST, CKV.DISK))),
                _c(
                    "io_cap",
                    lambda s, p: IMPLIES(s.ckv[p.b] == CKV.DISK, s.io_inflight < s.k.io_cap),
                    "admission cap: disk recoveries in flight stay within the I/O bandwidth",
                ),
            ],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.LOADING)),
                "ldpipe": lambda s, p: store(
                    s, s.ldpipe, p.b, ITE(s.ckv[p.b] == CKV.DISK, int(Pipe.IO), int(Pipe.DMA))
                ),
                "prog": lambda s, p: store(s, s.prog, p.b, 0),
                "io_inflight": lambda s, p: s.io_inflight + B2I(s.ckv[p.b] == CKV.DISK),
            },
            ["ckv", "ldpipe", "prog", "io_inflight"],
            "On-disk Prefix",
            "start an asynchronous load: disk loads in the I/O pipeline, host copies in DMA",
        ),
        action(
            "load_progress",
            [B],
            [
                _c("loading", lambda s, p: s.ckv[p.b] == CKV.LOADING),
                _c("not_done", lambda s, p: s.prog[p.b] < s.k.load_steps),
            ],
            {"prog": lambda s, p: store(s, s.prog, p.b, s.prog[p.b] + 1)},
            ["prog"],
            "On-disk Prefix",
            "one more chunk of the load landed",
        ),
        action(
            "load_done",
            [B, A, F],
            [
                _c("loading", lambda s, p: s.ckv[p.b] == CKV.LOADING),
                _c(
                    "complete",
                    lambda s, p: s.prog[p.b] == s.k.load_steps,
                    "never use a partial load",
                ),
            ],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.READY)),
                "addr": lambda s, p: store(s, s.addr, p.b, p.a),
                "graph": moved_graph,
                "io_inflight": lambda s, p: s.io_inflight - B2I(s.ldpipe[p.b] == Pipe.IO),
                "ldpipe": lambda s, p: store(s, s.ldpipe, p.b, int(Pipe.NONE)),
                "idx": lambda s, p: store(
                    s, s.idx, p.b, ITE(s.ldpipe[p.b] == Pipe.IO, int(Indexer.ABSENT), s.idx[p.b])
                ),
                "swa": lambda s, p: store(
                    s,
                    s.swa,
                    p.b,
                    ITE(
                        AND(s.ldpipe[p.b] == Pipe.IO, not s.k.swa_restored_from_disk),
                        int(Swa.NULL),
                        s.swa[p.b],
                    ),
                ),
                "fmt": lambda s, p: store(
                    s, s.fmt, p.b, ITE(s.ldpipe[p.b] == Pipe.IO, p.f, s.fmt[p.b])
                ),
            },
            ["ckv", "addr", "graph", "io_inflight", "ldpipe", "idx", "swa", "fmt"],
            "On-disk Prefix",
            "the load completed into a (possibly new) device slot; a moved buffer makes the graph stale; "
            "disk loads come back without indexer pages and in the file's stored form",
        ),
        action(
            "load_fail",
            [B],
            [_c("loading", lambda s, p: s.ckv[p.b] == CKV.LOADING)],
            {
                "ckv": lambda s, p: store(
                    s, s.ckv, p.b, ITE(s.ldpipe[p.b] == Pipe.IO, int(CKV.DISK), int(CKV.HOST))
                ),
                "io_inflight": lambda s, p: s.io_inflight - B2I(s.ldpipe[p.b] == Pipe.IO),
                "ldpipe": lambda s, p: store(s, s.ldpipe, p.b, int(Pipe.NONE)),
                "prog": lambda s, p: store(s, s.prog, p.b, s.k.load_steps),
            },
            ["ckv", "io_inflight", "ldpipe", "prog"],
            "On-disk Prefix",
            "the load failed: the source stays where it was, the hit is truncated and recomputed",
        ),
        action(
            "drop",
            [B],
            [
                _c("offloaded", lambda s, p: IN(s.ckv[p.b], (CKV.HOST, CKV.DISK))),
                _c("unpinned", unpinned, "a pinned host/disk source may still be loaded"),
                _c("lease_expired", lease_expired),
            ],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.FREE)),
                "tail": lambda s, p: store(s, s.tail, p.b, int(Tail.NONE)),
                "swa": lambda s, p: store(s, s.swa, p.b, int(Swa.NULL)),
                "idx": lambda s, p: store(s, s.idx, p.b, int(Indexer.ABSENT)),
                "nfree": lambda s, p: s.nfree + 1,
            },
            ["ckv", "tail", "swa", "idx", "nfree"],
            "On-disk Prefix",
            "delete the host/disk copy",
        ),
        # ---- eviction and residency ------------------------------------------------------
        action(
            "evict_start",
            [B],
            [
                _c("committed", lambda s, p: s.ckv[p.b] == CKV.READY),
                _c("unpinned", unpinned, "TOCTOU: never evict a block a checked request holds"),
                _c("lease_expired", lease_expired),
                _c("no_cpu_job", lambda s, p: s.idx[p.b] != Indexer.REBUILDING),
            ],
            {"ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.EVICTING))},
            ["ckv"],
            "Compressed KV",
            "reclaim an unreferenced device block",
        ),
        action(
            "evict_done",
            [B],
            [_c("evicting", lambda s, p: s.ckv[p.b] == CKV.EVICTING)],
            {
                "ckv": lambda s, p: store(s, s.ckv, p.b, int(CKV.FREE)),
                "tail": lambda s, p: store(s, s.tail, p.b, int(Tail.NONE)),
                "swa": lambda s, p: store(s, s.swa, p.b, int(Swa.NULL)),
                "idx": lambda s, p: store(s, s.idx, p.b, int(Indexer.ABSENT)),
                "nfree": lambda s, p: s.nfree + 1,
            },
            ["ckv", "tail", "swa", "idx", "nfree"],
            "Compressed KV",
            "the slot is free again",
        ),
        action(
            "touch",
            [B, T],
            [_c("resident", lambda s, p: NOT(IN(s.ckv[p.b], (CKV.FREE, CKV.EVICTING))))],
            {
                "lease": lambda s, p: store(s, s.lease, p.b, MAX(s.lease[p.b], s.now + p.t)),
            },
            ["lease"],
            "Compressed KV",
            "extend a residency lease (never shortens it)",
        ),
        action(
            "tick",
            [T],
            [_c("always", lambda s, p: True)],
            {"now": lambda s, p: s.now + p.t},
            ["now"],
            "Scheduler",
            "time passes (t ticks)",
        ),
        # ---- CUDA graph ------------------------------------------------------------------
        action(
            "capture",
            [],
            [_c("none", lambda s, p: s.graph == Graph.NONE)],
            {
                "graph": lambda s, p: int(Graph.CAPTURED),
                "gaddr": lambda s, p: s.addr,
            },
            ["graph", "gaddr"],
            "CUDA Graph",
            "capture over the persistent buffers; record their addresses",
        ),
        action(
            "replay",
            [],
            [_c("captured", lambda s, p: s.graph == Graph.CAPTURED)],
            {},
            [],
            "CUDA Graph",
            "replay the captured graph (reads the recorded addresses)",
        ),
        action(
            "recapture",
            [],
            [_c("stale", lambda s, p: s.graph == Graph.STALE)],
            {
                "graph": lambda s, p: int(Graph.CAPTURED),
                "gaddr": lambda s, p: s.addr,
            },
            ["graph", "gaddr"],
            "CUDA Graph",
            "recapture after a recovery moved a buffer",
        ),
        # ---- requests --------------------------------------------------------------------
        action(
            "admit",
            [R, T],
            [_c("idle", lambda s, p: s.req(p.r).phase == Req.IDLE)],
            {
                "phase": lambda s, p: int(Req.WAITING),
                "deadline": lambda s, p: s.now + p.t,
                "hit": lambda s, p: 0,
            },
            ["phase", "deadline", "hit"],
            "Request",
            "admit a request that will live t ticks",
        ),
        action(
            "match",
            [R, H],
            [
                _c("waiting", lambda s, p: s.req(p.r).phase == Req.WAITING),
                _c("in_pool", lambda s, p: AND(p.h >= 0, p.h <= s.N * s.k.L)),
            ],
            {
                "phase": lambda s, p: int(Req.MATCHED),
                "hit": lambda s, p: p.h,
            },
            ["phase", "hit"],
            "Request",
            "prefix-hash lookup: a candidate length; nothing is locked",
        ),
        action(
            "pin",
            [R],
            [
                _c("matched", lambda s, p: s.req(p.r).phase == Req.MATCHED),
                _c(
                    "present",
                    lambda s, p: s.forall_blocks(
                        0,
                        CDIV(s.req(p.r).hit, s.k.L),
                        lambda b: NOT(IN(s.ckv[b], (CKV.FREE, CKV.EVICTING))),
                    ),
                    "only existing blocks can be pinned",
                ),
                _c(
                    "pin_cap",
                    lambda s, p: (
                        pinned_blocks_total(s) + CDIV(s.req(p.r).hit, s.k.L) <= s.k.pin_cap
                    ),
                    "admission cap: pinned blocks stay within capacity",
                ),
            ],
            {
                "phase": lambda s, p: int(Req.PINNED),
                "pinned": lambda s, p: s.req(p.r).hit,
                "ref": lambda s, p: array(
                    s, lambda b: s.ref[b] + B2I(covers(s, b, s.req(p.r).hit))
                ),
            },
            ["phase", "pinned", "ref"],
            "Request",
            "take reference counts on the hit's blocks",
        ),
        action(
            "validate",
            [R],
            [
                _c(
                    "pinned",
                    lambda s, p: s.req(p.r).phase == Req.PINNED,
                    "check only under pins, so the check stays true until use",
                ),
                *[
                    _c(
                        rule.qualname,
                        (
                            lambda rule: (
                                lambda s, p: hit_rule.rule_holds(rule, s, p.r, s.req(p.r).hit)  # noqa: B023
                            )
                        )(rule),
                        rule.doc,
                    )
                    for rule in hit_rule.rules
                ],
            ],
            {
                "phase": lambda s, p: int(Req.VALIDATED),
                "pgen": lambda s, p: s.gen,
                "paddr": lambda s, p: s.addr,
            },
            ["phase", "pgen", "paddr"],
            "Request",
            "the four layers hold: record state_data_ptrs (generations and addresses)",
        ),
        action(
            "use",
            [R],
            [
                _c("checked", lambda s, p: IN(s.req(p.r).phase, (Req.VALIDATED, Req.RECOMPUTE))),
            ],
            {"phase": lambda s, p: int(Req.USING)},
            ["phase"],
            "Request",
            "compute from the hit",
        ),
        action(
            "release",
            [R],
            [_c("using", lambda s, p: s.req(p.r).phase == Req.USING)],
            give_up_pins(Req.IDLE),
            GIVE_UP_FRAME,
            "Request",
            "finish: drop the pins",
        ),
        action(
            "abort",
            [R],
            [_c("active", lambda s, p: IN(s.req(p.r).phase, ACTIVE))],
            give_up_pins(Req.IDLE),
            GIVE_UP_FRAME,
            "Request",
            "abort at any point; in-flight loads finish in their pipeline, so nothing is reused mid-write",
        ),
        action(
            "downgrade",
            [R],
            [
                _c(
                    "unchecked",
                    lambda s, p: IN(s.req(p.r).phase, (Req.MATCHED, Req.PINNED)),
                    "a hit that cannot pass (cap, failed load, layer) is never blocked forever",
                ),
            ],
            give_up_pins(Req.RECOMPUTE),
            GIVE_UP_FRAME,
            "Request",
            "give up the hit and recompute from scratch",
        ),
    ]
    return [_with_ghosts(a) for a in acts]


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


def _with_ghosts(a: Action) -> Action:
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


def _in_hit(s: Any, r: int, b: Any) -> Any:
    return AND(IN(s.req(r).phase, CHECKED), covers(s, b, s.req(r).hit))


def _in_window(s: Any, r: int, b: Any) -> Any:
    nb = CDIV(s.req(r).hit, s.k.L)
    return AND(IN(s.req(r).phase, CHECKED), nb - s.k.W <= b, b < nb)


def _at_boundary(s: Any, r: int, b: Any) -> Any:
    return AND(IN(s.req(r).phase, CHECKED), b == CDIV(s.req(r).hit, s.k.L) - 1)


def hit_truth(s: Any, r: int, b: Any) -> Any:
    """What a checked request reads at block ``b`` really is what its hit names."""
    return AND(
        IMPLIES(
            _in_hit(s, r, b),
            AND(
                s.cid[b] != 0,
                s.cid[b] == s.req(r).pcid[b],
                s.icid[b] == s.cid[b],
                s.missing[b] == 0,
                IN(s.form[b], s.k.supported_fmts),
                s.req(r).paddr[b] == s.at[b],
            ),
        ),
        IMPLIES(_in_window(s, r, b), AND(s.occ[b] != 0, s.wocc[b] == s.occ[b])),
        IMPLIES(_at_boundary(s, r, b), s.tcid[b] == s.cid[b]),
    )


def _truth_invariants() -> list[Invariant]:
    return [
        Invariant(
            "hit_truth",
            "a checked request's every state was built from the content its hit names: the "
            "compressed KV is the content recorded at validation and never changes until "
            "release, the indexer pages were built from it, the window rows from the current "
            "occupant, the saved compressor state from it at the boundary, every chunk of every "
            "load arrived, the bytes have a kernel, and the recorded addresses are where the "
            "bytes are (over ghost truth)",
            "safeguard",
            per_request=True,
            per_block=hit_truth,
        ),
        Invariant(
            "reading_truth",
            "a request computing from a hit keeps its pins and its checked hit until it "
            "finishes or aborts (over ghost truth: what it reads, not its phase)",
            "safeguard",
            per_request=True,
            scalar=lambda s, r: AND(
                s.req(r).reading >= 0,
                IMPLIES(
                    s.req(r).reading > 0,
                    AND(
                        s.req(r).pinned == s.req(r).reading,
                        s.req(r).hit == s.req(r).reading,
                        s.req(r).phase == Req.USING,
                    ),
                ),
            ),
        ),
        Invariant(
            "graph_truth",
            "a replayable graph reads where the bytes are (over ghost truth)",
            "safeguard",
            per_block=lambda s, b: IMPLIES(s.graph == Graph.CAPTURED, s.gaddr[b] == s.at[b]),
        ),
        Invariant(
            "load_truth",
            "a block not being loaded has all its bytes: a load counts as done only when every "
            "chunk arrived (over ghost truth)",
            "safeguard",
            per_block=lambda s, b: AND(
                IMPLIES(s.ckv[b] != CKV.LOADING, s.missing[b] == 0), s.missing[b] >= 0
            ),
        ),
        Invariant(
            "mechanism_truth",
            "the mechanism implies the truth: versions (ver/iver) say when an indexer page was "
            "built from the current content, phases say which derived state belongs to the "
            "slot's live occupant, prog counts the chunks that arrived, addr and fmt are where "
            "and in which form the bytes are, lease is the residency promised, an open tail "
            "has rows not yet compressed, the phase and "
            "the load's pipeline say which tier holds the offloaded copy; every identity is "
            "one already handed out",
            "aux",
            per_block=lambda s, b: AND(
                s.prog[b] + s.missing[b] == s.k.load_steps,
                s.addr[b] == s.at[b],
                s.fmt[b] == s.form[b],
                s.lease[b] == s.promised[b],
                (s.tail[b] == Tail.OPEN) == (s.pending[b] != 0),
                s.copy[b]
                == ITE(
                    s.ckv[b] == CKV.HOST,
                    COPY_HOST,
                    ITE(
                        s.ckv[b] == CKV.DISK,
                        COPY_DISK,
                        ITE(
                            s.ckv[b] == CKV.LOADING,
                            ITE(s.ldpipe[b] == Pipe.IO, COPY_DISK, COPY_HOST),
                            COPY_NONE,
                        ),
                    ),
                ),
                s.iver[b] <= s.ver[b],
                IMPLIES(
                    AND(s.idx[b] == Indexer.PRESENT, s.iver[b] == s.ver[b]),
                    AND(s.icid[b] == s.cid[b], s.cid[b] != 0),
                ),
                IMPLIES(
                    s.swa[b] == Swa.VALID,
                    AND(s.wocc[b] == s.occ[b], s.occ[b] != 0, s.cid[b] != 0),
                ),
                IMPLIES(s.tail[b] == Tail.SEALED, AND(s.tcid[b] == s.cid[b], s.cid[b] != 0)),
                IMPLIES(s.tail[b] != Tail.NONE, s.occ[b] != 0),
                (s.ckv[b] == CKV.FREE) == (s.occ[b] == 0),
                IN(s.ckv[b], (CKV.FREE, CKV.WRITING)) == (s.cid[b] == 0),
                s.occ[b] >= 0,
                s.occ[b] <= s.wseq,
                s.cid[b] >= 0,
                s.cid[b] <= s.wseq,
                s.icid[b] <= s.wseq,
                s.tcid[b] <= s.wseq,
            ),
        ),
    ]


def _invariants(hit_rule: HitRule) -> list[Invariant]:
    return _truth_invariants() + [
        Invariant(
            "refcount",
            "reference counts equal the pins the requests hold (so never negative), and a free "
            "block is referenced by no one (no double free, no use after free)",
            "safety",
            per_block=lambda s, b: AND(
                s.ref[b] == sum_pins(s, b),
                IMPLIES(IN(s.ckv[b], (CKV.FREE, CKV.EVICTING)), s.ref[b] == 0),
            ),
            protected_by=(("pin", "present"),),
            tight=(("discard", "unpinned"), ("drop", "unpinned")),
        ),
        Invariant(
            "toctou",
            "between check and use, no block in a validated request's state_data_ptrs is evicted, "
            "freed, overwritten or moved, and its generation does not change",
            "safeguard",
            per_request=True,
            per_block=lambda s, r, b: IMPLIES(
                AND(IN(s.req(r).phase, CHECKED), covers(s, b, s.req(r).hit)),
                AND(
                    s.ref[b] >= 1,
                    s.ckv[b] == CKV.READY,
                    s.gen[b] == s.req(r).pgen[b],
                    s.addr[b] == s.req(r).paddr[b],
                ),
            ),
            protected_by=(("evict_start", "unpinned"), ("validate", "pinned")),
        ),
        Invariant(
            "graph_topology",
            "a captured (replayable) graph's recorded addresses are the current ones; a recovery "
            "that moves a buffer makes the graph stale until recaptured",
            "safeguard",
            per_block=lambda s, b: IMPLIES(s.graph == Graph.CAPTURED, s.gaddr[b] == s.addr[b]),
        ),
        Invariant(
            "admission_cap",
            "disk recoveries in flight stay within the I/O cap, and pinned blocks within capacity",
            "safeguard",
            scalar=lambda s: AND(
                s.io_inflight <= s.k.io_cap, pinned_blocks_total(s) <= s.k.pin_cap
            ),
            protected_by=(("load_start", "io_cap"), ("pin", "pin_cap")),
            tight=(("load_start", "io_cap"), ("pin", "pin_cap")),
        ),
        Invariant(
            "separation",
            "each recovery job sits only in its own state's pipeline (transfers in IO/DMA, indexer "
            "work in CPU), and a CPU job never waits on an I/O job",
            "safeguard",
            per_block=lambda s, b: AND(
                (IN(s.ckv[b], (CKV.LOADING, CKV.OFFLOADING))) == (s.ldpipe[b] != Pipe.NONE),
                IN(s.ldpipe[b], (Pipe.NONE, Pipe.IO, Pipe.DMA)),
                IMPLIES(s.ckv[b] == CKV.OFFLOADING, s.ldpipe[b] == Pipe.DMA),
                (s.idx[b] == Indexer.REBUILDING) == (s.ixpipe[b] == Pipe.CPU),
                IN(s.ixpipe[b], (Pipe.NONE, Pipe.CPU)),
                IMPLIES(s.idx[b] == Indexer.REBUILDING, IN(s.ckv[b], (CKV.READY, CKV.OFFLOADING))),
            ),
            protected_by=(("rebuild_start", "kv_on_device"), ("offload_done", "no_cpu_job")),
        ),
        Invariant(
            "hit_soundness",
            "a checked request (validated or using) satisfies all four layers L1..L4 at its hit",
            "safeguard",
            per_request=True,
            per_block=lambda s, r, b: IMPLIES(
                IN(s.req(r).phase, CHECKED), hit_rule.block_ok(s, r, s.req(r).hit, b)
            ),
            scalar=lambda s, r: IMPLIES(
                IN(s.req(r).phase, CHECKED), hit_rule.scalar_ok(s, r, s.req(r).hit)
            ),
            # Not listed (the prover would call them vacuous, rightly): L3.disk_loaded is defence
            # in depth (ckv_ready plus load_integrity imply it), and L4.splice_aligned is implied
            # by L1's LCM alignment on the preset geometries; it matters for custom layouts.
            protected_by=tuple(
                ("validate", rule.qualname)
                for rule in hit_rule.rules
                if rule.qualname not in ("L3.disk_loaded", "L4.splice_aligned")
            ),
        ),
        Invariant(
            "load_integrity",
            "only a block whose load is in flight is partially loaded",
            "safety",
            per_block=lambda s, b: AND(
                IMPLIES(s.ckv[b] != CKV.LOADING, s.prog[b] == s.k.load_steps),
                s.prog[b] >= 0,
                s.prog[b] <= s.k.load_steps,
            ),
            protected_by=(("load_done", "complete"),),
            tight=(("load_progress", "not_done"),),
        ),
        Invariant(
            "request_hygiene",
            "pins are held exactly by requests in a pinned phase, over exactly their hit",
            "aux",
            per_request=True,
            scalar=lambda s, r: AND(
                s.req(r).hit >= 0,
                s.req(r).pinned >= 0,
                s.req(r).hit <= s.N * s.k.L,
                IMPLIES(IN(s.req(r).phase, HOLDS_PINS), s.req(r).pinned == s.req(r).hit),
                IMPLIES(NOT(IN(s.req(r).phase, HOLDS_PINS)), s.req(r).pinned == 0),
                IMPLIES(
                    IN(s.req(r).phase, (Req.IDLE, Req.WAITING, Req.RECOMPUTE)), s.req(r).hit == 0
                ),
            ),
        ),
        Invariant(
            "domains",
            "phase variables hold phases of their own lifecycle",
            "aux",
            per_block=lambda s, b: AND(
                IN(s.ckv[b], list(CKV)),
                IN(s.idx[b], list(Indexer)),
                IN(s.tail[b], list(Tail)),
                IN(s.swa[b], list(Swa)),
                IN(s.fmt[b], list(Fmt)),
                IN(s.ldpipe[b], list(Pipe)),
                IN(s.ixpipe[b], list(Pipe)),
                s.lease[b] >= 0,
            ),
            scalar=lambda s: AND(
                IN(s.graph, list(Graph)),
                s.now >= 0,
                *[IN(s.req(r).phase, list(Req)) for r in range(s.k.R)],
                *[s.req(r).deadline >= 0 for r in range(s.k.R)],
            ),
        ),
        Invariant(
            "ghost_counters",
            "free plus used equals capacity: nfree counts the FREE blocks and io_inflight the "
            "loads in the I/O pipeline (a count over blocks: checked bounded, see report)",
            "safety",
            scalar=lambda s: AND(
                s.nfree == count_blocks(s, lambda b: s.ckv[b] == CKV.FREE),
                s.io_inflight == count_blocks(s, lambda b: s.ldpipe[b] == Pipe.IO),
                s.nfree >= 0,
                s.nfree <= s.N,
                s.io_inflight >= 0,
            ),
            bounded=True,
        ),
    ]


def _reads() -> list[ReadSafety]:
    """What the reading actions read, and why it is safe (action-level obligations)."""
    return [
        ReadSafety(
            "replay",
            "recorded_addresses_current",
            "replaying the graph reads every recorded address: each is where the bytes are",
            per_block=lambda s, p, b: s.gaddr[b] == s.at[b],
            protected_by=("captured",),
        ),
        ReadSafety(
            "use",
            "hit_states_true",
            "computing from the hit reads every state of the hit: each was built from the "
            "content the hit names, loaded whole, in a form with a kernel, at the recorded address",
            per_block=lambda s, p, b: AND(
                hit_truth(s, p.r, b),
                IMPLIES(
                    covers(s, b, s.req(p.r).hit),
                    AND(IN(s.req(p.r).phase, CHECKED), s.ckv[b] == CKV.READY),
                ),
            ),
            protected_by=("checked",),
        ),
        *[
            ReadSafety(
                a,
                "promise_kept",
                f"{a} takes the block's residency away only once the residency promised to the "
                "scheduler (touch, L1's lease) has run out (over ghost truth)",
                scalar=lambda s, p: s.promised[p.b] <= s.now,
                tight=("lease_expired",),
            )
            for a in ("evict_start", "offload_done", "drop")
        ],
        ReadSafety(
            "seal",
            "rows_pending",
            "compression fires on rows that are there: a boundary is compressed once (over "
            "ghost truth: the rows appended since the last compression)",
            scalar=lambda s, p: s.pending[p.b] != 0,
            tight=("open",),
        ),
    ]


def stored(s: Any, n: Any) -> Any:
    """Blocks ``[0, n)`` are stored, sealed at the boundary and indexed, and promised resident
    past now: over ghost truth only (what was written, not what the mechanism recorded)."""
    return AND(
        n >= 1,
        n <= s.N,
        s.forall_blocks(
            0,
            n,
            lambda b: AND(
                s.cid[b] != 0,
                s.icid[b] == s.cid[b],
                s.missing[b] == 0,
                IN(s.form[b], s.k.supported_fmts),
                s.promised[b] >= s.now + 1,
                IMPLIES(b >= n - s.k.W, AND(s.occ[b] != 0, s.wocc[b] == s.occ[b])),
                IMPLIES(b == n - 1, s.tcid[b] == s.cid[b]),
            ),
        ),
    )


COMPLETENESS = Completeness(
    doc="after a request stores, seals and indexes a prefix (and keeps it resident), with no "
    "eviction, move or fault in between, a new request for the same prefix is validated at the "
    "full LCM-aligned length",
    write_path=(
        "allocate",
        "commit",
        "seal",
        "index_update",
        "rebuild_start",
        "rebuild_done",
        "touch",
    ),
    disturbing=(
        "discard",
        "slide",
        "offload",
        "offload_done",
        "offload_cancel",
        "spill",
        "load_start",
        "load_progress",
        "load_done",
        "load_fail",
        "drop",
        "evict_start",
        "evict_done",
    ),
    read_path=("admit", "match", "pin", "validate"),
    stored=stored,
)


RECOVERY = RecoveryPipelines(
    transitions=(
        "offload_cancel",  # a pinned block stays on device: cancel its offload
        "load_start",
        "load_progress",
        "load_done",
        "rebuild_start",
        "rebuild_done",
    ),
    deferred=(("load_start", "io_cap"),),  # past the cap a disk load queues; it still runs
    fired=("offload_cancel", "load_start", "rebuild_start"),
    pipes=("ldpipe", "ixpipe"),
    restores={Pipe.IO: "On-disk Prefix", Pipe.DMA: "Compressed KV", Pipe.CPU: "Indexer State"},
)


LOCALITY = [
    Locality(
        a,
        f"{a} judges a hit by the hit's own blocks: nothing past it can refuse it",
        lambda s, p, b: covers(s, b, s.req(p.r).hit),
    )
    for a in ("pin", "validate")
]


# A request gives up its pins (abort, downgrade) while a pinned block is in each phase it can
# hold one in: written, resident, and each recovery phase.
COVERAGE = [
    PinnedCoverage(
        ("abort", "downgrade"),
        "ckv",
        tuple(
            int(x)
            for x in (CKV.WRITING, CKV.READY, CKV.OFFLOADING, CKV.HOST, CKV.DISK, CKV.LOADING)
        ),
        "a request gives up its pins while a pinned block is in each phase it can be pinned in",
    )
]


def sum_pins(s: Any, b: Any) -> Any:
    """Pins on block ``b``: one per request whose pinned range covers it (requests expanded)."""
    total: Any = 0
    for r in range(s.k.R):
        total = total + B2I(covers(s, b, s.req(r).pinned))
    return total


def count_blocks(s: Any, pred: Callable[[Any], Any]) -> Any:
    """Number of pool blocks satisfying ``pred``: needs a concrete pool (bounded checks only)."""
    if not isinstance(s.N, int):
        raise TypeError("count_blocks needs a concrete pool size")
    total: Any = 0
    for b in range(s.N):
        total = total + B2I(pred(b))
    return total


def default_table(geometry: Geometry | None = None, hit_rule: HitRule | None = None) -> Table:
    """The default table, on the small geometry unless another is given."""
    g = geometry or small()
    rule = hit_rule or DEFAULT_HIT_RULE
    return Table.build(
        f"default[{g.name}]",
        g,
        _vars(),
        _actions(rule),
        _invariants(rule),
        rule,
        EQUIVALENT,
        _reads(),
        COMPLETENESS,
        LOCALITY,
        RECOVERY,
        COVERAGE,
    )


# Mutants (``kvstate mutate`` ids) that change nothing the properties can see: one line each.
EQUIVALENT: dict[str, str] = {
    "drop-guard:recapture": "recapturing a graph that is not stale records the current "
    "addresses again: what replay reads stays where the bytes are",
    "drop-guard:capture": "capturing over a captured or stale graph records the current "
    "addresses: what replay reads stays where the bytes are",
    "drop-guard:tick": "its guard is already True",
    "skip-reset:allocate.gen": "a checked hit's blocks are pinned and a pinned block is never "
    "freed, so its generation cannot change while checked either way; gen is the "
    "implementation's cross-check of the pins",
    "skip-reset:allocate.idx": "a free block's page is never synced (FREE means cid = 0, and a "
    "synced page needs cid != 0: mechanism_truth); evict_done and drop reset it anyway",
    "skip-reset:allocate.swa": "a free block's window is already NULL (FREE means no occupant, "
    "and a VALID window needs one: mechanism_truth); evict_done and drop reset it",
    "forget-update:commit.ver": "a block being written has no synced indexer page (cid = 0 while "
    "WRITING), so there is nothing for this bump to invalidate; seal's bump is the one that is",
    "forget-update:load_done.swa": "on this geometry SWA is restored from disk "
    "(swa_disk_policy full): the update is the identity",
    "forget-update:admit.hit": "an IDLE request's hit is already 0 (request_hygiene): the "
    "reset is the identity",
    "drop-guard:touch": "extending the lease of a free or evicting block only changes when its "
    "next occupant may be evicted: leases are residency policy, pins protect what is read",
    "forget-update:tick.now": "a clock that stands still only keeps leases from expiring "
    "(nothing is evicted, offloaded or dropped); no property asks time to pass",
    "off-by-one-update:tick.now": "one tick more only expires leases sooner; eviction still "
    "needs an unpinned block",
    "forget-update:admit.deadline": "the deadline only feeds the lease check (L1.lease_covers), "
    "a residency policy: pins, not leases, keep a checked hit resident",
    "drop-guard:release": "release from another phase drops the pins the request holds and "
    "forgets its hit, exactly as abort does (from IDLE: nothing to drop)",
    "forget-update:release.phase": "the request stays USING with no pins, an empty hit and "
    "nothing read (reading = 0); release or abort returns it to IDLE",
    "drop-guard:abort": "the guard only excludes IDLE, and aborting an IDLE request drops no "
    "pins and forgets an empty hit: the identity",
    "forget-update:abort.phase": "the request keeps its phase with no pins, an empty hit and "
    "nothing read (reading = 0); abort or release returns it to IDLE",
    "off-by-one-update:commit.ver": "a content version only has to change when the content "
    "does (the indexer is synced when iver == ver): a bump of 2 is as fresh as a bump of 1",
    "off-by-one-update:seal.ver": "a content version only has to change when the content does "
    "(the indexer is synced when iver == ver): a bump of 2 is as fresh as a bump of 1",
    "off-by-one-update:allocate.gen": "a generation only has to differ from the one a "
    "validated request recorded (toctou compares for equality): +2 differs as +1 does",
    "drop-conjunct:slide.valid": "sliding a NULL window writes NULL again and clears the "
    "ghost wocc, which is read only where the window is VALID",
    "swap-phase:capture.graph[CAPTURED<->STALE]": "a capture that leaves the graph STALE is "
    "recaptured (recording the current addresses) before any replay: a wasted capture",
    "swap-phase:recapture.graph[CAPTURED<->NONE]": "a recapture that leaves no graph is "
    "followed by a capture (recording the current addresses) before any replay",
    "swap-phase:release.phase[IDLE<->WAITING]": "the request is left admitted with no pins, "
    "no hit and nothing read: every later step is one an admitted request may take",
    "swap-phase:abort.phase[IDLE<->WAITING]": "the request is left admitted with no pins, no "
    "hit and nothing read: every later step is one an admitted request may take",
    "drop-conjunct:offload_done.unpinned": "only an unchecked (PINNED) request can pin an "
    "OFFLOADING block (validate needs READY): finishing the offload costs it its hit "
    "(validation fails, it downgrades), never a wrong read; no property promises an unchecked "
    "pin its hit",
    "off-by-one-compare:offload_done.unpinned[ref-1]": "as drop-conjunct:offload_done.unpinned "
    "for a block one unchecked request pins: a lost hit, never a wrong read",
}
