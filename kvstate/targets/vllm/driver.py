"""Drives vLLM's ``KVCacheManager`` the way its scheduler does, and records every call as code.

An operation is the toolkit's ``TraceStep`` (declared in :mod:`.ops`); its request argument is
an index into the live requests, taken modulo their number when it runs: any sequence of
operations is valid, so a failing sequence can be cut down by deleting steps and replayed on a
fresh manager.  A check that fails raises the toolkit's ``Nonconformance`` (its kind: the first
check class that failed; its detail: every class that did).  Each call the driver makes is also
written as a line of standalone Python (``self.code``), which becomes a finding's reproducer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep

from . import imports as vllm_import
from .checks import (
    Geometry,
    Violation,
    expected_complete_hit,
    geometry_of,
    hit_violations,
)
from .configs import Config
from .events import EventLedger
from .evict import EvictionOrder
from .ops import number, resolved
from .reset import reset_violations, stale_hits
from .tenants import TENANTS, keyed_tokens, reads_no_cache, separation_violations
from .window import reads_of, window_violations


def tokens_of(family: int, start: int, stop: int) -> list[int]:
    """Deterministic token ids: prompts of one family share their prefix (real traffic)."""
    return [(family * 7919 + i * 104729) % 50000 for i in range(start, stop)]


TOKENS_SRC = """
def tokens_of(family, start, stop):
    return [(family * 7919 + i * 104729) % 50000 for i in range(start, stop)]
