"""Multi-group readiness intersection: longest prefix every group can serve."""

import pytest
import torch

from kvstate.kernels import (
    Backend,
    KernelInputError,
    LaunchConfig,
    launch_override,
    longest_ready_prefix,
)

SIM, REF = Backend.SIMULATOR, Backend.TORCH


def _bitmap(
    groups: int, cols: int, fails: dict[int, list[int]], dtype: torch.dtype
) -> torch.Tensor:
    ready = torch.ones(groups, cols, dtype=torch.int32)
    for g, where in fails.items():
        ready[g, where] = 0
    return ready.to(dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.bool])
@pytest.mark.parametrize(
    ("groups", "cols", "fails", "expect"),
    [
        (3, 40, {}, 40),  # all ready
        (3, 40, {0: [0]}, 0),  # first block missing in one group
        (3, 40, {1: [17, 30], 2: [25]}, 17),  # groups disagree: the minimum wins
        (4, 40, {3: [39]}, 39),  # only the last block missing
        (1, 1, {}, 1),  # single block
        (1, 1, {0: [0]}, 0),
        (2, 0, {}, 0),  # no blocks at all
    ],
)
def test_prefix_matches_reference(groups, cols, fails, expect, dtype) -> None:
    ready = _bitmap(groups, cols, fails, dtype)
    assert longest_ready_prefix(ready, backend=SIM) == expect
    assert longest_ready_prefix(ready, backend=REF) == expect
    with launch_override(LaunchConfig(threads=4, max_blocks=2)):  # grid-stride + contention
        assert longest_ready_prefix(ready, backend=SIM) == expect


def test_random_bitmaps_agree() -> None:
    g = torch.Generator().manual_seed(7)
    for _ in range(6):
        ready = (torch.rand(3, 24, generator=g) < 0.93).to(torch.uint8)
        assert longest_ready_prefix(ready, backend=SIM) == longest_ready_prefix(ready, backend=REF)


def test_prefix_in_lcm_units_rounds_down() -> None:
    ready = _bitmap(2, 12, {1: [7]}, torch.uint8)  # 7 ready blocks
    assert longest_ready_prefix(ready, unit_blocks=2, backend=SIM) == 3
    assert longest_ready_prefix(ready, unit_blocks=4, backend=REF) == 1
    assert longest_ready_prefix(ready, unit_blocks=8, backend=SIM) == 0


def test_errors() -> None:
    with pytest.raises(KernelInputError, match="groups >= 1"):
        longest_ready_prefix(torch.ones(0, 4, dtype=torch.uint8), backend=SIM)
    with pytest.raises(KernelInputError, match="bool or integer"):
        longest_ready_prefix(torch.ones(2, 4), backend=SIM)
    with pytest.raises(KernelInputError, match="unit_blocks"):
        longest_ready_prefix(torch.ones(2, 4, dtype=torch.uint8), unit_blocks=0, backend=SIM)
