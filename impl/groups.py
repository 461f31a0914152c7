"""One manager per cache group (vLLM v1 style: a manager per group type behind a coordinator).

Each group has its own block size, page size and layers, taken from the geometry, and its own
hit rules: the spec rules whose ``group`` field names it (``"csa+hca"`` belongs to both
compressed groups, ``"all"`` to every group).  A manager owns its device and host page tensors,
knows how to lay a block's content out in pages, and maps a chain of records to the records its
pages come from (``map``); that mapping is what a group's view column and its data reads share,
so a mapping off by one block (the window and compressor-state defects that
``kvstate.testing.seeded`` plants by a source edit) corrupts both consistently, like the engines'
defects of those classes did.

* :class:`CompressedGroup` (CSA, HCA): full history, one page per compressed block per layer.
* :class:`IndexerGroup`: lightning-indexer keys over the CSA entries, rebuilt from them on CPU.
* :class:`SWAGroup`: the sliding window; pages come from their own pool so that a slid block
  returns them at once, and its block table points at the null page (id 0) instead.
* :class:`CompressorGroup`: the compressor state saved at the boundary after each block.  At an
  LCM boundary every HCA window has just fired (L is a multiple of m'), so only CSA's overlapping
  half window (m rows of a 2m-row ring) is live; HCA needs no state there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvstate.kernels import Backend, select_backend, splice_tail
from kvstate.spec.geometry import Geometry

from .errors import InternalError, LayoutError
from .writer import Writer


def _tok(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(np.asarray(a), dtype=torch.int64)


class Group:
    """Common storage of a group: ``device_data`` / ``host_data`` are ``[layers, pages, bytes]``."""

    name = ""
    state_var = ""  # the table variable that carries this group's readiness
    remaps = False  # whether map() is not the identity (never here; a seeded bug's edit)

    def __init__(
        self,
        g: Geometry,
        layers: Sequence[int],
        block_tokens: int,
        page_bytes: int,
        device_pages: int,
        host_pages: int,
        device: torch.device,
    ) -> None:
        L = g.lcm_tokens
        if L % block_tokens:
            raise LayoutError(
                f"group {self.name}: block of {block_tokens} tokens does not divide LCM {L}"
            )
        self.L = L
        self.block_tokens = block_tokens
        self.pages_per_block = L // block_tokens
        self.page_bytes = page_bytes
        self.layers = tuple(layers)
        self.layer_ids = torch.tensor(self.layers, dtype=torch.int64)
        pin = device.type == "cuda"
        self.device_data = torch.zeros(
            len(layers), device_pages, page_bytes, dtype=torch.uint8, device=device
        )
        self.host_data = torch.zeros(
            len(layers), host_pages, page_bytes, dtype=torch.uint8, pin_memory=pin
        )

    @property
    def nl(self) -> int:
        return len(self.layers)

    def host_index(self, hslot: int) -> slice:
        # A slice, not a list: indexing with a list copies page by page (advanced indexing).
        p = self.pages_per_block
        return slice(hslot * p, hslot * p + p)

    def map(self, rids: Sequence[int]) -> Sequence[int]:
        """Chain block ``b`` reads this group's pages of record ``map(rids)[b]``."""
        return rids


class SlotGroup(Group):
    """A group stored at the record's device slot (full-history groups and the compressor)."""

    def dev_index(self, slot: int) -> slice:
        p = self.pages_per_block
        return slice(slot * p, slot * p + p)


