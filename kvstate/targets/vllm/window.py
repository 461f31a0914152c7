"""Check class ``window``: every block a running request still reads is held.

A sliding-window group frees the blocks that fall out of the window, a Mamba group the states
before the last one; freeing one block too early is silent everywhere else (the block is still
cached, a later hit on it is sound), so it is checked directly: after every operation, for each
running request that has computed ``n`` tokens, the blocks of each group covering the tokens the
*next* position reads must be in the request's block table, non-null and referenced.

What a group reads is taken from vLLM's spec classes, never from the manager's own
``get_num_skipped_tokens`` (the method under test):

- full attention: every token ``[0, n)``;
- a sliding window of ``w`` tokens (``SlidingWindowSpec``, DeepSeek-V4's compressor and SWA
  groups): the last ``w - 1`` computed tokens, plus the ``extra_retained_tokens`` the spec
  promises to keep for multi-module MTP;
- a Mamba state (``MambaSpec``): the state after the last computed token, in the block that
  holds token ``n - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checks import Violation


@dataclass(frozen=True)
class Reads:
    """The span of computed tokens a running request's group reads for its next position."""

    group: int
    block_size: int
    what: str
    last: int | None  # tokens before the next position it reads (None: every token)


def reads_of(kvm: Any) -> list[Reads]:
    """What each group of ``kvm`` reads, from its spec class (groups of unknown kinds: none)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    out = []
    for i, mgr in enumerate(kvm.coordinator.single_type_managers):
        spec = getattr(mgr.kv_cache_spec, "first_spec", mgr.kv_cache_spec)
        if isinstance(spec, MambaSpec):
            out.append(Reads(i, mgr.block_size, "Mamba state", 1))
        elif isinstance(spec, SlidingWindowSpec):
            last = spec.sliding_window - 1 + int(getattr(spec, "extra_retained_tokens", 0) or 0)
            out.append(Reads(i, mgr.block_size, f"window {spec.sliding_window}", last))
        elif isinstance(spec, FullAttentionSpec):
            out.append(Reads(i, mgr.block_size, "full attention", None))
    return out


def window_violations(
    kvm: Any, reads: list[Reads], running: list[tuple[str, int]]
) -> list[Violation]:
    """``running``: (request id, computed tokens) of each running request."""
    out: list[Violation] = []
    managers = kvm.coordinator.single_type_managers
    for rid, n in running:
        if n <= 0:
            continue
        for r in reads:
            lo = 0 if r.last is None else max(0, n - r.last)
            table = managers[r.group].req_to_blocks.get(rid, [])
            for j in range(lo // r.block_size, (n - 1) // r.block_size + 1):
                b = table[j] if j < len(table) else None
                if b is not None and not b.is_null and b.ref_cnt > 0:
                    continue
                state = "missing" if b is None else "null (freed)" if b.is_null else "unreferenced"
                out.append(
                    Violation(
                        "window",
                        f"request {rid} has computed {n} tokens and its next position reads "
                        f"tokens [{lo}, {n}) of group {r.group} ({r.what}, block "
                        f"{r.block_size}), but block index {j} of its table is {state}",
                    )
                )
                break
    return out
