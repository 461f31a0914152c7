"""vLLM's real ``Scheduler`` on a CPU, with no model: the part of the target that needs only vLLM.

This module imports vLLM, torch and the standard library, nothing of kvstate, so that its text
can be pasted whole into a finding's reproducer (``engine.reproducer``).  It builds a
``Scheduler`` the way vLLM's own unit tests do (``tests/v1/core/utils.py`` ``create_scheduler``:
small configs, a ``KVCacheConfig`` with no tensors, ``ModelRunnerOutput`` fed back by hand), with
one difference, the model configuration, documented at :class:`StubModelConfig`.

:class:`Engine` plays the engine core and the model runner: ``arrive`` (``add_request``), ``step``
(``schedule`` then ``update_from_output`` with sampled tokens and the connector's transfer
results), ``abort`` (``finish_requests``) and ``reset`` (``reset_prefix_cache``).  A KV connector
(:class:`ScriptedConnector`) offers each request the external tokens its plan says, loaded
synchronously, asynchronously, or failing.  :func:`violations` checks the pool after every call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    SupportsHMA,
)
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import DraftTokenIds, KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

init_none_hash(sha256)


class StubModelConfig:
    """The model configuration the scheduler reads, without a model.

    ``ModelConfig`` cannot be built on a CPU install: its ``__post_init__`` resolves the model's
    architecture, which imports ``vllm._C`` (absent without the CUDA build) and reads a Hugging
    Face config (no network).  ``VllmConfig`` accepts ``model_config=None`` and is built that way;
    the scheduler then reads the attributes below from ``vllm_config.model_config`` (listed by
    running it with a recording stub).  None of them reaches the KV cache manager or the block
    pool: they select text-only generation (no M-RoPE, no encoder, no multimodal budget, no
    pooling or diffusion runner, no sampling mask), and ``max_model_len`` is the one the manager
    is built with either way.  Reading any other attribute raises ``StubGap``, so a vLLM release
    that reads more fails loudly instead of running on a guess.
    """

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.skip_tokenizer_init = True  # StructuredOutputManager: no tokenizer to load
        self.uses_mrope = False
        self.is_encoder_decoder = False
        self.runner_type = "generate"
        self.is_diffusion = False
        self.supports_multimodal_inputs = False
        self.multimodal_config = None
        self.return_sampling_mask = False

    def __getattr__(self, name: str) -> Any:
        raise StubGap(f"the stub ModelConfig has no {name!r}: this vLLM reads more of it")


class StubEagleConfig:
    """The speculative-decoding settings the scheduler reads, for an EAGLE drafter.

    ``SpeculativeConfig`` builds the draft model's ``ModelConfig`` from the target's (the
    obstacle of :class:`StubModelConfig` again), so it is replaced after ``VllmConfig`` is built,
    like the model configuration.  ``VllmConfig``'s own properties derive the lookahead counts
    the scheduler and its ``KVCacheManager`` use from these answers (``num_lookahead_tokens`` =
    ``num_speculative_tokens`` for EAGLE; one prefill lookahead token; lookahead block hashes
    when no connector is set), exactly as for a real EAGLE configuration: a single-module EAGLE
    drafter (``eagle3`` in vLLM's table: no extra drafting slots, trailing-block drop on).
    """

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.num_speculative_tokens_per_batch_size = None
        self.disable_eagle_block_drop = False
        self.disable_lookahead_block_hashes = False
        self.max_num_new_slots_for_drafting = 0  # EAGLE3, not parallel (vLLM's table)
        self.parallel_drafting = False
        self.method = "eagle3"
        self.use_heterogeneous_vocab = False

    def use_eagle(self) -> bool:
        return True

    def use_eagle_block_drop(self) -> bool:
        return True

    def needs_eagle_block_drop(self) -> bool:
        return True

    def use_dflash(self) -> bool:
        return False

    def use_dspark(self) -> bool:
        return False

    def uses_draft_model(self) -> bool:
        return False

    def use_multi_module_mtp(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        raise StubGap(f"the stub SpeculativeConfig has no {name!r}: this vLLM reads more of it")


class StubGap(AttributeError):
    """vLLM read a model setting the stub does not carry (a harness gap, never a finding)."""


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """A scheduler-side KV connector that offers what the harness's plan says.

    ``plan[request id] = (tokens, mode)``: the connector has the prompt's first ``tokens`` tokens
    (whole scheduler blocks; never the last prompt token) and loads them ``"sync"`` (in the step
    that computes the rest), ``"async"`` (the request waits for the transfer), ``"fail"``
    (asynchronously, and the transfer fails) or ``"syncfail"`` (synchronously, and the step
    reports the first loaded block invalid; one-group layouts only: vLLM takes block-level
    failures only there).  The worker-side methods are
    no-ops: no tensor is moved.
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.plan: dict[str, tuple[int, str]] = {}
        self.block = vllm_config.cache_config.block_size
        self.loading: dict[str, list[int]] = {}  # async loads in flight -> their block ids
        self.sync_failing: dict[str, list[int]] = {}  # sync loads this step, to fail
        self.local: dict[str, int] = {}  # request -> its local hit when last asked
        self.one_group = len(kv_cache_config.kv_cache_groups) == 1

    # scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        tokens, mode = self.plan.get(request.request_id, (0, "sync"))
        have = min(tokens, request.num_tokens - 1) // self.block * self.block
        ext = max(0, have - num_computed_tokens)
        self.local[request.request_id] = num_computed_tokens  # where the loaded tokens start
        return ext, bool(ext) and mode in ("async", "fail")

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        mode = self.plan.get(request.request_id, (0, "sync"))[1]
        # the blocks the load fills (group 0's; with one group, the ones a failure names)
        first = self.local.get(request.request_id, 0) // self.block
        ids = list(blocks.get_block_ids()[0][first:])
        if num_external_tokens and mode in ("async", "fail"):
            self.loading[request.request_id] = ids
        elif num_external_tokens and mode == "syncfail" and ids and self.one_group:
            self.sync_failing[request.request_id] = ids

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        return False, None

    # worker side: nothing runs
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


def layout_of(make_manager: Any) -> dict[str, Any]:
    """The groups and geometry a ``kvstate/targets/vllm/configs.py`` layout builds.

    A layout's source defines ``make_manager`` on top of ``manager_from_groups``; calling it with
    that helper swapped for a recorder yields the same ``KVCacheGroupSpec`` list the manager-only
    target drives, so both targets run the same layouts.
    """
    got: dict[str, Any] = {}
    g = make_manager.__globals__
    saved = g["manager_from_groups"]

    def record(groups: Any, num_blocks: int, use_eagle: bool, max_len: int, sb: int, hb: int,
               **knobs: Any) -> None:  # fmt: skip
        got.update(groups=groups, max_len=max_len, sched_block=sb, hash_block=hb, knobs=knobs)

    g["manager_from_groups"] = record
    try:
        make_manager(0, False)
    finally:
        g["manager_from_groups"] = saved
    return got


def fit_max_model_len(vllm_config: Any, groups: Any, num_blocks: int, layout: Any) -> int:
    """The longest ``max_model_len`` (whole scheduler blocks, at most the layout's) whose one
    request fits the pool, by each spec's own ``max_memory_usage_bytes``.

    vLLM refuses to start an engine whose KV cache cannot hold one request of
    ``max_model_len`` tokens (``kv_cache_planning.check_enough_kv_cache_memory``); pools this
    small would never be built with the layout's 512 tokens, and a request that cannot fit even
    an empty pool blocks the waiting queue forever, which vLLM rules out at start-up.
    """
    step = layout["sched_block"]
    for max_len in range(layout["max_len"] // step * step, step - 1, -step):
        vllm_config.model_config = StubModelConfig(max_len)
        need = sum(
            -(
                -g.kv_cache_spec.max_memory_usage_bytes(vllm_config)
                // g.kv_cache_spec.page_size_bytes
            )
            for g in groups
        )
        if need <= num_blocks - 1:
            return max_len
    raise ValueError(f"a pool of {num_blocks} blocks holds no request of this layout")


def make_scheduler(
    layout: dict[str, Any],
    num_blocks: int,
    *,
    budget: int = 64,
    max_seqs: int = 6,
    policy: str = "fcfs",
    connector: bool = False,
    failure_policy: str = "recompute",
    spec_tokens: int = 0,
    watermark: float = 0.0,
    reserve_full_isl: bool = True,
) -> Scheduler:
    """A ``Scheduler`` over ``num_blocks`` blocks (one of them vLLM's null block).

    ``watermark`` (the fraction of the pool kept free when admitting while others run) and
    ``reserve_full_isl`` (admit only when the whole prompt fits) are ``SchedulerConfig``'s;
    a release without them gets its defaults (they are passed only where the class has them).
    """
    groups = layout["groups"]
    mamba = any(isinstance(g.kv_cache_spec, MambaSpec) for g in groups)
    cache = CacheConfig(
        block_size=layout["sched_block"],
        enable_prefix_caching=True,
        mamba_cache_mode="align" if mamba else "none",
        **layout.get("knobs", {}),  # the manager's knobs are CacheConfig's (shared prefix)
    )
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        max_model_len=layout["max_len"],
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        policy=policy,
        **{
            k: v
            for k, v in (("watermark", watermark), ("scheduler_reserve_full_isl", reserve_full_isl))
            if k in getattr(SchedulerConfig, "__dataclass_fields__", {})
        },
    )
    kv_transfer = None
    if connector:
        kv_transfer = KVTransferConfig(
            kv_connector="ScriptedConnector",
            kv_role="kv_both",
            kv_connector_module_path=__name__,
            kv_load_failure_policy=failure_policy,
        )
    vllm_config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        cache_config=cache,
        scheduler_config=sched_cfg,
        kv_transfer_config=kv_transfer,
    )
    if spec_tokens:
        vllm_config.speculative_config = StubEagleConfig(spec_tokens)  # see StubEagleConfig
    max_len = fit_max_model_len(vllm_config, groups, num_blocks, layout)
    vllm_config.model_config = StubModelConfig(max_len)  # see StubModelConfig
    sched_cfg.max_model_len = max_len
    cache.num_gpu_blocks = num_blocks
    kv_cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    kv_cfg = generate_scheduler_kv_cache_config([kv_cfg])  # what the engine core hands it
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cfg,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=layout["sched_block"],
        hash_block_size=layout["hash_block"],
        log_stats=False,
    )


