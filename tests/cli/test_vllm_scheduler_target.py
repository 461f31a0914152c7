"""``kvstate fuzz --target vllm-scheduler``: vLLM's real ``Scheduler`` on a CPU.

The ci profile finds vLLM 0.33.0's Mamba "align" under-count through the scheduler's own calls
and prints a standalone reproducer that raises it; ``tools/vllm_mamba_sync_load_repro.py``
raises it in one ``schedule()``; each check class fires when one vLLM method is broken in
process (monkeypatch, restored after each test), with the time to catch printed (``pytest -s``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvstate.targets.vllm_scheduler import imports

try:
    imports.standalone()
except imports.VLLMUnavailable as e:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):  # .ci/run installs vLLM: a missing one is a failure there
        raise
    pytest.skip(f"vLLM not installed ({e}); run tools/install_vllm.sh", allow_module_level=True)

from vllm.v1.core import block_pool as bp  # noqa: E402
from vllm.v1.core import kv_cache_coordinator as kc  # noqa: E402
from vllm.v1.core import kv_cache_manager as km  # noqa: E402
from vllm.v1.core import single_type_kv_cache_manager as st  # noqa: E402
from vllm.v1.core.sched import scheduler as sm  # noqa: E402

from kvstate.targets.vllm_scheduler.checks import CHECK_CLASSES  # noqa: E402
from kvstate.targets.vllm_scheduler.configs import Config  # noqa: E402
from kvstate.targets.vllm_scheduler.driver import op  # noqa: E402
from kvstate.targets.vllm_scheduler.engine import ENGINE, Report, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FULL = (Config("full", 12, connector=False),)
SWA = (Config("swa", 14),)
PRIORITY = (Config("full", 12, policy="priority"),)
WATERMARK = (Config("full", 12, connector=False, watermark=0.5),)


@pytest.fixture(scope="module")
def ci_report() -> Report:
    t0 = time.monotonic()
    report = run("ci")
    print(f"\n{report.render()}\n(ci profile with minimizing: {time.monotonic() - t0:.1f} s)")
    return report


def test_ci_profile_finds_the_mamba_undercount_through_the_scheduler(ci_report: Report) -> None:
    assert not ci_report.ok
    cfg, f = ci_report.findings[0]
    assert cfg.layout == "mamba" and f.kind == "crash"
    assert "Cannot get 1 free blocks from the pool" in str(f)
    # nothing else fails: every finding is the Mamba under-count (one per Mamba configuration)
    assert all(c.layout == "mamba" and x.kind == "crash" for c, x in ci_report.findings)
    assert len(ci_report.trace) < ci_report.original_length  # minimized


def test_ci_profile_reaches_the_scheduler_paths(ci_report: Report) -> None:
    paths = ci_report.stats.paths
    for path in ("preempted", "chunked_prefill", "finished", "aborted", "sync_load",
                 "async_load_done", "async_load_failed", "sync_load_failed", "reset_ok",
                 "reset_refused", "spec_decode", "drafts_rejected", "mamba_cow"):  # fmt: skip
        assert paths[path] > 0, f"the ci profile never reached {path}"
    assert len(ci_report.stats.configs) == 11


def test_mamba_copy_on_write_and_junctions_run_through_the_scheduler() -> None:
    """vLLM's own lines, measured: a Mamba block larger than the hash block with the
    shared-prefix checkpoint makes the scheduler stop chunks at partial-block boundaries and
    junctions; a later request's hit there is copied on write (``_apply_cow``), and a running
    producer's entry moves to the copy (``move_block_hashes``)."""
    report = run(
        "ci", configs=(Config("mamba-prefix", 16),), examples=45, minimize_findings=False,
        code_coverage=True,
    )  # fmt: skip
    assert report.ok, report.render()
    print("\n".join(report.code.lines()[:3]))
    for fn in ("SingleTypeKVCacheManager._apply_cow", "BlockPool.move_block_hashes",
               "BlockPool.cache_partial_block", "Scheduler._mamba_block_aligned_split"):  # fmt: skip
        assert report.code.entered(fn), fn
    assert report.stats.paths["mamba_cow"] > 0


