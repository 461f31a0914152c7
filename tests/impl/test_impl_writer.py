"""Who writes a stored block's pages.  The production writer, the cache's default
(``impl/writer.py`` :class:`HandedRows`): a stored block holds exactly the rows its caller
handed over, and a block whose rows were not handed is not stored (``WriterFailed``, nothing
left pinned or half written).  ``writer=None``: the engine's kernels wrote the pages."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from cache_checks import make, store

from kvstate.impl import HandedRows, HeterogeneousKVCache, InvalidArgument, RowsNotHanded
from kvstate.impl.errors import WriterFailed
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import Indexer

G = small()
L = G.lcm_tokens
CSA, HCA = G.layers.count("csa"), G.layers.count("hca")


def forward(n: int, seed: int) -> dict[str, torch.Tensor]:
    """Stands for the model's forward pass over tokens ``[0, n)``: each group's rows (random
    bytes: nothing the cache could make up itself)."""
    gen = torch.Generator().manual_seed(seed)

    def kv(layers: int, rows: int) -> torch.Tensor:
        return torch.randint(0, 256, (layers, rows, G.entry_bytes), generator=gen).to(torch.uint8)

    state = torch.randint(-64, 64, (CSA, n, 2 * G.head_dim), generator=gen).float() / 8
    return {
        "csa": kv(CSA, n // G.csa_ratio),
        "hca": kv(HCA, n // G.hca_ratio),
        "swa": kv(len(G.layers), n),
        "compressor": state,
    }


def test_the_default_writer_stores_the_rows_handed_and_nothing_else() -> None:
    blocks = 3
    toks = harness_tokens(blocks * L + 1)
    computed = forward(len(toks), seed=1)
    with HeterogeneousKVCache(G, executors="manual") as c:
        rows = c.inspect().writer
        assert isinstance(rows, HandedRows)
        with rows.handing(), c.use(c.admit(c.request(toks))):
            for group, r in computed.items():
                rows.hand(group, 0, r)
        assert rows.held() == 0  # forgotten with the block that handed them
        with c.use(c.admit(c.request(toks))) as run:
            assert run.hit_tokens == blocks * L
            for name in ("csa", "hca"):
                grp = getattr(c.inspect().tiers, name)
                used = grp.entries_per_page * G.entry_bytes
                for li in range(grp.nl):
                    pages = run.read_compressed(name, li)[:, :used].reshape(-1, G.entry_bytes)
                    assert torch.equal(pages, computed[name][li, : blocks * L // grp.ratio])
            for li in range(len(G.layers)):  # the hit's window: the swa rows before its end
                window = run.read_window(li)
                h = run.hit_tokens
                assert torch.equal(window, computed["swa"][li, h - window.shape[0] : h])


def test_a_block_whose_rows_were_not_handed_is_not_stored() -> None:
    toks = harness_tokens(2 * L + 1)
    with HeterogeneousKVCache(G, executors="manual") as c:
        adm = c.admit(c.request(toks))
        with pytest.raises(WriterFailed) as info, c.use(adm):
            pass
        assert isinstance(info.value.__cause__, RowsNotHanded)
        assert adm.request.slot is None and c.stats()["pinned_blocks"] == 0
        again = c.admit(c.request(toks))
        assert again.hit_tokens == 0  # nothing of it was stored
        c.abort(again.request)


def test_hand_refuses_bad_rows_and_keeps_nothing_of_them() -> None:
    rows = HandedRows()
    good = torch.zeros(CSA, 2, G.entry_bytes, dtype=torch.uint8)
    for call in (
        lambda: rows.hand("csa", -1, good),
        lambda: rows.hand("csa", True, good),  # type: ignore[arg-type]
        lambda: rows.hand("", 0, good),
        lambda: rows.hand("csa", 0, good[0]),
        lambda: rows.hand("csa", 0, good.float()),
        lambda: rows.hand("compressor", 0, good),
        lambda: rows.hand("csa", 0, np.zeros((1, 2, 3), dtype=np.uint8)),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgument):
            call()
    assert rows.held() == 0
    with pytest.raises(InvalidArgument):
        HandedRows(fmt=99)


def test_rows_are_kept_per_thread_and_copied() -> None:
    rows = HandedRows()
    mine = torch.ones(CSA, 2, G.entry_bytes, dtype=torch.uint8)
    rows.hand("csa", 4, mine)
    mine.zero_()  # the caller reuses its buffer: what was handed stays
    layers, at = torch.arange(CSA), torch.tensor([4, 5])
    assert int(rows.rows("csa", layers, at, at, G.entry_bytes).min()) == 1
    seen: list[BaseException] = []

    def other() -> None:
        try:
            rows.rows("csa", layers, at, at, G.entry_bytes)
        except RowsNotHanded as exc:
            seen.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(seen) == 1  # another thread's request has positions of its own
    with pytest.raises(RowsNotHanded):  # handed in another shape than the cache stores
        rows.rows("csa", torch.arange(CSA + 1), at, at, G.entry_bytes)


@pytest.mark.parametrize("derive", [None, True])
def test_who_writes_the_indexer_pages_of_a_stored_block(derive: bool | None) -> None:
    """writer=None: the engine wrote every page; storing stamps the indexer's version and leaves
    its pages alone, unless derive_index=True.  Either way the block then hits."""
    c = make(writer=None, derive_index=derive)
    try:
        ix = c.inspect().tiers.indexer.device_data
        ix.fill_(0x5A)  # what "the engine" wrote
        before = ix.clone()
        toks = harness_tokens(2 * L + 3)
        store(c, toks)
        rids = c.inspect().resolve(c.chain(toks))
        m = c.inspect().meta
        assert all(m.idx[r] == Indexer.PRESENT and m.iver[r] == m.ver[r] for r in rids)
        if derive:
            assert not torch.equal(ix, before)  # derived from the (zero) CSA entries
        else:
            assert torch.equal(ix, before)
        a = c.admit(c.request(toks))
        assert a.state == "validated" and a.hit_tokens == 2 * L
    finally:
        c.close()
