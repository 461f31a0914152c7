"""Device and host storage of every group, and the data movements between tiers.

The device tier is real tensors on CUDA when available, else CPU tensors standing in for it;
the host tier is CPU tensors (pinned when a GPU is present).  A record's pages in the
full-history groups and the compressor group live at its device slot's index; its SWA pages come
from the SWA group's own pool.  Movements are whole-group tensor copies (one indexing op per
group and direction), and a load is split into *units* (one group layer each) so it can land in
``load_steps`` chunks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvstate.spec.geometry import Geometry
from kvstate.spec.layers import HitRule

from .bugs import Bugs
from .errors import LayoutError
from .groups import CompressedGroup, CompressorGroup, Group, IndexerGroup, SlotGroup, SWAGroup
from .storage import PagePool, SlotPool
from .testdata import Writer

Unit = tuple[SlotGroup, int]  # (group, layer position within the group)


def planned_bytes(g: Geometry, device_slots: int, host_slots: int) -> tuple[int, int]:
    """(device, host) bytes the tiers will allocate, computed before allocating anything."""
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
    return device_slots * (per_slot + swa), host_slots * (per_slot + swa)


class Tiers:
    def __init__(
        self,
        g: Geometry,
        *,
        device_slots: int,
        host_slots: int,
        device: torch.device,
        hit_rule: HitRule,
        bugs: Bugs,
        memory_limit: int,
    ) -> None:
        self._host_views: tuple[np.ndarray, np.ndarray] | None = None
        dev_b, host_b = planned_bytes(g, device_slots, host_slots)
        if dev_b + host_b > memory_limit:
            raise LayoutError(
                f"geometry {g.name!r}: {device_slots} device + {host_slots} host blocks need "
                f"{(dev_b + host_b) / 2**30:.1f} GiB (> memory_limit {memory_limit / 2**30:.1f} GiB); "
                "lower device_blocks/host_blocks or raise memory_limit"
            )
        self.g = g
        self.L = g.lcm_tokens
        self.device = device
        args = (device_slots, host_slots, device, hit_rule)
        self.csa = CompressedGroup("csa", g.csa_ratio, g, *args)
        self.hca = CompressedGroup("hca", g.hca_ratio, g, *args)
        self.indexer = IndexerGroup(g, *args)
        self.swa = SWAGroup(g, *args, bugs)
        self.compressor = CompressorGroup(g, *args, bugs)
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
        self.swa_pool = PagePool(1 + device_slots * self.swa.pages_per_block, first=1)
        self.host_slots = PagePool(host_slots)
        self.swa_pages_per_block = self.swa.pages_per_block
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
        self.indexer.build_into(self.csa.device_data[:, idx], self.indexer.device_data[:, idx])

    def build_index_run(self, slots: Sequence[int]) -> None:
        """``build_index`` of several slots: consecutive slots are built in one pass each."""
        if not slots:
            return
        if self.device.type != "cpu":
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
    def to_host(self, slot: int, swa_pages: Sequence[int], hslot: int) -> None:
        for grp in self.slot_groups:
            grp.host_data[:, grp.host_index(hslot)] = grp.device_data[:, grp.dev_index(slot)].to(
                "cpu"
            )
        if swa_pages:
            self.swa.host_data[:, self.swa.host_index(hslot)] = self.swa.device_data[
                :, list(swa_pages)
            ].to("cpu")

    def units(self, with_indexer: bool) -> list[Unit]:
        groups = self.slot_groups if with_indexer else self.disk_groups
        return [(grp, li) for grp in groups for li in range(grp.nl)]

    def unit_from_host(self, unit: Unit, hslot: int, slot: int) -> None:
        grp, li = unit
        grp.device_data[li, grp.dev_index(slot)] = grp.host_data[li, grp.host_index(hslot)].to(
            self.device
        )

    def unit_from_bytes(self, unit: Unit, data: torch.Tensor, slot: int) -> None:
        grp, li = unit
        grp.device_data[li, grp.dev_index(slot)] = data.view(
            grp.pages_per_block, grp.page_bytes
        ).to(self.device)

    def unit_bytes(self, unit: Unit) -> int:
        grp, _ = unit
        return grp.pages_per_block * grp.page_bytes

    def swa_from_host(self, hslot: int, pages: Sequence[int]) -> None:
        self.swa.device_data[:, list(pages)] = self.swa.host_data[:, self.swa.host_index(hslot)].to(
            self.device
        )

    def swa_from_bytes(self, data: torch.Tensor, pages: Sequence[int]) -> None:
        grp = self.swa
        self.swa.device_data[:, list(pages)] = data.view(
            grp.nl, grp.pages_per_block, grp.page_bytes
        ).to(self.device)

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
    def device_block(self, slot: int, swa_pages: Sequence[int]) -> list[torch.Tensor]:
        """Copies of every page a block holds on the device (what a pinned reader relies on)."""
        out = [grp.device_data[:, grp.dev_index(slot)].clone() for grp in self.slot_groups]
        if swa_pages:
            out.append(self.swa.device_data[:, list(swa_pages)].clone())
        return out
