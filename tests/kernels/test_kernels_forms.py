"""Layer L2's declaration (``kernels/forms.py``) is honest and enforced.

Each declared form is run through the entry point that claims to read it, under the simulator,
against the torch reference; a form nobody declares is refused; the library refuses a geometry
whose ``kernel_combos`` names a form no kernel serves; and the library's recovery movements go
through the paged kernels (so they are not kernels that only their tests call)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import kvstate.kernels as K
from kvstate.impl import HeterogeneousKVCache, LayoutError
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.kernels import Backend, EntryLayout
from kvstate.kernels.forms import COMPRESSED, TAIL, WINDOW, unsupported
from kvstate.spec import KernelCombo, deepseek_v4_flash, small

SIM, REF = Backend.SIMULATOR, Backend.TORCH


def test_every_declared_entry_point_exists() -> None:
    for table in (COMPRESSED, TAIL, WINDOW):
        for form, entry in table.items():
            assert callable(getattr(K, entry)), f"{form}: {entry} is not a kernels entry point"


def test_primary_compressed_form_decodes_on_its_kernel() -> None:
    g = deepseek_v4_flash()
    lay = EntryLayout.from_geometry(g)
    assert COMPRESSED[g.primary_combo.compressed_dtype] == "dequantize_entries"
    x = torch.randn(8, lay.head_dim, generator=torch.Generator().manual_seed(3))
    packed = K.quantize_entries(x, lay)
    sim = K.dequantize_entries(packed, lay, backend=SIM)
    assert torch.equal(sim, K.dequantize_entries(packed, lay, backend=REF))
    assert torch.allclose(sim, x, rtol=0.07, atol=1e-3)  # FP8 e4m3: 3 mantissa bits


@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_byte_forms_move_on_the_paged_kernel(dtype: torch.dtype) -> None:
    tier = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    table = torch.tensor([3, -1, 0])
    sim = K.gather_blocks(tier, table, backend=SIM)
    assert torch.equal(sim, K.gather_blocks(tier, table, backend=REF))
    assert torch.equal(sim[0], tier[3]) and torch.equal(sim[2], tier[0])


def test_fp32_tail_splices_on_its_kernel() -> None:
    m, ring, h = 4, 8, 14
    entries = torch.randn(h // m, 6)
    state = torch.randn(ring, 12)
    pos = torch.full((ring,), -1, dtype=torch.int64)
    for q in range(h - ring, h):
        pos[q % ring] = q
    a = K.splice_tail(entries, state, pos, ratio=m, num_tokens=h, backend=SIM)
    b = K.splice_tail(entries, state, pos, ratio=m, num_tokens=h, backend=REF)
    assert torch.equal(a.kv, b.kv) and torch.equal(a.state, b.state)


def test_undeclared_forms_are_refused() -> None:
    g = small()
    assert all(unsupported(c) is None for c in g.kernel_combos)
    assert all(unsupported(c) is None for c in deepseek_v4_flash().kernel_combos)
    legacy = KernelCombo("fp8_e4m3/v1_576", "fp32", "bf16", g.compressed_block_tokens)
    assert "compressed form 'fp8_e4m3/v1_576'" in (unsupported(legacy) or "")
    assert "tail form 'bf16'" in (
        unsupported(dataclasses.replace(legacy, compressed_dtype="bf16", tail_dtype="bf16")) or ""
    )


def test_library_refuses_a_geometry_naming_an_unserved_form(tmp_path: Path) -> None:
    g = small()
    legacy = KernelCombo("fp8_e4m3/v1_576", "fp32", "bf16", g.compressed_block_tokens)
    bad = dataclasses.replace(g, kernel_combos=g.kernel_combos | {legacy})
    with pytest.raises(LayoutError, match="not served: no kernel reads compressed form"):
        HeterogeneousKVCache(
            bad, cache_dir=tmp_path, executors="manual", writer=DeterministicWriter()
        )
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_recovery_movements_go_through_the_paged_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, int] = {"gather": 0, "scatter": 0}
    real_g, real_s = K.reference.gather_blocks_ref, K.reference.scatter_blocks_ref

    def gather(*a: object, **kw: object) -> torch.Tensor:
        calls["gather"] += 1
        return real_g(*a, **kw)  # type: ignore[arg-type]

    def scatter(*a: object, **kw: object) -> torch.Tensor:
        calls["scatter"] += 1
        return real_s(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(K.reference, "gather_blocks_ref", gather)
    monkeypatch.setattr(K.reference, "scatter_blocks_ref", scatter)
    g = small()
    toks = harness_tokens(2 * g.lcm_tokens + 1)
    c = HeterogeneousKVCache(
        g,
        cache_dir=tmp_path,
        executors="manual",
        kernel_backend="torch",
        writer=DeterministicWriter(),
    )
    try:
        with c.use(c.admit(c.request(toks))):
            pass
        c.tick(10)
        assert c.offload(100) == 2
        c.pipelines.drain()
        assert calls["gather"] > 0 and calls["scatter"] == 0  # offload: device -> host
        c.evict(100)
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 2 * g.lcm_tokens
        assert calls["scatter"] > 0  # restore: host -> device
    finally:
        c.close()
