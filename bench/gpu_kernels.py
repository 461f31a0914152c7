"""Sections 2 and 3 of the GPU check (``bench/gpu_check.py``): every kernel against its torch
reference on awkward inputs, bit for bit, and each kernel's bandwidth against a plain copy."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

# the sibling modules of this script (``bench/`` is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import CUDA, REF, Checks, Row, same_bits, timed  # noqa: E402

from kvstate.kernels import (  # noqa: E402
    BlockTableError,
    EntryLayout,
    TailDiscontinuityError,
    dequantize_entries,
    gather_blocks,
    quantize_entries,
    scatter_blocks,
    splice_tail,
)
from kvstate.kernels import paged as paged_kernels  # noqa: E402
from kvstate.kernels._launch import GPU_LAUNCH  # noqa: E402
from kvstate.spec.geometry import deepseek_v4_flash  # noqa: E402


# ---- 2. edge cases --------------------------------------------------------------------------
def check_edge_cases(dev: torch.device) -> Checks:
    c = Checks()
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if dtype == torch.uint8:
            return torch.randint(0, 256, shape, generator=g, device=dev, dtype=torch.uint8)
        return torch.randn(shape, generator=g, device=dev).to(dtype)

    print("edge cases (CUDA vs torch reference on the same GPU):")
    cases = [
        ((8, 40), torch.uint8, [3, -1, 0, 7], None),
        ((8, 40), torch.uint8, [3, 5, 1], 97),
        ((6, 4, 3, 2), torch.bfloat16, [2, -1, 5], 9),
        ((5, 8, 16), torch.float32, [4], None),
        ((4, 6), torch.int64, [-1, -1, -1], None),
        ((4, 6), torch.int64, [], None),
    ]
    for shape, dtype, table, length in cases:
        tier = rnd(shape, dtype)
        for idx in (torch.int32, torch.int64):
            t = torch.tensor(table, dtype=idx, device=dev)
            got = gather_blocks(tier, t, length=length, backend=CUDA)
            want = gather_blocks(tier, t, length=length, backend=REF)
            c.expect(
                f"gather {dtype} {shape} table={table} length={length} {idx}", same_bits(got, want)
            )
        n_units = length if length is not None else len(table) * shape[1]
        src = rnd((n_units, *shape[2:]), dtype)
        t = torch.tensor(table, dtype=torch.int32, device=dev)
        a, b = tier.clone(), tier.clone()
        scatter_blocks(src, t, a, length=length, backend=CUDA)
        scatter_blocks(src, t, b, length=length, backend=REF)
        c.expect(f"scatter {dtype} {shape} table={table} length={length}", same_bits(a, b))
    base = rnd((6, 41), torch.uint8)
    t = torch.tensor([5, 0, -1], device=dev)
    c.expect(
        "gather from an unaligned strided tier",
        same_bits(
            gather_blocks(base[:, 1:], t, backend=CUDA), gather_blocks(base[:, 1:], t, backend=REF)
        ),
    )
    c.raises(
        "bad slot raises BlockTableError",
        BlockTableError,
        lambda: gather_blocks(rnd((4, 8)), torch.tensor([0, 9], device=dev), backend=CUDA),
    )
    # the kernel's own guard (dispatcher validation bypassed): no fault, flag set, nothing read
    tier = rnd((4, 8), torch.int64)
    buf = torch.zeros(16, dtype=torch.int64, device=dev)
    err = torch.full((1,), 2, dtype=torch.int64, device=dev)
    bad_table = torch.tensor([7, -5], dtype=torch.int64, device=dev)
    from numba import cuda

    paged_kernels.launch_gather(
        cuda.as_cuda_array(tier),
        cuda.as_cuda_array(bad_table),
        cuda.as_cuda_array(buf),
        16,
        cuda.as_cuda_array(err),
        GPU_LAUNCH,
        cuda.external_stream(torch.cuda.current_stream().cuda_stream),
    )
    c.expect(
        "kernel flags out-of-range slots without touching memory",
        int(err[0]) == 0 and not bool(buf.any()),
    )

    lay = EntryLayout.from_geometry(deepseek_v4_flash())
    x = rnd((33, lay.head_dim)) * torch.logspace(-4, 4, 33, device=dev).unsqueeze(1)
    packed = quantize_entries(x, lay)
    c.expect(
        "dequant flash entries bit-exact",
        same_bits(
            dequantize_entries(packed, lay, backend=CUDA),
            dequantize_entries(packed, lay, backend=REF),
        ),
    )
    every = torch.zeros(8, 272, dtype=torch.uint8, device=dev)
    every[:, :256] = torch.arange(256, device=dev, dtype=torch.uint8)
    every[:, 256:264] = torch.tensor(
        [0, 1, 100, 127, 130, 200, 254, 255], device=dev, dtype=torch.uint8
    ).unsqueeze(1)
    every[:, 264:272] = torch.tensor(
        [0x01, 0x00, 0x80, 0x7F, 0x80, 0x7F, 0xC0, 0xFF], device=dev, dtype=torch.uint8
    )
    lay2 = EntryLayout(fp8_dims=256, scale_group=32, rope_dims=4, entry_bytes=272)
    c.expect(
        "dequant every fp8 code x extreme scales, bf16 specials",
        same_bits(
            dequantize_entries(every, lay2, backend=CUDA),
            dequantize_entries(every, lay2, backend=REF),
        ),
    )

    def layer(ratio: int, ring: int, num_tokens: int):
        n_c = num_tokens // ratio
        entries = rnd((n_c, 64))
        state = rnd((ring, 128))
        pos = torch.full((ring,), -1, dtype=torch.int64, device=dev)
        for q in range(num_tokens):
            pos[q % ring] = q
        return entries, state, pos

    for ratio, rows in ((4, 8), (16, 16)):
        for p in (0, 3, 4, 5, 16, 19, 40):
            e, s, pos = layer(ratio, rows, p)
            a = splice_tail(e, s, pos, ratio=ratio, num_tokens=p, backend=CUDA)
            b = splice_tail(e, s, pos, ratio=ratio, num_tokens=p, backend=REF)
            c.expect(
                f"splice m={ratio} S={rows} P={p}",
                same_bits(a.kv, b.kv) and same_bits(a.state, b.state),
            )
    e, s, pos = layer(4, 8, 14)
    pos[13 % 8] = 5
    c.raises(
        "stale tail row raises TailDiscontinuityError",
        TailDiscontinuityError,
        lambda: splice_tail(e, s, pos, ratio=4, num_tokens=14, backend=CUDA),
    )

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # kernels must follow torch's current stream
        t = torch.tensor([3, 1], device=dev)
        tier = rnd((4, 1 << 16))
        out = gather_blocks(tier, t, check=False, backend=CUDA)
    side.synchronize()
    c.expect("gather on a side stream", torch.equal(out, tier[[3, 1]]))
    return c


# ---- 3. bandwidth ---------------------------------------------------------------------------
def _copy_bandwidth(dev: torch.device, scale: float, iters: int) -> float:
    nbytes = max(1 << 20, int((1 << 30) * scale))
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / timed(lambda: dst.copy_(src), iters)


def _bw_paged(
    dev: torch.device, g: torch.Generator, scale: float, iters: int, page: int
) -> list[Row]:
    nb = max(64, int(16384 * scale))
    n = nb // 2
    tier = torch.randint(0, 256, (nb, 1, page), generator=g, device=dev, dtype=torch.uint8)
    table = torch.randperm(nb, generator=g, device=dev)[:n].to(torch.int32)
    table[::97] = -1
    out = torch.zeros(n, 1, page, dtype=torch.uint8, device=dev)
    t_gather = timed(lambda: gather_blocks(tier, table, out, check=False, backend=CUDA), iters)
    ok_gather = same_bits(out, gather_blocks(tier, table, backend=REF))
    written = tier.clone()
    t_scatter = timed(lambda: scatter_blocks(out, table, written, check=False, backend=CUDA), iters)
    ok_scatter = same_bits(written, scatter_blocks(out, table, tier.clone(), backend=REF))
    note = f"{n} x {page} B"
    return [
        Row("gather pages", 2 * n * page, t_gather, ok_gather, note),
        Row("scatter pages", 2 * n * page, t_scatter, ok_scatter, note),
    ]


def _bw_dequant(
    dev: torch.device, g: torch.Generator, scale: float, iters: int, lay: EntryLayout
) -> Row:
    ne = max(256, int((1 << 19) * scale))
    packed = quantize_entries(torch.randn(ne, lay.head_dim, generator=g, device=dev), lay)
    deq = torch.empty(ne, lay.head_dim, device=dev)
    t = timed(lambda: dequantize_entries(packed, lay, deq, backend=CUDA), iters)
    ok = same_bits(deq, dequantize_entries(packed, lay, backend=REF))
    moved = ne * (lay.entry_bytes + 4 * lay.head_dim)
    return Row("dequant entries", moved, t, ok, f"{ne} x {lay.entry_bytes} B -> fp32")


def _bw_splice(dev: torch.device, g: torch.Generator, scale: float, iters: int, dim: int) -> Row:
    n_c = max(64, int((1 << 18) * scale))  # a CSA layer at ~1M tokens: 262144 fp32 entries
    tokens = 4 * n_c + 3
    entries = torch.randn(n_c, dim, generator=g, device=dev)
    state = torch.randn(8, 2 * dim, generator=g, device=dev)
    pos = torch.full((8,), -1, dtype=torch.int64, device=dev)
    live = torch.arange(tokens - 7, tokens, device=dev)  # overlap (4) + tail (3) positions
    pos[live % 8] = live
    kv = torch.empty(n_c + 3, dim, device=dev)
    st = torch.empty(8, 2 * dim, device=dev)

    def run() -> object:
        return splice_tail(
            entries,
            state,
            pos,
            ratio=4,
            num_tokens=tokens,
            out_kv=kv,
            out_state=st,
            check=False,
            backend=CUDA,
        )

    t = timed(run, iters)
    ref = splice_tail(entries, state, pos, ratio=4, num_tokens=tokens, backend=REF)
    ok = same_bits(kv, ref.kv) and same_bits(st, ref.state)
    return Row("splice tail", 2 * kv.numel() * 4, t, ok, f"{n_c} entries x {dim} fp32")


def bandwidth(dev: torch.device, scale: float, iters: int) -> tuple[float, list[Row]]:
    """(copy bandwidth in B/s, one row per kernel) at DeepSeek-V4-Flash sizes times ``scale``."""
    geom = deepseek_v4_flash()
    lay = EntryLayout.from_geometry(geom)
    page = geom.page_bytes(geom.csa_ratio)  # 37440 B: 64 CSA entries, padded to 576
    g = torch.Generator(device=dev).manual_seed(1)
    copy_bw = _copy_bandwidth(dev, scale, iters)
    rows = _bw_paged(dev, g, scale, iters, page)
    rows.append(_bw_dequant(dev, g, scale, iters, lay))
    rows.append(_bw_splice(dev, g, scale, iters, lay.head_dim))
    return copy_bw, rows
