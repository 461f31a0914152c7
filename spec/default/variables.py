"""The default table's variables: the mechanism the implementation has, then the ghost truth."""

from __future__ import annotations

import enum

from kvstate.spec.phases import CKV, Fmt, Graph, Indexer, Pipe, Req, Swa, Tail
from kvstate.spec.table import Scope, Var

from .ghosts import GHOSTS


def phase_var(name: str, scope: Scope, init: enum.IntEnum, doc: str) -> Var:
    """An enumerated phase variable (its domain: ``init``'s enum), starting in ``init``."""
    phase = int(init)
    return Var(name, scope, lambda k, N, b: phase, type(init), doc=doc)


def variables() -> list[Var]:
    G, BL, RQ, RB = Scope.GLOBAL, Scope.BLOCK, Scope.REQ, Scope.REQ_BLOCK
    z = lambda k, N, b: 0  # noqa: E731
    own = lambda k, N, b: b  # noqa: E731  (a block's own address: every buffer distinct)
    return [
        Var("now", G, z, nonneg=True, doc="scheduler clock, in ticks"),
        phase_var("graph", G, Graph.NONE, "captured CUDA graph"),
        Var("io_inflight", G, z, doc="disk loads in the I/O pipeline (a counter)"),
        Var("nfree", G, lambda k, N, b: N, doc="blocks in phase FREE (a counter)"),
        phase_var("ckv", BL, CKV.FREE, "Compressed KV phase"),
        Var("gen", BL, z, doc="generation: bumped when the slot is reallocated"),
        Var("ref", BL, z, doc="reference count (pins held by requests)"),
        Var("ver", BL, z, doc="version of the compressed KV content"),
        phase_var("idx", BL, Indexer.ABSENT, "Indexer State phase"),
        Var("iver", BL, z, doc="compressed-KV version the indexer page was built from"),
        phase_var("tail", BL, Tail.NONE, "Uncompressed Tail at the boundary after b"),
        phase_var("swa", BL, Swa.NULL, "SWA Window block"),
        Var("lease", BL, z, doc="residency lease: resident until this tick"),
        Var("addr", BL, own, address=True, doc="device address of the block's state buffer"),
        Var("gaddr", BL, own, address=True, doc="address the captured graph recorded"),
        Var("prog", BL, lambda k, N, b: k.load_steps, doc="load progress; load_steps = complete"),
        phase_var("fmt", BL, Fmt.PRIMARY, "stored block form (kernel ABI)"),
        phase_var("ldpipe", BL, Pipe.NONE, "pipeline of the block's transfer job"),
        phase_var("ixpipe", BL, Pipe.NONE, "pipeline of the block's indexer job"),
        phase_var("phase", RQ, Req.IDLE, "request phase"),
        Var("hit", RQ, z, doc="candidate / validated hit length, tokens"),
        Var("pinned", RQ, z, doc="tokens whose blocks this request pins ([0, pinned))"),
        Var("deadline", RQ, z, doc="tick by which the request finishes"),
        Var("pgen", RB, z, doc="state_data_ptrs: generation recorded at validation"),
        Var("paddr", RB, z, address=True, doc="state_data_ptrs: address recorded at validation"),
        *GHOSTS,
    ]
