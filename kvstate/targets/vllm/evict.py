"""Check class ``eviction``: the block an allocation evicts is the least recently freed one.

vLLM's free queue promises an order (``FreeKVCacheBlockQueue``, ``BlockPool.free_blocks``):
blocks freed with no prefix-cache entry are reused first, and cached blocks are evicted in the
order they were freed (LRU; ties inside one call are vLLM's own, tail blocks first).  Releases
whose queue has no ``prepend_n`` (0.20.0) append every freed block, cached or not, in the
caller's order: there the shadow holds every free block to least recently freed first.  Checking it
through completeness alone is indirect (a reversed order only shows when a re-sent prompt
happens to miss), so this shadow of the queue watches each mutating call: it records when each
block became free and whether it had a cache entry then, and when a call evicts a cached free
block to reuse it, it fails if a block freed in an earlier call is still cached and free, or a
block freed with no entry is still free and unused.

The same per-call view tells the completeness probe whether anything was evicted since a prompt
was admitted (``lost_keys``): a compound operation (``roundtrip``) makes several calls, and an
eviction inside it must count.
"""

from __future__ import annotations

from typing import Any

from .checks import Violation


def _keys(pool: Any, block: Any) -> set[Any]:
    keys = set(getattr(pool, "cached_block_hashes_by_block", {}).get(block.block_id, ()))
    if block.block_hash is not None:
        keys.add(block.block_hash)
    return keys


class EvictionOrder:
    """A shadow of the free queue's order, updated around every mutating call."""

    def __init__(self, pool: Any, uncached_first: bool | None = None) -> None:
        self.pool = pool
        # Whether a block freed with no cache entry goes to the queue's front (vLLM >= the
        # release whose queue has ``prepend_n``); before that every freed block was appended
        # in the caller's order (pure LRU by free time), and the shadow follows that instead.
        if uncached_first is None:
            uncached_first = hasattr(type(pool.free_block_queue), "prepend_n")
        self.uncached_first = uncached_first
        self.calls = 0
        self.freed_at: dict[int, int] = {}  # free block id -> the call that freed it
        # Free blocks that had no cache entry when freed (and the never-used ones): reused first.
        self.reuse_first = {b.block_id for b in pool.blocks if not b.is_null and b.ref_cnt == 0}
        self.evictions = 0  # cached blocks evicted by allocations (the check's evaluations)
        self._before: list[tuple[int, Any]] = []

    def before(self) -> None:
        self._before = [(b.ref_cnt, b.block_hash) for b in self.pool.blocks]

    def after(self, call: str) -> list[Violation]:
        """Update the shadow after ``call`` and return the order violations it made."""
        self.calls += 1
        now = self.calls
        evicted: list[int] = []
        for b, (rc0, h0) in zip(self.pool.blocks, self._before, strict=True):
            if b.is_null:
                continue
            i = b.block_id
            if rc0 > 0 and b.ref_cnt == 0:  # freed by this call
                self.freed_at[i] = now
                if self.uncached_first and h0 is None and b.block_hash is None:
                    self.reuse_first.add(i)
            elif rc0 == 0 and b.ref_cnt > 0:  # taken: a hit (touch) or an allocation
                at = self.freed_at.pop(i, 0)
                self.reuse_first.discard(i)
                if h0 is not None and h0 not in _keys(self.pool, b):
                    evicted.append(i)
                    self.freed_at[i] = at  # kept for the comparison below, dropped after
            elif b.ref_cnt == 0 and b.block_hash is not None:
                self.reuse_first.discard(i)  # a free block that gained an entry is no longer first
        out: list[Violation] = []
        if evicted:
            self.evictions += 1
            newest = max(self.freed_at[i] for i in evicted)
            for b in self.pool.blocks:
                i = b.block_id
                if b.is_null or b.ref_cnt > 0:
                    continue
                if i in self.reuse_first:
                    out.append(
                        Violation(
                            "eviction",
                            f"{call} evicted cached block(s) {sorted(evicted)} while block {i}, "
                            f"freed with no cache entry, stayed free: uncached blocks are "
                            f"reused first",
                        )
                    )
                    break
                at = self.freed_at.get(i, now)
                if (b.block_hash is not None or not self.uncached_first) and at < newest:
                    victim = next(e for e in evicted if self.freed_at[e] == newest)
                    out.append(
                        Violation(
                            "eviction",
                            f"{call} evicted cached block {victim} (freed at call {newest}) "
                            f"while {'cached ' if b.block_hash is not None else ''}block {i}, "
                            f"freed earlier (call {at}), stayed in the free queue: eviction is "
                            f"least recently freed first",
                        )
                    )
                    break
            for i in evicted:
                self.freed_at.pop(i, None)
        return out
