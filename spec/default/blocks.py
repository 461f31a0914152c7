"""The default table's block actions on the device: the compressed KV's write path (allocate,
commit, discard, seal), the SWA window's slide and the indexer's update and rebuild."""

from __future__ import annotations

from kvstate.spec.expr import AND, OR, store
from kvstate.spec.phases import CKV, Indexer, Pipe, Swa, Tail
from kvstate.spec.table import Action

from .common import A, B, F, action, at_b, conj, is_at, moved_graph, unpinned


def block_actions() -> list[Action]:
    return [
        # ---- Compressed KV: write path ---------------------------------------------------
        action(
            "allocate",
            [B, A, F],
            [conj("free", is_at("ckv", CKV.FREE))],
            {
                **at_b(ckv=CKV.WRITING),
                "addr": lambda s, p: store(s, s.addr, p.b, p.a),
                "graph": moved_graph,
                "gen": lambda s, p: store(s, s.gen, p.b, s.gen[p.b] + 1),
                **at_b(tail=Tail.OPEN, swa=Swa.NULL, idx=Indexer.ABSENT),
                "fmt": lambda s, p: store(s, s.fmt, p.b, p.f),
                "nfree": lambda s, p: s.nfree - 1,
            },
            "Compressed KV",
            "take a free device slot (any: the allocator chooses, a; a moved buffer makes the "
            "graph stale) for new tokens in the form the writer produces (f); a new generation",
        ),
        action(
            "commit",
            [B],
            [conj("writing", is_at("ckv", CKV.WRITING))],
            {
                **at_b(ckv=CKV.READY),
                "ver": lambda s, p: store(s, s.ver, p.b, s.ver[p.b] + 1),
                **at_b(swa=Swa.VALID),
            },
            "Compressed KV",
            "prefill wrote the block: new content version",
        ),
        action(
            "discard",
            [B],
            [
                conj("writing", is_at("ckv", CKV.WRITING)),
                conj("unpinned", unpinned),
            ],
            {
                **at_b(ckv=CKV.FREE, tail=Tail.NONE),
                "nfree": lambda s, p: s.nfree + 1,
            },
            "Compressed KV",
            "the writer was aborted mid-prefill: free the slot",
        ),
        # ---- Uncompressed Tail -----------------------------------------------------------
        action(
            "seal",
            [B],
            [
                conj("open", is_at("tail", Tail.OPEN)),
                conj("committed", is_at("ckv", CKV.READY)),
                conj("unpinned", unpinned, "a shared (pinned) block is immutable"),
            ],
            {
                **at_b(tail=Tail.SEALED),
                "ver": lambda s, p: store(s, s.ver, p.b, s.ver[p.b] + 1),
            },
            "Uncompressed Tail",
            "compression fired at the boundary: the tail's rows become compressed entries (a new "
            "content version, so the indexer is stale until updated) and the state there is saved",
        ),
        # ---- SWA Window ------------------------------------------------------------------
        action(
            "slide",
            [B],
            [
                conj("valid", is_at("swa", Swa.VALID)),
                conj("unpinned", unpinned, "a pinned hit still needs its window"),
            ],
            at_b(swa=Swa.NULL),
            "SWA Window",
            "the window moved past the block: it becomes the null block",
        ),
        # ---- Indexer State ---------------------------------------------------------------
        action(
            "index_update",
            [B],
            [
                conj("committed", is_at("ckv", CKV.READY)),
                conj("no_job", lambda s, p: s.idx[p.b] != Indexer.REBUILDING),
            ],
            {
                **at_b(idx=Indexer.PRESENT),
                "iver": lambda s, p: store(s, s.iver, p.b, s.ver[p.b]),
            },
            "Indexer State",
            "inline indexer write alongside the compressed KV",
        ),
        action(
            "rebuild_start",
            [B],
            [
                conj(
                    "needed",
                    lambda s, p: OR(
                        s.idx[p.b] == Indexer.ABSENT,
                        AND(s.idx[p.b] == Indexer.PRESENT, s.iver[p.b] != s.ver[p.b]),
                    ),
                ),
                conj(
                    "kv_on_device",
                    lambda s, p: s.ckv[p.b] == CKV.READY,
                    "a CPU job never waits on an I/O job: its input must be resident",
                ),
            ],
            {
                **at_b(idx=Indexer.REBUILDING, ixpipe=Pipe.CPU),
            },
            "Indexer State",
            "queue an indexer rebuild in the CPU pipeline",
        ),
        action(
            "rebuild_done",
            [B],
            [conj("rebuilding", is_at("idx", Indexer.REBUILDING))],
            {
                **at_b(idx=Indexer.PRESENT),
                "iver": lambda s, p: store(s, s.iver, p.b, s.ver[p.b]),
                **at_b(ixpipe=Pipe.NONE),
            },
            "Indexer State",
            "the rebuilt keys match the current version",
        ),
        # ---- offload: device -> host -> disk --------------------------------------------
    ]
