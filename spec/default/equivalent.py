"""The mutants of the default table argued equivalent."""

from __future__ import annotations

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
