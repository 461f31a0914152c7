"""The default table's block actions on the device: the compressed KV's write path (allocate,
commit, discard, seal), the SWA window's slide and the indexer's update and rebuild."""

from __future__ import annotations

from kvstate.spec.expr import AND, OR, store
from kvstate.spec.phases import CKV, Indexer, Pipe, Swa, Tail
from kvstate.spec.table import Action

from .common import A, B, F, action, conj, moved_graph, unpinned


def block_actions() -> list[Action]:
    return [
        # ---- Compressed KV: write path ---------------------------------------------------
        action(
            "allocate",
            [B, A, F],
            [conj("free", lambda s, p: s.ckv[p.b] == CKV.FREE)],
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
            [conj("writing", lambda s, p: s.ckv[p.b] == CKV.WRITING)],
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
                conj("writing", lambda s, p: s.ckv[p.b] == CKV.WRITING),
                conj("unpinned", unpinned),
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
                conj("open", lambda s, p: s.tail[p.b] == Tail.OPEN),
                conj("committed", lambda s, p: s.ckv[p.b] == CKV.READY),
                conj("unpinned", unpinned, "a shared (pinned) block is immutable"),
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
                conj("valid", lambda s, p: s.swa[p.b] == Swa.VALID),
                conj("unpinned", unpinned, "a pinned hit still needs its window"),
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
                conj("committed", lambda s, p: s.ckv[p.b] == CKV.READY),
                conj("no_job", lambda s, p: s.idx[p.b] != Indexer.REBUILDING),
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
            [conj("rebuilding", lambda s, p: s.idx[p.b] == Indexer.REBUILDING)],
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
    ]
