"""The refinement mapping of the library's public API onto the table, as data.

Users never fire the table's actions one by one: they call ``HeterogeneousKVCache.request /
admit / use / finish / abort / append / tick / evict / offload / spill / drop`` (and the
pipelines run jobs behind their back).  Each call must be *explained* by a sequence of the
table's actions whose guards hold at each step; this module says which sequences each call may
take, as small regular expressions over action names (``|`` alternatives, ``*`` ``+`` ``?``,
parentheses, and the macros below written in capitals).  The API harness
(:mod:`kvstate.targets.api.state`) searches those sequences on the reference model, with the
parameters the library chose (hit length, addresses, stored form), for one that ends in the
state the library shows; nothing else in the project restates them.

``RESTART`` says what a process crash leaves: the table has no crash action (a crash is not a
transition of one process), so the state after a restart is Init except for the blocks whose
published disk entry survives, which keep the listed variables.
"""

from __future__ import annotations

from dataclasses import dataclass

from .phases import CKV, Pipe

# Macros: a name in capitals stands for its pattern (expanded before parsing).
MACROS: dict[str, str] = {
    # reclaim one device block (the LRU victim of an allocation, a load, or ``evict``)
    "EVICT": "evict_start evict_done",
    # make room on the device: evict a block, or slide a window (an empty SWA pool slides
    # the least recently used window the table lets slide before anything else)
    "ROOM": "EVICT | slide",
    # store one full block of a request: a slot and SWA pages (making room), the content,
    # compression at the boundary, the indexer stamp, the request's lease; a block outside
    # the window policy's (Geometry.swa_kept) is slid as it is stored
    "STORE": "ROOM* allocate commit slide? seal index_update touch",
    # a recovery step started by an admission (or a load queued by the I/O cap)
    "RECOVER": "offload_cancel | ROOM | load_start | rebuild_start",
    # a pending admission's recovery is over: validate, or truncate to the valid prefix and
    # pin again (the admission is given up and taken anew in the same request slot); where
    # not even the truncated hit passes (e.g. the request's deadline ran out while it
    # waited), the request taken anew is downgraded to a recompute (docs/library.md)
    "FINALIZE": "validate | abort admit match pin validate | abort admit match pin? downgrade",
    # one step of one pipeline job (a load chunk; a load that ends, completed or failed, with
    # its follow-ups: an indexer rebuild after a completed one, and in both cases the disk
    # loads the I/O cap held back, retried when a load ends; an offload; a rebuild)
    "JOB": (
        "load_progress | (load_fail | load_done rebuild_start?) (ROOM | load_start)*"
        " | offload_done | offload_cancel | rebuild_done"
    ),
}


@dataclass(frozen=True)
class ApiCall:
    """One public call: the action sequences that may explain it (any one of ``patterns``)."""

    patterns: tuple[str, ...]
    doc: str = ""
    # what every ticks parameter (``t`` of admit / touch / tick) of the explaining sequence
    # must be: "lifetime" (the request's, capped at lease_max: its admission and its leases),
    # "arg" (the call's own argument), or None (free)
    ticks: str | None = None


API: dict[str, ApiCall] = {
    "request": ApiCall(("",), "a Request object only: the cache's state does not change"),
    "admit": ApiCall(
        (
            "admit touch* match pin (validate | RECOVER* FINALIZE?)",
            "admit touch* match downgrade",
        ),
        "the longest valid hit, pinned and validated, or pinned with recovery jobs started "
        "(validated at use), or given up at the admission cap",
        ticks="lifetime",
    ),
    "use": ApiCall(("FINALIZE? use",), "wait for the recovery (if any), validate, compute"),
    "finish": ApiCall(
        ("STORE* release",), "store the request's new full blocks, drop the pins", "lifetime"
    ),
    # finish whose writer raised partway (WriterFailed): the blocks before the failing one
    # stored, the failing one's and the run's later ones' allocations given back, the pins
    # released all the same
    "finish_writer_failed": ApiCall(
        ("STORE* (ROOM* allocate discard)* release",),
        "finish whose writer raised partway: what was stored stays, the rest is given back",
        "lifetime",
    ),
    "abort": ApiCall(("abort",), "drop the pins and the hit at any point"),
    "append": ApiCall(
        ("(STORE | slide)*",), "decode: store completed blocks, slide the window", "lifetime"
    ),
    "tick": ApiCall(("tick",), "time passes", "arg"),
    # the CUDA-graph protocol of an engine that replays its step as a graph
    "capture": ApiCall(("capture",), "capture the step over the persistent buffers"),
    "replay": ApiCall(("replay",), "replay the captured graph (refused once it is stale)"),
    "recapture": ApiCall(("recapture",), "capture again after a recovery moved a buffer"),
    "evict": ApiCall(("EVICT*",), "evict up to n lease-expired unpinned device blocks"),
    "offload": ApiCall(("(drop | spill | offload)*",), "start up to n offloads (making host room)"),
    "spill": ApiCall(("(drop | spill)*",), "write up to n host blocks to disk (making disk room)"),
    "drop": ApiCall(("drop*",), "delete up to n expired host/disk entries"),
    # a whole request of another namespace (admit, use, finish): outside the modelled chain,
    # its only effect on it is the blocks its stores evict (its slot returns to idle)
    "foreign": ApiCall(("ROOM*",), "a request in another namespace: it shares no block"),
    "step": ApiCall(("JOB?",), "one step of one pipeline job (manual pipelines)"),
    "drain": ApiCall(("JOB*",), "every pipeline job to completion (manual pipelines)"),
    # faults and harness-side calls that must leave the cache's state as it is
    "read": ApiCall(("",), "a read through a Run changes nothing"),
    "mutate_tokens": ApiCall(("",), "the caller reuses its token buffer"),
    "corrupt": ApiCall(("",), "a published disk entry is truncated or bit-flipped"),
    "fault": ApiCall(("",), "arm a fault (disk full, read error, stalled read)"),
}

# With threaded pipelines a call may take the cache's lock more than once (``use`` waits for a
# recovery, releasing the lock, then validates, then enters); each critical section of the call
# must be explained by the call's patterns or by one of these.  A pipeline worker's sections are
# explained by ``drain`` (its job steps).
SECTIONS: dict[str, tuple[str, ...]] = {"use": ("FINALIZE",)}

# What a process crash keeps: blocks whose published disk entry survives (a disk block, or one
# being loaded from disk: its file is deleted only once the load completes) keep these
# variables (from the entry's header); every other variable and block is as in Init.
RESTART_SURVIVES: tuple[dict[str, int], ...] = (
    {"ckv": int(CKV.DISK)},
    {"ckv": int(CKV.LOADING), "ldpipe": int(Pipe.IO)},
)
RESTART_KEEPS: tuple[str, ...] = ("gen", "ver", "tail", "swa", "fmt")
RESTART_PHASE = int(CKV.DISK)  # the phase a surviving block comes back in
