"""The vLLM target's checks beyond the table's projection, each shown able to fire.

For each check class (sliding-window and Mamba state reads, eviction order, reset, KV cache
events, inputs that separate caches) one vLLM method is broken in-process with monkeypatch and
the fuzzer must report that class; the time to catch is printed (``pytest -s``).
"""

from __future__ import annotations

import os
import time

import pytest

from kvstate.targets.vllm import imports as vllm_import

try:
    vllm_import.load("vllm.v1.core.kv_cache_manager")
except vllm_import.VLLMUnavailable as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):  # .ci/run installs vLLM: a missing one is a failure there
        raise
    pytest.skip(f"vLLM not installed ({e}); run tools/install_vllm.sh", allow_module_level=True)

from test_vllm_target import BREAKS as PROJECTED_BREAKS  # noqa: E402
from vllm.v1.core import block_pool as bp  # noqa: E402
from vllm.v1.core import kv_cache_manager as km  # noqa: E402
from vllm.v1.core import kv_cache_utils as ku  # noqa: E402
from vllm.v1.core import single_type_kv_cache_manager as st  # noqa: E402

from kvstate.calls import parse_calls  # noqa: E402
from kvstate.targets.vllm.checks import CHECK_CLASSES  # noqa: E402
from kvstate.targets.vllm.configs import Config  # noqa: E402
from kvstate.targets.vllm.engine import run  # noqa: E402
from kvstate.targets.vllm.ops import parse  # noqa: E402

FULL = (Config("full", False, 14),)
SWA = (Config("swa", False, 16),)
MAMBA = (Config("mamba", False, 24),)
TENANTS = (Config("tenants", False, 14),)


def break_swa_skip(mp: pytest.MonkeyPatch) -> None:
    """The sliding window's skipped-token count one too high: a block still inside the window of
    a running request is freed (silent to every other check)."""
    orig = st.SlidingWindowManager.get_num_skipped_tokens
    mp.setattr(st.SlidingWindowManager, "get_num_skipped_tokens", lambda s, n: orig(s, n) + 1)


def break_mamba_skip(mp: pytest.MonkeyPatch) -> None:
    """Mamba keeps no state: the block holding the last computed token's state is freed."""
    mp.setattr(st.MambaManager, "get_num_skipped_tokens", lambda s, n: n)


def break_lru(mp: pytest.MonkeyPatch) -> None:
    """LRU reversed: freed cached blocks go to the front of the free queue (evicted first)."""
    orig = bp.BlockPool.free_blocks

    def free_blocks(self, ordered_blocks):  # type: ignore[no-untyped-def]
        blocks = list(ordered_blocks)
        orig(self, blocks)
        cached = [b for b in blocks if b.ref_cnt == 0 and b.block_hash is not None]
        for b in cached:
            self.free_block_queue.remove(b)
        self.free_block_queue.prepend_n(cached)

    mp.setattr(bp.BlockPool, "free_blocks", free_blocks)


def break_reset_in_use(mp: pytest.MonkeyPatch) -> None:
    """Reset does not wait for the blocks in use to be freed."""

    def reset(self):  # type: ignore[no-untyped-def]
        self.cached_block_hash_to_block = bp.BlockHashToBlockMap()
        self.cached_block_hashes_by_block.clear()
        for b in self.blocks:
            b.reset_hash()
        return True

    mp.setattr(bp.BlockPool, "reset_prefix_cache", reset)


def break_reset_incomplete(mp: pytest.MonkeyPatch) -> None:
    """Reset clears the blocks' hashes but keeps the hash map: old KV stays reachable."""
    orig = bp.BlockPool.reset_prefix_cache

    def reset(self):  # type: ignore[no-untyped-def]
        kept = self.cached_block_hash_to_block
        ok = orig(self)
        self.cached_block_hash_to_block = kept
        return ok

    mp.setattr(bp.BlockPool, "reset_prefix_cache", reset)


def break_events(mp: pytest.MonkeyPatch) -> None:
    """An eviction for reuse reports no ``BlockRemoved``: a router keeps routing to lost KV."""

    def evict(self, block):  # type: ignore[no-untyped-def]
        return bool(self._remove_cached_block_hashes(block))

    mp.setattr(bp.BlockPool, "_maybe_evict_cached_block", evict)


