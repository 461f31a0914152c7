"""SWA ring re-alignment: kernel (simulator) vs torch, at and around the n_win boundary."""

import pytest
import torch

from kvstate.kernels import (
    Backend,
    KernelInputError,
    LaunchConfig,
    WindowPositionError,
    launch_override,
    realign_window,
)
from kvstate.spec.geometry import small

SIM, REF = Backend.SIMULATOR, Backend.TORCH
N_WIN = small().n_win  # 16


def _ring(end: int, row: tuple[int, ...] = (5,), dtype: torch.dtype = torch.float32):
    ring = torch.full((N_WIN, *row), -3.0, dtype=dtype)
    pos = torch.full((N_WIN,), -1, dtype=torch.int32)
    for p in range(end):
        ring[p % N_WIN] = p + 1.0
        pos[p % N_WIN] = p
    return ring, pos


@pytest.mark.parametrize("end", [0, 1, 5, 15, 16, 17, 31, 32, 40])
@pytest.mark.parametrize("cfg", [None, LaunchConfig(threads=2, max_blocks=3)])
def test_window_in_position_order(end: int, cfg) -> None:
    ring, pos = _ring(end)
    if cfg is None:
        got = realign_window(ring, end, ring_pos=pos, backend=SIM)
    else:
        with launch_override(cfg):
            got = realign_window(ring, end, ring_pos=pos, backend=SIM)
    assert torch.equal(got, realign_window(ring, end, ring_pos=pos, backend=REF))
    for r in range(N_WIN):
        p = end - N_WIN + r
        assert torch.equal(got[r], torch.full((5,), p + 1.0 if p >= 0 else 0.0))


def test_multi_dim_bf16_rows_without_positions() -> None:
    ring, _ = _ring(21, (3, 4), torch.bfloat16)
    got = realign_window(ring, 21, backend=SIM)
    assert torch.equal(got, realign_window(ring, 21, backend=REF))
    assert (
        got.dtype == torch.bfloat16 and got[0, 0, 0].item() == 6.0 and got[-1, 2, 3].item() == 21.0
    )


@pytest.mark.parametrize("backend", [SIM, REF])
def test_stale_slot_raises_with_position(backend: Backend) -> None:
    ring, pos = _ring(20)
    pos[18 % N_WIN] = 2  # slot of position 18 was never rewritten
    with pytest.raises(WindowPositionError) as info:
        realign_window(ring, 20, ring_pos=pos, backend=backend)
    assert info.value.position == 18


def test_unchecked_stale_slot_is_zero_on_both_backends() -> None:
    ring, pos = _ring(20)
    pos[7] = 3
    got = realign_window(ring, 20, ring_pos=pos, check=False, backend=SIM)
    assert torch.equal(got, realign_window(ring, 20, ring_pos=pos, check=False, backend=REF))
    assert torch.equal(got[7 - (20 - N_WIN)], torch.zeros(5))


def test_window_errors() -> None:
    ring, pos = _ring(3)
    with pytest.raises(KernelInputError, match="end >= 0"):
        realign_window(ring, -1, backend=SIM)
    with pytest.raises(KernelInputError, match="entries"):
        realign_window(ring, 3, ring_pos=pos[:4], backend=SIM)
