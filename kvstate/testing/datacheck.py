"""Byte-exact verification of what a request reads, against the deterministic test writer.

The conformance harness compares abstract state with the model; this compares *data*: every
compressed page, indexer page, SWA window row and tail row a running request would read is
recomputed from (group, layer, position, token) and compared exactly.  Seeded data bugs (a
window one block late, a tail spliced at the wrong boundary) only show up here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
import torch

from kvstate.impl.testdata import expected_rows, expected_state_rows

if TYPE_CHECKING:
    from kvstate.impl.cache import Run


_EXPECTED: OrderedDict[tuple[object, ...], torch.Tensor] = OrderedDict()
_EXPECTED_MAX = 4096


def _entries(
    group: str, layer: int, lo: int, hi: int, tokens: np.ndarray, width: int
) -> torch.Tensor:
    """``expected_rows`` of one layer at positions ``[lo, hi)``, kept per exact question.

    The checks after every operation ask for the same rows again and again; the key is the
    question itself (the token values as int64 bytes), so building the argument tensors is
    skipped too.  Read only: callers compare it or copy it into a tensor of their own.
    """
    toks = np.ascontiguousarray(tokens, dtype=np.int64)
    key = (group, int(layer), int(lo), int(hi), toks.tobytes(), int(width))
    got = _EXPECTED.get(key)
    if got is None:
        got = expected_rows(
            group, torch.tensor([layer]), torch.arange(lo, hi), torch.from_numpy(toks), width
        )[0]
        _EXPECTED[key] = got
        if len(_EXPECTED) > _EXPECTED_MAX:
            _EXPECTED.popitem(last=False)
    return got


def verify_run(run: Run, tokens: np.ndarray) -> list[str]:
    """Problems found in the data ``run`` reads for a prefix of ``tokens`` (empty: all exact)."""
    core = run.cache.inspect()
    g = core.geometry
    L = g.lcm_tokens
    eb = g.entry_bytes  # a derived property: computed at every read, read here once
    h = run.hit_tokens
    problems: list[str] = []
    if h == 0:
        return problems
    # compressed KV pages (CSA and HCA), entry by entry: every block of a layer compared at
    # once (the entries of blocks 0..n-1 are the rows of positions 0..n*n_e, their tokens every
    # ratio-th from ratio - 1: L is a multiple of the ratio); block by block only to name the
    # blocks that differ
    nb = run.blocks
    for grp in (core.tiers.csa, core.tiers.hca):
        ppb, width = grp.pages_per_block, grp.entries_per_page * eb
        n_e = L // grp.ratio
        for li, layer in enumerate(grp.layers):
            pages = run.read_compressed(grp.name, li)
            if (
                len(tokens) >= nb * L
                and pages.dtype == torch.uint8
                and pages.dim() == 2
                and pages.shape[0] >= nb * ppb
                and pages.shape[1] >= width
                and ppb * width >= n_e * eb
            ):
                whole = pages[: nb * ppb, :width].reshape(nb, ppb * width // eb, eb)
                raw = _entries(
                    grp.name, layer, 0, nb * n_e, tokens[grp.ratio - 1 : nb * L : grp.ratio], eb
                )
                if torch.equal(whole[:, :n_e], raw.view(nb, n_e, eb)):
                    continue
            for b in range(nb):
                block = pages[b * grp.pages_per_block : (b + 1) * grp.pages_per_block]
                flat = block[:, : grp.entries_per_page * eb].reshape(-1, eb)
                raw = _entries(
                    grp.name,
                    layer,
                    b * n_e,
                    (b + 1) * n_e,
                    tokens[b * L + grp.ratio - 1 : (b + 1) * L : grp.ratio],
                    eb,
                )
                if not torch.equal(flat[: raw.shape[0]], raw):
                    problems.append(
                        f"compressed KV: {grp.name} layer {layer} block {b} bytes differ"
                    )
    # indexer pages are the keys of the compressed KV they index
    idx = core.tiers.indexer
    for li in range(idx.nl):
        got = run.read_compressed("indexer", li)
        if not torch.equal(got, idx.build(run.read_compressed("csa", li).unsqueeze(0))[0]):
            problems.append(f"indexer: layer {li} keys do not match the compressed KV")
    # SWA window: rows of positions [h - n_win, h)
    lo = max(0, h - g.n_win)
    for layer in range(len(g.layers)):
        want = torch.zeros(g.n_win, eb, dtype=torch.uint8)
        want[g.n_win - (h - lo) :] = _entries("swa", layer, lo, h, tokens[lo:h], eb)
        if not torch.equal(run.read_window(layer), want):
            problems.append(f"SWA window: layer {layer} rows differ from positions [{lo}, {h})")
    # tail: the compressor state at the boundary (the next CSA entry's first m rows)
    m = g.csa_ratio
    csa_layers = [i for i, k in enumerate(g.layers) if k == "csa"]
    for li, layer in enumerate(csa_layers):
        try:
            state = run.read_tail(li)
        except Exception as exc:  # noqa: BLE001 - a splice discontinuity is a finding, not a crash
            problems.append(f"uncompressed tail: layer {layer}: {type(exc).__name__}: {exc}")
            continue
        q = torch.arange(h - m, h)
        rows = expected_state_rows(
            torch.tensor([layer]), q, torch.tensor(tokens[h - m : h]), 2 * g.head_dim
        )[0]
        if not torch.equal(state[:m], rows) or bool(state[m:].any()):
            problems.append(f"uncompressed tail: layer {layer} state at boundary {h} differs")
    bad_pins = run.verify_pins()
    problems.extend(f"state_data_ptrs: {p}" for p in bad_pins)
    return problems