def _run_outside_repo(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def test_the_printed_reproducer_raises_with_vllm_alone(ci_report: Report, tmp_path: Path) -> None:
    script = tmp_path / "repro.py"
    script.write_text(ci_report.reproducer)
    assert "kvstate" not in "".join(
        line for line in ci_report.reproducer.splitlines() if line.startswith(("import", "from"))
    )
    got = _run_outside_repo(script, tmp_path)
    assert got.returncode != 0
    assert "ValueError: Cannot get 1 free blocks from the pool" in got.stderr
    assert "in schedule" in got.stderr and "allocate_slots" in got.stderr


def test_the_tools_reproducer_raises_in_one_schedule(tmp_path: Path) -> None:
    got = _run_outside_repo(ROOT / "tools" / "vllm_mamba_sync_load_repro.py", tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "reproduced: schedule() raised ValueError: Cannot get 1 free blocks" in got.stdout


# ---- one broken vLLM method per check class ------------------------------------------------
def break_free_leak(mp: pytest.MonkeyPatch) -> None:
    """``BlockPool.free_blocks`` forgets the last block of every multi-block free (a leak)."""
    orig = bp.BlockPool.free_blocks

    def free_blocks(self, ordered_blocks):  # type: ignore[no-untyped-def]
        blocks = list(ordered_blocks)
        orig(self, blocks[:-1] if len(blocks) > 1 else blocks)

    mp.setattr(bp.BlockPool, "free_blocks", free_blocks)


def break_finish_keeps_blocks(mp: pytest.MonkeyPatch) -> None:
    """``Scheduler._free_blocks`` forgets the request but not its blocks (they stay held)."""

    def _free_blocks(self, request):  # type: ignore[no-untyped-def]
        del self.requests[request.request_id]

    mp.setattr(sm.Scheduler, "_free_blocks", _free_blocks)


def break_swa_skip(mp: pytest.MonkeyPatch) -> None:
    """The sliding window's skipped-token count one too high: a block still inside the window
    of a running request is freed (the off-by-one issue 32 says the manager target misses)."""
    orig = st.SlidingWindowManager.get_num_skipped_tokens
    mp.setattr(st.SlidingWindowManager, "get_num_skipped_tokens", lambda s, n: orig(s, n) + 1)


def break_overcount(mp: pytest.MonkeyPatch) -> None:
    """The admission gate counts twice the blocks a request needs: one needing more than half
    the pool is refused forever, even by an idle pool."""
    orig = kc.KVCacheCoordinator.get_num_blocks_to_allocate

    def count(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return 2 * orig(self, *args, **kwargs)

    mp.setattr(kc.KVCacheCoordinator, "get_num_blocks_to_allocate", count)


def break_priority_victim(mp: pytest.MonkeyPatch) -> None:
    """The priority policy's victim inverted: the scheduler's ``max`` over running requests by
    (priority, arrival) takes the minimum, preempting the most important request."""

    def pick(*args, key=None, **kwargs):  # type: ignore[no-untyped-def]
        if key is not None and len(args) == 1:
            return min(args[0], key=key)
        return max(*args, key=key, **kwargs) if key is not None else max(*args, **kwargs)

    mp.setattr(sm, "max", pick, raising=False)


def break_watermark_when_idle(mp: pytest.MonkeyPatch) -> None:
    """The watermark applied with nothing running: an idle pool keeps ``watermark`` blocks back
    from admission, so a request that needs more than the rest waits forever."""
    orig = km.KVCacheManager.allocate_slots

    def allocate_slots(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["has_scheduled_reqs"] = True
        return orig(self, *args, **kwargs)

    mp.setattr(km.KVCacheManager, "allocate_slots", allocate_slots)


def break_full_isl_overcount(mp: pytest.MonkeyPatch) -> None:
    """The full-prompt admission gate (``scheduler_reserve_full_isl``) counts the prompt's blocks
    twice; the per-chunk count is right: a long prompt is never admitted."""
    orig = kc.KVCacheCoordinator.get_num_blocks_to_allocate

    def count(self, *args, apply_admission_cap=False, **kwargs):  # type: ignore[no-untyped-def]
        n = orig(self, *args, apply_admission_cap=apply_admission_cap, **kwargs)
        return 2 * n if apply_admission_cap else n

    mp.setattr(kc.KVCacheCoordinator, "get_num_blocks_to_allocate", count)


class _HeadPop(list):  # type: ignore[type-arg]
    def pop(self, index: int = 0):  # type: ignore[no-untyped-def,override]
        return super().pop(index)


def break_fcfs_victim(mp: pytest.MonkeyPatch) -> None:
    """The FCFS victim inverted: ``running.pop()`` takes the head (the oldest request), not the
    most recently admitted one."""
    orig = sm.Scheduler.schedule

    def schedule(self):  # type: ignore[no-untyped-def]
        self.running = _HeadPop(self.running)
        return orig(self)

    mp.setattr(sm.Scheduler, "schedule", schedule)


# name -> (the broken method, the configurations run, the check class that must fire)
BREAKS = {
    "conservation": (break_free_leak, FULL, "conservation"),
    "hygiene": (break_finish_keeps_blocks, FULL, "hygiene"),
    "window": (break_swa_skip, SWA, "window"),
    "liveness": (break_overcount, FULL, "liveness"),
    "liveness-full-isl": (break_full_isl_overcount, FULL, "liveness"),
    "liveness-watermark": (break_watermark_when_idle, WATERMARK, "liveness"),
    "preemption": (break_priority_victim, PRIORITY, "preemption"),
    "preemption-fcfs": (break_fcfs_victim, FULL, "preemption"),
}


# An abort during an async load: vLLM keeps r1's blocks until the connector reports the load
# (``finish_requests``' ``delay_free_blocks``), in ``update_from_output`` after the last
# step's ``schedule()``; the pool is idle only after that step.  Found by the ci profile.
ABORTED_LOAD = Config("full-2sizes", 14)
ABORTED_LOAD_TRACE = [
    op("arrive", 0, 107, 4, 51, 9, 2, 32, "syncfail"),
    op("abort", "r0"),
    op("arrive", 0, 79, 7, 1, 2, 1, 64, "async"),
    op("step", 30390),
    op("abort", "r1"),
    op("arrive", 2, 99, 3, 45, 16, 2, 0, "async"),
    op("step", 10713),
]


def test_liveness_judges_the_pool_admission_saw() -> None:
    f, d = ENGINE.replay(ABORTED_LOAD, ABORTED_LOAD_TRACE)
    assert f is None, str(f)
    assert not d.engine.idle_before and "r2" not in d.engine.last.num_scheduled_tokens
    d.run_op(len(ABORTED_LOAD_TRACE), op("step", 0))  # the next step admits r2: no over-count
    assert d.engine.last.num_scheduled_tokens.get("r2", 0) > 0


def test_liveness_catches_the_overcount_with_a_connector(monkeypatch: pytest.MonkeyPatch) -> None:
    break_overcount(monkeypatch)
    report = run("ci", configs=(ABORTED_LOAD,), examples=50, minimize_findings=False)
    assert not report.ok and report.findings[0][1].kind == "liveness", report.render()


def test_every_new_check_class_has_a_break() -> None:
    # crash: the Mamba finding above
    assert {c for _, _, c in BREAKS.values()} == set(CHECK_CLASSES) - {"crash"}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_check_fires_when_vllm_is_broken(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    brk, configs, check = BREAKS[name]
    brk(monkeypatch)
    t0 = time.monotonic()
    report = run("ci", configs=configs, examples=50, minimize_findings=False)
    took = time.monotonic() - t0
    assert not report.ok, f"{name}: the broken vLLM passed"
    f = report.findings[0][1]
    print(f"\n{name}: {brk.__doc__.split(':')[0]} -> [{f.kind}] after {report.stats.steps} "
          f"operations, {took:.2f} s")  # fmt: skip
    assert f.kind == check or check in f.detail, str(f)


def test_a_correct_vllm_passes_the_broken_configurations() -> None:
    """The same runs on an unpatched vLLM: the breaks above, not the configurations, fail."""
    for configs in (FULL, SWA, PRIORITY, WATERMARK):
        report = run("ci", configs=configs, examples=50, minimize_findings=False)
        assert report.ok, report.render()
