"""CUDA-graph topology registry: persistent buffers, recorded addresses, forced recapture.

A captured CUDA graph replays the kernel arguments it saw at capture.  Block tables and state
pointers are therefore *persistent* buffers: each step refills them in place (vLLM's approach),
padding slots are -1 and never used as an index (vLLM 43810).  What a graph cannot survive is a
block whose state buffer moved: the registry records, per block, the device address the graph
saw, and a recovery that installs a block at another address turns the graph STALE; replay is
refused until it is recaptured (no dynamic pointer jump inside static graph execution).

On a CUDA device a real ``torch.cuda.CUDAGraph`` is captured around the caller's function; on
CPU the registry keeps the same bookkeeping (so the protocol is tested everywhere) and replays
the function eagerly.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .errors import InternalError
from .meta import BlockMeta
from .phasecodes import GRAPH_CAPTURED, GRAPH_NONE, GRAPH_STALE


class GraphRegistry:
    def __init__(self, meta: BlockMeta, rows: int, max_blocks: int, device: torch.device) -> None:
        self.meta = meta
        self.phase = GRAPH_NONE
        # whether a move can stale the graph at all (phase CAPTURED), kept with ``phase`` in
        # this class alone: a store moves every block it allocates, and without a captured
        # graph the block store skips calling ``moved`` (interpreted: ~1.8k instructions each)
        self.captured = False
        self.device = device
        # persistent buffers: their own addresses never change, only their contents.  The host
        # side is numpy-backed (refilled with slice assignment, no per-step tensor building);
        # on a GPU it is copied into the device buffers the graph reads.
        self._bt = np.full((rows, max_blocks), -1, dtype=np.int32)
        self._sp = np.zeros((rows, max_blocks), dtype=np.int64)
        self._filled = [0] * rows  # entries of each row the last refill wrote (the rest is padding)
        # each row as a memoryview, made once: a refill writes it from an ``array`` of the same
        # item format, a C copy (assigning a list to a numpy slice costs ~150 instructions per
        # entry, and numpy's own call overhead ~4 times over per refill); padding is copied
        # from a row of -1 / 0 held for that
        self._bt_rows = [r.data for r in self._bt]  # (a row's memoryview)
        self._sp_rows = [r.data for r in self._sp]
        self._bt_fmt = self._bt_rows[0].format if rows else "i"
        self._sp_fmt = self._sp_rows[0].format if rows else "q"
        self._bt_pad = memoryview(array(self._bt_fmt, [-1]) * max_blocks)
        self._sp_pad = memoryview(array(self._sp_fmt, [0]) * max_blocks)
        # what each row holds (the last refill's slots and pointers, copies): a refill with the
        # same values writes nothing (converting a list into a numpy row costs ~150
        # instructions per entry; comparing two lists a few).  Only ``refill`` writes the rows.
        self._held: list[tuple[list[int], list[int]] | None] = [None] * rows
        self._width = max_blocks
        self._cuda = device.type == "cuda"  # read once: ``torch.device.type`` is a slow getter
        if self._cuda:  # pragma: no cover: CUDA device only (the fuzz runs on the CPU)
            self.block_tables = torch.full((rows, max_blocks), -1, dtype=torch.int32, device=device)
            self.state_ptrs = torch.zeros((rows, max_blocks), dtype=torch.int64, device=device)
        else:
            self.block_tables = torch.from_numpy(self._bt)
            self.state_ptrs = torch.from_numpy(self._sp)
        self.buffer_ptrs = (self.block_tables.data_ptr(), self.state_ptrs.data_ptr())
        self.captures = 0
        self.replays = 0
        self._fn: Callable[[], Any] | None = None
        self._graph: Any = None

    def refill(self, row: int, slots: list[int], ptrs: list[int]) -> None:
        """Write one request's block table and state pointers in place (-1 / 0 padding); a
        row that already holds exactly these is left as it is (a request's every use refills
        its row, mostly with what it already holds).  Otherwise the values are converted to
        ``array`` first (OverflowError for one that does not fit, before anything is
        written), then copied into the row as C buffers."""
        n = len(slots)
        if n > self._width:  # pragma: no cover: sized for max_model_len's pins: never truncate
            raise InternalError(
                f"{n} pinned blocks do not fit the graph's block table ({self._width})"
            )
        if len(ptrs) != n:
            ptrs = ptrs[:n]
        held = self._held[row]
        if held is not None and held[0] == slots and held[1] == ptrs:
            return  # the row (and its device copy) holds exactly these, padded as before
        # ``fromlist`` on an empty array: half the cost of ``array(fmt, values)``'s generic path
        bs = array(self._bt_fmt)
        bs.fromlist(slots)
        ps = array(self._sp_fmt)
        ps.fromlist(ptrs)
        self._held[row] = None  # until the row and its device copy are written
        old = self._filled[row]
        self._bt_rows[row][:n] = bs
        self._sp_rows[row][:n] = ps
        if old > n:  # beyond ``old`` the row is still padding
            self._bt_rows[row][n:old] = self._bt_pad[: old - n]
            self._sp_rows[row][n:old] = self._sp_pad[: old - n]
        self._filled[row] = n
        if self._cuda:  # pragma: no cover: CUDA device only (the fuzz runs on the CPU)
            self.block_tables[row].copy_(torch.from_numpy(self._bt[row]), non_blocking=True)
            self.state_ptrs[row].copy_(torch.from_numpy(self._sp[row]), non_blocking=True)
        self._held[row] = (list(slots), list(ptrs))  # copies: a caller may reuse its lists

    def record(self) -> None:
        """Capture: every known block's current address is what the graph saw."""
        m = self.meta
        m.gaddr[:] = m.addr
        self.phase = GRAPH_CAPTURED
        self.captured = True
        self.captures += 1
        if self._fn is not None and self._cuda:  # pragma: no cover: CUDA device only
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._fn()
            self._graph = g

    def set_function(self, fn: Callable[[], Any] | None) -> None:
        """The work the graph runs (reads the persistent buffers); None: bookkeeping only."""
        self._fn = fn
        self._graph = None

    def moved(self, rid: int, old: int, new: int) -> bool:
        """A block's state buffer moved from ``old`` to ``new``; True if that staled the graph."""
        if self.phase == GRAPH_CAPTURED and new != old and self.meta.gaddr[rid] >= 0:
            self.phase = GRAPH_STALE
            self.captured = False
            return True
        return False

    def replay(self) -> None:
        self.replays += 1
        if self._graph is not None:  # pragma: no cover: CUDA device only (record() made it)
            self._graph.replay()
        elif self._fn is not None:
            self._fn()
