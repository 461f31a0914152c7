"""Torch references: the executable specification of every kernel, and the CPU backend.

Each function here states the result of one kernel in plain vectorised torch, on any device.
The kernels are tested against these bit for bit, and the dispatcher's TORCH backend calls them
directly, so a machine without a GPU runs exactly the semantics a GPU runs.  Data-dependent
errors (bad slots, discontinuous tails, stale ring slots) raise the same exceptions, with the same
first offending index, as the kernels' error flags produce through the dispatcher.

The references assume the dispatcher has already checked shapes and dtypes; the quantizer, which
impl/ and tests call directly, checks its own input.
"""

from __future__ import annotations

import torch

from .errors import BlockTableError, KernelInputError, TailDiscontinuityError
from .layout import EntryLayout

_FP8_MAX = 448.0  # largest finite float8_e4m3fn


# ---- paged gather / scatter -------------------------------------------------------------------
def check_block_table(table: torch.Tensor, num_blocks: int, *, unique: bool) -> None:
    """Raise ``BlockTableError`` at the first slot that is neither -1 nor in ``[0, num_blocks)``;
    with ``unique``, also at the first slot that repeats an earlier one (a scatter write race)."""
    if table.device.type == "cpu" and table.numel() <= _SMALL_TABLE:
        # the library's own tables (one block, or one block per layer) are small and on the
        # host: a Python pass costs a microsecond where the tensor form below costs tens
        slots = table.tolist()
        if _strided(slots, num_blocks) is None:  # (a strided table is in range and unique)
            _check_small_table(slots, num_blocks, unique)
        return
    t = table.to(torch.int64)
    bad = ((t < -1) | (t >= num_blocks)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise BlockTableError(
            f"block table entry {i} holds slot {int(t[i])}, outside [0, {num_blocks}) and not -1",
            i,
        )
    if unique:
        live = (t >= 0).nonzero().flatten()
        if live.numel() > 1:
            vals = t[live]
            order = torch.argsort(vals, stable=True)
            dup = (vals[order][1:] == vals[order][:-1]).nonzero().flatten()
            if dup.numel():
                i = int(live[order[dup + 1]].min())
                raise BlockTableError(
                    f"scatter block table entry {i} repeats slot {int(t[i])}: two blocks would "
                    "race to write it",
                    i,
                )


_SMALL_TABLE = 512


def _check_small_table(slots: list[int], num_blocks: int, unique: bool) -> None:
    """``check_block_table`` on a host list (same first index, same messages)."""
    for i, s in enumerate(slots):
        if s < -1 or s >= num_blocks:
            raise BlockTableError(
                f"block table entry {i} holds slot {s}, outside [0, {num_blocks}) and not -1", i
            )
    if unique:
        seen: set[int] = set()
        for i, s in enumerate(slots):
            if s >= 0:
                if s in seen:
                    raise BlockTableError(
                        f"scatter block table entry {i} repeats slot {s}: two blocks would race "
                        "to write it",
                        i,
                    )
                seen.add(s)


def _strided(slots: list[int], num_blocks: int) -> tuple[int, int, int, int] | None:
    """``(first, run, step, runs)`` when ``slots[i] == first + (i // run) * step + i % run``
    for every ``i`` (``runs`` runs of ``run`` consecutive slots, ``step >= run`` apart, so no
    slot repeats) and every slot is in ``[0, num_blocks)``; else None.  The library's tables
    are of this form (one slot in every layer: ``li * per + slot``; a block's window pages in
    every layer), and such a table's slots are one strided view of the tier: the whole move
    is one copy instead of a Python loop of one copy per slot."""
    n = len(slots)
    if n == 0:
        return None
    first = slots[0]
    run = 1
    while run < n and slots[run] == first + run:
        run += 1
    if n % run:
        return None
    runs = n // run
    step = slots[run] - first if runs > 1 else run
    if step < run or first < 0 or first + (runs - 1) * step + run > num_blocks:
        return None
    i = 0
    for r in range(runs):
        base = first + r * step
        for k in range(run):
            if slots[i] != base + k:
                return None
            i += 1
    return first, run, step, runs


def _strided_view(tier: torch.Tensor, form: tuple[int, int, int, int]) -> torch.Tensor | None:
    """The blocks of a strided table (:func:`_strided`) in a contiguous ``tier``
    ``[num_blocks, units, width]``, as one view ``[runs, run, units, width]`` (None when the
    tier is not contiguous)."""
    if not tier.is_contiguous():
        return None
    first, run, step, runs = form
    blk = tier.shape[1] * tier.shape[2]
    return tier.as_strided(
        (runs, run, tier.shape[1], tier.shape[2]),
        (step * blk, blk, tier.shape[2], 1),
        tier.storage_offset() + first * blk,
    )


def all_live(table: torch.Tensor, num_blocks: int) -> bool:
    """Every slot in ``[0, num_blocks)`` (no -1 padding): whole blocks move as one indexed copy."""
    if table.numel() == 0:
        return True
    if table.device.type == "cpu" and table.numel() <= _SMALL_TABLE:
        slots = table.tolist()
        return min(slots) >= 0 and max(slots) < num_blocks
    return bool(((table >= 0) & (table < num_blocks)).all())


def _unit_index(
    table: torch.Tensor, block_units: int, length: int, num_blocks: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every buffer unit that a live slot covers: (buffer unit, tier slot, unit in block).
    Slots outside ``[0, num_blocks)`` (-1 included) move nothing, as in the kernels."""
    u = torch.arange(length, device=table.device)
    slot = table.to(torch.int64)[u // block_units] if length else u
    live = (slot >= 0) & (slot < num_blocks)
    return u[live], slot[live], (u % block_units)[live]


def gather_blocks_ref(
    tier: torch.Tensor, table: torch.Tensor, out: torch.Tensor, length: int, check: bool = True
) -> torch.Tensor:
    """``out`` viewed as ``[length, unit]`` gets unit ``u`` from ``tier[table[u // B], u % B]``
    (``B = tier.shape[1]``, ``unit = tier.shape[2:]``); slots -1 leave ``out`` untouched.
    ``check`` raises ``BlockTableError`` on a bad slot; without it bad slots are skipped."""
    if check:
        check_block_table(table, tier.shape[0], unique=False)
    src = tier.reshape(tier.shape[0], tier.shape[1], -1)
    n, units = table.shape[0], tier.shape[1]
    if length == n * units and n <= _SMALL_TABLE and all_live(table, tier.shape[0]):
        # whole blocks, no padding: one block copy per slot (the same bytes as the per-unit
        # form; torch's byte index_select is element-serial, a block copy is a memcpy), or
        # one copy in all for a strided table
        blocks = out.view(n, units, src.shape[2])
        slots = table.tolist()
        form = _strided(slots, tier.shape[0])
        view = None if form is None else _strided_view(src, form)
        if view is not None:
            blocks.reshape(view.shape).copy_(view)
            return out
        for i, slot in enumerate(slots):
            blocks[i].copy_(src[slot])
        return out
    dst = out.view(length, src.shape[2])
    u, slot, w = _unit_index(table, tier.shape[1], length, tier.shape[0])
    dst[u] = src[slot, w]
    return out


def scatter_blocks_ref(
    src: torch.Tensor, table: torch.Tensor, tier: torch.Tensor, length: int, check: bool = True
) -> torch.Tensor:
    """Inverse of the gather: ``tier[table[u // B], u % B] = src[u]`` for every unit of a live
    slot; -1 slots write nothing.  ``check`` refuses bad and repeated slots (without it, bad
    slots are skipped and repeated slots race, as in the kernel)."""
    if check:
        check_block_table(table, tier.shape[0], unique=True)
    dst = tier.view(tier.shape[0], tier.shape[1], -1)
    n, units = table.shape[0], tier.shape[1]
    if length == n * units and n <= _SMALL_TABLE and all_live(table, tier.shape[0]):
        # whole blocks, no padding (and, when checked, no repeats): one block copy per slot
        blocks = src.reshape(n, units, dst.shape[2])
        slots = table.tolist()
        form = _strided(slots, tier.shape[0])
        view = None if form is None else _strided_view(dst, form)
        if view is not None:  # one copy for a strided table (a layer run, a window)
            view.copy_(blocks.reshape(view.shape))
            return tier
        for i, slot in enumerate(slots):
            dst[slot].copy_(blocks[i])
        return tier
    s = src.reshape(length, dst.shape[2])
    u, slot, w = _unit_index(table, tier.shape[1], length, tier.shape[0])
    dst[slot, w] = s[u]
    return tier


# ---- FP8 / UE8M0 / BF16 entries -------------------------------------------------------------
def ue8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """``2 ** (code - 127)`` as float32, built from its bit pattern (code 0 is the subnormal
    2**-127, code 255 is NaN)."""
    c = codes.to(torch.int32)
    bits = torch.where(c == 0, torch.full_like(c, 0x00400000), c << 23)
    bits = torch.where(c == 255, torch.full_like(c, 0x7FC00000), bits)
    return bits.view(torch.float32)


def dequantize_entries_ref(entries: torch.Tensor, layout: EntryLayout) -> torch.Tensor:
    """Decode uint8 entries ``[n, >= payload]`` to float32 ``[n, head_dim]`` with torch's own
    float8_e4m3fn and bfloat16 casts (see ``dequant.py`` for the layout)."""
    n = entries.shape[0]
    e = entries
    fp8 = e[:, : layout.fp8_dims].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scales = ue8m0_decode(e[:, layout.scale_off : layout.scale_off + layout.n_scales])
    nope = (fp8.view(n, layout.n_scales, layout.scale_group) * scales.unsqueeze(-1)).view(n, -1)
    rope_bytes = e[:, layout.rope_off : layout.rope_off + 2 * layout.rope_dims].to(torch.int32)
    bits = rope_bytes[:, 0::2] | (rope_bytes[:, 1::2] << 8)
    rope = (bits << 16).view(torch.float32)
    return torch.cat([nope, rope], dim=1)


def quantize_entries(x: torch.Tensor, layout: EntryLayout) -> torch.Tensor:
    """Pack float32 ``[n, head_dim]`` into uint8 entries ``[n, entry_bytes]``.

    Per group of ``scale_group`` FP8 dims the scale is the smallest power of two ``2**e`` with
    ``amax / 2**e <= 448`` (computed exactly from frexp; an all-zero group gets ``e = 0``), so no
    code saturates; ``e`` is clamped to the UE8M0 range ``[-127, 127]``.  Values are divided by the
    scale (exact) and rounded to e4m3fn by torch (round-to-nearest-even).  RoPE dims are rounded
    to bfloat16 (RNE) and stored little-endian; padding bytes are zero.
    """
    if x.dim() != 2 or x.shape[1] != layout.head_dim:
        raise KernelInputError(
            f"quantize_entries wants [n, {layout.head_dim}], got {tuple(x.shape)}"
        )
    x = x.to(torch.float32)
    if not bool(torch.isfinite(x).all()):
        raise KernelInputError("quantize_entries: input holds inf or NaN")
    n = x.shape[0]
    nope = x[:, : layout.fp8_dims].reshape(n, layout.n_scales, layout.scale_group)
    amax = nope.abs().amax(dim=-1)
    mant, expo = torch.frexp(amax)  # amax = mant * 2**expo, mant in [0.5, 1)
    e = torch.where(mant <= 0.875, expo - 9, expo - 8)  # 448 = 0.875 * 2**9
    e = torch.where(amax == 0, torch.zeros_like(e), e).clamp(-127, 127)
    scaled = torch.ldexp(nope, (-e).unsqueeze(-1).to(torch.float32))
    q = scaled.clamp(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    out = torch.zeros(n, layout.entry_bytes, dtype=torch.uint8, device=x.device)
    out[:, : layout.fp8_dims] = q.reshape(n, layout.fp8_dims)
    out[:, layout.scale_off : layout.scale_off + layout.n_scales] = (e + 127).to(torch.uint8)
    rope = x[:, layout.fp8_dims :].to(torch.bfloat16).contiguous().view(torch.int16).to(torch.int32)
    rb = torch.stack([rope & 0xFF, (rope >> 8) & 0xFF], dim=-1).reshape(n, -1)
    out[:, layout.rope_off : layout.rope_off + 2 * layout.rope_dims] = rb.to(torch.uint8)
    return out


# ---- tail splice ------------------------------------------------------------------------------
def splice_tail_ref(
    entries: torch.Tensor,
    state: torch.Tensor,
    state_pos: torch.Tensor,
    ratio: int,
    num_tokens: int,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out_kv [n_c + t, D], out_state [S, 2D], first_bad [1])`` exactly as ``splice.py``
    defines them.  A row whose ring slot holds another position is zero and ``first_bad`` holds
    the first such position (-1 if none; computed without a host sync); with ``check`` it also
    raises ``TailDiscontinuityError``."""
    n_c, dim = entries.shape
    ring = state.shape[0]
    first_tail = ratio * n_c
    tail = num_tokens - first_tail
    base = first_tail - (ring - ratio)
    pos = torch.arange(base, base + ring, device=state.device)
    live = (pos >= 0) & (pos < num_tokens)
    slots = pos % ring
    held = state_pos.to(torch.int64)[slots]
    ok = live & (held == pos)
    stale = live & ~ok
    first_bad = torch.where(stale, pos, num_tokens).amin(dim=0, keepdim=True)  # ring >= 1
    first_bad = torch.where(first_bad < num_tokens, first_bad, -1)
    bad = stale.nonzero() if check else None
    if bad is not None and bad.numel():
        q = int(pos[bad[0, 0]])
        raise TailDiscontinuityError(
            f"compressor state slot {q % ring} holds position {int(held[bad[0, 0]])}, expected "
            f"{q} (entries end at token {first_tail - 1}, boundary {num_tokens})",
            q,
        )
    out_state = torch.where(
        ok.unsqueeze(1), state[slots], torch.zeros((), dtype=state.dtype, device=state.device)
    )
    tail_rows = out_state[ring - ratio : ring - ratio + tail, :dim]
    out_kv = torch.cat([entries, tail_rows], dim=0)
    return out_kv, out_state, first_bad
