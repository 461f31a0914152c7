"""Paged gather / scatter of cache blocks between a tier and a contiguous buffer.

A tier is a pool ``[num_blocks, row_words]``; a block table maps the i-th block of a request's
contiguous buffer to a tier slot.  Recovery moves whole blocks this way (host -> device restore,
device -> host offload) so it must be exact, bounds-safe and tolerant of the ``-1`` padding slots
that CUDA-graph static block tables carry (vLLM 43810: -1 used as an index).

Both kernels work on *words* (an integer view of the bytes: int64 where alignment allows) so one
compiled kernel serves every element dtype, bf16 included, and each load is as wide as possible.

Semantics (the torch reference in ``reference.py`` is the specification):

* ``buf`` is a flat word array holding ``valid_words`` words; table entry ``i`` covers words
  ``[i * row_words, min((i + 1) * row_words, valid_words))`` - the last block may be ragged, and
  entries entirely past ``valid_words`` move nothing.
* slot ``-1`` is skipped: gather leaves those destination words untouched, scatter writes nothing
  and never indexes the tier with it.
* any other slot outside ``[0, num_blocks)`` is never dereferenced; the smallest such table
  index is recorded with ``atomic.min`` in ``err[0]`` (initialised by the caller to
  ``len(table)``), and the dispatcher raises.
"""

from __future__ import annotations

from typing import Any, no_type_check

from numba import cuda

from ._launch import LaunchConfig


@no_type_check  # device code: Numba types it, not mypy
def _gather(tier: Any, table: Any, buf: Any, valid_words: int, err: Any) -> None:
    num_blocks = tier.shape[0]
    row_words = tier.shape[1]
    for i in range(cuda.blockIdx.x, table.shape[0], cuda.gridDim.x):
        slot = table[i]
        if slot == -1:
            continue
        if slot < 0 or slot >= num_blocks:
            if cuda.threadIdx.x == 0:
                cuda.atomic.min(err, 0, i)
            continue
        base = i * row_words
        stop = min(row_words, valid_words - base)
        for k in range(cuda.threadIdx.x, stop, cuda.blockDim.x):
            buf[base + k] = tier[slot, k]


@no_type_check  # device code: Numba types it, not mypy
def _scatter(buf: Any, table: Any, tier: Any, valid_words: int, err: Any) -> None:
    num_blocks = tier.shape[0]
    row_words = tier.shape[1]
    for i in range(cuda.blockIdx.x, table.shape[0], cuda.gridDim.x):
        slot = table[i]
        if slot == -1:
            continue
        if slot < 0 or slot >= num_blocks:
            if cuda.threadIdx.x == 0:
                cuda.atomic.min(err, 0, i)
            continue
        base = i * row_words
        stop = min(row_words, valid_words - base)
        for k in range(cuda.threadIdx.x, stop, cuda.blockDim.x):
            tier[slot, k] = buf[base + k]


gather_kernel = cuda.jit(_gather)
scatter_kernel = cuda.jit(_scatter)


def launch_gather(
    tier: Any, table: Any, buf: Any, valid_words: int, err: Any, cfg: LaunchConfig, stream: Any = 0
) -> None:
    """Launch the gather: ``buf[words of block i] = tier[table[i]]`` for every ``table[i] != -1``."""
    if table.shape[0] == 0 or valid_words == 0:
        return
    gather_kernel[cfg.blocks(table.shape[0]), cfg.threads, stream](
        tier, table, buf, valid_words, err
    )


def launch_scatter(
    buf: Any, table: Any, tier: Any, valid_words: int, err: Any, cfg: LaunchConfig, stream: Any = 0
) -> None:
    """Launch the scatter: ``tier[table[i]] = buf[words of block i]`` for every ``table[i] != -1``."""
    if table.shape[0] == 0 or valid_words == 0:
        return
    scatter_kernel[cfg.blocks(table.shape[0]), cfg.threads, stream](
        buf, table, tier, valid_words, err
    )
