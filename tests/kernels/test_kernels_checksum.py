"""Block checksum: kernel (simulator) vs torch, and the detection guarantees it documents."""

import itertools

import pytest
import torch

from kvstate.kernels import Backend, LaunchConfig, block_checksum, launch_override
from kvstate.kernels.reference import block_checksum_ref

SIM, REF = Backend.SIMULATOR, Backend.TORCH


def _bytes(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(
        0, 256, (n, length), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


def _python_checksum(data: bytes) -> int:
    """The definition, in plain Python integers."""
    a = (1 + sum(data)) % 2**32
    b = (len(data) + sum((i + 1) * x for i, x in enumerate(data))) % 2**32
    value = (b << 32) | a
    return value - 2**64 if value >= 2**63 else value


@pytest.mark.parametrize(
    "blocks",
    [
        _bytes(5, 64),
        _bytes(3, 37, seed=1),  # ragged last word: padded path
        _bytes(2, 1, seed=2),
        torch.zeros(2, 0, dtype=torch.uint8),  # empty rows
        torch.zeros(0, 16, dtype=torch.uint8),  # no rows
        torch.full((2, 48), 255, dtype=torch.uint8),
        torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(3)),  # float32 rows
        torch.randn(2, 7, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16),
    ],
)
@pytest.mark.parametrize("cfg", [None, LaunchConfig(threads=8, max_blocks=2)])
def test_kernel_matches_reference_and_definition(blocks: torch.Tensor, cfg) -> None:
    if cfg is None:
        got = block_checksum(blocks, backend=SIM)
    else:
        with launch_override(cfg):
            got = block_checksum(blocks, backend=SIM)
    want = block_checksum(blocks, backend=REF)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    for i in range(blocks.shape[0]):
        raw = blocks[i].contiguous().view(torch.uint8).reshape(-1).tolist()
        assert int(want[i]) == _python_checksum(bytes(raw))


def test_zero_block_does_not_checksum_to_zero_and_length_counts() -> None:
    a = block_checksum(torch.zeros(1, 64, dtype=torch.uint8), backend=SIM)
    b = block_checksum(torch.zeros(1, 65, dtype=torch.uint8), backend=SIM)
    assert int(a[0]) != 0 and int(a[0]) != int(b[0])


def test_every_single_byte_flip_is_detected() -> None:
    base = _bytes(1, 48, seed=5)[0]
    variants = []
    for i, delta in itertools.product(range(48), (1, 128, 255)):
        v = base.clone()
        v[i] = (int(v[i]) + delta) % 256
        variants.append(v)
    flipped = torch.stack(variants)
    ref = block_checksum_ref(flipped)
    assert bool((ref != block_checksum_ref(base.unsqueeze(0))).all())
    sample = flipped[::9]  # the kernel on a slice of them (the simulator is slow)
    assert torch.equal(block_checksum(sample, backend=SIM), ref[::9])


def test_every_swap_of_two_different_bytes_is_detected() -> None:
    base = _bytes(1, 32, seed=6)[0]
    variants = []
    for i, j in itertools.combinations(range(32), 2):
        if base[i] != base[j]:
            v = base.clone()
            v[i], v[j] = base[j], base[i]
            variants.append(v)
    swapped = torch.stack(variants)
    ref = block_checksum_ref(swapped)
    assert bool((ref != block_checksum_ref(base.unsqueeze(0))).all())
    assert torch.equal(block_checksum(swapped[::25], backend=SIM), ref[::25])


def test_swap_far_apart_in_a_large_block() -> None:
    base = torch.zeros(1, 1 << 20, dtype=torch.uint8)
    base[0, 3], base[0, (1 << 20) - 2] = 1, 200
    swapped = base.clone()
    swapped[0, 3], swapped[0, (1 << 20) - 2] = 200, 1
    assert int(block_checksum_ref(base)[0]) != int(block_checksum_ref(swapped)[0])
