"""Resuming from a disk-restored prefix under the three SWA disk policies.

The disk tier holds the full-history state of a prefix: compressed KV and indexer keys (states
1 and 4), which are a pure function of the prefix.  The short-lived states (2: compressor tail,
3: SWA window) are what the policies disagree about:

* ``full``: the window and tail at the boundary ``h`` were stored too; restore and resume.
* ``checkpoint``: window and tail were stored only at multiples of ``p = swa_checkpoint_tokens``.
  Restore the last checkpoint ``c = (h // p) * p`` (window + tail at ``c``), the compressed KV
  and indexer at ``h`` from disk, and recompute forward over ``tokens[c:h]``.
* ``zero``: no window or tail is stored.  *Recompute* here means: start from a state whose
  compressed KV and indexer keys are the disk copies (complete up to ``h``), whose window and
  tail are empty, and whose length is ``s = max(0, h - n_win * L)``; then run tokens
  ``[s, h)`` through every layer exactly as prefill does, except that compressed entries (and
  indexer keys) that the disk copy already holds are kept, never rewritten (see
  :meth:`HybridModel.replay`).  The logits of the recomputed positions are thrown away; what the
  recompute produces is the window and tail of every layer at ``h``.

Why ``n_win * L`` tokens suffice, exactly (bit for bit): layer 0's input (the embedding) is exact
at every recomputed position; a layer's output at position ``q`` is exact once its window rows
``[q - n_win + 1, q]`` are exact, because its compressed entries and indexer keys come from disk.
So layer ``l``'s kv rows are exact from ``s + l * (n_win - 1)`` on, and the last layer's window
at ``h`` (positions ``h - n_win .. h - 1``) is exact when ``h - n_win >= s + (L - 1) * (n_win - 1)``;
i.e. ``h - s >= (L - 1) * (n_win - 1) + n_win`` (:func:`zero_min_exact_tokens`: 106 for the
small geometry); ``s = h - n_win * L`` (112) satisfies it with room to spare.  The tail's rows (at
most ``2m`` back) are inside that range too.  The tests pin the bound both ways: 106 tokens give
a state bit-identical to the original, 105 do not (its oldest window row at the last layer is
off; the logits happen to survive), and just ``n_win`` tokens move the logits visibly.  Equal
ops per position (see ``model.py``) make "exact" mean bit-exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from kvstate.spec.geometry import SwaDiskPolicy

from .model import HybridModel, Tokens
from .state import (
    HybridState,
    LayerPieces,
    StateError,
    StatePieces,
    build_state,
    check_state,
)


def disk_copy(pieces: StatePieces) -> StatePieces:
    """What the disk tier stores for a prefix: compressed KV + indexer, no window, no tail."""
    out = []
    for lp in pieces.layers:
        fields: dict[str, object] = {
            "window_kv": lp.window_kv[:0].clone(),
            "window_pos": torch.zeros(0, dtype=torch.long),
        }
        if lp.tail_kv is not None:
            assert lp.tail_score is not None
            fields |= {
                "tail_kv": lp.tail_kv[:0].clone(),
                "tail_score": lp.tail_score[:0].clone(),
                "tail_pos": torch.zeros(0, dtype=torch.long),
            }
        out.append(replace(lp, **fields))  # type: ignore[arg-type]
    return StatePieces(pieces.geometry, pieces.length, tuple(out))


def swa_snapshot(pieces: StatePieces) -> StatePieces:
    """The short-lived part of a state (window + tail): what ``full`` and ``checkpoint`` save."""
    out = []
    for lp in pieces.layers:
        fields: dict[str, object] = {}
        if lp.compressed is not None:
            assert lp.compressed_loaded is not None
            fields |= {
                "compressed": lp.compressed[:0].clone(),
                "compressed_loaded": lp.compressed_loaded[:0].clone(),
                "compressed_version": 0,
            }
        if lp.indexer_keys is not None:
            fields |= {"indexer_keys": lp.indexer_keys[:0].clone(), "indexer_version": 0}
        out.append(replace(lp, **fields))  # type: ignore[arg-type]
    return StatePieces(pieces.geometry, pieces.length, tuple(out))


def merge(disk: StatePieces, swa: StatePieces | None, length: int) -> StatePieces:
    """Compressed/indexer from ``disk``, window/tail from ``swa`` (or none), at ``length``."""
    out: list[LayerPieces] = []
    for li, dp in enumerate(disk.layers):
        if swa is None:
            out.append(disk_copy(disk).layers[li])
            continue
        sp = swa.layers[li]
        out.append(
            replace(
                dp,
                window_kv=sp.window_kv.clone(),
                window_pos=sp.window_pos.clone(),
                tail_kv=None if sp.tail_kv is None else sp.tail_kv.clone(),
                tail_score=None if sp.tail_score is None else sp.tail_score.clone(),
                tail_pos=None if sp.tail_pos is None else sp.tail_pos.clone(),
            )
        )
    return StatePieces(disk.geometry, length, tuple(out))


def checkpoint_boundary(h: int, p: int) -> int:
    """The last window checkpoint at or before ``h``."""
    return (h // p) * p


def zero_recompute_start(model: HybridModel, h: int, recompute_tokens: int | None = None) -> int:
    """First position the zero policy recomputes: ``h - n_win * L`` (clamped at 0)."""
    n = model.geometry.zero_swa_recompute_tokens if recompute_tokens is None else recompute_tokens
    return max(0, h - n)


def zero_min_exact_tokens(model: HybridModel) -> int:
    """Fewest recomputed tokens that rebuild every window/tail bit-exactly (see module doc)."""
    g = model.geometry
    return (len(g.layers) - 1) * (g.n_win - 1) + g.n_win


def restore_from_disk(
    model: HybridModel,
    disk: StatePieces,
    prefix: Tokens,
    policy: SwaDiskPolicy,
    *,
    swa: StatePieces | None = None,
    recompute_tokens: int | None = None,
    check: bool = True,
) -> HybridState:
    """Rebuild the state at ``h = disk.length`` under an SWA disk policy.

    ``prefix`` is the prompt's first ``h`` tokens (the request carries them).  ``swa`` is the
    stored window/tail snapshot: at ``h`` for ``full``, at the last checkpoint for
    ``checkpoint``, unused for ``zero``.  ``recompute_tokens`` overrides ``n_win * L`` for the
    zero policy (tests use it to show that fewer tokens are not enough).  With ``check`` the
    result must pass :func:`check_state`.
    """
    g, h = model.geometry, disk.length
    toks: Sequence[int] = prefix.tolist() if isinstance(prefix, torch.Tensor) else list(prefix)
    if len(toks) != h:
        raise StateError(f"prefix has {len(toks)} tokens, disk state is at {h}")
    if policy == "full":
        if swa is None or swa.length != h:
            raise StateError("full policy needs the window/tail snapshot at the boundary")
        state = build_state(merge(disk, swa, h))
    elif policy == "checkpoint":
        p = g.swa_checkpoint_tokens
        if swa is None or swa.length != checkpoint_boundary(h, p):
            raise StateError(f"checkpoint policy needs the snapshot at {checkpoint_boundary(h, p)}")
        c = swa.length
        state = model.replay(build_state(merge(disk, swa, c)), toks[c:h])
    elif policy == "zero":
        s = zero_recompute_start(model, h, recompute_tokens)
        state = model.replay(build_state(merge(disk, None, s)), toks[s:h])
    else:
        raise ValueError(f"unknown SWA disk policy {policy!r}")
    if check:
        check_state(state)
    return state
