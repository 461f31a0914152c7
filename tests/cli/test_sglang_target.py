"""``kvstate fuzz --target sglang``: SGLang's unified radix cache against the table's projection.

Skips (with the reason) where SGLang is not installed (`tools/install_sglang.sh` installs it);
under CI, which installs it, a missing SGLang fails.  Each check class is shown able to fire by
breaking one SGLang method with monkeypatch (restored after the test) and asserting the fuzzer
reports that class and prints a reproducer.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from kvstate.targets.sglang import imports as sglang_import

try:
    sglang_import.load()
except sglang_import.SGLangUnavailable as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):  # .ci/run installs SGLang: a missing one is a failure there
        raise
    pytest.skip(f"SGLang not installed ({e}); run tools/install_sglang.sh", allow_module_level=True)

from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import HostKVCache  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402

from kvstate.targets.sglang.checks import CHECK_CLASSES  # noqa: E402
from kvstate.targets.sglang.configs import ALL, Config  # noqa: E402
from kvstate.targets.sglang.driver import NAMES, op  # noqa: E402
from kvstate.targets.sglang.engine import ENGINE, run  # noqa: E402

SWA = (Config("swa", "python", 4, 16, 96, 256),)
SWA_RUST = (Config("swa", "rust", 4, 16, 96, 256),)
# a page of traffic that stores a prefix and asks for it again, nothing evicted in between
STORE_AND_RESEND = [op("arrive", 1, 40), op("admit", 0, 256), op("decode", 0, 3), op("finish", 0),
                    op("resend", 0), op("admit", 0, 256)]  # fmt: skip
# with HiCache's host tier: the stored prefix is written through, evicted from the device, and
# the re-sent request's admission loads it back from the host
L2 = Config("swa", "python", 4, 16, 96, 256, hicache="l2")
STORE_EVICT_LOAD = STORE_AND_RESEND[:4] + [op("evict", 96), op("resend", 0), op("admit", 0, 256)]


def test_ci_profile_exercises_every_configuration_and_check() -> None:
    r = run(profile="ci")
    print(r.render())
    assert r.ok, r.render()
    assert set(r.stats.configs) == {c.label for c in ALL}
    for c in CHECK_CLASSES:
        if c != "crash":  # crash fires only when SGLang raises
            assert r.stats.checks[c] > 0, c
    for name in NAMES:
        # faults that need a storage file written first: their own tests below
        if name not in ("lose_file", "drop_sidecar"):
            assert r.stats.calls[name] > 0, name
    for path in ("hit", "miss", "eviction", "decode freed out-of-window SWA",
                 "SWA tombstone recovered", "Mamba hit", "host load-back",
                 "L3 prefetch loaded"):  # fmt: skip
        assert r.stats.paths[path] > 0, path


def _fuzz(configs: tuple[Config, ...] = SWA) -> Any:
    r = run(profile="dev", configs=configs, examples=6, steps=60)
    assert not r.ok, "the broken method went unnoticed"
    assert "standalone reproducer" in r.render()
    return r


def test_a_leaking_free_is_a_conservation_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    # the paged full/SWA allocator forgets the pages handed back to it
    monkeypatch.setattr(PagedTokenToKVPoolAllocator, "free_segment", lambda self, i, **k: None)
    # (where the first slots it loses are a recovered tombstone's, tombstone is reported first)
    assert "conservation" in _fuzz().finding.detail


def test_a_page_both_held_and_free_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    orig = PagedTokenToKVPoolAllocator.alloc_extend

    def alloc_extend(self, *a, **k):  # type: ignore[no-untyped-def]
        before = self.free_pages.clone()
        out = orig(self, *a, **k)
        taken = len(before) - len(self.free_pages)
        if out is not None and 0 < taken <= len(before) - taken:
            # the pages handed out stay on the free list; as many others drop off it, so
            # every count still adds up
            self.free_pages = torch.cat([before[:taken], before[2 * taken :]])
        return out

    monkeypatch.setattr(PagedTokenToKVPoolAllocator, "alloc_extend", alloc_extend)
    assert _fuzz().finding.kind == "freed-referenced"


def test_a_hit_naming_other_slots_is_an_L3_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    orig = UnifiedRadixCache.prefix_device_indices
    monkeypatch.setattr(
        UnifiedRadixCache, "prefix_device_indices", lambda self, req: orig(self, req).flip(0)
    )
    assert _fuzz(SWA_RUST).finding.kind == "L3"


def test_a_tombstone_recovery_that_leaks_is_a_tombstone_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # recovering an SWA tombstone swaps the node's full slots for the inserting request's; the
    # broken recovery forgets to free the old ones (the Python core's SWA component)
    from sglang.srt.mem_cache.unified_cache.components.swa import SWAComponent

    orig = SWAComponent._recover_from_incoming

    def leaky(self, *, cache_actions, **k):  # type: ignore[no-untyped-def]
        n = len(cache_actions)
        orig(self, cache_actions=cache_actions, **k)
        cache_actions[n:] = [
            a for a in cache_actions[n:] if type(a).__name__ != "FreeDeviceKVFullOnly"
        ]

    monkeypatch.setattr(SWAComponent, "_recover_from_incoming", leaky)
    assert _fuzz().finding.kind == "tombstone"


def test_an_unaligned_hit_is_an_L1_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    match, path = UnifiedRadixCache.match_prefix, UnifiedRadixCache.prefix_device_indices

    def short(self, params):  # type: ignore[no-untyped-def]
        r = match(self, params)
        n = r.device_prefix_len
        return r._replace(device_prefix_len=n - 1) if n else r

    monkeypatch.setattr(UnifiedRadixCache, "match_prefix", short)
    monkeypatch.setattr(
        UnifiedRadixCache,
        "prefix_device_indices",
        lambda self, req: path(self, req)[: req.prefix_len],
    )
    assert _fuzz().finding.kind == "L1"


def test_a_lock_never_released_is_a_locks_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(UnifiedRadixCache, "unlock", lambda self, lock: None)
    assert _fuzz().finding.kind == "locks"


def test_a_release_that_publishes_nothing_is_a_completeness_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    f, _ = ENGINE.replay(SWA[0], STORE_AND_RESEND)
    assert f is None, f  # unbroken, the re-sent prefix hits
    monkeypatch.setattr(UnifiedRadixCache, "checkpoint", lambda self, req, **k: None)
    f, _ = ENGINE.replay(SWA[0], STORE_AND_RESEND)
    assert f is not None and f.kind == "completeness", f


def test_a_buffer_moved_under_a_captured_graph_is_an_addresses_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orig = ReqToTokenPool.write

    def write(self, indices, values):  # type: ignore[no-untyped-def]
        self.req_to_token = self.req_to_token.clone()  # copy-on-write: the table moves
        return orig(self, indices, values)

    monkeypatch.setattr(ReqToTokenPool, "write", write)
    assert _fuzz().finding.kind == "addresses"


def test_a_load_back_from_the_host_tier_is_checked_whole() -> None:
    f, d = ENGINE.replay(L2, STORE_EVICT_LOAD)
    assert f is None, f
    assert d.stats.paths["host load-back"] == 1 and d.stats.checks["load"] == 1


def test_a_load_back_that_never_completes_is_a_load_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(UnifiedRadixCache, "is_load_back_event_done", lambda self, i: False)
    f, _ = ENGINE.replay(L2, STORE_EVICT_LOAD)
    assert f is not None and f.kind == "load", f


def test_a_load_back_missing_its_last_page_is_an_L3_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    orig = HostKVCache.load_to_device_per_layer_physical

    def short(self, device_pool, host_indices, device_indices, *a, **k):  # type: ignore[no-untyped-def]
        n = len(host_indices) - self.page_size  # the H2D copy stops a page short
        return orig(self, device_pool, host_indices[:n], device_indices[:n], *a, **k)

    monkeypatch.setattr(HostKVCache, "load_to_device_per_layer_physical", short)
    f, _ = ENGINE.replay(L2, STORE_EVICT_LOAD)
    assert f is not None and f.kind == "L3", f


L3 = Config("swa", "python", 4, 16, 96, 256, hicache="l3")
STORE_DROP_PREFETCH = [op("arrive", 1, 40), op("poll"), op("admit", 0, 256), op("decode", 0, 3),
                       op("finish", 0), op("poll"), op("evict", 96), op("evict_host", 400),
                       op("resend", 0), op("poll"), op("admit", 0, 256)]  # fmt: skip


def test_a_prefix_gone_from_device_and_host_is_served_from_file_storage() -> None:
    f, d = ENGINE.replay(L3, STORE_DROP_PREFETCH)
    assert f is None, f
    assert d.stats.paths["L3 prefetch loaded"] == 1 and d.stats.checks["load"] == 1


# a file removed: the pages before it may still be prefetched (a partial prefetch, checked for
# every state's markers); a file cut to half its size: SGLang's HiCacheFile.get reports the short
# read and the prefetch serves nothing (the target's markers sit in each slot's first bytes, which
# a cut file keeps, so the count of served prefetches is what shows a cut page was not served)
@pytest.mark.parametrize(("k", "served"), [(0, 1), (1, 0)])
def test_a_lost_or_cut_storage_file_is_never_served(k: int, served: int) -> None:
    f, d = ENGINE.replay(
        L3, STORE_DROP_PREFETCH[:8] + [op("lose_file", k)] + STORE_DROP_PREFETCH[8:]
    )
    assert f is None, f  # whatever the admission then hits holds its markers (checked)
    assert d.stats.calls["lose_file"] == 1 and d.stats.calls["admit"] == 2
    assert d.stats.paths["L3 prefetch loaded"] == served


def test_sglang_raising_on_an_allowed_call_is_a_crash_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def boom(self, *a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(UnifiedRadixCache, "evict", boom)
    assert _fuzz().finding.kind == "crash"


# DeepSeek-V4 with L3 storage: a prefix stored, dropped from device and host, asked again; its
# pages come back from file storage with every pool (compressed KV, indexer sidecar, SWA)
L3_DSV4 = Config("deepseek-v4", "rust", 256, 128, 256 * 10, 2048, hicache="l3")
DSV4_DROP_PREFETCH = [op("arrive", 1, 900), op("poll"), op("admit", 0, 2048), op("decode", 0, 3),
                      op("finish", 0), op("poll"), op("evict", 2560), op("evict_host", 8000),
                      op("drop_sidecar", 0), op("resend", 0), op("poll"),
                      op("admit", 0, 2048)]  # fmt: skip


def test_a_prefetch_missing_its_indexer_sidecar_is_not_served() -> None:
    f, d = ENGINE.replay(L3_DSV4, DSV4_DROP_PREFETCH[:8] + DSV4_DROP_PREFETCH[9:])
    assert f is None, f  # the control: the whole prefix comes back from L3, sidecar and all
    assert d.stats.paths["L3 prefetch loaded"] == 1 and d.stats.checks["sidecar"] == 1
    f, d = ENGINE.replay(L3_DSV4, DSV4_DROP_PREFETCH)
    assert f is None, f  # one indexer file lost: SGLang serves none of it from L3
    assert d.stats.calls["drop_sidecar"] == 1 and d.stats.paths["L3 prefetch loaded"] == 0


def test_a_partial_prefetch_without_its_sidecar_is_a_sidecar_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the file backend takes a lost indexer page for a present one, in its census and its read:
    # the prefetch stops partway for the sidecar yet the compressed KV is served
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    census, read = HiCacheFile._collect_existing_component_keys, HiCacheFile._read_page

    def present(self, keys, pool_transfers=None):  # type: ignore[no-untyped-def]
        out = census(self, keys, pool_transfers)
        for t in pool_transfers or []:
            if "indexer" in str(t.name):
                out |= {f"{self._get_component_key(k, t.name)}.bin" for k in keys}
        return out

    def read_ok(self, pool, key, host_pool, offset):  # type: ignore[no-untyped-def]
        return read(self, pool, key, host_pool, offset) or "indexer" in str(pool)

    monkeypatch.setattr(HiCacheFile, "_collect_existing_component_keys", present)
    monkeypatch.setattr(HiCacheFile, "_read_page", read_ok)
    f, _ = ENGINE.replay(L3_DSV4, DSV4_DROP_PREFETCH)
    assert f is not None and f.kind == "sidecar", f


# FULL+SWA+Mamba.  Without the extra buffer (page 1) a checkpoint copies the running Mamba state
# into a fresh slot the tree keeps; with it (page 4) the tree keeps the state the forward
# tracked at a chunk-aligned position: here the decode's track boundary at 48 tokens
MAMBA = Config("swa-mamba", "python", 1, 16, 96, 256, mamba="no_buffer")
MAMBA_EXTRA = Config("swa-mamba", "rust", 4, 16, 96, 256, mamba="extra_buffer")
TRACK_AND_RESEND = [op("arrive", 1, 40), op("admit", 0, 256), op("decode", 0, 10),
                    op("finish", 0), op("resend", 0), op("admit", 0, 256)]  # fmt: skip


def test_a_tracked_mamba_state_is_hit_and_a_stale_one_is_a_mamba_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    f, d = ENGINE.replay(MAMBA_EXTRA, TRACK_AND_RESEND)
    assert f is None, f  # the control: the re-sent prefix hits the state tracked at 48
    assert d.stats.paths["Mamba hit"] == 1 and d.stats.checks["mamba"] == 3
    # a finish donates the other ping-pong slot: the tree keeps the previous tracked state
    keep = HybridReqToTokenPool.get_mamba_ping_pong_keep_idx
    monkeypatch.setattr(
        HybridReqToTokenPool,
        "get_mamba_ping_pong_keep_idx",
        lambda self, req: self.get_mamba_ping_pong_other_idx(keep(self, req)),
    )
    f, _ = ENGINE.replay(MAMBA_EXTRA, TRACK_AND_RESEND)
    assert f is not None and f.kind == "mamba", f


def test_a_mamba_checkpoint_that_copies_nothing_is_a_mamba_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sglang.srt.mem_cache.memory_pool import MambaPool

    monkeypatch.setattr(MambaPool, "copy_from", lambda self, src, dst: None)
    assert _fuzz((MAMBA,)).finding.kind == "mamba"


def test_a_mamba_slot_never_freed_is_a_conservation_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator

    monkeypatch.setattr(MambaSlotAllocator, "free", lambda self, idx: None)
    f = _fuzz((MAMBA,)).finding
    assert f.kind == "conservation" and "mamba pool" in str(f), f


def test_a_mamba_slot_both_held_and_free_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator

    def alloc(self, n):  # type: ignore[no-untyped-def]
        before = self.free_slots
        if n > len(before) // 2:
            return None
        # the slots handed out stay on the free list; as many others drop off it, so every
        # count still adds up
        self.free_slots = torch.cat([before[:n], before[2 * n :]])
        return before[:n]

    monkeypatch.setattr(MambaSlotAllocator, "_do_alloc", alloc)
    f = _fuzz((MAMBA,)).finding
    assert f.kind == "freed-referenced" and "Mamba" in str(f), f
