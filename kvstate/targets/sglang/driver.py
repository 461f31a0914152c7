"""Drives SGLang's cache stack the way its scheduler does, and checks the table after each call.

An operation is the toolkit's :class:`~kvstate.harness.trace.TraceStep` (``admit(i=0, chunk=256)``)
run by the standalone function of ``ops.py`` of its name on a stack built by a configuration's
source; each is also written as a line of
Python (``self.code``), which with those sources becomes a finding's reproducer.  After every
operation the projected invariants are checked (``checks.py``): slot conservation per pool, no
slot free while a request or the tree references it, the locks, and at every match the hit rule
on the markers the hit names and, for a re-sent stored prefix, completeness.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep

from . import checks
from . import imports as sglang_import
from .configs import Config
from .ops import SOURCE as OPS_SOURCE

# name -> its parameters, in the order the standalone function of ``ops.py`` takes them
OPS: dict[str, tuple[str, ...]] = {
    "arrive": ("family", "length"),
    "resend": ("j",),
    "admit": ("i", "chunk"),
    "next_chunk": ("i", "chunk"),
    "decode": ("i", "steps"),
    "finish": ("i",),
    "abort": ("i",),
    "preempt": ("i",),
    "evict": ("tokens",),
    "evict_host": ("tokens",),
    "poll": (),
    "cancel": ("i",),
    "lose_file": ("k",),
    "drop_sidecar": ("k",),
}
NAMES = tuple(OPS)


def op(name: str, *values: int) -> TraceStep:
    """``name`` with its parameters given positionally, in :data:`OPS` order."""
    return TraceStep(name, dict(zip(OPS[name], values, strict=True)))


def finding(violations: list[checks.Violation], step: int, o: TraceStep) -> Nonconformance:
    """The toolkit's finding: its kind the first check class that failed, its detail every
    class that did (in order, once each)."""
    kinds = tuple(dict.fromkeys(v.check for v in violations))
    return Nonconformance(
        kinds[0],
        kinds,
        f"step {step} {o.call()}: " + "; ".join(f"[{v.check}] {v.message}" for v in violations),
    )


@dataclass
class Stats:
    calls: Counter[str] = field(default_factory=Counter)  # operations that acted
    idle: Counter[str] = field(default_factory=Counter)  # operations with nothing to act on
    checks: Counter[str] = field(default_factory=Counter)
    configs: Counter[str] = field(default_factory=Counter)
    paths: Counter[str] = field(default_factory=Counter)  # what the calls reached (hits...)
    steps: int = 0


def draw_op(rnd: Any, rng: Any, page: int, max_len: int, hicache: str = "") -> TraceStep:
    """One operation with traffic-like weights (arrivals, admissions and decode dominate)."""
    x = rnd()
    chunk = rng(1, 5) * page if rnd() < 0.3 else max_len
    if hicache == "l3" and x < 0.08:
        return op("poll")
    if x < 0.15:
        return op("arrive", rng(4), rng(page // 2 + 1, max_len // 2))
    if x < 0.22:
        return op("resend", rng(8))
    if x < 0.47:
        return op("admit", rng(8), chunk)
    if x < 0.55:
        return op("next_chunk", rng(4), chunk)
    if x < 0.75:
        return op("decode", rng(8), rng(1, page + 2))
    if x < 0.87:
        return op("finish", rng(8))
    if x < 0.90:
        return op("abort", rng(8))
    if x < 0.94:
        return op("preempt", rng(8))
    if x < (0.955 if hicache else 1.0):
        return op("evict", rng(1, 4) * page)
    if x < 0.97 or hicache == "l2":  # with L3 behind it, evict the host deeply: L3 serves
        return op("evict_host", rng(1, 4 if hicache == "l2" else 32) * page)
    if x < 0.985:
        return op("cancel", rng(8))
    return op("lose_file", rng(16)) if x < 0.993 else op("drop_sidecar", rng(16))


# With file storage (L3) behind the host tier, a prefix is served from L3 only after it was
# stored, written to storage, dropped from the device and then from the host, and asked again:
# a chain that uniform draws almost never complete in a walk.  On an L3 stack, once a request
# has arrived, a third of the draws follow that chain, one ordinary operation at a time (so a
# finding's trace minimizes like any other): poll (the prefetch), admit, finish (stored),
# poll (written to storage), evict every device page, evict the host, re-send the last stored
# prefix, poll (its prefetch from storage), admit it.
TIER_WALK = ("poll", "admit", "finish", "poll", "evict", "evict_host", "resend", "poll", "admit")


def draw_tier_walk(rnd: Any, d: Any) -> TraceStep | None:
    """The next step of the L3 chain (:data:`TIER_WALK`) for driver ``d``, or None to draw
    ordinary traffic."""
    st = d.st
    if d.config.hicache != "l3" or not (st.waiting or st.running or st.finished):
        return None
    if rnd() >= 1 / 3:
        return None
    name = TIER_WALK[d.tier_step % len(TIER_WALK)]
    d.tier_step += 1
    deep = d.config.pool * 4  # more than the device pool and the host pool (ratio 2) hold
    if name == "resend":
        return op("resend", max(len(st.finished) - 1, 0))
    if name == "admit":  # the last to arrive (the re-sent request), the whole prompt
        return op("admit", max(len(st.waiting) - 1, 0), d.config.max_len)
    if name == "finish":
        return op("finish", max(len(st.running) - 1, 0))
    return op(name) if name == "poll" else op(name, deep)


def _holds(kv: Any) -> bool:
    """The request holds KV slots (``ReqKvInfo.holds_kv`` from 0.5.19; before it, allocated)."""
    return bool(kv.holds_kv) if hasattr(kv, "holds_kv") else kv.kv_allocated_len > 0


def _uncached_sizes() -> Any:
    """The scheduler leak check's ``_get_total_uncached_sizes`` of a release before 0.5.22
    (its module moved), or None."""
    import importlib

    for name in ("sglang.srt.managers.scheduler_components.invariant_checker",
                 "sglang.srt.managers.scheduler_runtime_checker_mixin"):  # fmt: skip
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        for cls in vars(mod).values():
            fn = getattr(cls, "_get_total_uncached_sizes", None)
            if isinstance(cls, type) and cls.__module__ == name and fn is not None:
                return fn
    return None


class Driver:
    """One stack, its requests, and what the checks need to remember between calls."""

    def __init__(self, config: Config, stats: Stats | None = None, patch: Any = None) -> None:
        self.config = config
        sglang_import.load()  # off the repository root, torchvision stood in where missing
        self.ns: dict[str, Any] = {"__name__": "kvstate_sglang_config"}
        exec(compile(config.source + OPS_SOURCE, f"<sglang {config.label}>", "exec"), self.ns)  # noqa: S102
        self.st = self.ns["Stack"]()
        if patch is not None:  # a test's deliberately broken SGLang method
            patch(self)
        self.stats = stats or Stats()
        self.code: list[str] = ["st = Stack()"]
        self.epoch = 0  # bumped by every eviction that freed something (full or SWA)
        self._count_evictions()
        self.recovered: list[tuple[int, int]] = []  # SWA tombstone ranges this call recovered
        self.ready: dict[str, list[bool]] = {}  # the last hit's pages, per state: markers present
        self._observe_recoveries()
        self.stored: list[int] = []  # finished request j -> the epoch its prefix was stored in
        self.P, self.W = config.page, config.window
        self.tier_step = 0  # the L3 chain's next step (draw_tier_walk)
        self.at: tuple[int, TraceStep] = (0, TraceStep("", {}))
        self.trace: list[TraceStep] = []  # the operations run so far, the failing one included
        self.st.on_match = self._on_match
        self.st.on_loaded = self._on_loaded
        self.st.on_resume = self._on_resume
        self.captured = self._buffers()  # what a graph captured at startup would read

    def _buffers(self) -> dict[str, tuple[int, tuple[int, ...]]]:
        """Every tensor a captured CUDA graph reads from the pools (the KV pool's buffers, the
        request-to-token table, the full-to-SWA slot map), by attribute path: (address, shape)."""
        import torch

        out: dict[str, tuple[int, tuple[int, ...]]] = {}
        seen: set[int] = set()

        def walk(name: str, x: Any, depth: int) -> None:
            if isinstance(x, torch.Tensor):
                if x.numel():
                    out[name] = (x.data_ptr(), tuple(x.shape))
                return
            if isinstance(x, (list, tuple)):
                for i, y in enumerate(x):
                    walk(f"{name}[{i}]", y, depth)
                return
            if depth == 0 or id(x) in seen or not type(x).__module__.startswith("sglang"):
                return
            seen.add(id(x))
            for k, y in getattr(x, "__dict__", {}).items():
                walk(f"{name}.{k}", y, depth - 1)

        walk("kv", self.st.kv, 3)
        if self.st.mamba is not None:
            walk("mamba_pool", self.st.r2t.mamba_pool, 3)
        walk("req_to_token", self.st.r2t.req_to_token, 0)
        walk("full_to_swa_index_mapping", self.st.alloc.full_to_swa_index_mapping, 0)
        return out

    def _on_match(self, req: Any, hit: tuple[int, Any]) -> None:
        """Every match, checked before the scheduler uses it (lock, allocation)."""
        out = self._hit(req, hit)
        if self.st.mamba is not None:
            out += self._mamba_hit(req, hit[0])
        if out:
            raise finding(out, *self.at)

    def _mamba_state(self, slot: Any) -> dict[str, int]:
        """The marker each Mamba buffer holds at one (virtual) Mamba slot."""
        import torch

        at = self.st.r2t.translate_mamba_indices(torch.as_tensor(slot).reshape(1).long()).long()
        return {name: int(read(at)[0]) for name, (read, _w) in self.st.mamba.items()}

    def _mamba_hit(self, req: Any, h: int) -> list[checks.Violation]:
        """A Mamba stack's hit: the cached state the match copies into the request (the
        copy-on-write source) is the one recorded at the hit's end, in every Mamba buffer."""
        if h == 0:
            return []
        self.stats.checks["mamba"] += 1
        self.stats.paths["Mamba hit"] += 1
        src = self.ns["kv_of"](req).mamba_cow_src_index
        if src is None:
            return [checks.Violation("mamba", f"{req.rid}: a hit of {h} tokens with no Mamba "
                                     "state to copy")]  # fmt: skip
        want = self.ns["markers"](self.st.fill(req)[:h])[h - 1]
        got = self._mamba_state(src)
        bad = {n: v for n, v in got.items() if v != want}
        if not bad:
            return []
        return [checks.Violation(
            "mamba", f"{req.rid}: the Mamba state of a {h}-token hit (slot {int(src)}) is not "
            f"the prefix's: {bad} (the state at {h} is {want})")]  # fmt: skip

    def _on_resume(self, req: Any, lo: int) -> None:
        """An extend forward of a Mamba stack, after the copy-on-write and clear: the state the
        Mamba layers start from is the prefix's (position ``lo``), or zero for none."""
        self.stats.checks["mamba"] += 1
        want = self.ns["markers"](self.st.fill(req)[:lo])[lo - 1] if lo else 0
        got = self._mamba_state(self.ns["kv_of"](req).mamba_pool_idx)
        bad = {n: v for n, v in got.items() if v != want}
        if bad:
            raise finding([checks.Violation(
                "mamba", f"{req.rid}: the forward from position {lo} starts from Mamba state "
                f"{bad}, not the prefix's ({want})")], *self.at)  # fmt: skip

    def _on_loaded(self, req: Any, event: int) -> None:
        """A host load-back, where the forward would consume it: it completes (the forward
        waits on the event), then the whole prefix, device and loaded, holds the prompt's
        markers in every state the hit rule asks for (byte-identical and complete)."""
        import time

        self.stats.paths["host load-back"] += 1
        self.stats.checks["load"] += 1
        deadline = time.monotonic() + 5.0
        while not self.st.tree.is_load_back_event_done(event):
            if time.monotonic() > deadline:
                raise finding([checks.Violation(
                    "load", f"load-back event {event} of {req.rid} never completed")], *self.at)  # fmt: skip
            time.sleep(0.001)
        h = self.ns["prefix_len"](req)
        out = self._hit(
            req, (h, self.ns["prefix_indices"](self.st.tree, req).clone()), resend=False
        )
        if self.st.storage and "indexer" in self.ready:  # the host may hold L3's pages
            out = self._sidecar(req) + out
        if out:
            raise finding(out, *self.at)

    def _sidecar(self, req: Any) -> list[checks.Violation]:
        """A prefix served (partly) from L3 storage: every page holding its compressed KV
        holds its indexer pages too.  A prefetch that stops partway must stop for every pool
        at the same page; pages whose compressed KV arrived without the indexer sidecar are
        the partial-prefetch class."""
        self.stats.paths["load-back checked for its sidecar (L3 stack)"] += 1
        self.stats.checks["sidecar"] += 1
        ckv, idx = self.ready["ckv"], self.ready["indexer"]
        bad = [p for p, (c, i) in enumerate(zip(ckv, idx, strict=True)) if c and not i]
        if not bad:
            return []
        return [checks.Violation(
            "sidecar", f"{req.rid}: pages {bad[:5]} served from L3 storage hold their compressed "
            "KV without their indexer pages")]  # fmt: skip

    # -- the call -------------------------------------------------------------------------
    def run_op(self, step: int, op: TraceStep) -> None:
        name, args = op.action, list(op.inputs.values())
        self.trace.append(op)
        self.code.append(f"{name}(st, {', '.join(map(str, args))})")
        self.stats.steps += 1
        waiting = {"admit": self.st.waiting, "next_chunk": self.st.chunked,
                   "decode": self.st.running}.get(name)  # fmt: skip
        waiting = bool(waiting)
        swa_gone = self._swa_evicted()
        self.at = (step, op)
        self.recovered = []
        try:
            result = self.ns[name](self.st, *args)
        except Nonconformance:
            raise
        except Exception as e:  # noqa: BLE001 - SGLang raising on an allowed call is a finding
            raise finding(
                [checks.Violation("crash", f"{name} raised {type(e).__name__}: {e}")], step, op
            ) from e
        (self.stats.calls if result is not None else self.stats.idle)[name] += 1
        if name == "decode" and self._swa_evicted() > swa_gone:
            self.stats.paths["decode freed out-of-window SWA"] += 1
        if name in ("admit", "next_chunk", "decode") and result is None and waiting:
            self.stats.paths[f"{name} refused (no room)"] += 1
        out: list[checks.Violation] = []
        if name == "admit" and result is not None and getattr(result[0], "storage_hit_length", 0):
            self.stats.paths["L3 prefetch loaded"] += 1
        if name == "finish" and result is not None:
            self.stored.append(self.epoch)
        out += self._tombstone()
        out += self._conservation() + self._freed_referenced() + self._locks()
        self.stats.checks["addresses"] += 1
        out += checks.moved_buffers(self.captured, self._buffers())
        if out:
            raise finding(out, step, op)

    # -- observations ---------------------------------------------------------------------
    def _count_evictions(self) -> None:
        """Every eviction, whoever asks for it (``evict``, ``evict_for_alloc`` inside an
        allocation), goes through the tree's ``_evict``: an observer on this stack's instance
        bumps the epoch when it freed anything.  (Comparing cached totals before and after an
        operation misses an eviction inside an admission that also inserts more.)"""
        tree = self.st.tree
        where = "_evict" if hasattr(tree, "_evict") else "evict"  # before 0.5.19: evict itself
        inner = getattr(tree, where)

        def observed(*a: Any, **k: Any) -> Any:
            result = inner(*a, **k)
            if result.num_tokens_evicted or result.swa_num_tokens_evicted:
                self.epoch += 0 if self.st.hicache else 1
                self.stats.paths["eviction"] += 1
            return result

        setattr(tree, where, observed)
        if self.st.hicache:
            # with HiCache a device eviction leaves a backed-up prefix on the host: only a host
            # value freed (host eviction, or a device eviction of a prefix not backed up) loses it
            free = tree._free_values

            def freed(device_frees: Any, host_frees: Any) -> Any:
                if any(len(v) for v in host_frees.values()):
                    self.epoch += 1
                    self.stats.paths["host values freed"] += 1
                return free(device_frees, host_frees)

            tree._free_values = freed

    def _observe_recoveries(self) -> None:
        """Every insert (a checkpoint's, a release's) asks SGLang to report the ranges its SWA
        component adopted: a tombstoned SWA node inside the request's window recovered from
        the inserting request's slots (``InsertParams.track_adopted_ranges``, 0.5.22 on; a
        flag that only records, in both tree cores)."""
        tree = self.st.tree
        inner = tree.insert
        swa = self.ns["ComponentType"].SWA

        def observed(params: Any) -> Any:
            if hasattr(params, "track_adopted_ranges"):
                params.track_adopted_ranges = True
            result = inner(params)
            got = (getattr(result, "adopted_ranges", None) or {}).get(swa)
            if got:
                self.recovered += [(int(a), int(b)) for a, b in got]
            return result

        tree.insert = observed

    def _tombstone(self) -> list[checks.Violation]:
        """A call that recovered an SWA tombstone: the recovery swaps the node's full slots for
        the request's and frees the old ones, so right after it the full pool must conserve
        its slots.  The class names a recovery's own error: the pool off by exactly the
        recovered tokens (short: the old slots leaked; over: freed twice, the class of
        sgl-project/sglang#27586); any other imbalance is left to ``conservation``."""
        if not self.recovered:
            return []
        self.stats.paths["SWA tombstone recovered"] += 1
        self.stats.checks["tombstone"] += 1
        private = self._private()
        if private is None:
            return []
        a, t = self.st.alloc, self.st.tree
        held = a.full_available_size() + t.full_evictable_size() + t.full_protected_size()
        off = a.size_full - held - private[0]
        tokens = sum(end - start for start, end in self.recovered)
        if off == 0 or abs(off) != tokens:
            return []
        what = "leaked" if off > 0 else "freed twice"
        return [checks.Violation(
            "tombstone", f"recovering SWA tombstone range(s) {self.recovered[:4]} ({tokens} "
            f"tokens): the full pool is {abs(off)} slots {'short' if off > 0 else 'over'}, "
            f"the node's old full slots {what}")]  # fmt: skip

    def _swa_evicted(self) -> int:
        """Tokens whose SWA slots the running requests have given back (out of the window)."""
        swa = self.ns["ComponentType"].SWA
        return sum(
            kv.get_evicted_seqlen(swa) if hasattr(kv, "get_evicted_seqlen")
            else kv.swa_evicted_seqlen  # before 0.5.21: the SWA cursor alone
            for kv in map(self.ns["kv_of"], self._live()) if _holds(kv)
        )  # fmt: skip

    def _live(self) -> list[Any]:
        return [r for r, _ in self.st.running + self.st.chunked]

    def _hit(self, req: Any, hit: tuple[int, Any], resend: bool = True) -> list[checks.Violation]:
        import torch

        h, locs = hit
        self.stats.checks["L1"] += 1
        self.stats.paths["hit" if h else "miss"] += 1
        markers = self.ns["markers"](list(req.origin_input_ids) + list(req.output_ids))
        ready: dict[str, list[bool]] = {}
        swa_pages = set(checks.window_pages(self.P, self.W, h))
        for name, (space, read, _write) in self.st.states.items():
            pages = []
            for p in range(h // self.P):
                if space == "swa" and p not in swa_pages:
                    pages.append(True)  # older SWA pages may be gone
                    continue
                at = locs[p * self.P : (p + 1) * self.P].to(torch.int64)
                if space == "swa":
                    at = self.st.swa_of(at)
                want = torch.tensor(markers[p * self.P : (p + 1) * self.P], dtype=torch.int64)
                pages.append(bool((at > 0).all()) and bool((read(at) == want).all()))
            ready[name] = pages
            self.stats.checks["L3"] += 1
        self.ready = ready
        out = checks.hit_violations(self.P, self.W, h, ready, self.config.max_len)
        j = getattr(req, "resend_of", None) if resend else None
        if self.st.mamba is not None:
            j = None  # a Mamba stack hits only where a state was recorded: not the table's rule
        if j is not None and j < len(self.stored) and self.stored[j] == self.epoch:
            self.stats.checks["completeness"] += 1
            want_h = checks.expected_complete_hit(self.P, len(req.origin_input_ids),
                                                  len(self.st.finished[j]))  # fmt: skip
            if self.st.hicache:  # device and host together: the host part is loaded back
                h += max(req.host_hit_length, 0)
            if h < want_h:
                out.append(checks.Violation(
                    "completeness",
                    f"a re-sent stored prefix of {len(self.st.finished[j])} tokens hit {h} "
                    f"tokens with nothing evicted since it was stored (expected {want_h})"))  # fmt: skip
        return out

    def _conservation(self) -> list[checks.Violation]:
        a, t = self.st.alloc, self.st.tree
        private = self._private()
        if private is None:
            self.stats.paths["conservation not checkable (no private-token terms)"] += 1
            return []
        self.stats.checks["conservation"] += 2
        out = checks.conservation(
            "full", a.full_available_size(), t.full_evictable_size(), t.full_protected_size(),
            private[0], a.size_full,
        ) + checks.conservation(
            "swa", a.swa_available_size(), t.swa_evictable_size(), t.swa_protected_size(),
            private[1], a.size_swa,
        )  # fmt: skip
        if self.st.mamba is not None:
            # the scheduler's own Mamba leak check (SchedulerInvariantChecker._check_mamba_pool):
            # free + cached evictable + cached locked + the requests' own slots (kv_mamba_slots)
            from sglang.srt.managers.scheduler_components.pool_stats_observer import (
                kv_mamba_slots,
            )

            self.stats.checks["conservation"] += 1
            r2t = self.st.r2t
            mine = sum(kv_mamba_slots(self.ns["kv_of"](r)) for r in self._holders())
            out += checks.conservation(
                "mamba", r2t.mamba_allocator.available_size(), t.mamba_evictable_size(),
                t.mamba_protected_size(), mine, r2t.mamba_pool.size)  # fmt: skip
        return out

    def _holders(self) -> list[Any]:
        """Every request the target has not finished: running, chunked and waiting (a waiting
        request may hold a Mamba slot between its match and its admission)."""
        return self._live() + list(self.st.waiting)

    def _private(self) -> tuple[int, int] | None:
        """The running requests' own tokens per pool (full, SWA), by the scheduler's own terms:
        0.5.22 on ``kv_private_tokens``/``kv_private_swa_tokens``; before it, its leak check's
        ``_get_total_uncached_sizes`` (each release's own formula), asked with the live
        requests as its batch."""
        try:
            from sglang.srt.managers.scheduler_components.pool_stats_observer import (
                kv_private_swa_tokens,
                kv_private_tokens,
            )
        except ImportError:
            uncached = _uncached_sizes()
            if uncached is None:
                return None
            live = self._live()
            batch = SimpleNamespace(reqs=live, is_empty=lambda: not live)
            me = SimpleNamespace(
                is_hybrid_swa=True, page_size=self.P, tree_cache=self.st.tree,
                last_batch=batch, running_batch=None, get_last_batch=lambda: batch,
                get_running_batch=lambda: None, get_chunked_req=lambda: None,
            )  # fmt: skip
            full, swa = uncached(me)
            return int(full), int(swa)
        held = [kv for kv in map(self.ns["kv_of"], self._live()) if _holds(kv)]
        return (
            sum(kv_private_tokens(kv, self.P) for kv in held),
            sum(kv_private_swa_tokens(kv, self.P) for kv in held),
        )

    def _free_pages(self, sub: Any) -> list[int]:
        if hasattr(sub, "get_all_free_pages"):
            return [int(x) for x in sub.get_all_free_pages().tolist()]
        # before get_all_free_pages (0.5.21): the same census, both lists of page ids
        return [int(x) for x in sub.free_pages.tolist() + sub.release_pages.tolist()]

    def _freed_referenced(self) -> list[checks.Violation]:
        """No page is free while a running request's row or the tree names it, and none is
        on a free list twice."""
        self.stats.checks["freed-referenced"] += 1
        out = []
        st, a = self.st, self.st.alloc
        full_free = self._free_pages(a.full_attn_allocator)
        swa_free = self._free_pages(a.swa_attn_allocator)
        for pool, free in (("full", full_free), ("swa", swa_free)):
            if len(set(free)) != len(free):
                dup = sorted({p for p in free if free.count(p) > 1})[:5]
                out.append(checks.Violation(
                    "freed-referenced", f"{pool} free list holds pages {dup} twice"))  # fmt: skip
        full_set, swa_set = set(full_free), set(swa_free)
        for r in self._live():
            kv = self.ns["kv_of"](r)
            if not _holds(kv):
                continue
            n = kv.kv_allocated_len
            row = st.r2t.req_to_token[self.ns["pool_idx"](r), :n].long()
            bad = sorted({int(x) // self.P for x in row.tolist()} & full_set)
            if bad:
                out.append(
                    checks.Violation(
                        "freed-referenced",
                        f"request {r.rid} holds full pages {bad[:5]} that are on the free list",
                    )
                )
            tail = st.swa_of(row[max(0, n - self.W) :])
            bad = sorted({int(x) // self.P for x in tail.tolist()} & swa_set)
            if bad:
                out.append(
                    checks.Violation(
                        "freed-referenced",
                        f"request {r.rid} holds SWA pages {bad[:5]} of its window that are free",
                    )
                )
        if st.mamba is not None:
            out += self._mamba_freed_referenced()
        tree_pages = {int(x) // self.P for x in st.tree.all_values_flatten().tolist()}
        bad = sorted(tree_pages & full_set)
        if bad:
            out.append(
                checks.Violation(
                    "freed-referenced", f"the tree names full pages {bad[:5]} that are free"
                )
            )
        return out

    def _mamba_freed_referenced(self) -> list[checks.Violation]:
        """No Mamba slot is free while a request (its running slot, its tracking slots) or the
        tree (a cached state, locked or not) holds it, and none is free twice."""
        r2t, out = self.st.r2t, []
        free = [int(x) for x in r2t.mamba_allocator.free_slots.tolist()]
        if len(set(free)) != len(free):
            dup = sorted({x for x in free if free.count(x) > 1})[:5]
            out.append(checks.Violation("freed-referenced", f"Mamba free list holds {dup} twice"))
        free_set = set(free)
        for r in self._holders():
            kv = self.ns["kv_of"](r)
            held = [int(kv.mamba_pool_idx)] if kv.holds_mamba else []
            if kv.mamba_ping_pong_track_buffer is not None:
                slots = [int(x) for x in kv.mamba_ping_pong_track_buffer.tolist()]
                # a filled tracking slot: mamba_ping_pong_empty from 0.5.23, before it not -1
                empty = getattr(kv, "mamba_ping_pong_empty", None) or [x == -1 for x in slots]
                held += [x for x, e in zip(slots, empty, strict=True) if not e]
            bad = sorted(set(held) & free_set)
            if bad:
                out.append(checks.Violation(
                    "freed-referenced", f"request {r.rid} holds Mamba slots {bad} that are free"))  # fmt: skip
        cached = {int(x) for x in self.st.tree.all_mamba_values_flatten().tolist()}
        bad = sorted(cached & free_set)
        if bad:
            out.append(checks.Violation(
                "freed-referenced", f"the tree holds Mamba states in slots {bad[:5]} that are free"))  # fmt: skip
        return out

    def _locks(self) -> list[checks.Violation]:
        t = self.st.tree
        self.stats.checks["locks"] += 1
        prot = (t.full_protected_size(), t.swa_protected_size())
        if min(prot) < 0:
            return [checks.Violation("locks", f"negative protected size {prot}")]
        if any(r.lock is not None for r in self._live()):
            return []
        if self.st.hicache and (t.ongoing_write_through or t.ongoing_load_back):
            self.code.append("drain(st)")
            try:
                self.ns["drain"](self.st)  # the scheduler's next idle turns
            except Exception as e:  # noqa: BLE001 - SGLang raising while idle is a finding
                return [checks.Violation("crash", f"drain raised {type(e).__name__}: {e}")]
            prot = (t.full_protected_size(), t.swa_protected_size())
            if t.ongoing_write_through or t.ongoing_load_back:
                return [checks.Violation("locks", "a HiCache write-through or load-back "
                                         "never completed (5 s of idle turns)")]  # fmt: skip
        if any(prot):
            return [
                checks.Violation(
                    "locks", f"no request holds a lock, yet {prot} (full, swa) tokens are protected"
                )
            ]
        try:
            t.sanity_check()  # SGLang's own: every node unlocked when idle, sizes consistent
        except Exception as e:  # noqa: BLE001 - its assertion is the finding
            return [checks.Violation("locks", f"sanity_check: {type(e).__name__}: {e}")]
        return []
