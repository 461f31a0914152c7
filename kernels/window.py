"""SWA window re-alignment: ring buffer -> the request's window in position order.

The sliding-window branch keeps ``n_win`` rows in a ring (position ``p`` in slot ``p % n_win``).
Attention after a restore wants the window as a plain array in position order, with positions
before 0 as null rows; reading the ring in slot order instead is the stale/rotated-window bug
class (ROCm ATOM 1417).

Semantics (``reference.realign_window_ref`` is the executable specification): output row ``r``
is position ``end - n_win + r``; it is a zero row if that position is negative, otherwise a copy
of ring slot ``position % n_win``.  With ``has_pos`` set, ``ring_pos[slot]`` (the position each
slot holds, -1 if never written) must equal that position; a row that fails is zero-filled and
the smallest failing position is recorded with ``atomic.min`` in ``err[0]`` (initialised to
``end``), which the dispatcher turns into ``WindowPositionError``.

One block per output row, threads over the row's words (rows are word views, dtype-agnostic).
"""

from __future__ import annotations

from typing import Any, no_type_check

from numba import cuda

from ._launch import LaunchConfig


@no_type_check  # device code: Numba types it, not mypy
def _realign(ring: Any, ring_pos: Any, end: int, has_pos: int, out: Any, err: Any) -> None:
    n_win = ring.shape[0]
    row_words = ring.shape[1]
    for r in range(cuda.blockIdx.x, n_win, cuda.gridDim.x):
        q = end - n_win + r
        slot = q % n_win
        ok = q >= 0
        if ok and has_pos != 0 and ring_pos[slot] != q:
            ok = False
            if cuda.threadIdx.x == 0:
                cuda.atomic.min(err, 0, q)
        for k in range(cuda.threadIdx.x, row_words, cuda.blockDim.x):
            out[r, k] = ring[slot, k] if ok else 0


realign_kernel = cuda.jit(_realign)


def launch_realign(
    ring: Any,
    ring_pos: Any,
    end: int,
    has_pos: bool,
    out: Any,
    err: Any,
    cfg: LaunchConfig,
    stream: Any = 0,
) -> None:
    """Launch the re-alignment; ``ring_pos`` may be a 1-element dummy when ``has_pos`` is False."""
    if ring.shape[0] == 0:
        return
    realign_kernel[cfg.blocks(ring.shape[0]), cfg.threads, stream](
        ring, ring_pos, end, 1 if has_pos else 0, out, err
    )
