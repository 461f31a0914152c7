"""Lifecycle phases of the five cache states, of requests, graphs and pipelines.

Phases are small ``IntEnum`` s so that the same value is a plain int to the concrete interpreter
and a Z3 integer constant to the encoder.  Which phases are initial and which are terminal is
data too: the structural checks (every phase reachable, no trap phase) read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class CKV(IntEnum):
    """Compressed KV block (CSA/HCA entries of one LCM block), across device, host and disk."""

    FREE = 0
    WRITING = 1  # allocated on device, prefill writing into it
    READY = 2  # committed on device
    OFFLOADING = 3  # device copy still valid, copy to host in the DMA pipeline
    HOST = 4  # only on host
    DISK = 5  # only on disk
    LOADING = 6  # asynchronous load back to device in progress (see ``prog``)
    EVICTING = 7  # device slot being reclaimed


class Tail(IntEnum):
    """Uncompressed tail (compressor state) saved at the boundary after a block."""

    NONE = 0
    OPEN = 1  # rows still being appended, not at a compression boundary
    SEALED = 2  # compression fired at the boundary; the state there is saved


class Swa(IntEnum):
    """Sliding-window blocks: valid, or the null block for positions outside the window."""

    NULL = 0
    VALID = 1


class Indexer(IntEnum):
    """Lightning-indexer pages over the CSA entries; in sync when ``iver == ver``."""

    ABSENT = 0
    REBUILDING = 1  # a CPU-pipeline job is recomputing the keys
    PRESENT = 2


class Fmt(IntEnum):
    """Physical form a compressed block is stored in (kernel ABI, layer L2)."""

    PRIMARY = 0  # FP8 e4m3 + UE8M0 scales + BF16 RoPE, the geometry's page layout
    BF16 = 1  # an unquantised form that also has a fused kernel
    LEGACY = 2  # an older on-disk layout without a fused kernel


class Pipe(IntEnum):
    """Recovery pipelines (five-state separation)."""

    NONE = 0
    CPU = 1  # indexer rebuild, tail checks
    IO = 2  # disk loads, bounded by the I/O cap
    DMA = 3  # host <-> device copies


class Req(IntEnum):
    """Request phases along the admission path."""

    IDLE = 0
    WAITING = 1  # admitted, no hit computed yet
    MATCHED = 2  # hash lookup gave a candidate hit; nothing locked (volatile)
    PINNED = 3  # reference counts taken on the hit's blocks (state_data_ptrs being held)
    VALIDATED = 4  # L1..L4 passed while pinned; pointers and generations recorded
    USING = 5  # computing from the hit
    RECOMPUTE = 6  # downgraded: computes from scratch


class Graph(IntEnum):
    """A captured CUDA graph over the persistent buffers."""

    NONE = 0
    CAPTURED = 1
    STALE = 2  # a recovery changed an address it recorded; must be recaptured


@dataclass(frozen=True)
class Lifecycle:
    """One component's phase enum with its initial and terminal ("at rest") phases."""

    component: str
    var: str
    phases: type[IntEnum]
    initial: IntEnum
    terminal: frozenset[IntEnum]
    only: frozenset[IntEnum] | None = None  # the enum values this component uses, if a subset

    @property
    def members(self) -> list[IntEnum]:
        return [m for m in self.phases if self.only is None or m in self.only]


LIFECYCLES: tuple[Lifecycle, ...] = (
    Lifecycle("Compressed KV", "ckv", CKV, CKV.FREE, frozenset({CKV.FREE})),
    Lifecycle("Uncompressed Tail", "tail", Tail, Tail.NONE, frozenset({Tail.NONE})),
    Lifecycle("SWA Window", "swa", Swa, Swa.NULL, frozenset({Swa.NULL})),
    Lifecycle("Indexer State", "idx", Indexer, Indexer.ABSENT, frozenset({Indexer.ABSENT})),
    # On-disk Prefix: the load job's pipeline; its rest phase is "no job in flight".
    Lifecycle(
        "On-disk Prefix",
        "ldpipe",
        Pipe,
        Pipe.NONE,
        frozenset({Pipe.NONE}),
        frozenset({Pipe.NONE, Pipe.IO, Pipe.DMA}),
    ),
    Lifecycle("Request", "phase", Req, Req.IDLE, frozenset({Req.IDLE})),
    Lifecycle("CUDA Graph", "graph", Graph, Graph.NONE, frozenset({Graph.NONE, Graph.CAPTURED})),
)