def tokens_of(family: int, start: int, stop: int) -> list[int]:
    """Deterministic token ids: prompts of one family share their prefix (real traffic)."""
    return [(family * 7919 + i * 104729) % 50000 for i in range(start, stop)]


@dataclass
class Engine:
    """The engine core's loop around one ``Scheduler``, and what it has seen."""

    sched: Scheduler
    hash_block: int
    n: int = 0
    gone: set[str] = field(default_factory=set)  # finished or aborted request ids
    arrival: dict[str, int] = field(default_factory=dict)  # request id -> arrival order
    pending_failures: dict[str, list[int]] = field(default_factory=dict)
    last: Any = None  # the last SchedulerOutput
    running_before: list[str] = field(default_factory=list)  # running order before the step
    paths: dict[str, int] = field(default_factory=dict)
    window_found: list[str] = field(default_factory=list)  # found inside the last step
    idle_before: bool = False  # the pool as the last schedule() found it: see ``pool_idle``

    def _path(self, name: str, k: int = 1) -> None:
        self.paths[name] = self.paths.get(name, 0) + k

    def arrive(
        self,
        family: int,
        shared: int,
        tail: int,
        extra: int,
        max_tokens: int,
        priority: int = 0,
        ext_tokens: int = 0,
        mode: str = "sync",
    ) -> str:
        """``add_request``: a prompt of ``shared`` tokens of ``family`` then ``extra`` of
        ``tail``; the connector (if any) holds its first ``ext_tokens``."""
        rid = f"r{self.n}"
        self.n += 1
        longest = self.sched.max_model_len // 2  # room for the outputs
        shared = min(shared, longest)
        extra = max(1, min(extra, longest - shared))
        toks = tokens_of(family, 0, shared) + tokens_of(tail, shared, shared + extra)
        req = Request(
            rid,
            toks,
            SamplingParams(max_tokens=max_tokens),
            None,
            arrival_time=float(self.n),
            priority=priority,
            block_hasher=get_request_block_hasher(self.hash_block, sha256),
        )
        self.arrival[rid] = self.n
        self.last = None  # liveness and preemption are judged on a step's output only
        self.window_found = []
        if self.sched.connector is not None and ext_tokens:
            self.sched.connector.plan[rid] = (ext_tokens, mode)
        self.sched.add_request(req)
        return rid

    def step(self, seed: int = 0) -> Any:
        """``schedule()`` then ``update_from_output()``: each request scheduled to the end of its
        known tokens samples one token; async loads started before this step complete (those
        planned to fail report their blocks invalid)."""
        s = self.sched
        self.running_before = [r.request_id for r in s.running]
        conn = s.connector
        # Loads in flight when the step starts finish with it (as a worker reports them).
        finishing = dict(conn.loading) if conn is not None else {}
        self.idle_before = pool_idle(s)  # what admission sees: the frees below come after it
        out = s.schedule()
        self.last = out
        self.window_found = window(  # what this step's first new position reads, held?
            s,
            {r: s.requests[r].num_computed_tokens - k for r, k in out.num_scheduled_tokens.items()},
        )
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for k, rid in enumerate(ids):
            req = s.requests[rid]
            prefilling = req.num_computed_tokens < req.num_tokens
            new = (seed * 31 + req.num_tokens + k) % 50000
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            accepted = (seed >> (k % 12)) % (len(drafts) + 1) if drafts else 0
            sampled.append([] if prefilling else [*drafts[:accepted], new])
            if drafts:
                self._path("spec_decode")
                self._path("drafts_rejected", len(drafts) - accepted)
            if prefilling:
                self._path("chunked_prefill")  # a prefill chunk that leaves more to compute
        kv_out = None
        if conn is not None:
            # Block ids name a block in one group only: with several groups vLLM takes load
            # failures per request (failed_recving), with one group per block.
            one_group = len(s.kv_cache_config.kv_cache_groups) == 1
            invalid: set[int] = set()
            failed: set[str] = set()
            for rid, blocks in finishing.items():
                conn.loading.pop(rid, None)
                if conn.plan.get(rid, (0, ""))[1] == "fail" and blocks:
                    conn.plan[rid] = (0, "sync")  # lost: a retry finds nothing to load
                    if one_group:
                        invalid.add(blocks[0])
                    else:
                        failed.add(rid)
                    self._path("async_load_failed")
                else:
                    self._path("async_load_done")
            for rid, blocks in conn.sync_failing.items():
                conn.plan[rid] = (0, "sync")
                invalid.add(blocks[0])  # the first block a synchronous load filled
                self._path("sync_load_failed")
            conn.sync_failing.clear()
            kv_out = KVConnectorOutput(
                finished_recving=set(finishing) or None,
                invalid_block_ids=invalid,
                failed_recving=failed,
            )
            if out.has_sync_kv_loads:
                self._path("sync_load")
        self._path("preempted", len(out.preempted_req_ids or ()))
        self._path("mamba_cow", len(getattr(out, "kv_cache_block_copies", None) or ()))
        self._path("scheduled_new", len(out.scheduled_new_reqs))
        mro = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=kv_out,
        )
        result = s.update_from_output(out, mro)
        k_spec = s.num_spec_tokens
        if k_spec:  # the drafter proposes for every request that decodes next
            ids = [r.request_id for r in s.running if r.num_computed_tokens >= r.num_tokens - 1]
            drafts = [[(seed + 7 * j + len(r)) % 50000 for j in range(k_spec)] for r in ids]
            s.update_draft_token_ids(DraftTokenIds(ids, drafts))
        for eco in result.values():
            for o in eco.outputs:
                if o.finish_reason is not None:
                    self.gone.add(o.request_id)
                    self._path("finished")
        return out

    def abort(self, rid: str) -> None:
        """``finish_requests(rid, FINISHED_ABORTED)``: the client went away."""
        self.last, self.window_found = None, []
        if rid in self.sched.requests:
            self._path("aborted")
        self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        if rid in self.sched.requests or rid in self.arrival:
            self.gone.add(rid)

    def reset(self) -> bool:
        self.last, self.window_found = None, []
        ok = bool(self.sched.reset_prefix_cache())
        self._path("reset_ok" if ok else "reset_refused")
        return ok


