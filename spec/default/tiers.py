"""The default table's tier actions: offload to host, spill to disk, load back (its progress,
done and failure), drop and evict."""

from __future__ import annotations

from kvstate.spec.expr import AND, B2I, IMPLIES, IN, ITE, store
from kvstate.spec.phases import CKV, Indexer, Pipe, Swa, Tail
from kvstate.spec.table import Action

from .common import A, B, F, Fn, action, at_b, conj, is_at, lease_expired, moved_graph, unpinned


def freed() -> dict[str, Fn]:
    """The updates of a block whose slot is free again (dropped, or evicted): every state of
    it gone, one more free block."""
    return {
        **at_b(ckv=CKV.FREE, tail=Tail.NONE, swa=Swa.NULL, idx=Indexer.ABSENT),
        "nfree": lambda s, p: s.nfree + 1,
    }


def tier_actions() -> list[Action]:
    return [
        action(
            "offload",
            [B],
            [
                conj("committed", is_at("ckv", CKV.READY)),
                conj(
                    "unpinned",
                    unpinned,
                    "a checked hit reads the device copy: do not start moving it",
                ),
            ],
            {
                **at_b(ckv=CKV.OFFLOADING, ldpipe=Pipe.DMA),
            },
            "On-disk Prefix",
            "copy to host in the DMA pipeline (device copy stays)",
        ),
        action(
            "offload_done",
            [B],
            [
                conj("offloading", is_at("ckv", CKV.OFFLOADING)),
                conj("unpinned", unpinned),
                conj("lease_expired", lease_expired),
                conj("no_cpu_job", lambda s, p: s.idx[p.b] != Indexer.REBUILDING),
            ],
            {
                **at_b(ckv=CKV.HOST, ldpipe=Pipe.NONE),
            },
            "On-disk Prefix",
            "host copy complete; the device slot is released",
        ),
        action(
            "offload_cancel",
            [B],
            [conj("offloading", is_at("ckv", CKV.OFFLOADING))],
            {
                **at_b(ckv=CKV.READY, ldpipe=Pipe.NONE),
            },
            "On-disk Prefix",
            "a pinned block stays on device: keep the device copy",
        ),
        action(
            "spill",
            [B],
            [conj("on_host", is_at("ckv", CKV.HOST))],
            {
                **at_b(ckv=CKV.DISK),
            },
            "On-disk Prefix",
            "host copy written to disk (atomically) and dropped from host",
        ),
        # ---- recovery: load back to device -----------------------------------------------
        action(
            "load_start",
            [B],
            [
                conj("offloaded", lambda s, p: IN(s.ckv[p.b], (CKV.HOST, CKV.DISK))),
                conj(
                    "io_cap",
                    lambda s, p: IMPLIES(s.ckv[p.b] == CKV.DISK, s.io_inflight < s.k.io_cap),
                    "admission cap: disk recoveries in flight stay within the I/O bandwidth",
                ),
            ],
            {
                **at_b(ckv=CKV.LOADING),
                "ldpipe": lambda s, p: store(
                    s, s.ldpipe, p.b, ITE(s.ckv[p.b] == CKV.DISK, int(Pipe.IO), int(Pipe.DMA))
                ),
                "prog": lambda s, p: store(s, s.prog, p.b, 0),
                "io_inflight": lambda s, p: s.io_inflight + B2I(s.ckv[p.b] == CKV.DISK),
            },
            "On-disk Prefix",
            "start an asynchronous load: disk loads in the I/O pipeline, host copies in DMA",
        ),
        action(
            "load_progress",
            [B],
            [
                conj("loading", is_at("ckv", CKV.LOADING)),
                conj("not_done", lambda s, p: s.prog[p.b] < s.k.load_steps),
            ],
            {"prog": lambda s, p: store(s, s.prog, p.b, s.prog[p.b] + 1)},
            "On-disk Prefix",
            "one more chunk of the load landed",
        ),
        action(
            "load_done",
            [B, A, F],
            [
                conj("loading", is_at("ckv", CKV.LOADING)),
                conj(
                    "complete",
                    lambda s, p: s.prog[p.b] == s.k.load_steps,
                    "never use a partial load",
                ),
            ],
            {
                **at_b(ckv=CKV.READY),
                "addr": lambda s, p: store(s, s.addr, p.b, p.a),
                "graph": moved_graph,
                "io_inflight": lambda s, p: s.io_inflight - B2I(s.ldpipe[p.b] == Pipe.IO),
                **at_b(ldpipe=Pipe.NONE),
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
            "On-disk Prefix",
            "the load completed into a (possibly new) device slot; a moved buffer makes the graph stale; "
            "disk loads come back without indexer pages and in the file's stored form",
        ),
        action(
            "load_fail",
            [B],
            [conj("loading", is_at("ckv", CKV.LOADING))],
            {
                "ckv": lambda s, p: store(
                    s, s.ckv, p.b, ITE(s.ldpipe[p.b] == Pipe.IO, int(CKV.DISK), int(CKV.HOST))
                ),
                "io_inflight": lambda s, p: s.io_inflight - B2I(s.ldpipe[p.b] == Pipe.IO),
                **at_b(ldpipe=Pipe.NONE),
                "prog": lambda s, p: store(s, s.prog, p.b, s.k.load_steps),
            },
            "On-disk Prefix",
            "the load failed: the source stays where it was, the hit is truncated and recomputed",
        ),
        action(
            "drop",
            [B],
            [
                conj("offloaded", lambda s, p: IN(s.ckv[p.b], (CKV.HOST, CKV.DISK))),
                conj("unpinned", unpinned, "a pinned host/disk source may still be loaded"),
                conj("lease_expired", lease_expired),
            ],
            freed(),
            "On-disk Prefix",
            "delete the host/disk copy",
        ),
        # ---- eviction and residency ------------------------------------------------------
        action(
            "evict_start",
            [B],
            [
                conj("committed", is_at("ckv", CKV.READY)),
                conj("unpinned", unpinned, "TOCTOU: never evict a block a checked request holds"),
                conj("lease_expired", lease_expired),
                conj("no_cpu_job", lambda s, p: s.idx[p.b] != Indexer.REBUILDING),
            ],
            at_b(ckv=CKV.EVICTING),
            "Compressed KV",
            "reclaim an unreferenced device block",
        ),
        action(
            "evict_done",
            [B],
            [conj("evicting", is_at("ckv", CKV.EVICTING))],
            freed(),
            "Compressed KV",
            "the slot is free again",
        ),
    ]