def break_salt(mp: pytest.MonkeyPatch) -> None:
    orig = ku.generate_block_hash_extra_keys

    def keys(request, *a, **k):  # type: ignore[no-untyped-def]
        extra, idx = orig(request, *a, **k)
        kept = tuple(x for x in extra or () if x[0] != "cache_salt")
        return kept or None, idx

    mp.setattr(ku, "generate_block_hash_extra_keys", keys)


def break_lora(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(ku, "_gen_lora_extra_hash_keys", lambda request: [])


def break_mm(mp: pytest.MonkeyPatch) -> None:
    orig = ku._gen_mm_extra_hash_keys

    def keys(*a, **k):  # type: ignore[no-untyped-def]
        extra, idx = orig(*a, **k)
        return [(x[0], "image", *x[2:]) for x in extra], idx  # the image's identity dropped

    mp.setattr(ku, "_gen_mm_extra_hash_keys", keys)


def break_prompt_logprobs(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(km.KVCacheManager, "prefix_cache_lookup_enabled", lambda self, r: True)


# name -> (break, configurations, the check class that must fire)
BREAKS = {
    "window-swa": (break_swa_skip, SWA, "window"),
    "window-mamba": (break_mamba_skip, MAMBA, "window"),
    "eviction-lru-reversed": (break_lru, FULL, "eviction"),
    "reset-in-use": (break_reset_in_use, FULL, "reset"),
    "reset-incomplete": (break_reset_incomplete, FULL, "reset"),
    "events-removal-missing": (break_events, FULL, "events"),
    "separation-salt": (break_salt, TENANTS, "separation"),
    "separation-lora": (break_lora, TENANTS, "separation"),
    "separation-image": (break_mm, TENANTS, "separation"),
    "separation-prompt-logprobs": (break_prompt_logprobs, TENANTS, "separation"),
}


def test_every_check_class_has_a_break() -> None:
    assert set(PROJECTED_BREAKS) | {c for _, _, c in BREAKS.values()} == set(CHECK_CLASSES)


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_check_fires_when_vllm_is_broken(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    brk, configs, check = BREAKS[name]
    brk(monkeypatch)
    t0 = time.monotonic()
    r = run(profile="ci", configs=configs, examples=120)  # derandomized: the same run every time
    assert not r.ok, f"{name}: not caught"
    assert r.finding is not None
    fired = set(r.finding.detail)
    print(
        f"{name}: caught as {sorted(fired)} after {r.stats.steps} steps in {r.seconds:.1f} s "
        f"(with minimizing {time.monotonic() - t0:.1f} s), {len(r.trace)} ops"
    )
    assert check in fired, r.render()
    compile(r.reproducer, "<reproducer>", "exec")


# A roundtrip (one operation: admit, chunks, finish, re-send) on mamba+eagle/pool24 whose own
# later chunks evict the Mamba states its first chunks cached: the re-sent prompt rightly hits
# 0 tokens.  With the eviction epoch updated once per operation, the re-send was held to the
# full-cache promise (48 tokens) and reported as a completeness failure of a correct vLLM.
ROUNDTRIP_EVICTS = parse(
    parse_calls(
        """
        roundtrip(family=2, shared=0, tail=11, extra=21, chunk=5)
        step(rid=1, chunk=41, drafts=2, accepted=1)
        roundtrip(family=2, shared=8, tail=13, extra=22, chunk=27)
        step(rid=1, chunk=39, drafts=2, accepted=2)
        arrive(family=0, shared=72, tail=13, extra=7, rid=4)
        admit(rid=4, chunk=4, ext_blocks=0)
        step(rid=4, chunk=9, drafts=2, accepted=0)
        roundtrip(family=1, shared=16, tail=11, extra=10, chunk=29)
        roundtrip(family=2, shared=0, tail=11, extra=4, chunk=15)
        roundtrip(family=1, shared=56, tail=13, extra=14, chunk=21)
        """
    )
)


def test_an_eviction_inside_a_compound_operation_counts() -> None:
    from kvstate.targets.vllm.engine import ENGINE

    f, d = ENGINE.replay(Config("mamba", True, 24), ROUNDTRIP_EVICTS[:-1])
    assert f is None
    epoch = d.epoch
    d.run_op(len(ROUNDTRIP_EVICTS) - 1, ROUNDTRIP_EVICTS[-1])  # raises a Finding if held to it
    assert d.epoch > epoch  # the roundtrip's own chunks evicted cached entries


def test_the_same_seed_walks_the_same_whatever_is_imported(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Hypothesis draws some integers from constants in the local modules loaded at the time:
    a run after importing a module full of them (as the command line imports more of kvstate
    than ``kvstate.fuzz.run``) must walk exactly as one before."""
    import sys

    cfg = (Config("full", False, 14),)

    def walk() -> tuple[int, list[tuple[str, int]]]:
        r = run(profile="ci", configs=cfg, examples=12, minimize_findings=False)
        return r.stats.steps, sorted(r.stats.calls.items())

    before = walk()
    consts = (
        ", ".join(str(7 * i + 3) for i in range(40))
        + ", "
        + ", ".join(str(104729 * i + 17) for i in range(40))
    )
    (tmp_path / "kvstate_manyconsts.py").write_text(f"A = [{consts}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("kvstate_manyconsts")
    try:
        assert walk() == before
    finally:
        sys.modules.pop("kvstate_manyconsts", None)


# Two prompts computed and freed in two calls (r0 first), then one roundtrip whose admission
# must evict: the first eviction of the run happens inside the compound operation.
EVICT_IN_ROUNDTRIP = parse(
    parse_calls(
        """
        arrive(family=0, shared=0, tail=10, extra=70, rid=0)
        admit(rid=0, chunk=80, ext_blocks=0)
        arrive(family=0, shared=0, tail=11, extra=70, rid=1)
        admit(rid=1, chunk=80, ext_blocks=0)
        finish(rid=0)
        finish(rid=1)
        roundtrip(family=0, shared=0, tail=12, extra=70, chunk=80)
        """
    )
)


@pytest.mark.parametrize("name", ["eviction-lru-reversed", "completeness"])
def test_a_broken_vllm_is_caught_inside_a_compound_operation(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bookkeeping runs around every call a ``roundtrip`` makes: LRU reversed (r1's entries
    evicted before r0's) and a pool that caches nothing are both caught at the roundtrip itself,
    and the same trace passes on an unbroken vLLM."""
    from kvstate.targets.vllm.engine import ENGINE

    f, _ = ENGINE.replay(FULL[0], EVICT_IN_ROUNDTRIP)
    assert f is None, str(f)
    brk, check = (break_lru, "eviction") if name != "completeness" else (_no_caching, name)
    brk(monkeypatch)
    t0 = time.monotonic()
    f, d = ENGINE.replay(FULL[0], EVICT_IN_ROUNDTRIP)
    print(f"{name} inside a roundtrip: caught as {f and f.kind} in {time.monotonic() - t0:.2f} s")
    assert f is not None and check in f.detail
    assert len(d.trace) == len(EVICT_IN_ROUNDTRIP) and d.trace[-1].action == "roundtrip"


def _no_caching(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(bp.BlockPool, "cache_full_blocks", lambda self, *a, **k: None)


def _free_as_0_20(mp: pytest.MonkeyPatch) -> None:
    """vLLM 0.20.0's ``BlockPool.free_blocks`` and queue: every freed block, cached or not, is
    appended in the caller's order (no ``prepend_n``, no reuse-uncached-first)."""

    def free_blocks(self, ordered_blocks):  # type: ignore[no-untyped-def]
        blocks = [b for b in ordered_blocks if not b.is_null]
        for b in blocks:
            b.ref_cnt -= 1
        self.free_block_queue.append_n([b for b in blocks if b.ref_cnt == 0])

    mp.setattr(bp.BlockPool, "free_blocks", free_blocks)
    mp.delattr(ku.FreeKVCacheBlockQueue, "prepend_n")


def test_the_eviction_shadow_follows_the_release_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """On vLLM 0.20.0 every layout failed ``eviction`` within two examples ("uncached blocks
    are reused first"): the shadow held 0.20.0 to 0.33.0's order.  A pool freeing as 0.20.0 does
    passes; the same pool with LRU reversed (cached blocks evicted newest first) still fails."""
    _free_as_0_20(monkeypatch)
    r = run(profile="ci", configs=FULL, examples=24, minimize_findings=False)
    assert r.ok, r.render()
    orig = bp.BlockPool.free_blocks

    def newest_first(self, ordered_blocks):  # type: ignore[no-untyped-def]
        orig(self, list(ordered_blocks))
        q = self.free_block_queue
        free = q.get_all_free_blocks()
        for b in free:
            q.remove(b)
        q.append_n(free[::-1])

    monkeypatch.setattr(bp.BlockPool, "free_blocks", newest_first)
    r = run(profile="ci", configs=FULL, examples=24, minimize_findings=False)
    assert not r.ok and r.finding is not None and "eviction" in r.finding.detail, r.render()