# ---------------------------------------------------------------------------------------------
# Checks after every call (kvstate/targets/vllm_scheduler/checks.py maps them to the table).
# ---------------------------------------------------------------------------------------------
def _holders(sched: Scheduler) -> dict[int, list[tuple[str, int]]]:
    out: dict[int, list[tuple[str, int]]] = {}
    for gi, mgr in enumerate(sched.kv_cache_manager.coordinator.single_type_managers):
        for rid, blocks in mgr.req_to_blocks.items():
            for b in blocks:
                if not b.is_null:
                    out.setdefault(b.block_id, []).append((rid, gi))
    return out


def conservation(sched: Scheduler) -> list[str]:
    """Every non-null block is either free (in the free queue once, ref_cnt 0; cached or not)
    or held (ref_cnt = the request slots holding it, not in the queue): free + held = pool."""
    pool = sched.kv_cache_manager.block_pool
    q = pool.free_block_queue
    seen: list[int] = []
    node = q.fake_free_list_head.next_free_block
    while node is not None and node is not q.fake_free_list_tail and len(seen) <= len(pool.blocks):
        seen.append(node.block_id)
        node = node.next_free_block
    holders = _holders(sched)
    real = [b for b in pool.blocks if not b.is_null]
    out = []
    if len(seen) != len(set(seen)) or q.num_free_blocks != len(seen):
        out.append(
            f"free queue lists {len(seen)} entries ({len(set(seen))} distinct), counter "
            f"{q.num_free_blocks}"
        )
    free, held = set(seen), {b.block_id for b in real if b.ref_cnt > 0}
    if free & held or len(free | held) != len(real):
        out.append(
            f"pool of {len(real)}: {len(free)} free + {len(held)} held, overlap "
            f"{sorted(free & held)}, unaccounted "
            f"{sorted({b.block_id for b in real} - free - held)}"
        )
    for b in real:
        n = len(holders.get(b.block_id, ()))
        if b.ref_cnt != n:
            out.append(f"block {b.block_id} has ref_cnt {b.ref_cnt}, {n} request slot(s) hold it")
            break
    return out


