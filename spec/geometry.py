"""Model parameters: the geometry of a DeepSeek-V4-style hybrid-attention KV cache.

Every constant the table, the model, the implementation and the kernels need about sizes comes
from here, so the proof, the fuzzer and the library agree on one layout.  Two presets are
provided: the real DeepSeek-V4-Flash geometry and the small test geometry,
which keeps the real relations (m divides m', m' = n_win, 2m-row overlap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from .errors import GeometryError

LayerKind = Literal["swa", "csa", "hca"]
SwaDiskPolicy = Literal["full", "checkpoint", "zero"]


@dataclass(frozen=True)
class KernelCombo:
    """One fused-kernel signature: the block forms a hit may splice together (layer L2)."""

    compressed_dtype: str
    tail_dtype: str
    window_dtype: str
    block_tokens: int


@dataclass(frozen=True)
class Geometry:
    """Frozen description of one model's cache layout and the allocator's capacities.

    Sizes are in tokens unless named ``*_bytes``.  Capacities (pools, caps) are per cache
    instance.  ``model_blocks`` and ``model_requests`` size the *concrete* reference model used
    by tests and bounded checks; the Z3 proofs treat the pool size symbolically.
    """

    name: str
    layers: tuple[LayerKind, ...]
    csa_ratio: int  # m: one CSA entry per m tokens (overlapping windows of 2m)
    hca_ratio: int  # m': one HCA entry per m' tokens
    n_win: int  # sliding-window length in tokens
    head_dim: int
    fp8_dims: int
    rope_dims: int
    scale_group: int  # one UE8M0 scale per this many FP8 dims
    indexer_heads: int
    indexer_dim: int
    indexer_entry_bytes: int
    top_k: int
    compressed_block_tokens: int  # token positions per compressed-KV block (vLLM: 256)
    swa_block_tokens: int
    page_pad_bytes: int  # pages are padded to a multiple of this (FlashMLA: 576)
    align_bytes: int  # byte-level alignment required of every splice offset and page stride
    device_blocks: int
    host_blocks: int
    disk_blocks: int
    max_requests: int
    io_cap: int  # concurrent disk loads the I/O path carries (admission cap)
    pin_cap_blocks: int  # blocks that may be pinned at once (admission cap)
    load_steps: int  # progress steps of one asynchronous load
    lease_max: int  # longest residency lease, in scheduler ticks
    swa_disk_policy: SwaDiskPolicy
    swa_checkpoint_tokens: int  # p for the "checkpoint" policy
    kernel_combos: frozenset[KernelCombo]
    model_blocks: int = 3
    model_requests: int = 2
    entry_pad_bytes: int = 8
    extra: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived quantities -------------------------------------------------------------
    @property
    def lcm_tokens(self) -> int:
        """Hit lengths must be a multiple of this (layer L1): LCM of every block size and ratio."""
        return math.lcm(
            self.compressed_block_tokens, self.swa_block_tokens, self.csa_ratio, self.hca_ratio
        )

    @property
    def entry_bytes(self) -> int:
        """Bytes of one compressed entry: FP8 dims + UE8M0 scales + BF16 RoPE, padded."""
        raw = self.fp8_dims + self.fp8_dims // self.scale_group + 2 * self.rope_dims
        return -(-raw // self.entry_pad_bytes) * self.entry_pad_bytes

    @property
    def n_scales(self) -> int:
        return self.fp8_dims // self.scale_group

    def entries_per_block(self, ratio: int) -> int:
        return self.compressed_block_tokens // ratio

    def page_bytes(self, ratio: int) -> int:
        raw = self.entries_per_block(ratio) * self.entry_bytes
        return -(-raw // self.page_pad_bytes) * self.page_pad_bytes

    @property
    def indexer_page_bytes(self) -> int:
        raw = self.entries_per_block(self.csa_ratio) * self.indexer_entry_bytes
        return -(-raw // self.page_pad_bytes) * self.page_pad_bytes

    @property
    def window_blocks(self) -> int:
        """SWA blocks a hit needs, ending at the boundary: cdiv(W-1, block) + 1 (vLLM rule)."""
        return -(-(self.n_win - 1) // self.swa_block_tokens) + 1

    @property
    def window_lcm_blocks(self) -> int:
        """The same window measured in LCM blocks (the unit of the abstract model)."""
        tokens = self.window_blocks * self.swa_block_tokens
        return max(1, -(-tokens // self.lcm_tokens))

    @property
    def checkpoint_blocks(self) -> int:
        """LCM blocks between two SWA checkpoints: ``swa_checkpoint_tokens`` rounded down to a
        whole number of LCM blocks (a checkpoint is a hit boundary, so at least one block)."""
        return max(1, self.swa_checkpoint_tokens // self.lcm_tokens)

    def swa_kept(self, b: int, n: int) -> bool:
        """Whether block ``b`` of a stored prefix of ``n`` blocks keeps its SWA pages (the
        device tier's window policy; :meth:`swa_kept_blocks` says which)."""
        return b in self.swa_kept_blocks(b, b + 1, n)

    def swa_kept_blocks(self, lo: int, hi: int, n: int) -> set[int]:
        """The blocks of ``[lo, hi)`` that keep their SWA pages in a stored prefix of ``n``
        blocks: :func:`swa_kept_blocks` with this geometry's window and checkpoint interval."""
        return swa_kept_blocks(self.window_lcm_blocks, self.checkpoint_blocks, lo, hi, n)

    def swa_pool_blocks(self, device_blocks: int, max_requests: int) -> int:
        """LCM blocks' worth of SWA pages the device tier allocates (at most one per device
        slot): a window for every request (its hit's window, which it pins), the checkpoint
        windows the device's slots can hold, the windows of the disk loads in flight (a load
        reserves SWA pages for a block whose window it restores), and the ``W + 1`` blocks a
        store in progress keeps at its end.  The stored prefixes' end windows beyond that
        share what is left, least recently used first.  Past that, taking pages slides
        the least recently used unpinned window (``BlockStore.take_swa``)."""
        w = self.window_lcm_blocks
        checkpoints = -(-device_blocks // self.checkpoint_blocks)
        need = w * (max_requests + checkpoints + self.io_cap) + w + 1
        return min(device_blocks, need)

    @property
    def csa_tail_rows(self) -> int:
        """Compressor-state rows a CSA layer keeps: 2m, because its windows overlap."""
        return 2 * self.csa_ratio

    @property
    def hca_tail_rows(self) -> int:
        return self.hca_ratio

    @property
    def zero_swa_recompute_tokens(self) -> int:
        """Tokens the zero-SWA disk policy recomputes: n_win x layers."""
        return self.n_win * len(self.layers)

    @property
    def primary_combo(self) -> KernelCombo:
        return KernelCombo("fp8_e4m3+ue8m0/bf16_rope", "fp32", "bf16", self.compressed_block_tokens)

    def count(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layers if k == kind)

    # ---- validation ---------------------------------------------------------------------
    def validate(self) -> None:
        """Reject a geometry that cannot be laid out, before anything is allocated from it."""
        positive = (
            "csa_ratio hca_ratio n_win head_dim fp8_dims scale_group indexer_heads indexer_dim "
            "indexer_entry_bytes top_k compressed_block_tokens swa_block_tokens page_pad_bytes "
            "align_bytes device_blocks host_blocks disk_blocks max_requests io_cap pin_cap_blocks "
            "load_steps lease_max swa_checkpoint_tokens model_blocks model_requests entry_pad_bytes"
        ).split()
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise GeometryError(
                    f"geometry {self.name!r}: {name} must be a positive int, got {value!r}"
                )
        if self.rope_dims < 0:
            raise GeometryError(f"geometry {self.name!r}: rope_dims must be >= 0")
        if not self.layers or any(k not in ("swa", "csa", "hca") for k in self.layers):
            raise GeometryError(
                f"geometry {self.name!r}: layers must be a non-empty tuple of swa/csa/hca"
            )
        if self.hca_ratio % self.csa_ratio:
            raise GeometryError(
                f"geometry {self.name!r}: m={self.csa_ratio} must divide m'={self.hca_ratio}"
            )
        if self.fp8_dims + self.rope_dims != self.head_dim:
            raise GeometryError(
                f"geometry {self.name!r}: fp8_dims + rope_dims ({self.fp8_dims}+{self.rope_dims}) != head_dim {self.head_dim}"
            )
        if self.fp8_dims % self.scale_group:
            raise GeometryError(f"geometry {self.name!r}: scale_group must divide fp8_dims")
        for ratio in (self.csa_ratio, self.hca_ratio):
            if self.compressed_block_tokens % ratio:
                raise GeometryError(
                    f"geometry {self.name!r}: compressed_block_tokens {self.compressed_block_tokens} "
                    f"is not a multiple of compression ratio {ratio}"
                )
        for ratio in (self.csa_ratio, self.hca_ratio):
            if self.page_bytes(ratio) % self.align_bytes:
                raise GeometryError(
                    f"geometry {self.name!r}: page stride is not {self.align_bytes}-byte aligned"
                )
        if self.swa_disk_policy not in ("full", "checkpoint", "zero"):
            raise GeometryError(
                f"geometry {self.name!r}: unknown swa_disk_policy {self.swa_disk_policy!r}"
            )
        if self.primary_combo not in self.kernel_combos:
            raise GeometryError(
                f"geometry {self.name!r}: the primary block form has no fused kernel"
            )
        if self.pin_cap_blocks > self.device_blocks:
            raise GeometryError(f"geometry {self.name!r}: pin_cap_blocks exceeds device_blocks")

    def with_changes(self, **changes: object) -> Geometry:
        """A copy with some fields replaced (validated again)."""
        try:
            return replace(self, **changes)  # type: ignore[arg-type]
        except TypeError as exc:
            raise GeometryError(f"geometry {self.name!r}: {exc}") from exc


def swa_kept_blocks(w: int, p: int, lo: int, hi: int, n: int) -> set[int]:
    """The device tier's SWA window policy: the blocks of ``[lo, hi)`` that keep their SWA
    pages in a stored prefix of ``n`` blocks, for a window of ``w`` blocks and checkpoints
    every ``p`` blocks (``Geometry.window_lcm_blocks``, ``Geometry.checkpoint_blocks``).

    Kept: the window of the prefix's end boundary ``n`` and of the boundary one block earlier
    (``[n - w - 1, n)``: a request whose prompt is exactly the stored ``n`` blocks hits at most
    ``n - 1`` of them, since its last token is always computed), and the window ``[c - w, c)``
    of every checkpoint boundary ``c`` (a multiple of ``p`` within the prefix).  Every other
    block is slid at its store: a hit needs the SWA Window only at its boundary (rule
    ``L3.swa_window``), so these are the boundaries a hit may still end at once the rest are
    gone.  Built from the kept windows, not block by block (a store run asks once for all its
    blocks, with ``w`` and ``p`` it read once)."""
    tail = max(lo, n - w - 1)
    kept = set(range(tail, hi))
    for c in range((lo // p + 1) * p, min(hi, tail) + w, p):  # checkpoints past lo
        kept.update(range(max(lo, c - w), min(c, hi, tail)))
    return kept


def _combos(block_tokens: int) -> frozenset[KernelCombo]:
    return frozenset(
        {
            KernelCombo("fp8_e4m3+ue8m0/bf16_rope", "fp32", "bf16", block_tokens),
            KernelCombo("bf16", "fp32", "bf16", block_tokens),
        }
    )


def deepseek_v4_flash() -> Geometry:
    """DeepSeek-V4-Flash at full size (paper sec. 4.2.1; vLLM's page layout)."""
    kinds: list[LayerKind] = ["swa", "swa"]
    for i in range(41):
        kinds.append("csa" if i % 2 == 0 else "hca")
    layers = tuple(kinds)
    return Geometry(
        name="deepseek-v4-flash",
        layers=layers,
        csa_ratio=4,
        hca_ratio=128,
        n_win=128,
        head_dim=512,
        fp8_dims=448,
        rope_dims=64,
        scale_group=64,
        indexer_heads=64,
        indexer_dim=128,
        indexer_entry_bytes=132,
        top_k=512,
        compressed_block_tokens=256,
        swa_block_tokens=64,
        page_pad_bytes=576,
        align_bytes=64,
        device_blocks=65536,
        host_blocks=262144,
        disk_blocks=4194304,
        max_requests=256,
        io_cap=8,
        pin_cap_blocks=49152,
        load_steps=4,
        lease_max=64,
        swa_disk_policy="checkpoint",
        swa_checkpoint_tokens=4096,
        kernel_combos=_combos(256),
    )


def small(block_tokens: int = 16) -> Geometry:
    """The small test geometry (LCM block 16 tokens; 32 is the other test size)."""
    return Geometry(
        name="small",
        layers=("swa", "swa", "csa", "hca", "csa", "hca", "csa"),
        csa_ratio=4,
        hca_ratio=16,
        n_win=16,
        head_dim=128,
        fp8_dims=112,
        rope_dims=16,
        scale_group=16,
        indexer_heads=4,
        indexer_dim=32,
        indexer_entry_bytes=36,
        top_k=4,
        compressed_block_tokens=block_tokens,
        swa_block_tokens=8,
        page_pad_bytes=64,
        align_bytes=16,
        device_blocks=64,
        host_blocks=128,
        disk_blocks=1024,
        max_requests=4,
        io_cap=2,
        pin_cap_blocks=48,
        load_steps=2,
        lease_max=4,
        swa_disk_policy="full",
        # 4 LCM blocks: past the 2-block window, so the device's window policy
        # (``swa_kept``) slides the blocks between checkpoints here too (as 16 blocks do on
        # DeepSeek-V4-Flash, whose window is 1 block)
        swa_checkpoint_tokens=64,
        kernel_combos=_combos(block_tokens),
    )


PRESETS = {"deepseek-v4-flash": deepseek_v4_flash, "small": small}


def preset(name: str) -> Geometry:
    """Look a preset up by name; a clear error lists the known ones."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise GeometryError(
            f"unknown geometry {name!r}; known: {', '.join(sorted(PRESETS))}"
        ) from None
