"""Check class ``reset``: ``reset_prefix_cache`` is refused while blocks are in use, complete otherwise.

RLHF flows call it after a weight update: KV computed under the old weights must never be hit
again.  So, for each call: it returns ``False`` exactly when some running request holds blocks
(and then changes no cache entry); when it returns ``True`` no prefix-cache entry survives; and
no later hit returns a block cached before it (``stale_hits``: the driver keeps the blocks
cached before the last successful reset until they are computed again).
"""

from __future__ import annotations

from typing import Any

from .checks import Violation


def reset_violations(
    ok: bool,
    holders: list[str],
    keys_before: frozenset[Any],
    keys_after: frozenset[Any],
    map_entries: int,
) -> list[Violation]:
    """``holders``: running requests (each holds blocks); keys: the pool's (hash, block) pairs
    as the blocks record them; ``map_entries``: the entries of the pool's hash-to-block map."""
    out: list[Violation] = []
    if ok and holders:
        out.append(
            Violation(
                "reset",
                f"reset_prefix_cache returned True while request(s) {holders[:4]} hold blocks",
            )
        )
    if not ok and not holders:
        out.append(Violation("reset", "reset_prefix_cache refused with no block in use"))
    if ok and (keys_after or map_entries):
        out.append(
            Violation(
                "reset",
                f"reset_prefix_cache returned True but prefix-cache entries survive "
                f"({len(keys_after)} on blocks, {map_entries} in the hash map)",
            )
        )
    if not ok and keys_after != keys_before:
        out.append(Violation("reset", "a refused reset_prefix_cache changed the prefix cache"))
    return out


def stale_hits(blocks: tuple[list[Any], ...], stale: set[int]) -> list[Violation]:
    """Hit blocks cached before the last successful reset and not computed since."""
    bad = sorted({b.block_id for g in blocks for b in g if not b.is_null and b.block_id in stale})
    if not bad:
        return []
    return [
        Violation(
            "reset",
            f"hit block(s) {bad[:6]} were cached before the last successful reset_prefix_cache",
        )
    ]
