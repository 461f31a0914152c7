"""``kvstate fuzz --target vllm``: vLLM's KV cache manager against the table's projected rules.

Skips (with the reason) where vLLM is not installed: `tools/install_vllm.sh` installs it.  Each
check class is shown able to fire by breaking one vLLM method with monkeypatch and asserting the
fuzzer reports that class (and prints a reproducer).
"""

from __future__ import annotations

import os

import pytest

from kvstate.targets.vllm import imports as vllm_import

try:
    vllm_import.load("vllm.v1.core.kv_cache_manager")
except vllm_import.VLLMUnavailable as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):  # .ci/run installs vLLM: a missing one is a failure there
        raise
    pytest.skip(f"vLLM not installed ({e}); run tools/install_vllm.sh", allow_module_level=True)

from vllm.v1.core import block_pool as bp  # noqa: E402
from vllm.v1.core import kv_cache_coordinator as kc  # noqa: E402
from vllm.v1.core import kv_cache_utils as ku  # noqa: E402
from vllm.v1.core import single_type_kv_cache_manager as st  # noqa: E402

from kvstate.targets.vllm.checks import CHECK_CLASSES  # noqa: E402
from kvstate.targets.vllm.configs import ALL, Config  # noqa: E402
from kvstate.targets.vllm.engine import run  # noqa: E402

FULL = (Config("full", False, 14),)
TWO = (Config("full-2sizes", False, 16),)


# Findings on vLLM 0.33.0, written up with their reproducers in docs/vllm-findings.md:
# (configuration, EAGLE, check class).  Anything else the ci profile finds fails this test.
KNOWN = {("mamba", True, "crash")}


def test_ci_profile_exercises_every_configuration_and_check() -> None:
    r = run(profile="ci")
    print(r.render())
    found = {(c.name, c.use_eagle, f.kind) for c, f in r.findings}
    assert found <= KNOWN, r.render()
    assert set(r.stats.configs) == {c.label for c in ALL}
    for c in CHECK_CLASSES:
        assert r.stats.checks[c] > 0, c
    for call in ("get_computed_blocks", "allocate_slots", "free", "cache_blocks", "evict_blocks",
                 "reset_prefix_cache", "remove_skipped_blocks", "chunked_prefill", "decode",
                 "spec_decode", "external_tokens"):  # fmt: skip
        assert r.stats.calls[call] > 0, call


def _wrap_hit(monkeypatch: pytest.MonkeyPatch, change) -> None:  # type: ignore[no-untyped-def]
    for cls in (kc.UnitaryKVCacheCoordinator, kc.HybridKVCacheCoordinator):
        orig = cls.find_longest_cache_hit

        def patched(self, *a, _orig=orig, **k):  # type: ignore[no-untyped-def]
            blocks, h, u = _orig(self, *a, **k)
            return change(self, blocks, h, u)

        monkeypatch.setattr(cls, "find_longest_cache_hit", patched)


def break_refcount(mp: pytest.MonkeyPatch) -> None:
    orig = bp.BlockPool.touch

    def touch(self, blocks):  # type: ignore[no-untyped-def]
        orig(self, [b for b in blocks if b.ref_cnt == 0])  # a shared hit takes no reference

    mp.setattr(bp.BlockPool, "touch", touch)


def break_free_queue(mp: pytest.MonkeyPatch) -> None:
    orig = ku.FreeKVCacheBlockQueue.append_n

    def append_n(self, blocks):  # type: ignore[no-untyped-def]
        orig(self, blocks)
        if blocks:
            self.num_free_blocks += 1  # the counter drifts from the queue

    mp.setattr(ku.FreeKVCacheBlockQueue, "append_n", append_n)


def break_exclusive(mp: pytest.MonkeyPatch) -> None:
    orig = bp.BlockPool.get_new_blocks

    def get_new_blocks(self, n):  # type: ignore[no-untyped-def]
        ret = orig(self, n)
        held = [b for b in self.blocks if b.ref_cnt > 0 and not b.is_null and b not in ret]
        if ret and held:  # hand out a block someone holds instead of a free one
            ret[0].ref_cnt -= 1
            self.free_block_queue.append(ret[0])
            held[0].ref_cnt += 1
            ret[0] = held[0]
        return ret

    mp.setattr(bp.BlockPool, "get_new_blocks", get_new_blocks)


def break_toctou(mp: pytest.MonkeyPatch) -> None:
    orig = st.FullAttentionManager.remove_skipped_blocks

    def remove_skipped_blocks(self, request_id, n, *a, **k):  # type: ignore[no-untyped-def]
        orig(self, request_id, n, *a, **k)
        blocks = self.req_to_blocks.get(request_id)
        if blocks and not blocks[0].is_null and n > 2 * self.block_size:
            self.block_pool.free_blocks([blocks[0]])  # full attention drops a computed block
            blocks[0] = self._null_block

    mp.setattr(st.FullAttentionManager, "remove_skipped_blocks", remove_skipped_blocks)


def break_l1(mp: pytest.MonkeyPatch) -> None:
    _wrap_hit(mp, lambda self, blocks, h, u: (blocks, h - 1 if h else h, u))


def break_l3(mp: pytest.MonkeyPatch) -> None:
    def change(self, blocks, h, u):  # type: ignore[no-untyped-def]
        if h and blocks[0]:
            blocks[0].pop()  # one group covers less than the reported hit
        return blocks, h, u

    _wrap_hit(mp, change)


def break_soundness(mp: pytest.MonkeyPatch) -> None:
    def change(self, blocks, h, u):  # type: ignore[no-untyped-def]
        g = blocks[0]
        if len(g) >= 2:
            g[0], g[1] = g[1], g[0]  # right blocks, wrong positions: another prefix's KV
        return blocks, h, u

    _wrap_hit(mp, change)


def break_completeness(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(bp.BlockPool, "cache_full_blocks", lambda self, *a, **k: None)  # never cached


BREAKS = {
    "refcount": (break_refcount, FULL),
    "free_queue": (break_free_queue, FULL),
    "exclusive": (break_exclusive, FULL),
    "toctou": (break_toctou, FULL),
    "L1": (break_l1, FULL),
    "L3": (break_l3, TWO),
    "soundness": (break_soundness, FULL),
    "completeness": (break_completeness, FULL),
}


def test_every_projected_check_class_has_a_break() -> None:
    # the other classes' breaks: test_vllm_target_more.py
    assert set(BREAKS) <= set(CHECK_CLASSES)


@pytest.mark.parametrize("check", sorted(BREAKS))
def test_each_check_fires_when_vllm_is_broken(check: str, monkeypatch: pytest.MonkeyPatch) -> None:
    brk, configs = BREAKS[check]
    brk(monkeypatch)
    r = run(profile="dev", configs=configs, examples=60)
    assert not r.ok, f"{check}: not caught"
    assert r.finding is not None
    fired = set(r.finding.detail)
    print(
        check,
        "->",
        fired,
        f"after {r.stats.steps} steps in {r.seconds:.1f} s,",
        len(r.trace),
        "ops",
    )
    assert check in fired, r.render()
    assert "kvm = make_manager(" in r.reproducer
    compile(r.reproducer, "<reproducer>", "exec")


def test_bad_target_or_profile_is_a_documented_error() -> None:
    from kvstate import fuzz
    from kvstate.impl.errors import InvalidArgument

    with pytest.raises(InvalidArgument):
        fuzz.run(target="nope")
    with pytest.raises(InvalidArgument):
        fuzz.run(target="vllm", profile="nope")
