"""The default table's declarations beside its actions and invariants: action-level read
safety, the completeness rule, how the recovery pipelines run, locality and the coverage goals."""

from __future__ import annotations

from typing import Any

from kvstate.spec.expr import AND, IMPLIES, IN
from kvstate.spec.phases import CKV, Pipe
from kvstate.spec.table import Completeness, Locality, PinnedCoverage, ReadSafety, RecoveryPipelines

from .common import CHECKED, covers
from .invariants import hit_truth


def reads() -> list[ReadSafety]:
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
