"""``stats()`` names what it counts: ``blocks`` counts the prefix blocks the cache knows by the
phase of their compressed KV, and a known block whose slot was freed is a ``tombstone``, never
"free" beside ``device_free`` (the pool's free slots: a new cache reported ``free 0`` beside
``device_free 64``)."""

from __future__ import annotations

from cache_checks import make

from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small

G = small()


def test_stats_fields_say_what_they_count() -> None:
    with make() as c:
        s = c.stats()
        assert "free" not in s["blocks"] and s["blocks"]["tombstones"] == 0
        assert sum(s["blocks"].values()) == 0 and s["device_free"] == G.device_blocks
        a = c.admit(c.request(harness_tokens(2 * G.lcm_tokens + 1), lifetime=1))
        with c.use(a):
            pass
        s = c.stats()
        assert s["blocks"]["ready"] == 2 and s["device_free"] == G.device_blocks - 2
        c.tick(5)
        assert c.evict(2) == 2
        s = c.stats()
        # the evicted blocks are still known (tombstones) and their slots are free again
        assert s["blocks"]["tombstones"] == 2 and s["device_free"] == G.device_blocks
