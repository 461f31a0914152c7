"""Planted bugs of the classes ``kvstate/targets/api/poolstate.py`` and ``records.py`` close.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (:mod:`kvstate.api_planted` imports this list).
Each moves no block the table sees: a device slot's claim left behind, filed under the wrong
free list or never dropped, a pool built one page short, a forgotten record's graph address
carried over to the key that reuses its id.  Refinement and the accounting (which balances
each pool against its own size) pass them all.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "released_slot_loses_its_claim_list",
        "slot claims: a freed claimed slot handed to the next load",
        "impl/storage.py",
        "        (self._claimed if self.claim[slot] else self._unclaimed)[slot] = None",
        "        self._unclaimed[slot] = None",
    ),
    (
        "moved_block_keeps_its_old_claim",
        "slot claims: a block that moved still claims its old slot",
        "impl/blocks.py",
        "        if old >= 0:\n            self.tiers.slots.unclaim(old, rid)",
        "        if old > 0:\n            self.tiers.slots.unclaim(old, rid)",
    ),
    (
        "swa_pool_one_page_short",
        "pool sizes: the SWA page pool smaller than swa_blocks promises",
        "impl/tiers.py",
        "        self.swa_pool = PagePool(1 + swa_blocks * self.swa.pages_per_block, first=1)",
        "        self.swa_pool = PagePool(swa_blocks * self.swa.pages_per_block, first=1)",
    ),
    (
        "purged_record_keeps_graph_address",
        "record purge: a reused id inherits the captured graph's address",
        "impl/blocks.py",
        "            self.meta.gaddr[rid] = -1\n            self.meta.retire(rid)",
        "            self.meta.retire(rid)",
    ),
)
