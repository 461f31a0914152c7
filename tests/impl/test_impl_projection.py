"""The recovery projection's shortcut (return at once when nothing would change) agrees with
the full computation on random metadata, including corrupt, moving and stale blocks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.impl.coordinator import projection
from kvstate.impl.meta import BlockMeta
from kvstate.spec.phases import CKV, Indexer, Pipe


@settings(max_examples=300)
@given(data=st.data(), n=st.integers(1, 6), drops=st.booleans())
def test_projection_shortcut_agrees_with_the_full_loop(
    data: st.DataObject, n: int, drops: bool
) -> None:
    m = BlockMeta(4)
    rids = [m.new(bytes([i]), None, 0) for i in range(n)]
    for i in rids:
        m.ckv[i] = int(data.draw(st.sampled_from(list(CKV))))
        m.idx[i] = int(data.draw(st.sampled_from(list(Indexer))))
        m.ver[i] = data.draw(st.integers(0, 2))
        m.iver[i] = data.draw(st.integers(0, 2))
        m.ldpipe[i] = int(data.draw(st.sampled_from(list(Pipe))))
        m.corrupt[i] = data.draw(st.booleans())
    full = projection(m, rids, disk_drops_swa=drops, shortcut=False)
    fast = projection(m, rids, disk_drops_swa=drops)
    assert (fast == {}) == (not any(full.values()))
    if fast:
        assert fast == full
