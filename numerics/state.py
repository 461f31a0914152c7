"""The five cache states of one request in the tiny hybrid model, and their export/restore.

A prefix-cache hit is only as good as the state it restores.  This module names every piece of
per-request state the tiny model (``kvstate.numerics.model``) needs to resume at a boundary ``h``,
in the seed article's five categories, so the kvstate allocator can store and restore each one per
tier and the tests can break each one on purpose:

1. **Compressed KV** (:class:`CompressedState`): CSA entries (one per ``m`` tokens) and HCA entries
   (one per ``m'`` tokens) for the whole history; plus a per-entry ``loaded`` flag (an entry whose
   asynchronous disk load has not finished is present in the table but not ready).
2. **Uncompressed tail** (:class:`TailState`): the compressor state, i.e. the kv and score rows of
   tokens not yet folded into a complete compression window.  CSA windows overlap (entry ``j``
   covers tokens ``[m*j - m, m*j + m - 1]``), so a CSA layer keeps up to ``2m`` rows; HCA keeps up
   to ``m'``.
3. **SWA window** (:class:`WindowState`): a ring buffer of the last ``n_win`` kv rows and their
   positions; every layer has one.
4. **Indexer state** (:class:`IndexerState`): one lightning-indexer key per CSA entry, with a
   version that must equal the compressed KV's version.
5. **Bookkeeping**: :attr:`HybridState.length` (tokens folded into the state, i.e. the next
   position), the versions and the ``loaded`` flags above.

:class:`StatePieces` is the flat, storage-shaped form (rows in position order, no ring-buffer
slots) that the cache stores per tier; :func:`export_pieces` and :func:`build_state` convert both
ways, bit-exactly.  :func:`state_problems` / :func:`check_state` are the structural checks a
restore must pass; they catch every corruption in ``kvstate.numerics.corrupt`` except the
silently re-labelled window (see there), which only a numerical comparison catches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from kvstate.spec.geometry import Geometry, LayerKind

DTYPE = torch.float32


class StateError(ValueError):
    """A state cannot be resumed from: a piece is missing, stale, misplaced or not loaded."""


# ---- geometry helpers ----------------------------------------------------------------------


def ratio_of(g: Geometry, kind: LayerKind) -> int:
    """Compression ratio of a layer kind (0 for SWA-only layers, which compress nothing)."""
    return {"swa": 0, "csa": g.csa_ratio, "hca": g.hca_ratio}[kind]


def tail_capacity(g: Geometry, kind: LayerKind) -> int:
    """Rows of compressor state a layer keeps (2m for CSA because windows overlap, m' for HCA)."""
    return {"swa": 0, "csa": g.csa_tail_rows, "hca": g.hca_tail_rows}[kind]


def tail_row_dim(g: Geometry, kind: LayerKind) -> int:
    """Width of one compressor row.

    A CSA token contributes to two entries (its own block's and, as the previous block, the next
    one's) with different projections, so its row holds both halves: ``2 * head_dim``.
    """
    return {"swa": 0, "csa": 2 * g.head_dim, "hca": g.head_dim}[kind]


def visible_entries(position: int, ratio: int) -> int:
    """Compressed entries query ``position`` may read: entry j iff ``j < (position + 1) // ratio``."""
    return (position + 1) // ratio


def expected_window_positions(g: Geometry, length: int) -> list[int]:
    """Positions the SWA ring must hold at boundary ``length``: the last ``n_win`` tokens."""
    return list(range(max(0, length - g.n_win), length))


def expected_tail_positions(g: Geometry, kind: LayerKind, length: int) -> list[int]:
    """Positions whose compressor rows are still live at boundary ``length``.

    CSA: the last complete block (needed as the *previous* half of the next entry) plus the
    partial current block.  HCA: only the partial current block (windows do not overlap).
    """
    if kind == "csa":
        m = g.csa_ratio
        return list(range(max(0, (length // m) * m - m), length))
    if kind == "hca":
        mp = g.hca_ratio
        return list(range((length // mp) * mp, length))
    return []


def entries_per_block(g: Geometry, kind: LayerKind) -> int:
    """Compressed entries in one cache block of ``compressed_block_tokens`` token positions."""
    return g.entries_per_block(ratio_of(g, kind))


# ---- the live (ring-buffer) state ----------------------------------------------------------


@dataclass
class WindowState:
    """(3) SWA window: ring buffer of kv rows, slot ``pos % n_win``; ``pos == -1`` is empty."""

    kv: Tensor  # [n_win, head_dim]
    pos: Tensor  # [n_win] int64

    @classmethod
    def empty(cls, g: Geometry) -> WindowState:
        return cls(torch.zeros(g.n_win, g.head_dim, dtype=DTYPE), torch.full((g.n_win,), -1))

    def rows(self) -> tuple[Tensor, Tensor]:
        """Occupied rows in position order (a fresh tensor) and their positions."""
        slots = sorted((int(p), s) for s, p in enumerate(self.pos.tolist()) if p >= 0)
        idx = torch.tensor([s for _, s in slots], dtype=torch.long)
        return self.kv.index_select(0, idx), torch.tensor([p for p, _ in slots], dtype=torch.long)

    def clone(self) -> WindowState:
        return WindowState(self.kv.clone(), self.pos.clone())


@dataclass
class TailState:
    """(2) Compressor state: kv and score rows of unfolded tokens, ring slot ``pos % capacity``."""

    kv: Tensor  # [capacity, row_dim]
    score: Tensor  # [capacity, row_dim]
    pos: Tensor  # [capacity] int64, -1 empty

    @classmethod
    def empty(cls, g: Geometry, kind: LayerKind) -> TailState:
        cap, dim = tail_capacity(g, kind), tail_row_dim(g, kind)
        return cls(
            torch.zeros(cap, dim, dtype=DTYPE),
            torch.zeros(cap, dim, dtype=DTYPE),
            torch.full((cap,), -1),
        )

    @property
    def capacity(self) -> int:
        return int(self.pos.shape[0])

    def rows(self) -> tuple[Tensor, Tensor, Tensor]:
        """Occupied rows in position order: kv, score, positions."""
        slots = sorted((int(p), s) for s, p in enumerate(self.pos.tolist()) if p >= 0)
        idx = torch.tensor([s for _, s in slots], dtype=torch.long)
        return (
            self.kv.index_select(0, idx),
            self.score.index_select(0, idx),
            torch.tensor([p for p, _ in slots], dtype=torch.long),
        )

    def clear(self, position: int) -> None:
        """Forget a row once every window that needs it has been compressed."""
        slot = position % self.capacity
        if int(self.pos[slot]) == position:
            self.pos[slot] = -1
            self.kv[slot].zero_()
            self.score[slot].zero_()

    def clone(self) -> TailState:
        return TailState(self.kv.clone(), self.score.clone(), self.pos.clone())


@dataclass
class CompressedState:
    """(1) Compressed KV entries of one CSA/HCA layer, in entry order.

    ``version`` counts entry writes; ``loaded[j]`` is False while entry j's load is in flight.
    """

    entries: Tensor  # [n, head_dim]
    loaded: Tensor  # [n] bool
    version: int

    @classmethod
    def empty(cls, g: Geometry) -> CompressedState:
        return cls(torch.zeros(0, g.head_dim, dtype=DTYPE), torch.zeros(0, dtype=torch.bool), 0)

    @property
    def n(self) -> int:
        return int(self.entries.shape[0])

    def clone(self) -> CompressedState:
        return CompressedState(self.entries.clone(), self.loaded.clone(), self.version)


@dataclass
class IndexerState:
    """(4) Lightning-indexer keys, one ``indexer_dim`` key per CSA entry, and their version.

    The geometry's ``indexer_entry_bytes`` (``indexer_dim`` FP8 bytes + scales) is one key per
    entry; the ``indexer_heads`` live on the query side, as in the V3.2/V4 lightning indexer.
    """

    keys: Tensor  # [n, indexer_dim]
    version: int

    @classmethod
    def empty(cls, g: Geometry) -> IndexerState:
        return cls(torch.zeros(0, g.indexer_dim, dtype=DTYPE), 0)

    def clone(self) -> IndexerState:
        return IndexerState(self.keys.clone(), self.version)


@dataclass
class LayerState:
    """All cache state of one layer; SWA-only layers have just the window."""

    kind: LayerKind
    window: WindowState
    tail: TailState | None = None
    compressed: CompressedState | None = None
    indexer: IndexerState | None = None

    @classmethod
    def empty(cls, g: Geometry, kind: LayerKind) -> LayerState:
        if kind == "swa":
            return cls(kind, WindowState.empty(g))
        return cls(
            kind,
            WindowState.empty(g),
            TailState.empty(g, kind),
            CompressedState.empty(g),
            IndexerState.empty(g) if kind == "csa" else None,
        )

    def clone(self) -> LayerState:
        return LayerState(
            self.kind,
            self.window.clone(),
            self.tail.clone() if self.tail is not None else None,
            self.compressed.clone() if self.compressed is not None else None,
            self.indexer.clone() if self.indexer is not None else None,
        )


@dataclass
class HybridState:
    """A request's whole cache state after ``length`` tokens (state 5: ``length`` = next position)."""

    geometry: Geometry
    length: int
    layers: list[LayerState]

    @classmethod
    def empty(cls, g: Geometry) -> HybridState:
        return cls(g, 0, [LayerState.empty(g, k) for k in g.layers])

    def clone(self) -> HybridState:
        return HybridState(self.geometry, self.length, [ls.clone() for ls in self.layers])


# ---- the storage form ----------------------------------------------------------------------


@dataclass(frozen=True)
class LayerPieces:
    """One layer's state as the cache stores it: plain tensors, rows in position order.

    ``None`` means the layer kind has no such state (SWA layers have no compressed/tail/indexer;
    HCA has no indexer).  A tier that does not hold a piece gives it zero rows, not ``None``.
    """

    kind: LayerKind
    window_kv: Tensor  # [w, head_dim]                      (3)
    window_pos: Tensor  # [w] int64
    tail_kv: Tensor | None = None  # [t, tail_row_dim]      (2)
    tail_score: Tensor | None = None  # [t, tail_row_dim]
    tail_pos: Tensor | None = None  # [t] int64
    compressed: Tensor | None = None  # [n, head_dim]       (1)
    compressed_loaded: Tensor | None = None  # [n] bool
    compressed_version: int = 0
    indexer_keys: Tensor | None = None  # [n, indexer_dim]  (4)
    indexer_version: int = 0

    def compressed_block(self, g: Geometry, block: int) -> Tensor:
        """Entries of one cache block (``compressed_block_tokens`` positions): the unit of a tier."""
        if self.compressed is None:
            raise StateError(f"{self.kind} layer has no compressed KV")
        epb = entries_per_block(g, self.kind)
        return self.compressed[block * epb : (block + 1) * epb]


@dataclass(frozen=True)
class StatePieces:
    """The whole state at boundary ``length`` (5) as per-layer pieces."""

    geometry: Geometry
    length: int
    layers: tuple[LayerPieces, ...]

    def replace_layer(self, index: int, layer: LayerPieces) -> StatePieces:
        layers = list(self.layers)
        layers[index] = layer
        return StatePieces(self.geometry, self.length, tuple(layers))


def _c(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clone()


def export_pieces(state: HybridState) -> StatePieces:
    """Copy a live state out into storage form (every tensor is a fresh copy the cache owns)."""
    out = []
    for ls in state.layers:
        wkv, wpos = ls.window.rows()
        fields: dict[str, object] = {"kind": ls.kind, "window_kv": wkv, "window_pos": wpos}
        if ls.tail is not None:
            tkv, tsc, tpos = ls.tail.rows()
            fields |= {"tail_kv": tkv, "tail_score": tsc, "tail_pos": tpos}
        if ls.compressed is not None:
            fields |= {
                "compressed": ls.compressed.entries.clone(),
                "compressed_loaded": ls.compressed.loaded.clone(),
                "compressed_version": ls.compressed.version,
            }
        if ls.indexer is not None:
            fields |= {
                "indexer_keys": ls.indexer.keys.clone(),
                "indexer_version": ls.indexer.version,
            }
        out.append(LayerPieces(**fields))  # type: ignore[arg-type]
    return StatePieces(state.geometry, state.length, tuple(out))


def build_state(pieces: StatePieces) -> HybridState:
    """Rebuild a live state from pieces: rows go back to ring slot ``pos % capacity``.

    No validation here (a restore path may legitimately build a state that is "ahead", e.g.
    compressed entries restored from disk past a window checkpoint); call :func:`check_state`.
    """
    g = pieces.geometry
    if len(pieces.layers) != len(g.layers):
        raise StateError(f"pieces have {len(pieces.layers)} layers, geometry {len(g.layers)}")
    layers = []
    for li, (kind, lp) in enumerate(zip(g.layers, pieces.layers, strict=True)):
        if lp.kind != kind:
            raise StateError(f"layer {li}: pieces are {lp.kind}, geometry says {kind}")
        ls = LayerState.empty(g, kind)
        for row, p in zip(lp.window_kv, lp.window_pos.tolist(), strict=True):
            slot = p % g.n_win
            ls.window.kv[slot] = row
            ls.window.pos[slot] = p
        if ls.tail is not None and lp.tail_pos is not None:
            assert lp.tail_kv is not None and lp.tail_score is not None
            for i, p in enumerate(lp.tail_pos.tolist()):
                slot = p % ls.tail.capacity
                ls.tail.kv[slot] = lp.tail_kv[i]
                ls.tail.score[slot] = lp.tail_score[i]
                ls.tail.pos[slot] = p
        if ls.compressed is not None and lp.compressed is not None:
            loaded = lp.compressed_loaded
            if loaded is None:
                loaded = torch.ones(lp.compressed.shape[0], dtype=torch.bool)
            ls.compressed = CompressedState(
                lp.compressed.clone(), loaded.clone(), lp.compressed_version
            )
        if ls.indexer is not None and lp.indexer_keys is not None:
            ls.indexer = IndexerState(lp.indexer_keys.clone(), lp.indexer_version)
        layers.append(ls)
    return HybridState(g, pieces.length, layers)


def pieces_equal(a: StatePieces, b: StatePieces) -> bool:
    """Bit-exact equality of two exported states (same rows, positions, versions, flags)."""
    if a.length != b.length or len(a.layers) != len(b.layers):
        return False
    for la, lb in zip(a.layers, b.layers, strict=True):
        for name in LayerPieces.__dataclass_fields__:
            va, vb = getattr(la, name), getattr(lb, name)
            if isinstance(va, Tensor) and isinstance(vb, Tensor):
                if va.shape != vb.shape or va.dtype != vb.dtype or not torch.equal(va, vb):
                    return False
            elif va != vb:
                return False
    return True


# ---- structural checks ---------------------------------------------------------------------


def _positions(t: Tensor) -> list[int]:
    return sorted(int(p) for p in t.tolist() if p >= 0)


def state_problems(state: HybridState) -> list[str]:
    """Every reason the state cannot be resumed from at ``state.length``; empty when sound.

    Checks, per layer: the window holds exactly the last ``n_win`` positions in their ring slots;
    the tail holds exactly the live compressor rows; the compressed chain has exactly
    ``length // ratio`` entries, all loaded; the indexer has one key per entry and the same
    version.  What it cannot see: rows whose *content* belongs to other positions but whose
    position labels are right (a block table off by one) -- only numerics reveal that.
    """
    g, h = state.geometry, state.length
    out: list[str] = []
    for li, ls in enumerate(state.layers):
        where = f"layer {li} ({ls.kind})"
        got = _positions(ls.window.pos)
        want = expected_window_positions(g, h)
        if got != want:
            out.append(f"{where}: window holds positions {_span(got)}, expected {_span(want)}")
        for slot, p in enumerate(ls.window.pos.tolist()):
            if p >= 0 and p % g.n_win != slot:
                out.append(f"{where}: window position {p} sits in slot {slot}")
        if ls.tail is not None:
            got = _positions(ls.tail.pos)
            want = expected_tail_positions(g, ls.kind, h)
            if got != want:
                out.append(f"{where}: tail holds positions {_span(got)}, expected {_span(want)}")
        if ls.compressed is not None:
            want_n = h // ratio_of(g, ls.kind)
            if ls.compressed.n != want_n:
                out.append(f"{where}: {ls.compressed.n} compressed entries, expected {want_n}")
            missing = (~ls.compressed.loaded).nonzero().flatten().tolist()
            if missing:
                out.append(f"{where}: compressed entries {_span(missing)} not loaded")
        if ls.indexer is not None and ls.compressed is not None:
            if ls.indexer.version != ls.compressed.version:
                out.append(
                    f"{where}: indexer version {ls.indexer.version} != "
                    f"compressed version {ls.compressed.version}"
                )
            if ls.indexer.keys.shape[0] != ls.compressed.n:
                out.append(
                    f"{where}: {ls.indexer.keys.shape[0]} indexer keys for "
                    f"{ls.compressed.n} entries"
                )
    return out


def check_state(state: HybridState) -> None:
    """Raise :class:`StateError` naming every problem :func:`state_problems` finds."""
    problems = state_problems(state)
    if problems:
        raise StateError("; ".join(problems))


def _span(xs: Iterable[int]) -> str:
    xs = list(xs)
    if not xs:
        return "[]"
    if xs == list(range(xs[0], xs[-1] + 1)):
        return f"[{xs[0]}..{xs[-1]}]"
    return str(xs)