"""


def finding(violations: list[Violation], trace: list[TraceStep], error: str = "") -> Nonconformance:
    """The toolkit's finding for ``violations`` of the last step of ``trace``: its kind is the
    first check class that failed, its detail every class that did (in order, once each) and,
    when vLLM raised (``error``: the exception's type), that type; a crash alone is
    ``crash: ValueError``, so a minimized trace must raise the same type."""
    checks = list(dict.fromkeys(v.check for v in violations))
    detail = [c for c in checks if c != "crash" or len(checks) > 1] + [error] * bool(error)
    exc = Nonconformance(
        checks[0], detail, "\n".join(f"[{v.check}] {v.message}" for v in violations)
    )
    exc.trace = list(trace)
    return exc


@dataclass
class Live:
    rid: str
    var: str
    req: Any
    running: bool = False
    max_computed: int = 0
    out_seed: int = 0
    admitted_epoch: int = -1
    external: bool = False  # some of its tokens came from a KV connector, not computed here
    tenant: int = 0  # the tenants configuration's inputs (tenants.py)


@dataclass
class Finished:
    tokens: tuple[int, ...]
    computed: int
    epoch: int  # the eviction epoch when it was admitted
    tenant: int = 0


@dataclass
class Stats:
    ops: Counter[str] = field(default_factory=Counter)  # operations run, by name
    calls: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    configs: Counter[str] = field(default_factory=Counter)
    steps: int = 0


class Driver:
    """One manager, its requests, and the ground truth of what each block holds."""

    def __init__(self, config: Config, manager_cls: Any = None, stats: Stats | None = None) -> None:
        self.config = config
        self.ns: dict[str, Any] = {"__name__": "kvstate_vllm_config"}
        exec(compile(config.source, f"<vllm config {config.name}>", "exec"), self.ns)  # noqa: S102
        if manager_cls is not None:
            self.ns["KVCacheManager"] = manager_cls
        self.kvm = self.ns["make_manager"](config.num_blocks, config.use_eagle)
        self.geo: Geometry = geometry_of(self.kvm, config.use_eagle)
        self.RS = vllm_import.load("vllm.v1.request")[0].RequestStatus
        self.live: list[Live] = []
        self.finished: list[Finished] = []
        self.content: dict[int, tuple[int, ...]] = {}  # block id -> the prefix it was computed with
        self.held: dict[str, dict[tuple[int, int], int]] = {}  # rid -> (group, index) -> block id
        self.n = 0
        self.trace: list[TraceStep] = []  # the operations run so far, resolved (ops.resolved)
        self.picked: str | None = None
        self.created: str | None = None
        self.epoch = 0  # bumped whenever a cached prefix entry disappears (any eviction)
        self.keys = self._cache_keys()
        self.stats = stats or Stats()
        self.tenants = "make_tenant_request" in self.ns
        if self.tenants:  # a release without these inputs' classes cannot build the layout
            for t in range(TENANTS):
                self.ns["make_tenant_request"](f"probe{t}", list(range(1, 33)), t)
        self.raw: dict[int, tuple[int, ...]] = {}  # tenants: block id -> its plain token ids
        self.stale: set[int] = set()  # blocks cached before the last successful reset
        self.reads = reads_of(self.kvm)
        self.evictions = EvictionOrder(self.kvm.block_pool)
        self.ledger = EventLedger(self.kvm)
        self.code: list[str] = [
            f"kvm = make_manager({config.num_blocks}, use_eagle={config.use_eagle})"
        ]
        self.lookahead = 2 if config.use_eagle else 0
        mamba = [
            g for g in self.geo.groups if g.reads_last == g.block_size and g.kind == ("compressor",)
        ]
        self.mamba_block = mamba[0].block_size if mamba and "mamba" in config.name else 0
        iface = vllm_import.load("vllm.v1.kv_cache_interface")[0]
        self.ckpt = getattr(iface, "get_mamba_prefill_checkpoint_position", None)
        if self.ckpt is None:  # older releases: the last block boundary before the last token
            self.ckpt = lambda n, bs, eagle: max(0, (n - 1) // bs * bs - (bs if eagle else 0))

    # -- helpers ---------------------------------------------------------------------------
    def _call(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One call into vLLM; a mutating one is followed by the per-call bookkeeping: the
        eviction order and the eviction epoch (a compound operation makes several calls)."""
        self.stats.calls[name] += 1
        if name == "get_computed_blocks":
            return vllm_import.call(fn, *args, **kwargs)
        self.evictions.before()
        seen = self.evictions.evictions
        result = vllm_import.call(fn, *args, **kwargs)
        v = self.evictions.after(name)
        self.stats.checks["eviction"] += self.evictions.evictions - seen
        keys = self._cache_keys()
        if self.keys - keys:
            self.epoch += 1
        self.keys = keys
        if v:
            self.pending.extend(v)
        return result

    def _tokens(self, x: Live) -> list[Any]:
        """The request's content as the model sees it (plain token ids but for tenants)."""
        return keyed_tokens(x.req) if self.tenants else x.req.all_token_ids

    def _pick(self, req: int, rid: int | None, running: bool | None) -> Live | None:
        """The ``req``-th live request (modulo), or, in a resolved trace, the one numbered
        ``rid``."""
        cands = [x for x in self.live if running is None or x.running == running]
        if rid is not None:
            x = next((c for c in cands if number(c.rid) == rid), None)
        else:
            x = cands[req % len(cands)] if cands else None
        self.picked = x.rid if x else None
        return x

    def _cache_keys(self) -> frozenset[Any]:
        pool = self.kvm.block_pool
        keys = {(b.block_hash, b.block_id) for b in pool.blocks if b.block_hash is not None}
        extra = getattr(pool, "cached_block_hashes_by_block", {})  # secondary keys (newer releases)
        keys.update((k, b) for b, ks in extra.items() for k in ks)
        return frozenset(keys)

    def _record_content(self, x: Live) -> None:
        toks = self._tokens(x)
        raw = x.req.all_token_ids
        done = x.req.num_computed_tokens
        for g in self.geo.groups:
            blocks = self.kvm.coordinator.single_type_managers[g.index].req_to_blocks.get(x.rid, [])
            for j, b in enumerate(blocks):
                if not b.is_null and (j + 1) * g.block_size <= done:
                    self.content[b.block_id] = tuple(toks[: (j + 1) * g.block_size])
                    self.stale.discard(b.block_id)
                    if self.tenants:
                        self.raw[b.block_id] = tuple(raw[: (j + 1) * g.block_size])

    def _compute(self, x: Live, n_new: int, accepted: int = 0, drafts: int = 0) -> None:
        """The step ran: ``n_new`` tokens (incl. drafts) computed, rejected drafts rolled back."""
        r = x.req
        r.num_computed_tokens += n_new - (drafts - accepted)
        self.code.append(f"{x.var}.num_computed_tokens = {r.num_computed_tokens}")
        x.max_computed = max(x.max_computed, r.num_computed_tokens)
        self._record_content(x)
        if r.num_computed_tokens >= max(r.num_prompt_tokens, r.num_tokens):
            # The step sampled one token after the accepted drafts: the request again has
            # exactly one token not yet computed (op_step keeps room for them below max_len).
            outs = [(x.out_seed * 31 + r.num_tokens + k) % 50000 for k in range(accepted + 1)]
            r.append_output_token_ids(outs)
            self.code.append(f"{x.var}.append_output_token_ids({outs})")
            assert r.num_computed_tokens == r.num_tokens - 1, "driver: computed/tokens drifted"

    # -- operations -------------------------------------------------------------------------
    def apply(self, step: TraceStep) -> None:
        getattr(self, "op_" + step.action)(**step.inputs)

    def op_arrive(
        self,
        family: int,
        shared: int,
        tail: int,
        extra: int,
        rid: int | None = None,
        tenant: int = 0,
    ) -> None:
        self._arrive(family, shared, tail, extra, None if rid is None else f"r{rid}", tenant)

    def _arrive(
        self, family: int, shared: int, tail_family: int, extra: int, rid: str | None, tenant: int
    ) -> None:
        max_prompt = self.geo.max_len // 2
        shared = min(shared, max_prompt)
        extra = min(extra, max_prompt - shared)
        if shared + extra < 2:
            extra = 2
        toks = tokens_of(family, 0, shared) + tokens_of(tail_family, shared, shared + extra)
        rid = rid or f"r{self.n}"
        self.created = rid
        var = rid
        self.n += 1
        src = f"tokens_of({family}, 0, {shared}) + tokens_of({tail_family}, {shared}, {shared + extra})"
        if self.tenants:
            req = self.ns["make_tenant_request"](rid, toks, tenant)
            self.code.append(f"{var} = make_tenant_request({rid!r}, {src}, {tenant})")
        else:
            req = self.ns["make_request"](self.ns["HASH_BLOCK"], rid, toks)
            self.code.append(f"{var} = make_request(HASH_BLOCK, {rid!r}, {src})")
        self.live.append(Live(rid, var, req, out_seed=int(rid[1:]), tenant=tenant))

    def _mamba_split(self, r: Any, start: int, n: int) -> int:
        """The scheduler's chunk clipping in Mamba "align" mode (state exists at chunk ends)."""
        if not self.mamba_block:
            return n
        bs = self.mamba_block
        prefill_end = max(r.num_prompt_tokens, r.num_tokens - 1)
        if start >= prefill_end:
            return n
        end = start + n
        if end < prefill_end:
            aligned = end // bs * bs
            end = aligned if aligned > start else min(start - start % bs + bs, prefill_end)
        last = self.ckpt(r.num_tokens, bs, self.config.use_eagle)
        # Not the prompt's partial-tail hash boundary the scheduler also stops at when hashes are
        # finer than the Mamba block: a hit there ends inside a Mamba block, which the table's
        # hit rule (whole LCM blocks; L1, L3, soundness) cannot judge.  The scheduler target
        # drives that path, copy-on-write included (docs/vllm-scheduler.md).
        stops = (start - start % bs + bs if start % bs else 0, last)
        end = min((x for x in stops if start < x < end), default=end)
        return max(end - start, 1)

    def _copies_ran(self) -> None:
        """The step ran: the copy-on-write copies it carried are done, and their source and
        destination blocks' extra references end (the scheduler's ``schedule()`` drains them
        with ``take_kv_cache_block_copies`` and frees them once the step completes)."""
        take = getattr(self.kvm, "take_kv_cache_block_copies", None)
        if take is None:  # releases without Mamba copy-on-write
            return
        copies, retained = take()
        if retained:
            self.stats.calls["cow_copies"] += len(copies)
            self.code.append("kvm.block_pool.free_blocks(kvm.take_kv_cache_block_copies()[1])")
            self._call("free_blocks", self.kvm.block_pool.free_blocks, retained)

    def _new_step(self) -> None:
        """An engine step starts (``Scheduler.schedule()`` calls ``new_step_starts``) before a
        ``step`` operation: admissions between two steps are one engine step's, so one cannot
        use a Mamba state another cached in it.  Without any, a Mamba manager treats every
        cached state as made "this step" and refuses every hit on one
        (``get_num_blocks_to_allocate`` returns more than the pool)."""
        if hasattr(self.kvm, "new_step_starts"):  # releases before it keep no per-step set
            self.kvm.new_step_starts()
            self.code.append("kvm.new_step_starts()")

    def op_admit(self, chunk: int, ext_blocks: int, req: int = 0, rid: int | None = None) -> None:
        x = self._pick(req, rid, running=False)
        if x is None:
            return
        r = x.req
        self.code.append(f"blocks, hit = kvm.get_computed_blocks({x.var})[:2]")
        res = self._call("get_computed_blocks", self.kvm.get_computed_blocks, r)
        blocks, hit = vllm_import.hit_of(res)
        self.code[-1] += f"  # hit == {hit}"
        self._check_hit(x, blocks, hit)
        self.stats.checks["hits>0" if hit else "hits=0"] += 1
        L = self.geo.L
        ext = min(ext_blocks * L, max(0, (r.num_tokens - 1 - hit) // L * L))
        n_new = min(max(1, chunk), r.num_tokens - hit - ext)
        n_new = self._mamba_split(r, hit + ext, n_new)
        if ext:
            self.stats.calls["external_tokens"] += 1
            x.external = True
        self.code.append(
            f"new = kw(kvm.allocate_slots, {x.var}, {n_new}, num_new_computed_tokens=hit, "
            f"new_computed_blocks=blocks, num_lookahead_tokens={self.lookahead}, "
            f"num_external_computed_tokens={ext}, full_sequence_must_fit=True)"
        )
        new = self._call(
            "allocate_slots",
            self.kvm.allocate_slots,
            r,
            n_new,
            num_new_computed_tokens=hit,
            new_computed_blocks=blocks,
            num_lookahead_tokens=self.lookahead,
            num_external_computed_tokens=ext,
            full_sequence_must_fit=True,
        )
        self.code[-1] += f"  # {'None: no room' if new is None else 'admitted'}"
        if new is None:
            return
        x.running = True
        x.admitted_epoch = self.epoch
        r.status = self.RS.RUNNING
        r.num_computed_tokens = hit + ext
        self.code.append(f"{x.var}.status = RequestStatus.RUNNING")
        self._compute(x, n_new)
        self._copies_ran()

    def op_step(
        self, chunk: int, drafts: int, accepted: int, req: int = 0, rid: int | None = None
    ) -> None:
        x = self._pick(req, rid, running=True)
        if x is None:
            return
        r = x.req
        if r.num_tokens >= self.geo.max_len - self.lookahead - 8:
            return
        if r.num_computed_tokens < r.num_tokens - 1:  # chunked prefill
            n_new, drafts, accepted = min(max(1, chunk), r.num_tokens - r.num_computed_tokens), 0, 0
            n_new = self._mamba_split(r, r.num_computed_tokens, n_new)
            self.stats.calls["chunked_prefill"] += 1
        else:  # decode, with EAGLE draft tokens when on
            drafts = drafts if self.config.use_eagle else 0
            accepted = min(accepted, drafts)
            n_new = 1 + drafts
            self.stats.calls["spec_decode" if drafts else "decode"] += 1
        self._new_step()
        self.code.append(
            f"new = kw(kvm.allocate_slots, {x.var}, {n_new}, num_lookahead_tokens={self.lookahead})"
        )
        new = self._call(
            "allocate_slots",
            self.kvm.allocate_slots,
            r,
            n_new,
            num_lookahead_tokens=self.lookahead,
        )
        self.code[-1] += f"  # {'None: no room' if new is None else 'ok'}"
        if new is None:
            return
        self._compute(x, n_new, accepted, drafts)
        self._copies_ran()

    def op_preempt(self, req: int = 0, rid: int | None = None) -> None:
        x = self._pick(req, rid, running=True)
        if x is None:
            return
        self.code.append(
            f"kvm.free({x.var}); {x.var}.status = RequestStatus.PREEMPTED; "
            f"{x.var}.num_computed_tokens = 0"
        )
        self._call("free", self.kvm.free, x.req)
        x.running = False
        x.req.status = self.RS.PREEMPTED
        x.req.num_computed_tokens = 0
        self.held.pop(x.rid, None)

    def op_finish(self, req: int = 0, rid: int | None = None) -> None:
        x = self._pick(req, rid, running=True)
        if x is None:
            return
        self.code.append(f"kvm.free({x.var})")
        self._call("free", self.kvm.free, x.req)
        self.live.remove(x)
        self.held.pop(x.rid, None)
        self.finished.append(
            Finished(
                tuple(x.req.prompt_token_ids),
                0 if x.external else x.req.num_computed_tokens,  # computed here, or no promise
                x.admitted_epoch,
                x.tenant,
            )
        )
        self.finished = self.finished[-8:]

    def op_resend(self, k: int, chunk: int) -> None:
        """A finished prompt arrives again (the completeness probe)."""
        if not self.finished:
            return
        f = self.finished[k % len(self.finished)]
        rid = f"s{self.n}"  # its own namespace: resolved traces name arrivals explicitly
        self.n += 1
        if self.tenants:
            req = self.ns["make_tenant_request"](rid, list(f.tokens), f.tenant)
            self.code.append(f"{rid} = make_tenant_request({rid!r}, {list(f.tokens)}, {f.tenant})")
        else:
            req = self.ns["make_request"](self.ns["HASH_BLOCK"], rid, list(f.tokens))
            self.code.append(f"{rid} = make_request(HASH_BLOCK, {rid!r}, {list(f.tokens)})")
        x = Live(rid, rid, req, out_seed=1000 + int(rid[1:]), tenant=f.tenant)
        self.live.append(x)
        self.op_admit(chunk, 0, req=len([y for y in self.live if not y.running]) - 1)

    def op_roundtrip(self, family: int, shared: int, tail: int, extra: int, chunk: int) -> None:
        """A prompt computed to its end and freed, then sent again at once (completeness)."""
        self._arrive(family, shared, tail, extra, f"q{self.n}", 0)
        x = self.live[-1]
        n = number(x.rid)
        self.op_admit(chunk, 0, rid=n)
        for _ in range(64):
            if not x.running or x.req.num_computed_tokens >= x.req.num_prompt_tokens:
                break
            before = x.req.num_computed_tokens
            self.op_step(chunk, 0, 0, rid=n)
            if x.req.num_computed_tokens == before:
                break  # no room: the probe gives up
        if x.running:
            self.op_finish(rid=n)
            self.op_resend(-1, chunk)
        else:
            self.live.remove(x)

    def op_evict(self, k: int) -> None:
        cached = sorted({b for _, b in self._cache_keys()})
        if not cached:
            return
        b = cached[k % len(cached)]
        self.code.append(f"kvm.evict_blocks({{{b}}})")
        self._call("evict_blocks", self.kvm.evict_blocks, {b})

    def op_reset(self) -> None:
        self.code.append("kvm.reset_prefix_cache()")
        before = self.keys
        ok = bool(self._call("reset_prefix_cache", self.kvm.reset_prefix_cache))
        self.code[-1] += f"  # -> {ok}"
        self.stats.checks["reset"] += 1
        holders = [x.rid for x in self.live if x.running]
        entries = len(getattr(self.kvm.block_pool, "cached_block_hash_to_block", ()))
        self.pending.extend(reset_violations(ok, holders, before, self.keys, entries))
        if ok:
            self.stale = set(self.content)

    def op_skip(self, req: int = 0, rid: int | None = None) -> None:
        x = self._pick(req, rid, running=True)
        if x is None:
            return
        n = x.req.num_computed_tokens
        self.code.append(f"kvm.remove_skipped_blocks({x.rid!r}, {n})")
        self._call("remove_skipped_blocks", self.kvm.remove_skipped_blocks, x.rid, n)

    def op_cache(self, req: int = 0, rid: int | None = None) -> None:
        x = self._pick(req, rid, running=True)
        if x is None:
            return
        n = x.req.num_computed_tokens
        self.code.append(f"kvm.cache_blocks({x.var}, {n})")
        self._call("cache_blocks", self.kvm.cache_blocks, x.req, n)

    # -- checks -----------------------------------------------------------------------------
    def _check_hit(self, x: Live, blocks: Any, hit: int) -> None:
        per_group = tuple(list(g) for g in blocks.blocks)
        v = hit_violations(self.geo, hit, per_group, self._tokens(x), self.content)
        for c in ("L1", "L3", "soundness"):
            self.stats.checks[c] += 1
        v += stale_hits(per_group, self.stale)
        if self.tenants:
            self.stats.checks["separation"] += 1
            sizes = [g.block_size for g in self.geo.groups]
            v += separation_violations(x.req, hit, per_group, sizes, self.content, self.raw)
        # Completeness: the same prompt ran to the end before and nothing was evicted since.
        prompt = tuple(x.req.prompt_token_ids)
        if x.req.num_tokens == len(prompt) and not reads_no_cache(x.req):
            for f in reversed(self.finished):
                if f.tokens == prompt and f.epoch == self.epoch and f.computed >= len(prompt):
                    self.stats.checks["completeness"] += 1
                    want = expected_complete_hit(self.geo, len(prompt), f.computed)
                    if hit < want:
                        v.append(
                            Violation(
                                "completeness",
                                f"a re-sent {len(prompt)}-token prompt, computed and freed with "
                                f"nothing evicted since, hit {hit} tokens; the geometry "
                                f"promises {want}",
                            )
                        )
                    break
        if v:
            self.pending.extend(v)
            self._emit_hit_asserts(v, hit)

    def _emit_hit_asserts(self, v: list[Violation], hit: int) -> None:
        """The reproducer stops where the answer broke the rule, with the evidence."""
        kinds = {x.check for x in v}
        self.code.append('print("hit", hit, "blocks per group", [len(g) for g in blocks.blocks])')
        if "L1" in kinds:
            self.code.append(f"assert hit % {self.geo.L} == 0, 'L1: hit not whole LCM blocks'")
        if "L3" in kinds:
            sizes = [g.block_size if g.cacheable else None for g in self.geo.groups]
            self.code.append(
                f"assert all(b is None or len(g) * b == hit for g, b in zip(blocks.blocks, "
                f"{sizes})), 'L3: a group does not cover exactly the hit'"
            )
        if "completeness" in kinds:
            want = [x for x in v if x.check == "completeness"][0].message.split("promises ")[-1]
            self.code.append(f"assert hit >= {want}, 'completeness: re-sent prompt misses'")
        if "soundness" in kinds:
            self.code.append("raise AssertionError('soundness: see the block content note above')")

    pending: list[Violation]

    def state_violations(self) -> list[Violation]:
        """Refcounts, the free queue, exclusive blocks and TOCTOU, after any call."""
        out: list[Violation] = []
        pool = self.kvm.block_pool
        holders: dict[int, list[tuple[str, int, int]]] = {}
        lists: dict[str, dict[tuple[int, int], int]] = {}
        for g in self.geo.groups:
            mgr = self.kvm.coordinator.single_type_managers[g.index]
            for rid, blocks in mgr.req_to_blocks.items():
                for j, b in enumerate(blocks):
                    if b.is_null:
                        continue
                    holders.setdefault(b.block_id, []).append((rid, g.index, j))
                    lists.setdefault(rid, {})[(g.index, j)] = b.block_id
        # refcount: each block's ref_cnt is the number of request slots holding it.
        self.stats.checks["refcount"] += 1
        for b in pool.blocks:
            if b.is_null:
                continue
            n = len(holders.get(b.block_id, ()))
            if b.ref_cnt != n:
                out.append(
                    Violation(
                        "refcount",
                        f"block {b.block_id} has ref_cnt {b.ref_cnt} but {n} request slot(s) "
                        f"hold it {holders.get(b.block_id, [])}",
                    )
                )
        # free queue: exactly the unreferenced blocks, each once, and the counter agrees.
        self.stats.checks["free_queue"] += 1
        q = pool.free_block_queue
        seen: list[int] = []
        node = q.fake_free_list_head.next_free_block
        while (
            node is not None and node is not q.fake_free_list_tail and len(seen) <= len(pool.blocks)
        ):
            seen.append(node.block_id)
            node = node.next_free_block
        free_set = {b.block_id for b in pool.blocks if b.ref_cnt == 0 and not b.is_null}
        if len(seen) != len(set(seen)) or set(seen) != free_set or q.num_free_blocks != len(seen):
            out.append(
                Violation(
                    "free_queue",
                    f"free queue {sorted(seen)} (counter {q.num_free_blocks}) vs unreferenced "
                    f"blocks {sorted(free_set)}",
                )
            )
        # exclusive: a block serves one group and one content at a time.
        self.stats.checks["exclusive"] += 1
        by_rid = {x.rid: x for x in self.live}
        for bid, hs in holders.items():
            if len({g for _, g, _ in hs}) > 1:
                out.append(Violation("exclusive", f"block {bid} serves groups {hs} at once"))
                continue
            if len(hs) > 1:
                prefixes = set()
                for rid, g, j in hs:
                    end = (j + 1) * self.geo.groups[g].block_size
                    x = by_rid.get(rid)
                    toks = self._tokens(x) if x else []
                    prefixes.add(tuple(toks[:end]) if len(toks) >= end else ("uncomputed", rid))
                if len(prefixes) > 1:
                    out.append(
                        Violation("exclusive", f"block {bid} holds two contents at once: {hs}")
                    )
        # toctou: a running request's blocks are never moved or handed to another content.
        self.stats.checks["toctou"] += 1
        for x in self.live:
            if not x.running:
                continue
            now = lists.get(x.rid, {})
            before = self.held.get(x.rid, {})
            for (g, j), bid in before.items():
                grp = self.geo.groups[g]
                if (j + 1) * grp.block_size > x.req.num_computed_tokens:
                    continue  # not computed yet: speculative slots may be re-laid
                cur = now.get((g, j))
                if cur is None and grp.reads_last is not None:
                    continue  # a window / state group nulls what it no longer reads
                if cur != bid:
                    out.append(
                        Violation(
                            "toctou",
                            f"request {x.rid}'s computed block {bid} (group {g}, index {j}) "
                            f"was {'dropped' if cur is None else f'replaced by {cur}'} while it runs",
                        )
                    )
            self.held[x.rid] = dict(now)
        return out

    def _window_and_events(self) -> list[Violation]:
        self.stats.checks["window"] += 1
        running = [(x.rid, x.req.num_computed_tokens) for x in self.live if x.running]
        v = window_violations(self.kvm, self.reads, running)
        if self.ledger.enabled:
            self.stats.checks["events"] += 1
            ev = self.ledger.check(self.kvm, self.keys)
            if ev:
                self.code.append("print(kvm.take_events())  # the event stream since the start")
            v += ev
        return v

    def run_op(self, step: int, op: TraceStep) -> None:
        """Run ``op`` (the run's ``step``-th); raise ``Nonconformance`` when a check fails."""
        self.pending = []
        self.picked = self.created = None
        self.stats.ops[op.action] += 1
        try:
            self.apply(op)
        except Exception as e:  # vLLM raised or asserted: a finding of its own kind
            self.trace.append(resolved(op, self.picked, self.created))
            crash = Violation("crash", f"{type(e).__name__}: {e}")
            raise finding(self.pending + [crash], self.trace, type(e).__name__) from e
        self.trace.append(resolved(op, self.picked, self.created))
        v = self.pending + self.state_violations() + self._window_and_events()
        self.stats.steps += 1
        if v:
            raise finding(v, self.trace)
