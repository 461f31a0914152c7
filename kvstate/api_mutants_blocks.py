"""Planted bugs of the classes ``kvstate/targets/api/single.py`` and ``geometry.py`` close.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (that module imports this list: it is over 700
lines).  Without the operation each is out of the ci run's reach: only ``act`` calls the
store's ``touch`` and ``discard`` alone, and at 16-token blocks the planted span equals the
table's (``swa_checkpoint_tokens // 16 == checkpoint_blocks``): only ``geometry`` tells them apart.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    # kvstate/targets/api/single.py: the block-level surface, one action by name
    (
        "touch_shortens_lease",
        "single action: a lease shortened",
        "impl/blocks.py",
        "            lease = self.meta.lease\n            lease[rid] = max(lease[rid], self.gate.now + t)",
        "            lease = self.meta.lease\n            lease[rid] = self.gate.now + t",
    ),
    (
        "discard_keeps_tail",
        "single action: free without reset",
        "impl/blocks.py",
        "            m.tail[rid] = TAIL_NONE\n            self.tombstones[rid] = None",
        "            self.tombstones[rid] = None",
    ),
    # kvstate/targets/api/geometry.py: a constant that holds at 16-token blocks only
    (
        "window_policy_for_16_token_blocks",
        "geometry: a span written for one block size",
        "impl/blocks.py",
        "        self.swa_policy = (g.window_lcm_blocks, g.checkpoint_blocks)",
        "        self.swa_policy = (g.window_lcm_blocks, g.swa_checkpoint_tokens // 16)",
    ),
)
