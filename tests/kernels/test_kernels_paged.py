"""Paged gather/scatter: kernel (Numba CUDA simulator) vs torch reference, edge shapes included."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.kernels import (
    Backend,
    BlockTableError,
    KernelInputError,
    LaunchConfig,
    gather_blocks,
    launch_override,
    scatter_blocks,
)

SIM, REF = Backend.SIMULATOR, Backend.TORCH
LAUNCHES = [None, LaunchConfig(threads=4, max_blocks=2)]


def _launch(cfg: LaunchConfig | None):
    return launch_override(cfg) if cfg is not None else _Null()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _tier(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=g, dtype=torch.uint8)
    return torch.randn(shape, generator=g).to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("cfg", LAUNCHES)
@pytest.mark.parametrize(
    ("shape", "dtype", "table", "length"),
    [
        ((8, 40), torch.uint8, [3, -1, 0, 7], None),  # 2-D tier, a padding slot
        ((8, 40), torch.uint8, [3, 5, 1], 97),  # ragged last block (17 of 40 units)
        ((6, 4, 3, 2), torch.bfloat16, [2, -1, 5], 9),  # bf16 units [3, 2], ragged
        ((5, 8, 16), torch.float32, [4], None),  # single block
        ((5, 8, 16), torch.float32, [1, 4, 0, 2, 3], 33),  # ragged by one unit
        ((4, 6), torch.int64, [-1, -1, -1], None),  # all padding
        ((4, 6), torch.int64, [], None),  # empty table
    ],
)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gather_matches_reference(shape, dtype, table, length, index_dtype, cfg) -> None:
    tier = _tier(shape, dtype)
    t = torch.tensor(table, dtype=index_dtype)
    with _launch(cfg):
        got = gather_blocks(tier, t, length=length, backend=SIM)
    want = gather_blocks(tier, t, length=length, backend=REF)
    assert _same(got, want)
    # direct statement of the semantics for the live slots
    unit = shape[2:]
    flat = want.reshape(-1, *unit) if unit else want.reshape(-1)
    for i, slot in enumerate(table):
        lo, hi = i * shape[1], min((i + 1) * shape[1], flat.shape[0])
        if lo >= hi:
            continue
        expect = tier[slot, : hi - lo] if slot >= 0 else torch.zeros_like(flat[lo:hi])
        assert _same(flat[lo:hi], expect)


@pytest.mark.parametrize("cfg", LAUNCHES)
def test_gather_leaves_padding_rows_untouched(cfg) -> None:
    tier = _tier((6, 12), torch.float32)
    table = torch.tensor([1, -1, 4, -1], dtype=torch.int32)
    out = torch.full((4, 12), 7.5)
    with _launch(cfg):
        gather_blocks(tier, table, out, backend=SIM)
    assert torch.equal(out[1], torch.full((12,), 7.5)) and torch.equal(out[3], out[1])
    assert torch.equal(out[0], tier[1]) and torch.equal(out[2], tier[4])


def test_gather_strided_unaligned_tier_uses_narrow_words() -> None:
    base = _tier((6, 41), torch.uint8)
    tier = base[:, 1:]  # rows start at odd addresses: only byte words fit
    table = torch.tensor([5, 0, -1], dtype=torch.int64)
    got = gather_blocks(tier, table, backend=SIM)
    assert _same(got, gather_blocks(tier, table, backend=REF))
    assert torch.equal(got[0], tier[5])


@pytest.mark.parametrize("bad", [-2, 6, 1000])
@pytest.mark.parametrize("backend", [SIM, REF])
def test_gather_rejects_bad_slot_with_index(bad: int, backend: Backend) -> None:
    tier = _tier((6, 8), torch.float32)
    table = torch.tensor([0, -1, bad, bad], dtype=torch.int32)
    with pytest.raises(BlockTableError) as info:
        gather_blocks(tier, table, backend=backend)
    assert info.value.index == 2


def test_gather_unchecked_skips_bad_slots_like_reference() -> None:
    tier = _tier((6, 8), torch.float32)
    table = torch.tensor([0, 9, -3, 5], dtype=torch.int64)
    got = gather_blocks(tier, table, check=False, backend=SIM)
    want = gather_blocks(tier, table, check=False, backend=REF)
    assert torch.equal(got, want) and torch.equal(got[1], torch.zeros(8))


@pytest.mark.parametrize("cfg", LAUNCHES)
@pytest.mark.parametrize(
    ("shape", "dtype", "table", "length"),
    [
        ((8, 40), torch.uint8, [3, -1, 0, 7], None),
        ((8, 40), torch.uint8, [3, 5, 1], 97),
        ((6, 4, 3, 2), torch.bfloat16, [2, -1, 5], 9),
        ((5, 8, 16), torch.float32, [4], None),
        ((4, 6), torch.int64, [-1, -1], None),
        ((4, 6), torch.int64, [], None),
    ],
)
def test_scatter_matches_reference(shape, dtype, table, length, cfg) -> None:
    t = torch.tensor(table, dtype=torch.int32)
    n_units = length if length is not None else len(table) * shape[1]
    src = _tier((n_units, *shape[2:]), dtype, seed=1)
    before = _tier(shape, dtype, seed=2)
    got, want = before.clone(), before.clone()
    with _launch(cfg):
        scatter_blocks(src, t, got, length=length, backend=SIM)
    scatter_blocks(src, t, want, length=length, backend=REF)
    assert _same(got, want)
    untouched = set(range(shape[0])) - {s for s in table if s >= 0}
    for s in untouched:  # -1 never used as an index, other blocks intact
        assert _same(got[s], before[s])
    if length is not None and len(table) and table[-1] >= 0:
        tail = length - (len(table) - 1) * shape[1]  # ragged: rest of the last block intact
        assert _same(got[table[-1], tail:], before[table[-1], tail:])


def test_scatter_then_gather_round_trips() -> None:
    tier = torch.zeros(10, 4, 6, dtype=torch.bfloat16)
    table = torch.tensor([7, -1, 2, 9], dtype=torch.int64)
    src = _tier((15, 6), torch.bfloat16, seed=3)
    scatter_blocks(src, table, tier, length=15, backend=SIM)
    back = gather_blocks(tier, table, length=15, backend=SIM)
    live = torch.cat([torch.arange(0, 4), torch.arange(8, 15)])
    assert _same(back[live], src[live]) and torch.equal(
        back[4:8], torch.zeros(4, 6, dtype=torch.bfloat16)
    )


@pytest.mark.parametrize("backend", [SIM, REF])
def test_scatter_refuses_duplicates_and_bad_slots_before_writing(backend: Backend) -> None:
    tier = torch.zeros(6, 4)
    src = torch.ones(3, 4)
    with pytest.raises(BlockTableError) as info:
        scatter_blocks(src, torch.tensor([1, 3, 1]), tier, backend=backend)
    assert info.value.index == 2
    with pytest.raises(BlockTableError) as info:
        scatter_blocks(src, torch.tensor([1, 6, 2]), tier, backend=backend)
    assert info.value.index == 1
    assert torch.equal(tier, torch.zeros(6, 4))


def test_layout_errors_are_clear() -> None:
    tier = _tier((6, 8), torch.float32)
    with pytest.raises(KernelInputError, match="length"):
        gather_blocks(tier, torch.tensor([0]), length=9, backend=SIM)
    with pytest.raises(KernelInputError, match="int32/int64"):
        gather_blocks(tier, torch.tensor([0.0]), backend=SIM)
    with pytest.raises(KernelInputError, match="dtype"):
        gather_blocks(tier, torch.tensor([0]), torch.zeros(8, dtype=torch.float64), backend=SIM)
    with pytest.raises(KernelInputError, match="rows of words"):
        scatter_blocks(torch.ones(8), torch.tensor([0]), torch.zeros(8, 6).t(), backend=SIM)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_tables_agree_with_reference(data: st.DataObject) -> None:
    nb = data.draw(st.integers(1, 8), label="num_blocks")
    bu = data.draw(st.integers(1, 5), label="block_units")
    unit = data.draw(st.sampled_from([(), (3,), (2, 2)]), label="unit")
    dtype = data.draw(st.sampled_from([torch.uint8, torch.bfloat16, torch.float32, torch.int64]))
    raw = data.draw(st.lists(st.integers(-1, nb - 1), max_size=6), label="table")
    seen: set[int] = set()
    table = []
    for slot in raw:  # scatter needs distinct live slots: repeats become padding
        table.append(slot if slot not in seen else -1)
        seen.add(slot)
    length = data.draw(st.integers(0, len(table) * bu), label="length")
    index_dtype = data.draw(st.sampled_from([torch.int32, torch.int64]))
    cfg = data.draw(st.sampled_from(LAUNCHES))
    tier = _tier((nb, bu, *unit), dtype)
    t = torch.tensor(table, dtype=index_dtype)
    with _launch(cfg):
        got = gather_blocks(tier, t, length=length, backend=SIM)
    assert _same(got, gather_blocks(tier, t, length=length, backend=REF))
    src = _tier((length, *unit), dtype, seed=9)
    a, b = tier.clone(), tier.clone()
    with _launch(cfg):
        scatter_blocks(src, t, a, length=length, backend=SIM)
    scatter_blocks(src, t, b, length=length, backend=REF)
    assert _same(a, b)


@settings(max_examples=150, deadline=None)
@given(
    first=st.integers(0, 12),
    run=st.integers(1, 4),
    gap=st.integers(-2, 4),
    runs=st.integers(1, 4),
    poke=st.integers(-1, 15),
)
def test_strided_tables_one_copy_same_bytes(
    first: int, run: int, gap: int, runs: int, poke: int
) -> None:
    """The reference moves a strided table (runs of consecutive slots a fixed step apart: one
    slot in every layer, a window's pages in every layer) as one strided copy: the same bytes
    as one copy per slot, and a table that only looks strided (a slot poked out of the pattern,
    a repeat, a step shorter than the run, a slot past the tier) takes the checked path."""
    nb = 24
    tier = _tier((nb, 2, 8), torch.uint8, seed=first + 7 * run)
    slots = [first + r * (run + gap) + k for r in range(runs) for k in range(run)]
    if 0 <= poke < len(slots):
        slots[poke] = (slots[poke] + 5) % nb
    table = torch.tensor(slots, dtype=torch.int64)
    if any(not -1 <= s < nb for s in slots):
        with pytest.raises(BlockTableError):
            gather_blocks(tier, table, backend=REF)
        return
    if -1 in slots:  # padding: moved unit by unit (tested above)
        return
    got = gather_blocks(tier, table, backend=REF)
    assert torch.equal(got, torch.stack([tier[s] for s in slots]))
    src = _tier((len(slots), 2, 8), torch.uint8, seed=99)
    out = tier.clone()
    if len(set(slots)) < len(slots):
        with pytest.raises(BlockTableError):
            scatter_blocks(src, table, out, backend=REF)
        assert torch.equal(out, tier)  # refused before anything is written
        return
    scatter_blocks(src, table, out, backend=REF)
    want = tier.clone()
    for i, s in enumerate(slots):
        want[s] = src[i]
    assert torch.equal(out, want)
