"""Planted bugs of the block-side classes the declared-form, slot-order, store-room order,
truncation and memo checks close (``kvstate/targets/api/admform.py``, ...).

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (``kvstate/api_planted.py`` imports this list).
Each is a sibling of a generated mutant that survived the ci walk before these checks, not
the generated edit itself.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "admission_equal_by_identity",
        "declared form: an Admission compared by identity, not by its fields",
        "impl/handles.py",
        "@dataclass(init=False)  # the dataclasses-made __init__ runs interpreted: one per admission\n"
        "class Admission:",
        "@dataclass(init=False, eq=False)  # the dataclasses-made __init__ runs interpreted: one per admission\n"
        "class Admission:",
    ),
    (
        "take_steals_newest_claim",
        "slot order: a take steals the most recently freed claimed slot",
        "impl/storage.py",
        "        elif self._claimed:\n            slot, _ = self._claimed.popitem(False)",
        "        elif self._claimed:\n            slot = next(reversed(self._claimed))\n"
        "            del self._claimed[slot]",
    ),
    (
        "recovery_only_after_a_miss",
        "readiness: an admission with a resident head validates it at once, the rest unrecovered",
        "impl/requests.py",
        "            if recover and now.hit < h_max and grows\n",
        "            if recover and now.hit == 0 and grows\n",
    ),
    (
        "freed_slot_kept_negated",
        "free without reset: a freed block's slot set to its old slot negated, not -1 (none)",
        "impl/blocks.py",
        "            self.tiers.slots.release(m.slot[rid])\n            m.slot[rid] = -1\n",
        "            self.tiers.slots.release(m.slot[rid])\n            m.slot[rid] = -2 - m.slot[rid]\n",
    ),
    (
        "match_leaves_a_token",
        "limits: match refuses a hit of every token of the request",
        "impl/requests.py",
        "            if h > len(req.chain.tokens):",
        "            if h + 1 > len(req.chain.tokens):",
    ),
    (
        "truncation_cuts_a_block_further",
        "readiness: a truncation searches below its cap, cutting a block further than needed",
        "impl/requests.py",
        "            found = gate.coord.search(gate.chain_view(rids, s), 0, cap)",
        "            found = gate.coord.search(gate.chain_view(rids, s), 0, max(0, cap - L))",
    ),
)
