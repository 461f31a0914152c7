"""What the library's request-path tests share: a cache over the small geometry with the
deterministic writer (``make``; ``planted``: with seeded bugs), a first request that stores a
prompt (``store``), offloading every block (``offload_all``), and the byte checks of a hit's
compressed pages, window and tail against what (group, layer, position, token) say they must be
(``check_compressed``, ``check_window``, ``check_tail``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from kvstate.impl import HeterogeneousKVCache
from kvstate.impl.testdata import DeterministicWriter, expected_rows, expected_state_rows
from kvstate.spec import small
from kvstate.testing import seeded

G = small()
L = G.lcm_tokens


def make(**kw: Any) -> HeterogeneousKVCache:
    kw.setdefault("executors", "manual")
    kw.setdefault("writer", DeterministicWriter())  # content the byte checks recompute
    return HeterogeneousKVCache(G, **kw)


def planted(*bugs: str, **kw: Any) -> HeterogeneousKVCache:
    """``make``, from the staged copy of ``impl/`` with ``bugs`` planted."""
    kw.setdefault("executors", "manual")
    return seeded.cache(G, bugs=bugs, **kw)


def store(c: HeterogeneousKVCache, toks: np.ndarray, **kw: Any) -> None:
    """First request over ``toks``: no hit, stores its full blocks on finish."""
    a = c.admit(c.request(toks, **kw))
    with c.use(a):
        pass


def check_window(run: Any, toks: np.ndarray, layer: int = 3) -> None:
    h = run.hit_tokens
    lo = max(0, h - G.n_win)
    want = torch.zeros(G.n_win, G.entry_bytes, dtype=torch.uint8)
    if h:
        rows = expected_rows(
            "swa",
            torch.tensor([layer]),
            torch.arange(lo, h),
            torch.tensor(toks[lo:h]),
            G.entry_bytes,
        )
        want[G.n_win - (h - lo) :] = rows[0]
    assert torch.equal(run.read_window(layer), want)


def check_tail(run: Any, toks: np.ndarray, li: int = 0) -> None:
    h, m = run.hit_tokens, G.csa_ratio
    layer = [i for i, k in enumerate(G.layers) if k == "csa"][li]
    state = run.read_tail(li)
    q = torch.arange(h - m, h)
    rows = expected_state_rows(
        torch.tensor([layer]), q, torch.tensor(toks[h - m : h]), 2 * G.head_dim
    )[0]
    assert torch.equal(state[:m], rows)  # the next entry's window: positions h - m .. h + m - 1
    assert not state[m:].any()  # positions >= h do not exist yet


def check_compressed(run: Any, toks: np.ndarray) -> None:
    core = run.cache.inspect()
    for grp in (core.tiers.csa, core.tiers.hca):
        for li, layer in enumerate(grp.layers):
            pages = run.read_compressed(grp.name, li)
            for b in range(run.blocks):
                want = grp.make_pages(b * L, toks[b * L : (b + 1) * L], core.writer)[li]
                assert torch.equal(
                    pages[b * grp.pages_per_block : (b + 1) * grp.pages_per_block], want
                )
                n_e = L // grp.ratio
                raw = expected_rows(
                    grp.name,
                    torch.tensor([layer]),
                    torch.arange(b * n_e, (b + 1) * n_e),
                    torch.tensor(toks[b * L + grp.ratio - 1 : (b + 1) * L : grp.ratio]),
                    G.entry_bytes,
                )
                flat = want[:, : grp.entries_per_page * G.entry_bytes].reshape(-1, G.entry_bytes)
                assert torch.equal(flat, raw[0])
    idx = core.tiers.indexer
    for li in range(idx.nl):  # indexer pages are in sync with the compressed KV they index
        got = run.read_compressed("indexer", li)
        assert torch.equal(got, idx.build(run.read_compressed("csa", li).unsqueeze(0))[0])


def offload_all(c: HeterogeneousKVCache) -> None:
    c.tick(10)
    c.offload(1000)
    if c.inspect().pipeline_mode == "manual":
        c.pipelines.drain()
    else:
        deadline = time.time() + 10
        while c.inspect().busy() and time.time() < deadline:
            time.sleep(0.005)
