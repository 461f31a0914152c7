"""Check class ``events``: the KV cache events report every stored and removed block once, in order.

A router or a KV-aware gateway rebuilds vLLM's prefix cache from ``take_events()``
(``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``).  The ledger here replays the events
in the order they come, as a multiset of (block hash, group) entries, one per cached block (vLLM
does not deduplicate blocks of equal content), and after every operation compares it with the
pool's own hash map: an entry removed that was never stored (or removed twice), a store or a
removal missing, or one reported twice, leaves the two apart.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .checks import Violation


class EventLedger:
    """The prefix cache as the event stream describes it."""

    def __init__(self, kvm: Any) -> None:
        from vllm.distributed import kv_events as ev
        from vllm.v1.core import kv_cache_utils as ku

        self.ev = ev
        self.ku = ku
        needs = ("maybe_convert_block_hash", "get_block_hash", "get_group_id")
        self.enabled = bool(getattr(kvm.block_pool, "enable_kv_cache_events", False)) and all(
            hasattr(ku, n) for n in needs
        )  # a release without them is not checked for events
        # Releases whose events carry no group index are compared on hashes alone.
        self.grouped = "group_idx" in getattr(ev.BlockStored, "__struct_fields__", ())
        self.entries: Counter[tuple[Any, Any]] = Counter()
        self.events = 0

    def _key(self, h: Any, group: Any) -> tuple[Any, Any]:
        return (h.hex() if isinstance(h, bytes) else h, group)

    def _pool_entries(self, keys: frozenset[Any]) -> Counter[tuple[Any, Any]]:
        ku = self.ku
        return Counter(
            self._key(
                ku.maybe_convert_block_hash(ku.get_block_hash(k)),
                ku.get_group_id(k) if self.grouped else None,
            )
            for k, _block in keys
        )

    def check(self, kvm: Any, keys: frozenset[Any]) -> list[Violation]:
        """Replay the events since the last check; ``keys``: the pool's (hash key, block) pairs."""
        if not self.enabled:
            return []
        out: list[Violation] = []
        for e in kvm.take_events():
            self.events += 1
            group = getattr(e, "group_idx", None)
            if isinstance(e, self.ev.AllBlocksCleared):
                self.entries.clear()
            elif isinstance(e, self.ev.BlockStored):
                for h in e.block_hashes:
                    self.entries[self._key(h, group)] += 1
            elif isinstance(e, self.ev.BlockRemoved):
                for h in e.block_hashes:
                    k = self._key(h, group)
                    if self.entries[k] <= 0:
                        out.append(
                            Violation(
                                "events",
                                f"BlockRemoved for hash {str(k[0])[:16]} (group {group}) that no "
                                f"earlier event stored (or that was already removed)",
                            )
                        )
                    else:
                        self.entries[k] -= 1
        self.entries = +self.entries  # drop zero counts
        pool = self._pool_entries(keys)
        if pool != self.entries:
            extra = self.entries - pool
            missing = pool - self.entries
            out.append(
                Violation(
                    "events",
                    f"the event stream describes {sum(self.entries.values())} cached block(s), "
                    f"the pool holds {sum(pool.values())}: {sum(extra.values())} reported but "
                    f"not cached (a removal missing or a store doubled), "
                    f"{sum(missing.values())} cached but not reported (a store missing)",
                )
            )
            self.entries = Counter(pool)  # report each divergence once
        return out