def hygiene(engine: Engine) -> list[str]:
    """A finished, aborted or preempted request holds no block.  vLLM's documented exceptions:
    an aborted request whose async load is in flight keeps its blocks until the transfer
    reports; a preempted request whose later async load completed waits in
    ``kv_holding_waiting`` with that KV (``Scheduler._holds_kv_blocks``)."""
    s = engine.sched
    loading = set(s.connector.loading) if s.connector is not None else set()
    out = []
    for rid in sorted({r for bs in _holders(s).values() for r, _ in bs}):
        req = s.requests.get(rid)
        if rid in engine.gone and rid not in loading:
            out.append(f"request {rid} finished or was aborted and still holds blocks")
        elif (
            req is not None
            and req.status == RequestStatus.PREEMPTED
            and not (req in s.kv_holding_waiting and req.num_computed_tokens > 0)
        ):  # vLLM's one exception: KV an async load brought in, kept for its resumption
            out.append(f"request {rid} was preempted and still holds blocks")
        elif req is None and rid not in engine.gone:
            out.append(f"blocks held for {rid}, which the scheduler no longer knows")
    return out


def reads(sched: Scheduler) -> list[tuple[int, int, str, int | None]]:
    """(group, block size, what, tokens before the next position it reads) from spec classes,
    never from the managers' ``get_num_skipped_tokens`` (the method under test)."""
    out = []
    for i, mgr in enumerate(sched.kv_cache_manager.coordinator.single_type_managers):
        spec = getattr(mgr.kv_cache_spec, "first_spec", mgr.kv_cache_spec)
        if isinstance(spec, MambaSpec):
            out.append((i, mgr.block_size, "Mamba state", 1))
        elif isinstance(spec, SlidingWindowSpec):
            last = spec.sliding_window - 1 + int(getattr(spec, "extra_retained_tokens", 0) or 0)
            out.append((i, mgr.block_size, f"window {spec.sliding_window}", last))
        elif isinstance(spec, FullAttentionSpec):
            out.append((i, mgr.block_size, "full attention", None))
    return out


