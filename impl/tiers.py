"""Device and host storage of every group, and the data movements between tiers.

The device tier is real tensors on CUDA when available, else CPU tensors standing in for it;
the host tier is CPU tensors (pinned when a GPU is present).  A record's pages in the
full-history groups and the compressor group live at its device slot's index; its SWA pages come
from the SWA group's own pool, sized for the windows a device can need at once
(:meth:`Geometry.swa_pool_blocks`), since a stored prefix keeps them only at its end window and
its checkpoints (:meth:`Geometry.swa_kept`).  Movements are whole-group tensor copies (one indexing op per
group and direction), and a load is split into *units* (one group layer each) so it can land in
``load_steps`` chunks.

Every movement into or out of the device tier goes through the paged kernels
(``kvstate.kernels.gather_blocks`` / ``scatter_blocks``: Numba CUDA on a GPU, the torch reference
on the CPU), one launch per group and direction: a group's layers are one tier of
``layers x slots`` blocks, so a block's pages in every layer are one block table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvstate.kernels import Backend, gather_blocks, scatter_blocks, select_backend
from kvstate.kernels.forms import unsupported
from kvstate.spec.geometry import Geometry

from .errors import LayoutError
from .groups import CompressedGroup, CompressorGroup, Group, IndexerGroup, SlotGroup, SWAGroup
from .storage import PagePool, SlotPool
from .writer import Writer

Unit = tuple[SlotGroup, int]  # (group, layer position within the group)


def swa_pool_blocks(
    g: Geometry, device_slots: int, max_requests: int | None, swa_blocks: int | None
) -> int:
    """Blocks' worth of device SWA pages: ``swa_blocks`` where the caller chose it, else
    :meth:`Geometry.swa_pool_blocks` (the windows a device can need at once)."""
    if swa_blocks is not None:
        return swa_blocks
    return g.swa_pool_blocks(device_slots, g.max_requests if max_requests is None else max_requests)


def planned_bytes(
    g: Geometry,
    device_slots: int,
    host_slots: int,
    max_requests: int | None = None,
    swa_blocks: int | None = None,
) -> tuple[int, int]:
    """(device, host) bytes the tiers will allocate, computed before allocating anything.  The
    device's SWA pages are :func:`swa_pool_blocks` blocks' worth, not one block's per slot;
    the host keeps one per slot."""
    L = g.lcm_tokens
    ppc = L // g.compressed_block_tokens
    ncsa, nhca = g.count("csa"), g.count("hca")
    per_slot = ppc * (
        ncsa * g.page_bytes(g.csa_ratio)
        + nhca * g.page_bytes(g.hca_ratio)
        + ncsa * g.indexer_page_bytes
    )
    per_slot += ncsa * (g.csa_tail_rows * 2 * g.head_dim * 4 + g.csa_tail_rows * 8)
    swa = len(g.layers) * L * g.entry_bytes
    swa_blocks = swa_pool_blocks(g, device_slots, max_requests, swa_blocks)
    null_page = len(g.layers) * g.swa_block_tokens * g.entry_bytes  # the SWA pool's page 0
    dev = device_slots * per_slot + swa_blocks * swa + null_page
    return dev, host_slots * (per_slot + swa)


class Tiers:
    def __init__(
        self,
        g: Geometry,
        *,
        device_slots: int,
        host_slots: int,
        device: torch.device,
        memory_limit: int,
        backend: str | None = None,
        max_requests: int | None = None,
        swa_blocks: int | None = None,
    ) -> None:
        self.backend = backend  # the kernels' backend (None: the dispatch point chooses)
        self._torch_copies: bool | None = None  # the backend resolved to torch (``_scatter``)
        self._host_views: tuple[np.ndarray, np.ndarray] | None = None
        for combo in sorted(g.kernel_combos, key=repr):
            why = unsupported(combo)
            if why is not None:  # L2 would admit blocks that nothing here can serve
                raise LayoutError(f"geometry {g.name!r}: kernel combo {combo} is not served: {why}")
        swa_blocks = swa_pool_blocks(g, device_slots, max_requests, swa_blocks)
        dev_b, host_b = planned_bytes(g, device_slots, host_slots, max_requests, swa_blocks)
        if dev_b + host_b > memory_limit:
            raise LayoutError(
                f"geometry {g.name!r}: {device_slots} device + {host_slots} host blocks need "
                f"{(dev_b + host_b) / 2**30:.1f} GiB (> memory_limit {memory_limit / 2**30:.1f} GiB); "
                "lower device_blocks/host_blocks or raise memory_limit"
            )
        self.g = g
        self.L = g.lcm_tokens
        self.device = device
        args = (device_slots, host_slots, device)
        self.csa = CompressedGroup("csa", g.csa_ratio, g, *args)
        self.hca = CompressedGroup("hca", g.hca_ratio, g, *args)
        self.indexer = IndexerGroup(g, *args)
        self.swa = SWAGroup(g, swa_blocks, host_slots, device)
        self.compressor = CompressorGroup(g, *args)
        self.groups: tuple[Group, ...] = (
            self.csa,
            self.hca,
            self.indexer,
            self.swa,
            self.compressor,
        )
        self.slot_groups: tuple[SlotGroup, ...] = (
            self.csa,
            self.hca,
            self.indexer,
            self.compressor,
        )
        self.disk_groups: tuple[SlotGroup, ...] = (self.csa, self.hca, self.compressor)
        self.slots = SlotPool(device_slots)
        self.swa_blocks = swa_blocks  # LCM blocks' worth of device SWA pages
        self.swa_pool = PagePool(1 + swa_blocks * self.swa.pages_per_block, first=1)
        self.host_slots = PagePool(host_slots)
        self.swa_pages_per_block = self.swa.pages_per_block
        # a disk chunk's units as kernel runs (group, layers, bytes), worked out once per range
        self._chunk_runs: dict[tuple[int, int], list[tuple[SlotGroup, range, int]]] = {}
        # the same as numpy copies into each group's tier (``_np_runs``; None: not on the CPU)
        self._np_chunk_runs: dict[tuple[int, int], list[tuple[np.ndarray, int, int, int]]] = {}
        self._np_tiers: dict[str, np.ndarray] | None = None
        # (group, device address of slot 0, bytes per slot): pins record page addresses cheaply
        self.slot_bases = tuple(
            (grp.name, grp.device_data.data_ptr(), grp.pages_per_block * grp.page_bytes)
            for grp in self.slot_groups
        )

    # ---- writing a block's content ------------------------------------------------------
    def write_block(
        self, slot: int, swa_pages: Sequence[int], start: int, tokens: np.ndarray, writer: Writer
    ) -> None:
        for grp in (self.csa, self.hca):
            grp.device_data[:, grp.dev_index(slot)] = grp.make_pages(start, tokens, writer).to(
                self.device
            )
        if swa_pages:
            self.swa.device_data[:, list(swa_pages)] = self.swa.make_pages(
                start, tokens, writer
            ).to(self.device)

    def write_tail(
        self, slot: int, start: int, tokens: np.ndarray, writer: Writer, backend: str | None
    ) -> None:
        """Save the compressor state at the block's end boundary and check it splices."""
        grp = self.compressor
        page = grp.make_pages(start, tokens, writer)
        for li in range(grp.nl):
            state, pos = grp.decode(page[li])
            grp.check(state, pos, start + self.L, backend)
        grp.device_data[:, grp.dev_index(slot)] = page.to(self.device)

    def build_index(self, slot: int) -> None:
        idx = self.csa.dev_index(slot)
        if self.device.type == "cpu":  # numpy views of the whole tiers, made once: slicing a
            # numpy array costs a fraction of a torch __getitem__ plus .numpy() per store
            if self._host_views is None:
                self._host_views = (self.csa.device_data.numpy(), self.indexer.device_data.numpy())
            src, dst = self._host_views
            self.indexer.build_into_host(src[:, idx], dst[:, idx])
            return
        self.indexer.build_into(  # pragma: no cover: CUDA device only (tiers on a GPU)
            self.csa.device_data[:, idx], self.indexer.device_data[:, idx]
        )

    def build_index_run(self, slots: Sequence[int]) -> None:
        """``build_index`` of several slots: consecutive slots are built in one pass each."""
        if not slots:
            return
        if self.device.type != "cpu":  # pragma: no cover: CUDA device only (tiers on a GPU)
            for slot in slots:
                self.build_index(slot)
            return
        if self._host_views is None:
            self._host_views = (self.csa.device_data.numpy(), self.indexer.device_data.numpy())
        src, dst = self._host_views
        p = self.csa.pages_per_block  # build_index: both at the CSA group's index of a slot
        order = sorted(slots)
        lo = prev = order[0]
        for s in [*order[1:], -2]:
            if s != prev + 1:  # [lo, prev] is one contiguous range of slots
                a, b = lo * p, (prev + 1) * p
                self.indexer.build_into_host(src[:, a:b], dst[:, a:b])
                lo = s
            prev = s

    # ---- device <-> host ------------------------------------------------------------------
    # ---- movements through the paged kernels --------------------------------------------
    def _table(self, rows: Sequence[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.int64, device=self.device)

    @staticmethod
    def _blocks(grp: Group) -> torch.Tensor:
        """The group's device tier as ``[layers x blocks, pages per block, page bytes]``."""
        d = grp.device_data
        return d.view(d.shape[0] * (d.shape[1] // grp.pages_per_block), grp.pages_per_block, -1)

    def _scatter(self, grp: SlotGroup, layers: range, src: torch.Tensor, slot: int) -> None:
        """Write ``src`` (layers ``layers`` of one block, contiguous) to device slot ``slot``.
        A slot's pages in a run of layers are one strided view of the group's tier: where the
        kernels' backend is torch, one copy into that view (what its reference scatter does for
        such a table, less building, checking and pattern-matching a block table for every
        landed chunk: a third of a 64K remote recovery's landing CPU); else the backend's
        scatter kernel over the block table."""
        per = grp.device_data.shape[1] // grp.pages_per_block
        d = grp.device_data
        if self._torch_copies is None:
            self._torch_copies = select_backend(self.backend).backend is Backend.TORCH
        if self._torch_copies and d.is_contiguous() and 0 <= slot < per:
            view = d.view(d.shape[0], per, grp.pages_per_block, -1)[
                layers.start : layers.stop, slot
            ]
            view.copy_(src.reshape(view.shape))
            return
        table = self._table([li * per + slot for li in layers])
        scatter_blocks(src.to(self.device), table, self._blocks(grp), backend=self.backend)

    def _gather(self, grp: SlotGroup, slot: int) -> torch.Tensor:
        """Every layer's pages of device slot ``slot``: ``[layers, pages per block, bytes]``."""
        per = grp.device_data.shape[1] // grp.pages_per_block
        table = self._table([li * per + slot for li in range(grp.nl)])
        return gather_blocks(self._blocks(grp), table, backend=self.backend)

    def _swa_rows(self, pages: Sequence[int]) -> torch.Tensor:
        """Block table of SWA pages ``pages`` in every layer (the SWA tier viewed page by page)."""
        n = self.swa.device_data.shape[1]
        return self._table([li * n + p for li in range(self.swa.nl) for p in pages])

    def _swa_tier(self) -> torch.Tensor:
        d = self.swa.device_data
        return d.view(d.shape[0] * d.shape[1], 1, d.shape[2])

    def to_host(self, slot: int, swa_pages: Sequence[int], hslot: int) -> None:
        for grp in self.slot_groups:
            grp.host_data[:, grp.host_index(hslot)] = self._gather(grp, slot).to("cpu")
        if swa_pages:
            rows = gather_blocks(self._swa_tier(), self._swa_rows(swa_pages), backend=self.backend)
            self.swa.host_data[:, self.swa.host_index(hslot)] = rows.view(
                self.swa.nl, len(swa_pages), -1
            ).to("cpu")

    def units(self, with_indexer: bool) -> list[Unit]:
        groups = self.slot_groups if with_indexer else self.disk_groups
        return [(grp, li) for grp in groups for li in range(grp.nl)]

    @staticmethod
    def _runs(units: Sequence[Unit]) -> list[tuple[SlotGroup, range]]:
        """Consecutive units of one group as (group, layers): one kernel launch each."""
        runs: list[tuple[SlotGroup, range]] = []
        for grp, li in units:
            if runs and runs[-1][0] is grp and runs[-1][1].stop == li:
                runs[-1] = (grp, range(runs[-1][1].start, li + 1))
            else:
                runs.append((grp, range(li, li + 1)))
        return runs

    def land_host(self, units: Sequence[Unit], hslot: int, slot: int) -> None:
        """Copy ``units`` of host slot ``hslot`` to device slot ``slot``."""
        for grp, layers in self._runs(units):
            src = grp.host_data[layers.start : layers.stop, grp.host_index(hslot)]
            self._scatter(grp, layers, src.contiguous(), slot)

    def land_chunk(self, ulo: int, uhi: int, data: torch.Tensor | np.ndarray, slot: int) -> int:
        """Copy the disk units ``[ulo, uhi)``, laid out back to back in ``data``, to device slot
        ``slot``; returns the bytes used.  A disk load lands each of its chunks this way, and the
        chunk's runs are worked out once per range (not a list of every disk unit and its runs
        per chunk)."""
        runs = self._chunk_runs.get((ulo, uhi))
        if runs is None:
            runs = [
                (grp, layers, len(layers) * grp.pages_per_block * grp.page_bytes)
                for grp, layers in self._runs(self.units(False)[ulo:uhi])
            ]
            self._chunk_runs[(ulo, uhi)] = runs
        nruns = self._np_runs(ulo, uhi, runs)
        if nruns and 0 <= slot < nruns[0][0].shape[1]:  # (a chunk of no units: no copy)
            return self._np_land(nruns, data, slot)
        src = torch.from_numpy(data) if isinstance(data, np.ndarray) else data
        off = 0
        for grp, layers, n in runs:
            self._scatter(grp, layers, src[off : off + n], slot)
            off += n
        return off

    def _np_runs(
        self, ulo: int, uhi: int, runs: list[tuple[SlotGroup, range, int]]
    ) -> list[tuple[np.ndarray, int, int, int]] | None:
        """A chunk's runs as numpy copies (each group's tier seen as ``[layers, slots, block
        bytes]``), where the tiers are contiguous CPU tensors and the kernels' backend is
        torch; None elsewhere (a GPU's tiers take the scatter).  A landing is run by the I/O
        workers without the lock, eight at a time: each torch call there released and took
        back the GIL, and each tensor made or freed took it from C++ (about 40 context
        switches per block of a 64K recovery, where the copies' bytes are the only work)."""
        got = self._np_chunk_runs.get((ulo, uhi))
        if got is not None:
            return got
        if self._torch_copies is None:
            self._torch_copies = select_backend(self.backend).backend is Backend.TORCH
        if not self._torch_copies or self.device.type != "cpu":
            return None
        if self._np_tiers is None:
            tiers: dict[str, np.ndarray] = {}
            for grp in self.slot_groups:
                d = grp.device_data
                if not d.is_contiguous():  # pragma: no cover: the groups allocate them whole
                    return None
                per = d.shape[1] // grp.pages_per_block
                tiers[grp.name] = d.view(torch.uint8).numpy().reshape(d.shape[0], per, -1)
            self._np_tiers = tiers
        got = [(self._np_tiers[grp.name], lay.start, lay.stop, n) for grp, lay, n in runs]
        self._np_chunk_runs[(ulo, uhi)] = got
        return got

    @staticmethod
    def _np_land(
        nruns: list[tuple[np.ndarray, int, int, int]], data: torch.Tensor | np.ndarray, slot: int
    ) -> int:
        """:meth:`land_chunk` by numpy copies (``_np_runs``): the GIL is let go once per copy."""
        src = data if isinstance(data, np.ndarray) else data.numpy()
        if src.ndim != 1 or src.dtype != np.uint8:  # (the tiers' own bytes are uint8)
            src = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        off = 0
        for tier, l0, l1, n in nruns:
            dst = tier[l0:l1, slot]
            dst[...] = src[off : off + n].reshape(dst.shape)
            off += n
        return off

    def unit_bytes(self, unit: Unit) -> int:
        grp, _ = unit
        return grp.pages_per_block * grp.page_bytes

    def swa_from_host(self, hslot: int, pages: Sequence[int]) -> None:
        src = self.swa.host_data[:, self.swa.host_index(hslot)].contiguous()
        self._swa_scatter(src, pages)

    def swa_from_bytes(self, data: torch.Tensor, pages: Sequence[int]) -> None:
        self._swa_scatter(data, pages)

    def _swa_scatter(self, src: torch.Tensor, pages: Sequence[int]) -> None:
        tier = self._swa_tier()
        scatter_blocks(
            src.reshape(-1, 1, tier.shape[2]).to(self.device),
            self._swa_rows(pages),
            tier,
            backend=self.backend,
        )

    def host_payload(
        self, hslot: int, with_swa: bool
    ) -> tuple[list[tuple[str, int, torch.Tensor]], torch.Tensor | None]:
        """A host copy as disk units (the indexer is not persisted: it is rebuilt after a load)."""
        units = [
            (grp.name, li, grp.host_data[li, grp.host_index(hslot)].clone())
            for grp, li in self.units(False)
        ]
        swa = self.swa.host_data[:, self.swa.host_index(hslot)].clone() if with_swa else None
        return units, swa

    # ---- reads (for use, tests and the stress checker) -----------------------------------
    # ---- what a Run reads (the caller holds the cache's lock) -------------------------------
    def read_window(
        self,
        li: int,
        rids: Sequence[int],
        h: int,
        swa_pages: Sequence[tuple[int, ...]],
        swa: Sequence[int],
        valid: int,
        backend: str | None,
    ) -> torch.Tensor:
        """The SWA rows of positions ``[h - n_win, h)`` of SWA layer ``li`` over the chain's
        records ``rids`` (zeros before position 0; a block whose window was slid, the null
        page's zeros).  ``swa_pages`` / ``swa``: each record's device pages and window phase
        (the block metadata's columns), ``valid`` the phase whose pages hold the window."""
        g, grp = self.g, self.swa
        bt, n_win, eb = g.swa_block_tokens, g.n_win, g.entry_bytes
        out = torch.zeros(n_win, eb, dtype=torch.uint8)
        if h == 0:
            return out
        first = max(0, h - n_win) // bt
        last = (h - 1) // bt
        table = []
        mapped = grp.map(rids)
        for j in range(first, last + 1):
            b, i = divmod(j, grp.pages_per_block)
            rid = mapped[b] if b < len(mapped) else 0  # 0: the null record
            pages = swa_pages[rid]
            table.append(pages[i] if pages and swa[rid] == valid else grp.NULL_PAGE)
        tier = grp.device_data[li].view(-1, bt, eb)
        t = torch.tensor(table, dtype=torch.int64, device=tier.device)
        rows = gather_blocks(tier, t, backend=backend).reshape(-1, eb).cpu()
        lo = max(0, h - n_win) - first * bt
        got = rows[lo : lo + min(h, n_win)]
        out[n_win - got.shape[0] :] = got
        return out

    def tail_state(self, li: int, rid: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The compressor state saved at the end of record ``rid`` (device slot ``slot``) for
        CSA layer ``li``, decoded (a copy): ``(state, positions)``."""
        grp = self.compressor
        return grp.decode(grp.device_data[li, grp.dev_index(max(slot, 0))])  # type: ignore[no-any-return]

    def device_block(self, slot: int, swa_pages: Sequence[int]) -> list[torch.Tensor]:
        """Copies of every page a block holds on the device (what a pinned reader relies on)."""
        out = [grp.device_data[:, grp.dev_index(slot)].clone() for grp in self.slot_groups]
        if swa_pages:
            out.append(self.swa.device_data[:, list(swa_pages)].clone())
        return out
