"""End-to-end cases: the tiny model's real states stored in kvstate, restored from a hit, compared
with a full recompute; and each of the five states broken by a real kvstate mechanism.

Shared by ``tests/numerics/test_e2e_numerics.py`` and the demo (``python -m kvstate.numerics``), so both
report the same numbers.  Every case builds its own :class:`HeterogeneousKVCache` (manual
pipelines, driven step by step) on :func:`~kvstate.numerics.kvbridge.storage_geometry`, stores
the prompt's first ``h = 144`` tokens (9 LCM blocks) with :class:`ModelWriter`, moves or breaks
blocks, then admits a request for the whole 160-token prompt (``max_hit`` 159, so 144 is the
longest hit) and measures:

* ``served``: the hit kvstate validated, restored through ``Run`` and resumed; the max |logit
  diff| against the full prefill over the tokens computed after the hit (0.0 = bit-exact);
* ``broken``: the max |logit diff| had the broken state been used at ``h`` -- read from kvstate's
  storage without validation (:class:`~kvstate.numerics.kvbridge.StorageReader`), or, where the
  storage does not physically hold the broken bytes, built from the restored state by the
  matching :mod:`kvstate.numerics.corrupt` function (said in ``how``);
* kvstate's verdict and the explanation lines (the rules, states and groups that cut the hit).

Mechanisms (all real library paths; ``test_hooks().act`` calls are the library's own guarded
transitions):

========================== ===============================================================
case                       how the state is broken
========================== ===============================================================
tail removed               block 8 stored without ``seal``: the compressor state at 144 was
                           never saved (``allocate, commit, index_update`` only)
window slid                ``slide`` on block 8: its window pages go back to the pool and its
                           block table entry becomes the null block
window offset (bug)        seeded bug ``swa_offset_by_one_block``: the SWA block table is one
                           LCM block late (the staged copy of ``kvstate.testing.seeded``)
indexer version stale      block 8 indexed before it was sealed (``index_update`` before
                           ``seal``): its indexer page is one content version behind
compressed block corrupt   block 8's disk file tampered with (an HCA entry negated in place):
                           the chunk's MAC fails when it loads
disk load not finished     block 8 loading from disk, one of ``load_steps`` chunks landed
                           (manual pipelines); also the seeded bug ``use_before_load_complete``
========================== ===============================================================
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from kvstate.impl.cache import Admission, HeterogeneousKVCache, Request
from kvstate.impl.errors import NotReady
from kvstate.impl.events import EventKind
from kvstate.spec.geometry import SwaDiskPolicy
from kvstate.spec.phases import Swa

from .corrupt import BROKEN_STATE, offset_window, stale_indexer
from .disk import checkpoint_boundary, disk_copy, restore_from_disk, swa_snapshot
from .kvbridge import (
    ModelWriter,
    Trace,
    key_bytes,
    read_unvalidated,
    restore_pieces,
    resume_from,
    storage_geometry,
    store_prompt,
)
from .model import HybridModel, ModelConfig
from .scenario import TOL, max_diff
from .state import StatePieces

N_TOKENS = 160
H = 144


@dataclass
class E2EResult:
    """One row of the end-to-end table."""

    case: str
    broken: str  # which of the five states ("-" for an intact restore)
    requested: int  # the hit the prefix-hash lookup alone would give (h)
    hit: int  # the hit kvstate let the request compute from (0: refused / recompute)
    verdict: str
    served_diff: float  # resumed from what kvstate served vs the full recompute
    broken_diff: float | None = None  # had the broken state been used at h
    how: str = ""  # how the broken state's numerics were obtained
    explanation: list[str] = field(default_factory=list)  # lines naming rule/state/group
    states: tuple[str, ...] = ()  # the states named by the final cuts / refusal
    rules: tuple[str, ...] = ()
    seconds: float = 0.0
    #: "exact" (an intact restore), "caught" (kvstate keeps the broken state out), or "gap": a
    #: seeded bug in the block table the hit rule itself reads through; validation shortens the
    #: hit but the served state is still wrong (the numerics and the conformance fuzzer catch
    #: it; the hit rule cannot)
    expect: str = "caught"
    extra: dict[str, Any] = field(default_factory=dict)  # case-specific facts the tests check

    @property
    def output_changed(self) -> bool:
        return self.broken_diff is not None and self.broken_diff > TOL

    @property
    def served_exact(self) -> bool:
        return self.served_diff == 0.0

    @property
    def caught(self) -> bool:
        """kvstate kept the broken state out: it shortened/refused the hit and what it did serve
        equals the recompute bit for bit."""
        return self.hit < self.requested and self.served_exact

    @property
    def as_expected(self) -> bool:
        if self.expect == "exact":
            return self.hit == self.requested and self.served_exact
        if self.expect == "gap":
            return self.output_changed and self.hit < self.requested and not self.served_exact
        return self.output_changed and self.caught


class E2E:
    """The model, the prompt, its trace (states at every boundary, full-prefill logits)."""

    def __init__(self, seed: int = 0, n_tokens: int = N_TOKENS, h: int = H) -> None:
        self.model = HybridModel(config=ModelConfig(seed=seed))
        g = self.model.geometry
        if h % g.lcm_tokens or not 0 < h <= (n_tokens - 1) // g.lcm_tokens * g.lcm_tokens:
            raise ValueError(f"h={h} must be a multiple of {g.lcm_tokens} below n_tokens")
        gen = torch.Generator().manual_seed(1000 + seed)  # the numerics scenario's prompt
        tokens = torch.randint(0, self.model.config.vocab, (n_tokens,), generator=gen).tolist()
        self.h = h
        self.L = g.lcm_tokens
        self.trace = Trace.run(self.model, tokens)

    @property
    def tokens(self) -> list[int]:
        return self.trace.tokens

    # ---- plumbing ---------------------------------------------------------------------------
    def cache(
        self, policy: SwaDiskPolicy | None = None, bugs: tuple[str, ...] = ()
    ) -> tuple[HeterogeneousKVCache, ModelWriter]:
        cg = storage_geometry(self.model.geometry, policy)
        writer = ModelWriter(self.model, cg)
        if not bugs:
            return HeterogeneousKVCache(cg, writer=writer, executors="manual"), writer
        from kvstate.testing import seeded  # the bug cases only: a staged copy of impl/

        return seeded.cache(cg, bugs=bugs, writer=writer, executors="manual"), writer

    def diff(self, pieces: StatePieces) -> float:
        """max |logit diff| of resuming (unchecked) from ``pieces`` vs the full prefill."""
        logits = resume_from(self.model, pieces, self.trace, check=False)
        return max_diff(logits, self.trace.reference[pieces.length :])

    def request(self, c: HeterogeneousKVCache) -> Request:
        return c.request(self.tokens)

    def rids(self, c: HeterogeneousKVCache) -> list[int]:
        return c.inspect().resolve(c.chain(self.tokens[: self.h]))

    def serve(
        self, c: HeterogeneousKVCache, adm: Admission, at: int | None = None
    ) -> tuple[int, float, StatePieces]:
        """Use the admission: (hit, diff of the restored state vs recompute, pieces)."""
        with c.use(adm, store=False) as run:
            pieces = restore_pieces(self.model, run, at)
            return run.hit_tokens, self.diff(pieces), pieces

    @staticmethod
    def to_host(c: HeterogeneousKVCache, rids: list[int]) -> None:
        c.tick(c.table.consts.lease_max + 1)
        for rid in rids:
            c.test_hooks().act("offload", rid)
        c.pipelines.drain()

    @staticmethod
    def to_disk(c: HeterogeneousKVCache, rids: list[int]) -> None:
        for rid in rids:
            c.test_hooks().act("spill", rid)

    def store_last_block(
        self, c: HeterogeneousKVCache, w: ModelWriter, steps: tuple[str, ...]
    ) -> int:
        """Store the prompt's first ``h - L`` tokens normally, then block ``h/L - 1`` by the
        library's own transitions ``steps`` (a write path that skips or reorders one)."""
        store_prompt(c, w, self.trace, self.h - self.L)
        hooks, b = c.test_hooks(), self.h // self.L - 1
        chain = c.chain(self.tokens[: self.h])
        rid = hooks.record(chain.keys[b], chain.block_tokens_of(b), b * self.L)
        with w.writing(self.trace):
            for step in steps:
                hooks.act(step, rid)
        hooks.act("touch", rid, c.table.consts.lease_max)
        return rid

    def _explain(self, adm: Admission) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
        """Explanation lines below ``h`` (the cut of the prompt's partial last block, which
        every case has, is left out), and the states and rules of the cuts that decided the
        final hit (after recovery, and truncations at use)."""
        ex, h = adm.explanation, self.h
        lines = [f"shortened: {s}" for s in ex.immediate.shortenings if s.to_tokens < h]
        if ex.after_recovery is not None:
            lines.append(f"recoverable to {ex.after_recovery.hit} tokens")
            lines += [
                f"after recovery: {s}" for s in ex.after_recovery.shortenings if s.to_tokens < h
            ]
        if ex.unrecoverable is not None:
            lines += [
                f"even after recovery: {s}" for s in ex.unrecoverable.shortenings if s.to_tokens < h
            ]
        lines += [f"truncated: {s}" for s in ex.truncations]
        if ex.rejection:
            lines.append(f"rejected: {ex.rejection}")
        final = [
            s for s in [*(ex.after_recovery or ex.immediate).shortenings, *ex.truncations]
            if s.to_tokens < h
        ]  # fmt: skip
        return lines, tuple(s.state for s in final), tuple(s.rule for s in final)

    # ---- (a) intact restores ------------------------------------------------------------------
    def intact(self, tier: str) -> E2EResult:
        """A hit restored from ``tier``: device, host, disk:full, disk:checkpoint, disk:zero."""
        t0 = time.perf_counter()
        policy: SwaDiskPolicy | None = None
        if tier.startswith("disk:"):
            policy = tier.split(":")[1]  # type: ignore[assignment]
        c, w = self.cache(policy)
        try:
            store_prompt(c, w, self.trace, self.h)
            rids = self.rids(c)
            how = ""
            if tier == "host":
                self.to_host(c, rids)
            elif policy in ("full", "checkpoint"):
                self.to_host(c, rids)
                self.to_disk(c, rids)
            elif policy == "zero":  # the disk keeps no window: the last window stays on host
                self.to_host(c, rids)
                self.to_disk(c, rids[: -c.table.consts.W])
            adm = c.admit(self.request(c))
            c.pipelines.drain()
            m = c.inspect().meta
            extra = {"windowless": sum(m.swa[r] == Swa.NULL for r in rids)}  # after the loads
            writes = w.calls
            if policy == "checkpoint":  # window + tail from the last checkpoint, then replay
                cp = checkpoint_boundary(self.h, self.model.geometry.swa_checkpoint_tokens)
                with c.use(adm, store=False) as run:
                    hit = run.hit_tokens
                    at_h = restore_pieces(self.model, run)
                    at_c = restore_pieces(self.model, run, cp)
                st = restore_from_disk(
                    self.model,
                    disk_copy(at_h),
                    self.tokens[:hit],
                    "checkpoint",
                    swa=swa_snapshot(at_c),
                )
                logits, _ = self.model.resume(st, self.tokens[hit:])
                diff = max_diff(logits, self.trace.reference[hit:])
                how = (
                    f"compressed + indexer at {hit}, window + tail read at checkpoint {cp}, "
                    f"replay of {hit - cp} tokens (kvstate's disk tier keeps every block's "
                    "window under 'checkpoint' as under 'full'; the restore uses only the "
                    "checkpoint's)"
                )
            else:
                hit, diff, pieces = self.serve(c, adm)
                if policy == "zero":  # the policy's own recompute from the restored history
                    st = restore_from_disk(self.model, disk_copy(pieces), self.tokens[:hit], "zero")
                    logits, _ = self.model.resume(st, self.tokens[hit:])
                    diff = max(diff, max_diff(logits, self.trace.reference[hit:]))
                    how = (
                        f"blocks 0..{len(rids) - c.table.consts.W - 1} from disk (no window), "
                        f"the last window from host; also the zero policy's recompute of "
                        f"{self.model.geometry.zero_swa_recompute_tokens} tokens"
                    )
            assert w.calls == writes, "restoring must not write"
            lines, states, rules = self._explain(adm)
            plan = sorted({s.state for s in adm.recovery.steps})
            verdict = f"validated {hit}" + (f" after recovery ({', '.join(plan)})" if plan else "")
            return E2EResult(
                f"hit from {tier}", "-", self.h, hit, verdict, diff, None, how, lines, states, rules,
                time.perf_counter() - t0, "exact", extra,
            )  # fmt: skip
        finally:
            c.close()

    # ---- (b) one state broken -------------------------------------------------------------------
    def _broken(
        self,
        case: str,
        corruption: str,
        c: HeterogeneousKVCache,
        adm: Admission,
        broken: Callable[[], StatePieces],
        how: str,
        t0: float,
        expect: str = "caught",
    ) -> E2EResult:
        c.pipelines.drain()
        hit, served, _ = self.serve(c, adm)
        lines, states, rules = self._explain(adm)
        verdict = f"shortened {self.h} -> {hit}" if hit < self.h else f"validated {hit}"
        return E2EResult(
            case, BROKEN_STATE[corruption], self.h, hit, verdict, served,  # type: ignore[index]
            self.diff(broken()), how, lines, states, rules, time.perf_counter() - t0, expect,
        )  # fmt: skip

    def tail_removed(self) -> E2EResult:
        t0 = time.perf_counter()
        c, w = self.cache()
        try:
            self.store_last_block(c, w, ("allocate", "commit", "index_update"))  # no seal
            req = self.request(c)
            adm = c.admit(req)
            raw = read_unvalidated(self.model, c, req, self.h)
            return self._broken(
                "tail removed (block stored without seal)", "drop_tail", c, adm, lambda: raw,
                "storage read at h: no compressor rows saved at the boundary", t0,
            )  # fmt: skip
        finally:
            c.close()

    def window_slid(self) -> E2EResult:
        t0 = time.perf_counter()
        c, w = self.cache()
        try:
            store_prompt(c, w, self.trace, self.h)
            c.test_hooks().act("slide", self.rids(c)[-1])
            req = self.request(c)
            adm = c.admit(req)
            raw = read_unvalidated(self.model, c, req, self.h)
            return self._broken(
                "window slid (boundary block -> null block)", "offset_window", c, adm,
                lambda: raw, "storage read at h: the last block's window rows are the null page",
                t0,
            )  # fmt: skip
        finally:
            c.close()

    def window_offset_bug(self) -> E2EResult:
        t0 = time.perf_counter()
        c, w = self.cache(bugs=("swa_offset_by_one_block",))
        try:
            store_prompt(c, w, self.trace, self.h)
            adm = c.admit(self.request(c))
            earlier = self.trace.pieces(self.h - self.model.geometry.swa_block_tokens)
            intact = self.trace.pieces(self.h)
            return self._broken(
                "window offset by one block (seeded bug)", "offset_window", c, adm,
                lambda: offset_window(intact, earlier),
                "corrupt.offset_window at h (rows one SWA block earlier, labels right); the "
                "served column reads the buggy block table at the served hit", t0, "gap",
            )  # fmt: skip
        finally:
            c.close()

    def indexer_stale(self) -> E2EResult:
        t0 = time.perf_counter()
        c, w = self.cache()
        try:
            self.store_last_block(c, w, ("allocate", "commit", "index_update", "seal"))
            adm = c.admit(self.request(c), recover=False)  # validation alone
            res = self._broken(
                "indexer version stale (indexed before seal)", "stale_indexer", c, adm,
                lambda: self.trace.pieces(self.h), "", t0,
            )  # fmt: skip
            # with recovery kvstate rebuilds the stale page from the compressed KV it indexes
            again = c.admit(self.request(c))
            rebuild = sorted({s.state for s in again.recovery.steps})
            c.pipelines.drain()
            with c.use(again, store=False) as run:
                hit = run.hit_tokens
                at_h = restore_pieces(self.model, run)
                at_prev = restore_pieces(self.model, run, self.h - self.L)
            diff = self.diff(at_h)
            res.broken_diff = self.diff(stale_indexer(at_h, at_prev))
            res.how = (
                f"corrupt.stale_indexer on the restored state (keys as of {self.h - self.L}); "
                f"with recovery kvstate rebuilds it ({', '.join(rebuild)}): hit {hit}, "
                f"max diff {diff:g}"
            )
            res.served_diff = max(res.served_diff, diff)
            res.extra = {"recovered_hit": hit, "recovered_diff": diff, "recovery": rebuild}
            res.seconds = time.perf_counter() - t0
            return res
        finally:
            c.close()

    def compressed_corrupt(self) -> E2EResult:
        t0 = time.perf_counter()
        c, w = self.cache("full")
        try:
            store_prompt(c, w, self.trace, self.h)
            rids = self.rids(c)
            self.to_host(c, rids)
            self.to_disk(c, rids)
            layer = next(i for i, k in enumerate(self.model.geometry.layers) if k == "hca")
            tampered = self._negate_hca_entry(c, rids[-1])
            adm = c.admit(self.request(c))
            c.pipelines.drain()
            fails = [e.detail for e in c.events.of(EventKind.LOAD_FAILED)]
            broken = self.trace.pieces(self.h)
            lp = broken.layers[layer]
            assert lp.compressed is not None
            comp = lp.compressed.clone()
            comp[self.h // self.model.geometry.hca_ratio - 1] = tampered
            broken = broken.replace_layer(layer, replace(lp, compressed=comp))
            res = self._broken(
                "compressed block corrupted (disk file tampered)", "drop_compressed_block", c,
                adm, lambda: broken,
                f"the tampered file's bytes: HCA layer {layer} entry of block {len(rids) - 1} "
                "negated", t0,
            )  # fmt: skip
            res.extra = {"load_failed": fails}
            return res
        finally:
            c.close()

    def _negate_hca_entry(self, c: HeterogeneousKVCache, rid: int) -> torch.Tensor:
        """Flip the sign bit of every float of block ``rid``'s first HCA entry in its disk file;
        returns the entry as the file now holds it."""
        entry = c.inspect().disk_entries[rid]
        off = entry.payload_offset
        for group, gpos, nbytes in entry.units:
            if (group, gpos) == ("hca", 0):
                break
            off += nbytes
        else:  # pragma: no cover - the layout always has an HCA unit
            raise AssertionError("no HCA unit in the disk entry")
        g = self.model.geometry
        lo = off + key_bytes(g)
        path = Path(entry.path)
        raw = bytearray(path.read_bytes())
        for i in range(g.head_dim):
            raw[lo + 4 * i + 3] ^= 0x80
        path.write_bytes(bytes(raw))
        return torch.frombuffer(raw[lo : lo + 4 * g.head_dim], dtype=torch.float32).clone()

    def load_unfinished(self) -> E2EResult:
        t0 = time.perf_counter()
        c, w = self.cache("full")
        try:
            store_prompt(c, w, self.trace, self.h)
            last = self.rids(c)[-1]
            self.to_host(c, [last])
            self.to_disk(c, [last])
            req = self.request(c)
            adm = c.admit(req)
            c.pipelines.io.step(last)  # chunk 1 of load_steps landed
            job = c.inspect().load_job(last)
            raw = read_unvalidated(self.model, c, req, self.h, slots={last: job.dst})
            try:
                with c.use(adm, store=False):
                    refusal = "used"
            except NotReady as exc:
                refusal = f"{type(exc).__name__}: {exc}"
            # what validation says about the block meanwhile: another request for the prefix
            other = c.admit(self.request(c), recover=False)
            lines, states, rules = self._explain(other)
            other_hit, other_diff, _ = self.serve(c, other)
            c.pipelines.drain()
            hit, served, _ = self.serve(c, adm)
            steps = c.table.consts.load_steps
            return E2EResult(
                f"disk load not finished (1 of {steps} chunks)", BROKEN_STATE["partial_load"],
                self.h, other_hit,
                f"use() refused while loading; a concurrent hit shortened {self.h} -> "
                f"{other_hit}; {hit} once the load completed",
                max(served, other_diff),
                self.diff(raw), "storage read at h from the load's destination slot",
                [f"use() while loading: {refusal}", *lines], states, rules,
                time.perf_counter() - t0,
                extra={"refusal": refusal, "after_load_hit": hit, "after_load_diff": served},
            )  # fmt: skip
        finally:
            c.close()

    def load_done_early_bug(self) -> E2EResult:
        t0 = time.perf_counter()
        c, w = self.cache("full", bugs=("use_before_load_complete",))
        try:
            store_prompt(c, w, self.trace, self.h)
            last = self.rids(c)[-1]
            self.to_host(c, [last])
            self.to_disk(c, [last])
            req = self.request(c)
            adm = c.admit(req)
            c.pipelines.drain()  # the planted bug completes the load before its chunks landed
            raw = read_unvalidated(self.model, c, req, self.h)
            return self._broken(
                "disk load marked done early (seeded bug)", "partial_load", c, adm,
                lambda: raw, "storage read at h: the block as the early completion left it", t0,
            )  # fmt: skip
        finally:
            c.close()

    # ---- everything ----------------------------------------------------------------------------
    def run(self, key: str) -> E2EResult:
        """One case by its key in :data:`CASES`."""
        if key in INTACT:
            return self.intact(key)
        if key not in BROKEN:
            raise KeyError(f"unknown case {key!r}; known: {', '.join(CASES)}")
        return getattr(self, key)()  # type: ignore[no-any-return]


#: Intact restores (by tier) and broken states (by method), in table order.
INTACT = ("device", "host", "disk:full", "disk:checkpoint", "disk:zero")
BROKEN = (
    "tail_removed",
    "window_slid",
    "window_offset_bug",
    "indexer_stale",
    "compressed_corrupt",
    "load_unfinished",
    "load_done_early_bug",
)
CASES = (*INTACT, *BROKEN)


def default_e2e(seed: int = 0) -> E2E:
    return _e2e(int(seed))


def default_results(seed: int = 0) -> dict[str, E2EResult]:
    """Every case with the default sizes, computed once per seed (the demo and the tests share
    them, as they share ``default_scenario``)."""
    return _results(int(seed))


@lru_cache(maxsize=2)
def _e2e(seed: int) -> E2E:
    return E2E(seed)


@lru_cache(maxsize=2)
def _results(seed: int) -> dict[str, E2EResult]:
    e = _e2e(seed)
    return {key: e.run(key) for key in CASES}


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return "0 (bit-exact)" if x == 0.0 else f"{x:.3e}"


def format_e2e(results: list[E2EResult]) -> str:
    """case | state broken | output changed (max diff) | served vs recompute | kvstate verdict,
    each row followed by its explanation lines and how the broken numerics were obtained."""
    head = ("case", "state broken", "output changed", "served vs recompute", "kvstate verdict")
    rows = []
    for r in results:
        changed = "-" if r.broken_diff is None else (
            f"{'yes' if r.output_changed else 'NO'} ({_fmt(r.broken_diff)})"
        )  # fmt: skip
        rows.append((r.case, r.broken, changed, _fmt(r.served_diff), r.verdict))
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head) - 1)]

    def line(cells: tuple[str, ...]) -> str:
        first = "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths, strict=True))
        return f"{first}  {cells[-1]}"

    out = [line(head), "-" * (sum(widths) + 2 * len(widths) + len(head[-1]))]
    for cells, res in zip(rows, results, strict=True):
        out.append(line(cells))
        out += [f"    explanation: {x}" for x in res.explanation]
        if res.how:
            out.append(f"    how: {res.how}")
    return "\n".join(out)