class CompressedGroup(SlotGroup):
    state_var = "ckv"

    def __init__(
        self,
        name: str,
        ratio: int,
        g: Geometry,
        device_slots: int,
        host_slots: int,
        device: torch.device,
    ) -> None:
        self.name = name
        self.ratio = ratio
        self.entry_bytes = g.entry_bytes
        self.entries_per_page = g.compressed_block_tokens // ratio
        layers = [i for i, k in enumerate(g.layers) if k == name]
        ppl = g.lcm_tokens // g.compressed_block_tokens
        super().__init__(
            g,
            layers,
            g.compressed_block_tokens,
            g.page_bytes(ratio),
            device_slots * ppl,
            host_slots * ppl,
            device,
        )

    def make_pages(self, start: int, tokens: np.ndarray, writer: Writer) -> torch.Tensor:
        """``[layers, pages, page_bytes]`` of the LCM block starting at token ``start``: entry
        ``e`` covers tokens up to ``(e+1)*ratio - 1``; padding bytes are zero."""
        n_e = self.L // self.ratio
        e0 = start // self.ratio
        pos = torch.arange(e0, e0 + n_e, dtype=torch.int64)
        tok = _tok(tokens[self.ratio - 1 :: self.ratio])
        rows = writer.rows(self.name, self.layer_ids, pos, tok, self.entry_bytes)
        used = self.entries_per_page * self.entry_bytes
        pages = torch.zeros(self.nl, self.pages_per_block, self.page_bytes, dtype=torch.uint8)
        pages[:, :, :used] = rows.reshape(self.nl, self.pages_per_block, used)
        return pages


class IndexerGroup(SlotGroup):
    name = "indexer"
    state_var = "idx"

    def __init__(
        self,
        g: Geometry,
        device_slots: int,
        host_slots: int,
        device: torch.device,
    ) -> None:
        if g.indexer_entry_bytes > g.entry_bytes:
            raise LayoutError(
                f"geometry {g.name!r}: indexer entries ({g.indexer_entry_bytes} B) are derived from "
                f"compressed entries ({g.entry_bytes} B) and cannot be larger"
            )
        self.entry_bytes = g.entry_bytes
        self.key_bytes = g.indexer_entry_bytes
        self.entries_per_page = g.compressed_block_tokens // g.csa_ratio
        layers = [i for i, k in enumerate(g.layers) if k == "csa"]
        ppl = g.lcm_tokens // g.compressed_block_tokens
        super().__init__(
            g,
            layers,
            g.compressed_block_tokens,
            g.indexer_page_bytes,
            device_slots * ppl,
            host_slots * ppl,
            device,
        )

    def build(self, csa_pages: torch.Tensor) -> torch.Tensor:
        """Indexer keys from the CSA pages they index: pure CPU-side work, no I/O (this is what
        a rebuild recomputes, so the keys always match the compressed KV they were built from)."""
        nl, ppl = csa_pages.shape[0], csa_pages.shape[1]
        out = torch.empty(nl, ppl, self.page_bytes, dtype=torch.uint8, device=csa_pages.device)
        self.build_into(csa_pages, out)
        return out

    def build_into(self, csa_pages: torch.Tensor, out: torch.Tensor) -> None:
        """:meth:`build` written straight into ``out`` (the tier's own pages: storing a block
        allocates nothing and copies each key byte once)."""
        nl, ppl = csa_pages.shape[0], csa_pages.shape[1]
        epp, eb, kb = self.entries_per_page, self.entry_bytes, self.key_bytes
        if csa_pages.device.type != "cpu":  # pragma: no cover: CUDA device only (tiers on a GPU)
            ent = csa_pages[..., : epp * eb].reshape(nl, ppl, epp, eb)[..., :kb]
            torch.bitwise_xor(ent, 0xA5, out=out[..., : epp * kb].view(nl, ppl, epp, kb))
            out[..., epp * kb :] = 0
            return
        # numpy's strided loops are ~3x torch's on CPU here
        self.build_into_host(csa_pages.numpy(), out.numpy())  # views, no copies

    def build_into_host(self, src: np.ndarray, dst: np.ndarray) -> None:
        """:meth:`build_into` on host memory, as numpy views of the tiers."""
        nl, ppl = src.shape[0], src.shape[1]
        epp, eb, kb = self.entries_per_page, self.entry_bytes, self.key_bytes
        ent = src[..., : epp * eb].reshape(nl, ppl, epp, eb)[..., :kb]
        keys = dst[..., : epp * kb].reshape(nl, ppl, epp, kb)
        if not np.may_share_memory(keys, dst):
            raise InternalError("indexer pages are not viewable in place")
        np.bitwise_xor(ent, np.uint8(0xA5), out=keys)
        dst[..., epp * kb :] = 0


