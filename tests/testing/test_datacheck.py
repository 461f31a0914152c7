"""``verify_run`` compares every compressed page a run reads layer by layer (all blocks at
once) and names the blocks that differ: the same problems as a block-by-block comparison."""

from __future__ import annotations

from typing import Any

import torch

from kvstate.spec import default_table
from kvstate.targets.api import ApiHarness, witnesses
from kvstate.testing.datacheck import verify_run

TABLE = default_table()
N = 4


class _Tampered:
    """A run whose ``read_compressed(group, layer)`` has one byte flipped in one block."""

    def __init__(self, run: Any, group: str, layer: int, row: int) -> None:
        self._run, self._at = run, (group, layer, row)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._run, name)

    def read_compressed(self, group: str, layer: int) -> torch.Tensor:
        pages = self._run.read_compressed(group, layer).clone()
        if (group, layer) == self._at[:2]:
            pages[self._at[2], 0] ^= 1
        return pages


def test_every_block_of_every_layer_is_compared_and_named() -> None:
    h = ApiHarness(TABLE, N)
    try:
        for o in witnesses(N, TABLE.consts.L, TABLE.consts.lease_max)["hit after a host load"][
            :-1
        ]:  # (not the finish)
            h.apply(o)
        lv = next(x for x in h.live if x is not None and x.run is not None)
        run, want = lv.run, lv.want[: len(lv.req.tokens)]
        assert run.blocks == N and verify_run(run, want) == []
        core = run.cache.inspect()
        named = 0
        for grp in (core.tiers.csa, core.tiers.hca):
            for li, layer in enumerate(grp.layers):
                for b in range(run.blocks):
                    got = verify_run(_Tampered(run, grp.name, li, b * grp.pages_per_block), want)
                    kv = [p for p in got if p.startswith("compressed KV")]
                    assert kv == [f"compressed KV: {grp.name} layer {layer} block {b} bytes differ"]
                    named += 1
        assert named >= 2 * N
    finally:
        h.close()
