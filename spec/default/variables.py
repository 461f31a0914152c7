"""The default table's variables: the mechanism the implementation has, then the ghost truth."""

from __future__ import annotations

from kvstate.spec.phases import CKV, Fmt, Graph, Indexer, Pipe, Req, Swa, Tail
from kvstate.spec.table import Scope, Var

from .ghosts import GHOSTS


def variables() -> list[Var]:
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
