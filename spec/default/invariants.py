"""The default table's invariants: the safeguards over the ghost truth, the proof that the
mechanism implies the truth, and the mechanism's own safeguards."""

from __future__ import annotations

from typing import Any

from kvstate.spec.expr import AND, CDIV, IMPLIES, IN, ITE, NOT
from kvstate.spec.layers import HitRule
from kvstate.spec.phases import CKV, Fmt, Graph, Indexer, Pipe, Req, Swa, Tail
from kvstate.spec.table import Invariant

from .common import CHECKED, HOLDS_PINS, count_blocks, covers, pinned_blocks_total, sum_pins
from .ghosts import COPY_DISK, COPY_HOST, COPY_NONE


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


def truth_invariants() -> list[Invariant]:
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


def invariants(hit_rule: HitRule) -> list[Invariant]:
    return truth_invariants() + [
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