class SWAGroup(Group):
    name = "swa"
    state_var = "swa"
    NULL_PAGE = 0

    def __init__(
        self,
        g: Geometry,
        device_slots: int,
        host_slots: int,
        device: torch.device,
    ) -> None:
        self.entry_bytes = g.entry_bytes
        ppl = g.lcm_tokens // g.swa_block_tokens
        super().__init__(
            g,
            range(len(g.layers)),
            g.swa_block_tokens,
            g.swa_block_tokens * g.entry_bytes,
            1 + device_slots * ppl,
            host_slots * ppl,
            device,
        )

    def make_pages(self, start: int, tokens: np.ndarray, writer: Writer) -> torch.Tensor:
        pos = torch.arange(start, start + self.L, dtype=torch.int64)
        rows = writer.rows("swa", self.layer_ids, pos, _tok(tokens), self.entry_bytes)
        return rows.reshape(self.nl, self.pages_per_block, self.page_bytes)


class CompressorGroup(SlotGroup):
    name = "compressor"
    state_var = "tail"

    def __init__(
        self,
        g: Geometry,
        device_slots: int,
        host_slots: int,
        device: torch.device,
    ) -> None:
        self.ratio = g.csa_ratio
        self.ring = g.csa_tail_rows
        self.width = 2 * g.head_dim  # kv | score
        self.state_bytes = self.ring * self.width * 4
        layers = [i for i, k in enumerate(g.layers) if k == "csa"]
        super().__init__(
            g,
            layers,
            g.lcm_tokens,
            self.state_bytes + self.ring * 8,
            device_slots,
            host_slots,
            device,
        )

    def make_pages(self, start: int, tokens: np.ndarray, writer: Writer) -> torch.Tensor:
        """The ring at boundary ``h = start + L``: positions ``[h - m, h)`` in slots ``q % 2m``."""
        h = start + self.L
        m, S = self.ratio, self.ring
        q = torch.arange(h - m, h, dtype=torch.int64)
        rows = writer.state_rows(self.layer_ids, q, _tok(tokens[self.L - m :]), self.width)
        state = torch.zeros(self.nl, S, self.width, dtype=torch.float32)
        state[:, q % S] = rows
        pos = torch.full((S,), -1, dtype=torch.int64)
        pos[q % S] = q
        page = torch.empty(self.nl, 1, self.page_bytes, dtype=torch.uint8)
        page[:, 0, : self.state_bytes] = state.view(torch.uint8).reshape(self.nl, -1)
        page[:, 0, self.state_bytes :] = pos.view(torch.uint8).view(1, -1)
        return page

    def decode(self, page: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(state ``[2m, 2D]`` float32, positions ``[2m]`` int64) of one layer's page."""
        raw = page.reshape(-1).to("cpu").clone()
        state = raw[: self.state_bytes].view(torch.float32).view(self.ring, self.width)
        pos = raw[self.state_bytes :].view(torch.int64)
        return state, pos

    def check(
        self, state: torch.Tensor, pos: torch.Tensor, h: int, backend: str | None
    ) -> torch.Tensor:
        """Splice the ring at boundary ``h`` with the tail-splice kernel (which raises
        ``TailDiscontinuityError`` at the first stale row).  Positions are shifted by a multiple
        of the ring so the check needs only the last few compressed entries; returns the state."""
        S, m = self.ring, self.ratio
        shift = ((h - S) // S) * S if h >= S else 0
        local = h - shift
        # the kernel runs where its backend needs its inputs (CUDA: on the GPU, whatever the tier)
        dev = torch.device("cuda" if select_backend(backend).backend is Backend.CUDA else "cpu")
        state, pos = state.to(dev), pos.to(dev)
        held = torch.where(pos >= 0, pos - shift, torch.full_like(pos, -1))
        entries = torch.zeros(local // m, self.width // 2, dtype=torch.float32, device=dev)
        out = splice_tail(
            entries, state, held, ratio=m, num_tokens=local, check=True, backend=backend
        )
        return out.state.cpu()  # (decode's contract: the caller gets host tensors)