def window(sched: Scheduler, at: dict[str, int] | None = None) -> list[str]:
    """Every block a running request's next position reads is in its table, non-null, held.

    ``at``: request id -> the position to check (default: every running request at its
    computed tokens).  ``Engine.step`` checks each scheduled request right after
    ``schedule()``, at the first position the step computes: ``allocate_slots`` frees what the
    window left behind *before* the step runs, so a block freed one token early is visible
    only then (after the step the window has moved past it).
    """
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    out = []
    if at is None:
        at = {r.request_id: r.num_computed_tokens for r in sched.running}
    for rid, n in at.items():
        if n <= 0:
            continue
        req = sched.requests[rid]
        for gi, bs, what, last in reads(sched):
            lo = 0 if last is None else max(0, n - last)
            table = managers[gi].req_to_blocks.get(req.request_id, [])
            for j in range(lo // bs, (n - 1) // bs + 1):
                b = table[j] if j < len(table) else None
                if b is not None and not b.is_null and b.ref_cnt > 0:
                    continue
                state = "missing" if b is None else "null (freed)" if b.is_null else "unreferenced"
                out.append(
                    f"running {req.request_id} computed {n} tokens; its next position "
                    f"reads tokens [{lo}, {n}) of group {gi} ({what}, block {bs}) but "
                    f"block index {j} is {state}"
                )
                break
    return out


def blocks_needed(sched: Scheduler, req: Request) -> int:
    """Blocks the whole request needs at most, over all groups: what fits an empty pool."""
    total = min(req.num_tokens + req.max_tokens, sched.max_model_len) + sched.num_lookahead_tokens
    return sum(
        math.ceil(total / mgr.block_size) + 1
        for mgr in sched.kv_cache_manager.coordinator.single_type_managers
    )


def pool_idle(sched: Scheduler) -> bool:
    """Nothing running, no async load in flight, no block held by anyone.

    A request aborted while its async load is in flight keeps its blocks until the connector
    reports the load in ``finished_recving`` (``Scheduler.finish_requests`` frees it with
    ``delay_free_blocks``; ``_update_from_kv_xfer_finished`` frees the blocks), which
    ``update_from_output`` handles after that step's ``schedule()``.
    """
    if sched.running or (sched.connector is not None and sched.connector.loading):
        return False
    return not any(b.ref_cnt for b in sched.kv_cache_manager.block_pool.blocks if not b.is_null)


def liveness(engine: Engine) -> list[str]:
    """Admission: a step whose ``schedule()`` began with the pool idle (:func:`pool_idle`)
    and that ends with it still idle must have admitted a waiting request that fits the whole
    pool (else that request is refused forever: an over-count).  Judged on the pool both before
    ``schedule()`` (what admission saw; blocks freed later in the step were not free to it) and
    after the step (an admission that started an async load holds blocks and runs no token)."""
    s, out = engine.sched, engine.last
    if out is None or not engine.idle_before or out.total_num_scheduled_tokens:
        return []
    if not pool_idle(s):
        return []
    usable = s.cache_config.num_gpu_blocks - 1
    waiting = [
        r
        for r in s.requests.values()
        if r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
    ]
    fits = [r for r in waiting if blocks_needed(s, r) <= usable]
    if fits:
        r = fits[0]
        return [
            f"schedule() admitted nothing with the pool idle ({usable} blocks free): waiting "
            f"{r.request_id} ({r.num_tokens} tokens) needs at most {blocks_needed(s, r)}"
        ]
    return []


def preemption_policy(engine: Engine) -> list[str]:
    """The victims are those vLLM documents: FCFS the last of ``running`` (most recently
    admitted), priority the largest (priority, arrival time)."""
    s, out = engine.sched, engine.last
    victims = set(out.preempted_req_ids or ()) if out is not None else set()
    victims &= set(engine.running_before)  # preemptions of this step's running requests
    if not victims:
        return []
    before = engine.running_before
    if s.policy.name == "PRIORITY":
        key = {
            rid: (s.requests[rid].priority, s.requests[rid].arrival_time)
            for rid in before
            if rid in s.requests
        }
        ranked = sorted(key, key=lambda r: key[r], reverse=True)
        want = set(ranked[: len(victims)])
    else:
        want = set(before[len(before) - len(victims) :])
    if victims != want:
        return [
            f"preempted {sorted(victims)} of running {before}; policy "
            f"{s.policy.name.lower()} picks {sorted(want)}"
        ]
    return []


CHECKS = {
    "conservation": lambda e: conservation(e.sched),
    "hygiene": hygiene,
    "window": lambda e: e.window_found + window(e.sched),
    "liveness": liveness,
    "preemption": preemption_policy,
}


def violations(engine: Engine) -> list[tuple[str, str]]:
    """Every check class on the engine's current state: (class, message) for each failure."""
    return [(name, m) for name, fn in CHECKS.items() for m in fn(engine)]
