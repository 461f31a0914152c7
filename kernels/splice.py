"""Tail splice: compressed entries + compressor state -> attention input and resumable state.

After a prefix hit at boundary ``P`` (tokens ``0..P-1`` are cached), a compressed layer of ratio
``m`` is restored from two sources that were saved separately: the compressed entries and the
compressor state (the kv+score rows of tokens whose compression window has not closed).  Using
one without the other, or a state saved at another boundary, silently restores the wrong context
(LMCache 2845 / 2206, ROCm ATOM 1417), so the splice checks that they meet exactly.

Exact semantics (``reference.splice_tail_ref`` is the executable specification):

* Compression fires at ``(pos + 1) % m == 0`` writing entry ``pos // m``, so at boundary ``P``
  exactly ``n_c = P // m`` entries exist and their coverage of new tokens ends at ``m * n_c - 1``
  (CSA entry ``j`` covers ``[m*j - m, m*j + m - 1]``; HCA entry ``j`` covers ``[m*j, m*j + m - 1]``).
  The dispatcher refuses ``len(entries) != P // m`` before launching.
* The tail is positions ``[m * n_c, P)``: ``t = P - m * n_c`` rows, ``0 <= t < m``.  Its first
  position is the one right after the last entry's coverage.
* The compressor state is a ring of ``S`` rows (``S = 2m`` for CSA, ``S = m'`` for HCA, so the
  overlap is ``o = S - m`` rows of the previous window).  The row of position ``q`` lives in slot
  ``q % S`` and ``state_pos[q % S]`` records which position that slot holds (``-1``: never
  written).  Each row is ``[kv (D) | score (D)]``.
* Output ``out_kv`` ``[n_c + t, D]``: the attention input - the ``n_c`` entries, then the kv half
  of the ``t`` tail rows in position order.
* Output ``out_state`` ``[S, 2D]``: the state to resume compression from, linearised - row ``s``
  is position ``m * n_c - o + s``, i.e. exactly the window of the next entry ``n_c``.  Positions
  ``< 0`` (the first window's missing left overlap) and ``>= P`` (not yet seen) are zero rows.
* Continuity: every position ``q`` in ``[max(0, m * n_c - o), P)`` must be found in its slot
  (``state_pos[q % S] == q``).  The kernel zero-fills a row whose slot holds anything else and
  records the smallest such ``q`` with ``atomic.min`` in ``err[0]`` (initialised to ``P``); the
  dispatcher returns it as ``SpliceResult.first_bad`` (-1 if none) and, with ``check``, raises
  ``TailDiscontinuityError`` naming that position.

Buffers are word views (same word type for all four arrays), so the splice is dtype-agnostic.
"""

from __future__ import annotations

from typing import Any, no_type_check

from numba import cuda

from ._launch import LaunchConfig


@no_type_check  # device code: Numba types it, not mypy
def _splice(
    entries: Any,
    state: Any,
    state_pos: Any,
    ratio: int,
    num_tokens: int,
    out_kv: Any,
    out_state: Any,
    err: Any,
) -> None:
    n_c = entries.shape[0]
    kv_words = entries.shape[1]
    ring = state.shape[0]
    row_words = state.shape[1]
    first_tail = ratio * n_c
    tail = num_tokens - first_tail
    base = first_tail - (ring - ratio)
    for r in range(cuda.blockIdx.x, n_c + tail + ring, cuda.gridDim.x):
        if r < n_c:
            for k in range(cuda.threadIdx.x, kv_words, cuda.blockDim.x):
                out_kv[r, k] = entries[r, k]
        elif r < n_c + tail:
            q = first_tail + (r - n_c)
            slot = q % ring
            ok = state_pos[slot] == q
            if not ok and cuda.threadIdx.x == 0:
                cuda.atomic.min(err, 0, q)
            for k in range(cuda.threadIdx.x, kv_words, cuda.blockDim.x):
                out_kv[r, k] = state[slot, k] if ok else 0
        else:
            s = r - n_c - tail
            q = base + s
            live = q >= 0 and q < num_tokens
            slot = q % ring
            ok = live and state_pos[slot] == q
            if live and not ok and cuda.threadIdx.x == 0:
                cuda.atomic.min(err, 0, q)
            for k in range(cuda.threadIdx.x, row_words, cuda.blockDim.x):
                out_state[s, k] = state[slot, k] if ok else 0


splice_kernel = cuda.jit(_splice)


def launch_splice(
    entries: Any,
    state: Any,
    state_pos: Any,
    ratio: int,
    num_tokens: int,
    out_kv: Any,
    out_state: Any,
    err: Any,
    cfg: LaunchConfig,
    stream: Any = 0,
) -> None:
    """Launch the splice over ``n_c + t + S`` output rows (see the module docstring)."""
    rows = out_kv.shape[0] + out_state.shape[0]
    if rows == 0:
        return
    splice_kernel[cfg.blocks(rows), cfg.threads, stream](
        entries, state, state_pos, ratio, num_tokens, out_kv, out_state, err
    )
