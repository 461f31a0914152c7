"""FP8 e4m3 + UE8M0 + BF16 entry dequantization: kernel (simulator) vs torch, bit for bit."""

import warnings

import pytest
import torch

from kvstate.kernels import (
    Backend,
    EntryLayout,
    KernelInputError,
    LaunchConfig,
    dequantize_entries,
    launch_override,
    quantize_entries,
)
from kvstate.kernels.reference import dequantize_entries_ref
from kvstate.spec.geometry import deepseek_v4_flash, small

SIM, REF = Backend.SIMULATOR, Backend.TORCH


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality, except that any NaN matches any NaN (payloads are not specified)."""
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return False
    return torch.equal(a.view(torch.int32)[~nan_a], b.view(torch.int32)[~nan_b])


def test_layouts_match_the_geometries() -> None:
    flash = EntryLayout.from_geometry(deepseek_v4_flash())
    assert (flash.entry_bytes, flash.n_scales, flash.rope_off, flash.head_dim) == (584, 7, 455, 512)
    tiny = EntryLayout.from_geometry(small())
    assert (tiny.entry_bytes, tiny.n_scales, tiny.rope_off, tiny.head_dim) == (152, 7, 119, 128)


@pytest.mark.parametrize("geom", [small, deepseek_v4_flash])
@pytest.mark.parametrize("cfg", [None, LaunchConfig(threads=8, max_blocks=2)])
def test_round_trip_is_bit_exact_and_close(geom, cfg) -> None:
    layout = EntryLayout.from_geometry(geom())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, layout.head_dim, generator=g) * torch.logspace(-3, 3, 6).unsqueeze(1)
    packed = quantize_entries(x, layout)
    assert packed.dtype == torch.uint8 and packed.shape == (6, layout.entry_bytes)
    assert not packed[:, layout.rope_off + 2 * layout.rope_dims :].any()  # zero padding
    if cfg is None:
        got = dequantize_entries(packed, layout, backend=SIM)
    else:
        with launch_override(cfg):
            got = dequantize_entries(packed, layout, backend=SIM)
    want = dequantize_entries(packed, layout, backend=REF)
    assert _bits_equal(got, want)
    # e4m3 keeps 3 mantissa bits: error <= half an ulp of the group's scale-aligned amax
    nope = x[:, : layout.fp8_dims].reshape(6, layout.n_scales, layout.scale_group)
    amax = nope.abs().amax(-1, keepdim=True)
    err = (got[:, : layout.fp8_dims].reshape_as(nope) - nope).abs()
    assert bool((err <= amax / 16 + 1e-30).all())
    rope = x[:, layout.fp8_dims :]
    assert torch.equal(got[:, layout.fp8_dims :], rope.to(torch.bfloat16).to(torch.float32))


def test_every_fp8_code_and_extreme_scale_decodes_like_torch() -> None:
    layout = EntryLayout(fp8_dims=256, scale_group=32, rope_dims=4, entry_bytes=272)
    scales = [0, 1, 100, 127, 130, 200, 254, 255]  # 2**-127 (subnormal) ... 2**127, NaN
    rows = []
    for i, s in enumerate(scales):
        row = torch.zeros(layout.entry_bytes, dtype=torch.uint8)
        row[:256] = torch.roll(torch.arange(256, dtype=torch.int32), 37 * i).to(torch.uint8)
        row[layout.scale_off : layout.scale_off + layout.n_scales] = s
        rows.append(row)
    entries = torch.stack(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the simulator's float32 overflow to inf
        got = dequantize_entries(entries, layout, backend=SIM)
    want = dequantize_entries_ref(entries, layout)
    assert _bits_equal(got, want)
    assert bool(torch.isinf(got).any()) and bool(torch.isnan(got).any())  # edges were reached
    assert bool(((got != 0) & (got.abs() < 2.0**-126)).any())  # subnormal results too


def test_bf16_special_patterns_decode_like_torch() -> None:
    layout = EntryLayout(fp8_dims=8, scale_group=8, rope_dims=12, entry_bytes=40)
    patterns = [
        0x0000,
        0x8000,
        0x0001,
        0x807F,
        0x0080,
        0x3F80,
        0xBF80,
        0x7F7F,
        0x7F80,
        0xFF80,
        0x7FC0,
        0x7F81,
    ]
    entries = torch.zeros(2, layout.entry_bytes, dtype=torch.uint8)
    for j, p in enumerate(patterns):
        entries[:, layout.rope_off + 2 * j] = p & 0xFF
        entries[:, layout.rope_off + 2 * j + 1] = p >> 8
    entries[1, : layout.fp8_dims] = torch.tensor(
        [0x7F, 0xFF, 0x80, 0x01, 0x08, 0x7E, 0x38, 0xB8], dtype=torch.uint8
    )
    entries[1, layout.scale_off] = 127
    got = dequantize_entries(entries, layout, backend=SIM)
    want = dequantize_entries_ref(entries, layout)
    assert _bits_equal(got, want)
    assert got[1, 6].item() == 1.0 and got[1, 7].item() == -1.0 and got[1, 5].item() == 448.0
    assert got[0, layout.fp8_dims + 5].item() == 1.0 and got[0, layout.fp8_dims + 1].item() == 0.0
    assert str(got[0, layout.fp8_dims + 1].item()) == "-0.0"


def test_quantizer_picks_the_smallest_non_saturating_power_of_two() -> None:
    layout = EntryLayout(fp8_dims=8, scale_group=2, rope_dims=0, entry_bytes=16)
    x = torch.tensor([[448.0, -1.0, 449.0, 0.0, 0.0, 0.0, 1e-30, 0.0]])
    packed = quantize_entries(x, layout)
    assert packed[0, layout.scale_off : layout.scale_off + 4].tolist() == [
        127,
        128,
        127,
        19,
    ]  # 1e-30 / 2**-108 = 324.5
    back = dequantize_entries(packed, layout, backend=SIM)
    assert back[0, 0].item() == 448.0 and back[0, 1].item() == -1.0 and back[0, 2].item() == 448.0
    with pytest.raises(KernelInputError, match="inf or NaN"):
        quantize_entries(torch.tensor([[float("inf")] + [0.0] * 7]), layout)


def test_shapes_and_empty_input() -> None:
    layout = EntryLayout.from_geometry(small())
    empty = torch.zeros(0, layout.entry_bytes, dtype=torch.uint8)
    assert dequantize_entries(empty, layout, backend=SIM).shape == (0, 128)
    with pytest.raises(KernelInputError, match="uint8"):
        dequantize_entries(torch.zeros(2, 151, dtype=torch.uint8), layout, backend=SIM)
    with pytest.raises(ValueError, match="scale_group"):
        EntryLayout(fp8_dims=10, scale_group=4, rope_dims=0, entry_bytes=16)
    with pytest.raises(ValueError, match="payload"):
        EntryLayout(fp8_dims=8, scale_group=4, rope_dims=4, entry_bytes=16)


def test_strided_entries_and_out() -> None:
    layout = EntryLayout.from_geometry(small())
    x = torch.randn(8, layout.head_dim, generator=torch.Generator().manual_seed(3))
    packed = quantize_entries(x, layout)
    pages = torch.zeros(4, 2 * layout.entry_bytes + 16, dtype=torch.uint8)
    pages[:, : 2 * layout.entry_bytes] = packed.view(4, -1)
    view = pages[:, : 2 * layout.entry_bytes].reshape(4, 2, layout.entry_bytes)[:, 1]  # strided
    out = torch.zeros(4, 2 * layout.head_dim)[:, ::2]  # strided output
    dequantize_entries(view, layout, out, backend=SIM)
    assert _bits_equal(out, dequantize_entries_ref(packed[1::2], layout))
