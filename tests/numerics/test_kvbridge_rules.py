"""The unvalidated reader's readiness counts are the table's own L3 rules, not a copy: a block
whose indexer page is stale, or whose load has not finished, ends the prefix they count."""

from __future__ import annotations

from kvstate.impl import HeterogeneousKVCache
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.numerics.kvbridge import StorageReader
from kvstate.spec import small
from kvstate.spec.phases import CKV


def test_reader_counts_follow_the_tables_l3_rules() -> None:
    g = small()
    L = g.lcm_tokens
    c = HeterogeneousKVCache(g, executors="manual", writer=DeterministicWriter())
    try:
        toks = harness_tokens(3 * L + 1)
        with c.use(c.admit(c.request(toks))):
            pass
        req = c.request(toks)
        reader = StorageReader(c, req, 3 * L)
        assert (reader.loaded_blocks(), reader.synced_blocks()) == (3, 3)
        m, rid, poke = c.inspect().meta, reader.rids[1], c.test_hooks().poke
        # a negative test: damage block 1's state behind the cache's back
        poke("iver", rid, m.ver[rid] + 1)
        assert (reader.loaded_blocks(), reader.synced_blocks()) == (3, 1)
        poke("iver", rid, m.ver[rid])
        poke("ckv", reader.rids[2], int(CKV.LOADING))
        assert (reader.loaded_blocks(), reader.synced_blocks()) == (2, 3)
    finally:
        c.close()
