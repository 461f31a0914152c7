"""Multi-group readiness intersection: the longest prefix every cache group can serve.

A hit is only safe if *every* group (compressed KV, indexer, compressor state, SWA, ...) has its
blocks of the prefix ready; engines that let groups disagree restore KV without its sidecar
(SGLang 30057) or misalign the hit (vLLM 52828).  Given per-group ready bitmaps indexed in LCM
units, the answer is the first column where some group is not ready.

Parallel form: one thread per column (grid-stride), each loops over the groups and, on a miss,
lowers ``result[0]`` with ``atomic.min`` (initialised by the caller to the number of columns).
The result is order-independent, so the kernel is deterministic.  A thread whose column is
already past the current minimum skips its work (a monotone, race-free read).
"""

from __future__ import annotations

from typing import Any, no_type_check

from numba import cuda

from ._launch import LaunchConfig


@no_type_check  # device code: Numba types it, not mypy
def _ready_prefix(ready: Any, result: Any) -> None:
    groups = ready.shape[0]
    cols = ready.shape[1]
    for b in range(cuda.grid(1), cols, cuda.gridsize(1)):
        if b >= result[0]:
            continue
        for g in range(groups):
            if ready[g, b] == 0:
                cuda.atomic.min(result, 0, b)
                break


ready_prefix_kernel = cuda.jit(_ready_prefix)


def launch_ready_prefix(ready: Any, result: Any, cfg: LaunchConfig, stream: Any = 0) -> None:
    """Launch over the columns of ``ready`` ``[groups, cols]``; ``result[0]`` must hold ``cols``."""
    cols = ready.shape[1]
    if cols == 0 or ready.shape[0] == 0:
        return
    blocks = cfg.blocks(-(-cols // cfg.threads))
    ready_prefix_kernel[blocks, cfg.threads, stream](ready, result)
