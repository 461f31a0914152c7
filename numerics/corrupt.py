"""Break one of the five states on purpose, the way a cache bug would, for negative tests.

Each function takes the :class:`StatePieces` a cache would restore at boundary ``h`` and returns
a copy with one state broken *physically* the way the named bug leaves it: the tensors keep the
shapes a restore would produce (a never-written page reads as zeros), while the bookkeeping
(positions, versions, ``loaded`` flags) tells the truth wherever a real allocator's metadata
would.  So :func:`~kvstate.numerics.state.check_state` catches each of them except
:func:`offset_window`, whose position labels are right and whose contents are not: that one only
a numerical comparison catches.  ``resume(..., check=False)`` then shows how far the logits move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import torch

from .state import LayerPieces, StateError, StatePieces, entries_per_block

Corruption = Literal[
    "drop_tail", "offset_window", "stale_indexer", "drop_compressed_block", "partial_load"
]
CORRUPTIONS: tuple[Corruption, ...] = (
    "drop_tail",
    "offset_window",
    "stale_indexer",
    "drop_compressed_block",
    "partial_load",
)

#: Which of the five states each corruption breaks (for reports).
BROKEN_STATE: dict[Corruption, str] = {
    "drop_tail": "(2) uncompressed tail",
    "offset_window": "(3) SWA window",
    "stale_indexer": "(4) indexer state",
    "drop_compressed_block": "(1) compressed KV",
    "partial_load": "(1)+(5) on-disk prefix: load not finished",
}


def _layers(pieces: StatePieces, layer: int | None, kinds: tuple[str, ...]) -> list[int]:
    if layer is not None:
        if pieces.layers[layer].kind not in kinds:
            raise StateError(f"layer {layer} is {pieces.layers[layer].kind}, need one of {kinds}")
        return [layer]
    return [i for i, lp in enumerate(pieces.layers) if lp.kind in kinds]


def drop_tail(pieces: StatePieces, *, layer: int | None = None) -> StatePieces:
    """The compressor state was not saved/restored: every CSA/HCA layer restarts with no rows.

    The next compression then folds an incomplete window (CSA loses the previous block's half).
    """
    out = pieces
    for li in _layers(pieces, layer, ("csa", "hca")):
        lp = out.layers[li]
        assert lp.tail_kv is not None and lp.tail_score is not None
        out = out.replace_layer(
            li,
            replace(
                lp,
                tail_kv=lp.tail_kv[:0].clone(),
                tail_score=lp.tail_score[:0].clone(),
                tail_pos=torch.zeros(0, dtype=torch.long),
            ),
        )
    return out


def offset_window(
    pieces: StatePieces, earlier: StatePieces, *, layer: int | None = None
) -> StatePieces:
    """The SWA block table is off by one block: rows come from one ``swa_block_tokens`` earlier.

    ``earlier`` is the state exported at ``h - swa_block_tokens``; its window rows (positions
    ``[h - block - n_win, h - block)``) are placed under the labels ``[h - n_win, h)``.  Positions
    look right, contents are wrong: the "stale window" bug (ROCm ATOM 1417).  Rows that would come
    from before position 0 are missing.
    """
    g = pieces.geometry
    block = g.swa_block_tokens
    if earlier.length != pieces.length - block:
        raise StateError(f"earlier pieces must be at {pieces.length - block}, got {earlier.length}")
    out = pieces
    for li in _layers(pieces, layer, ("swa", "csa", "hca")):
        lp, ep = out.layers[li], earlier.layers[li]
        src = {int(p): i for i, p in enumerate(ep.window_pos.tolist())}
        rows, labels = [], []
        for p in lp.window_pos.tolist():
            if p - block in src:
                rows.append(ep.window_kv[src[p - block]])
                labels.append(p)
        kv = torch.stack(rows) if rows else lp.window_kv[:0].clone()
        out = out.replace_layer(
            li, replace(lp, window_kv=kv, window_pos=torch.tensor(labels, dtype=torch.long))
        )
    return out


def stale_indexer(
    pieces: StatePieces, older: StatePieces, *, layer: int | None = None
) -> StatePieces:
    """The indexer pages were last synced at an older version (the state at ``older.length``).

    Keys of entries written since then were never copied: those rows read as zeros (a fresh
    page), and the indexer version is the older one, so it no longer matches the compressed KV.
    The top-k then picks different entries (SGLang 30057: KV restored without its sidecar).
    """
    if older.length >= pieces.length:
        raise StateError("older pieces must be at an earlier boundary")
    out = pieces
    for li in _layers(pieces, layer, ("csa",)):
        lp, op = out.layers[li], older.layers[li]
        assert lp.indexer_keys is not None and op.indexer_keys is not None
        keys = torch.zeros_like(lp.indexer_keys)
        keys[: op.indexer_keys.shape[0]] = op.indexer_keys
        out = out.replace_layer(
            li, replace(lp, indexer_keys=keys, indexer_version=op.indexer_version)
        )
    return out


def _last_block(pieces: StatePieces) -> int:
    return pieces.length // pieces.geometry.compressed_block_tokens - 1


def _blank_block(lp: LayerPieces, pieces: StatePieces, block: int, fraction: float) -> LayerPieces:
    """Keep the first ``fraction`` of a block's values, zero the rest, flag touched entries."""
    g = pieces.geometry
    assert lp.compressed is not None and lp.compressed_loaded is not None
    epb = entries_per_block(g, lp.kind)
    lo, hi = block * epb, (block + 1) * epb
    if block < 0 or hi > lp.compressed.shape[0]:
        raise StateError(f"block {block} is not a complete block of layer {lp.kind}")
    comp = lp.compressed.clone()
    flat = comp[lo:hi].reshape(-1)
    keep = int(flat.numel() * fraction)
    flat[keep:] = 0.0
    comp[lo:hi] = flat.view(hi - lo, -1)
    loaded = lp.compressed_loaded.clone()
    full_rows = keep // g.head_dim
    loaded[lo + full_rows : hi] = False
    return replace(lp, compressed=comp, compressed_loaded=loaded)


def drop_compressed_block(
    pieces: StatePieces, *, block: int | None = None, layer: int | None = None
) -> StatePieces:
    """One compressed block (``compressed_block_tokens`` positions) is missing: reads as zeros.

    Default: the last complete block before ``h``, in every CSA and HCA layer.
    """
    b = _last_block(pieces) if block is None else block
    out = pieces
    for li in _layers(pieces, layer, ("csa", "hca")):
        out = out.replace_layer(li, _blank_block(out.layers[li], pieces, b, 0.0))
    return out


def partial_load(
    pieces: StatePieces,
    *,
    block: int | None = None,
    layer: int | None = None,
    fraction: float = 0.5,
) -> StatePieces:
    """A disk load of one compressed block stopped part-way: the first ``fraction`` of the
    page's values arrived, the rest is still zeros (the allocator used it before completion)."""
    b = _last_block(pieces) if block is None else block
    out = pieces
    for li in _layers(pieces, layer, ("csa", "hca")):
        out = out.replace_layer(li, _blank_block(out.layers[li], pieces, b, fraction))
    return out


def apply(
    kind: Corruption,
    pieces: StatePieces,
    state_at: Callable[[int], StatePieces],
) -> StatePieces:
    """Apply corruption ``kind`` to the pieces at ``h``; ``state_at(h')`` supplies older states.

    ``offset_window`` uses the state one SWA block earlier; ``stale_indexer`` the one an LCM
    block (``lcm_tokens``) earlier, i.e. the previous boundary a cache would have saved.
    """
    g, h = pieces.geometry, pieces.length
    if kind == "drop_tail":
        return drop_tail(pieces)
    if kind == "offset_window":
        return offset_window(pieces, state_at(h - g.swa_block_tokens))
    if kind == "stale_indexer":
        return stale_indexer(pieces, state_at(h - g.lcm_tokens))
    if kind == "drop_compressed_block":
        return drop_compressed_block(pieces)
    if kind == "partial_load":
        return partial_load(pieces)
    raise ValueError(f"unknown corruption {kind!r}")
