"""The cache stacks the SGLang target drives, each as standalone source built from SGLang's classes.

Each configuration is *source text* (exec'd by the driver, and pasted verbatim into a finding's
reproducer, which then needs only SGLang) defining ``make_stack()``: the request-to-token pool,
the KV pool, the allocator and the ``UnifiedRadixCache`` built the way SGLang's scheduler builds
them, on ``device="cpu"``, plus ``STATES``: the state buffers a hit must find its markers in,
each as ``(name, index space, view)`` (see ``ops.py``).  The tree core (``python`` or ``rust``,
the production default) is chosen by SGLang's own switch,
``SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND``, set in the prelude.
"""

from __future__ import annotations

from dataclasses import dataclass

PRELUDE = """\
import os
os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = {core!r}
{switches}
import importlib
import inspect
import torch
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache


def first(name, *modules):
    # the cache modules moved and were renamed between releases: the first module that has it
    for m in modules:
        try:
            return getattr(importlib.import_module("sglang.srt.mem_cache." + m), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(name + " is in none of sglang.srt.mem_cache." + ", ".join(modules))


def accepted(fn, **kw):
    # the keyword arguments this release's fn takes (its signature grew between releases)
    params = inspect.signature(fn).parameters
    return {{k: v for k, v in kw.items() if k in params}}


class _OnCpu:
    # a Triton kernel's launch, kernel[grid](*args), run as plain torch on a CPU
    def __init__(self, run):
        self.run = run

    def __getitem__(self, grid):
        return self.run


def _extend_on_cpu(prefix_lens, seq_lens, last_loc, free_pages, out, _pow2, page):
    _paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out, page, "cpu")


def _decode_on_cpu(seq_lens, last_loc, free_pages, out, _pow2, page):
    # a request whose next token starts a page takes the next free page, in batch order
    need = (seq_lens - 1) % page == 0
    rank = torch.cumsum(need.to(torch.int64), 0) - need.to(torch.int64)
    start = free_pages[rank.clamp(max=max(len(free_pages) - 1, 0))] * page
    out.copy_(torch.where(need, start, last_loc + 1) if len(free_pages) else last_loc + 1)


# Before 0.5.22 the paged allocator launches its Triton kernels unconditionally (0.5.22 added
# the CPU path, alloc_extend_naive/alloc_decode_naive): on a CPU the launch is stood in for by
# SGLang's own alloc_extend_naive, present in every release, and the same page walk for decode.
_paged = first("alloc_extend_naive", "allocator.paged", "allocator")
_paged = importlib.import_module(_paged.__module__)
if not hasattr(_paged, "alloc_decode_naive"):
    _paged.alloc_extend_kernel = _OnCpu(_extend_on_cpu)
    _paged.alloc_decode_kernel = _OnCpu(_decode_on_cpu)

SWATokenToKVPoolAllocator = first("SWATokenToKVPoolAllocator", "allocator.swa", "swa_memory_pool")
ComponentType = first("ComponentType", "unified_cache.components.base",
                      "unified_cache.component_type", "unified_cache_components.tree_component")

PAGE, WINDOW, POOL, MAX_REQS, MAX_LEN = {page}, {window}, {pool}, 6, {max_len}


SERVER_ARGS = {{}}  # a layout's own server arguments (the Mamba layout's radix strategy)
TREE_COMPONENTS = (ComponentType.FULL, ComponentType.SWA)
TREE_PARAMS = {{}}  # a layout's own CacheInitParams fields


def server_args(**more):
    # a CPU server's arguments: the attention backend SGLang's CPU deployments name, so that
    # the cache's index writes take their CPU path (before 0.5.22 they otherwise launch Triton)
    return ServerArgs(model_path="dummy", page_size=PAGE, attention_backend="torch_native",
                      **SERVER_ARGS, **more)


def tree_params(r2t, alloc):
    return CacheInitParams(
        req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=PAGE,
        disable=False, sliding_window_size=WINDOW,
        tree_components=TREE_COMPONENTS, eviction_policy="lru", **TREE_PARAMS)


def make_tree(r2t, alloc):
    return UnifiedRadixCache(params=tree_params(r2t, alloc))
"""

SWA = """\
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool


def make_stack():
    set_global_server_args_for_scheduler(server_args())
    r2t = ReqToTokenPool(size=MAX_REQS, max_context_len=MAX_LEN, device="cpu",
                         enable_memory_saver=False)
    return make_swa_stack(r2t)


def make_swa_stack(r2t):
    kv = SWAKVPool(**accepted(  # enable_kvcache_transpose: required before 0.5.15
        SWAKVPool.__init__, size=POOL, size_swa=POOL, page_size=PAGE, dtype=torch.bfloat16,
        head_num=1, head_dim=8, swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
        device="cpu", enable_kvcache_transpose=False))
    alloc = SWATokenToKVPoolAllocator(**accepted(  # req_to_token_pool: 0.5.20 on
        SWATokenToKVPoolAllocator.__init__, size=POOL, size_swa=POOL, page_size=PAGE,
        dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False, req_to_token_pool=r2t))
    return r2t, kv, alloc, make_tree(r2t, alloc)


def slot_view(buf):
    # (read, write) of one int32 marker per token slot of a [slots, heads, dim] buffer
    words = buf.view(buf.shape[0], -1).view(torch.int32)
    def read(locs):
        return words[locs, 0].to(torch.int64)
    def write(locs, vals):
        words[locs, 0] = vals.to(torch.int32)
    return read, write


def states(kv):
    # name -> (index space, read, write): the full layer's K (full slots), the SWA layer's K
    return {"full": ("full", *slot_view(kv.full_kv_pool.k_buffer[0])),
            "swa": ("swa", *slot_view(kv.swa_kv_pool.k_buffer[0]))}
"""

DSV4 = """\
from sglang.srt.mem_cache import deepseek_v4_memory_pool as _dsv4
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool


def resolve_compress_state_ring_size(ratio):
    # 0.5.21 on: the ring under the published spec config; before it, the same ring without
    # speculative decoding
    if hasattr(_dsv4, "resolve_compress_state_ring_size"):
        return _dsv4.resolve_compress_state_ring_size(ratio)
    return _dsv4.get_compress_state_ring_size(ratio, False)


RATIOS = [4, 128, 4, 128]  # CSA and HCA layers alternate


def make_stack():
    set_global_server_args_for_scheduler(server_args())
    r2t = ReqToTokenPool(size=MAX_REQS, max_context_len=MAX_LEN, device="cpu",
                         enable_memory_saver=False)
    kv = DeepSeekV4TokenToKVPool(**accepted(
        DeepSeekV4TokenToKVPool.__init__, max_num_reqs=MAX_REQS, swa_size=POOL, c4_size=POOL // 4, c128_size=POOL // 128,
        # sized as SGLang's pool configurator sizes the non-unified (fp8) pool: the ratio-4
        # compressor-state ring is addressed per SWA page (swa_tokens // page * ring), the
        # ratio-128 state per request slot
        c4_state_pool_size=POOL // PAGE * resolve_compress_state_ring_size(4),
        c128_state_pool_size=MAX_REQS * resolve_compress_state_ring_size(128), page_size=PAGE,
        swa_page_size=PAGE, dtype=torch.float8_e4m3fn, c4_state_dtype=torch.float32,
        c128_state_dtype=torch.float32, qk_nope_head_dim=448, qk_rope_head_dim=64,
        indexer_head_dim=128, layer_num=len(RATIOS), device="cpu", enable_memory_saver=False,
        compression_ratios=RATIOS, sliding_window=WINDOW, start_layer=0,
        end_layer=len(RATIOS), full_size=POOL,  # full_size: 0.5.21 on
        state_dtype=torch.float32))  # one state dtype before 0.5.14
    alloc = SWATokenToKVPoolAllocator(**accepted(
        SWATokenToKVPoolAllocator.__init__, size=POOL, size_swa=POOL, page_size=PAGE,
        dtype=torch.float8_e4m3fn, device="cpu", kvcache=kv, need_sort=False,
        req_to_token_pool=r2t))
    return r2t, kv, alloc, make_tree(r2t, alloc)


def page_view(buf, per_page):
    # (read, write) of one int32 marker per token slot of a page-major [pages, bytes] buffer:
    # slot s sits in page s // per_page, at int32 s % per_page of that page
    words = buf.view(torch.int32)
    def read(locs):
        return words[locs // per_page, locs % per_page].to(torch.int64)
    def write(locs, vals):
        words[locs // per_page, locs % per_page] = vals.to(torch.int32)
    return read, write


def states(kv):
    # the SWA window (SWA slots), compressed KV at ratio 4 and its indexer (full pages)
    return {"swa": ("swa", *page_view(kv.swa_kv_pool.kv_buffer[0], PAGE)),
            "ckv": ("full", *page_view(kv.c4_kv_pool.kv_buffer[0], PAGE)),
            "indexer": ("full", *page_view(kv.c4_indexer_kv_pool.index_k_with_scale_buffer[0],
                                            PAGE))}
"""

# FULL+SWA+Mamba (a hybrid SWA/linear-attention model): SGLang's HybridReqToTokenPool with a
# Mamba2 state pool beside the SWA KV pool, tree components FULL, SWA and MAMBA.  Two radix
# strategies: "no_buffer" (page 1: only the running state exists; a checkpoint copies it into a
# fresh slot, a finish donates it) and "extra_buffer" (page 4: the forward also writes the state
# at the tracked, chunk-aligned position into a ping-pong slot, and the tree keeps only those).
MAMBA = (
    SWA
    + """

from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
from sglang.srt.environ import envs as _envs
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

EXTRA_BUFFER = None  # the configuration's: the "extra_buffer" radix strategy
MAMBA_CHUNK = 16  # the Mamba cache chunk and track interval (tokens)
TREE_COMPONENTS = (ComponentType.FULL, ComponentType.SWA, ComponentType.MAMBA)
TREE_PARAMS = {"enable_mamba_extra_buffer": EXTRA_BUFFER}
if EXTRA_BUFFER:
    SERVER_ARGS = {"mamba_radix_cache_strategy": "extra_buffer",
                   "mamba_track_interval": MAMBA_CHUNK}
if not torch.cuda.is_available():
    # a device seam: prepare_for_decode pins its track mask before the H2D copy, and pinning
    # needs an accelerator; on a CPU the tensor is already where the copy puts it
    torch.Tensor.pin_memory = lambda self, *a, **k: self


def make_stack():
    # conservation counts the requests' own Mamba slots by the scheduler's own term (its
    # SchedulerInvariantChecker's, 0.5.22 on): a release without it is not driven here
    from sglang.srt.managers.scheduler_components.pool_stats_observer import kv_mamba_slots
    del kv_mamba_slots
    args = server_args()
    # a dummy model has no HF config to read mamba_chunk_size from: preset, as SGLang's own
    # unified-radix-cache fixtures do
    args._mamba_cache_chunk_size = MAMBA_CHUNK
    set_global_server_args_for_scheduler(args)
    # the smallest Mamba pool SGLang's configurator lets serve MAX_REQS requests: it caps them
    # at max_mamba_cache_size // _calculate_mamba_ratio() (3 slots a request, and the tracking
    # slots with the extra buffer); its method reads only the published configuration
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    mamba_slots = MAX_REQS * KVCacheConfigurator._calculate_mamba_ratio(None)
    with _envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
        shape = Mamba2StateShape.create(
            tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=2, head_dim=16,
            state_size=8, conv_kernel=4)
        params = Mamba2CacheParams(shape=shape, layers=[0])
    r2t = HybridReqToTokenPool(
        size=MAX_REQS, mamba_size=mamba_slots, mamba_spec_state_size=MAX_REQS,
        max_context_len=MAX_LEN, device="cpu", enable_memory_saver=False, cache_params=params,
        mamba_layer_ids=[0], enable_mamba_extra_buffer=EXTRA_BUFFER,
        speculative_num_draft_tokens=3)
    return make_swa_stack(r2t)


def mamba_states(r2t):
    # name -> (read, write) of one int32 marker per Mamba slot: the SSM (temporal) state and
    # the conv window of the Mamba layer, each slot's first bytes
    cache = r2t.mamba_pool.mamba_cache
    return {"ssm": slot_view(cache.temporal[0]), "conv": slot_view(cache.conv[0][0])}
"""
)

LAYOUTS = {"swa": SWA, "deepseek-v4": DSV4, "swa-mamba": MAMBA}

# HiCache's host tier (L2) on a CPU: SGLang's own four device seams stood in (no
# cudaHostRegister, no pinned host memory, sgl_kernel's transfer_kv_direct, which has no CPU
# build, as a plain index copy per layer, and a no-op CPU stream sync); everything else is
# SGLang's: init_hicache, its HybridCacheController, the host pool, write-through, load-back.
HICACHE = """\
import sglang.srt.mem_cache.memory_pool_host as _host_legacy
import sglang.srt.mem_cache.pool_host.common as _host_common
import sglang.srt.mem_cache.pool_host.mha as _host_mha
import contextlib
import sglang.srt.mem_cache.pool_host.base as _host_base
from sglang.srt.mem_cache.pool_host.base import HostKVCache

# 0.5.21 on: the host pool is booked against a budget scope (else this machine's free RAM)
host_memory_budget_scope = getattr(_host_base, "host_memory_budget_scope",
                                   lambda size: contextlib.nullcontext())

HOST_RATIO = {ratio}


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_indices.long()] = src[src_indices.long()]


_host_common._cuda_host_register = lambda *a, **k: None
HostKVCache.pin_memory = property(lambda self: False, lambda self, value: None)
_host_mha.transfer_kv_direct = _host_legacy.transfer_kv_direct = _transfer_kv_direct
torch.cpu.Stream.synchronize = lambda self: None
_make_device_stack = make_stack


def make_stack():
    # as the scheduler does with --enable-hierarchical-cache: the device stack, then init_hicache
    r2t, kv, alloc, tree = _make_device_stack()
{storage_setup}    args = server_args(hicache_ratio=HOST_RATIO,
                      hicache_io_backend="direct", hicache_mem_layout="layer_first",
                      hicache_write_policy="write_through"{storage})
    set_global_server_args_for_scheduler(args)
    with host_memory_budget_scope(1 << 30):  # booked against 1 GiB, not this machine's free RAM
        tree.init_hicache(args, tree_params(r2t, alloc))
    return r2t, kv, alloc, tree
"""


# SGLang's switches for the SWA pool that users turn on, with their defaults.  Every stack's
# prelude sets each of them (off or on), so one configuration's choice never leaks into the next
# built in the same process.  ``SGLANG_OPT_RELEASE_PREFILL_SWA``: once decode passes the window,
# the prefill's SWA lock is dropped (its SWA KV becomes evictable rather than freed);
# ``SGLANG_SWA_EVICTION_INTERVAL``: decode frees out-of-window SWA slots every that many tokens.
# ``SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS`` (on by default): a checkpoint first
# frees the request's out-of-window SWA slots.
SWITCHES = {
    "SGLANG_OPT_RELEASE_PREFILL_SWA": "false",
    "SGLANG_SWA_EVICTION_INTERVAL": "128",
    "SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS": "true",
}
SWA_SAVING = {"SGLANG_OPT_RELEASE_PREFILL_SWA": "true", "SGLANG_SWA_EVICTION_INTERVAL": "1"}


# L3: SGLang's file storage backend (HiCacheFile) in a fresh temporary directory, one rank
# (the distributed state a server would set up stood in by SGLang's own parallel override);
# prefetches wait until complete (wait_complete) and start at one page.
L3_SETUP = """\
    import tempfile
    from sglang.srt.runtime_context import get_parallel
    get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = tempfile.mkdtemp(prefix="sglang-l3-")
"""
L3_ARGS = (
    ', hicache_storage_backend="file", hicache_storage_prefetch_policy="wait_complete", '
    "hicache_storage_backend_extra_config='{\"prefetch_threshold\": %d}' % PAGE"
)


@dataclass(frozen=True)
class Config:
    layout: str  # a key of LAYOUTS
    core: str  # the tree core: "python" or "rust"
    page: int
    window: int
    pool: int  # tokens per pool (full and SWA alike): small enough that traffic evicts
    max_len: int
    saving: bool = False  # SWA_SAVING's switches on (else SWITCHES' defaults)
    hicache: str = ""  # "l2": HiCache's host tier (write-through), "l3": and file storage
    mamba: str = ""  # the swa-mamba layout's radix strategy: "no_buffer" or "extra_buffer"

    @property
    def label(self) -> str:
        return (
            f"{self.layout}/{self.core}/page{self.page}-window{self.window}/pool{self.pool}"
            + (f"/{self.mamba.replace('_', '-')}" if self.mamba else "")
            + ("/swa-saving" if self.saving else "")
            + (f"/hicache-{self.hicache}" if self.hicache else "")
        )

    @property
    def source(self) -> str:
        env = {**SWITCHES, **(SWA_SAVING if self.saving else {})}
        head = PRELUDE.format(
            core=self.core, page=self.page, window=self.window, pool=self.pool,
            max_len=self.max_len,
            switches="\n".join(f"os.environ[{k!r}] = {v!r}" for k, v in env.items()),
        )  # fmt: skip
        body = head + "\n" + LAYOUTS[self.layout]
        if self.mamba:
            body = body.replace(
                "\nEXTRA_BUFFER = None", f"\nEXTRA_BUFFER = {self.mamba == 'extra_buffer'}"
            )
        if self.hicache == "l2":
            body += "\n" + HICACHE.format(ratio=2.0, storage="", storage_setup="")
        elif self.hicache == "l3":
            body += "\n" + HICACHE.format(ratio=2.0, storage=L3_ARGS, storage_setup=L3_SETUP)
        return body


def _all() -> tuple[Config, ...]:
    out = []
    for core in ("python", "rust"):
        out += [
            Config("swa", core, 4, 16, 96, 256),  # page below the window
            Config("swa", core, 32, 8, 320, 512),  # page above the window
            Config("swa", core, 4, 16, 48, 256),  # a small pool: eviction under locks
            Config("deepseek-v4", core, 256, 128, 256 * 10, 2048),
            Config("swa", core, 4, 16, 96, 256, saving=True),
        ]
        # FULL+SWA+Mamba: page 1 without the extra buffer, page 4 with it
        out.append(Config("swa-mamba", core, 1, 16, 96, 256, mamba="no_buffer"))
        out.append(Config("swa-mamba", core, 4, 16, 96, 256, mamba="extra_buffer"))
    out.append(Config("deepseek-v4", "rust", 256, 128, 256 * 10, 2048, saving=True))
    out.append(Config("swa", "rust", 32, 8, 320, 512, saving=True))  # a page above the window
    for core in ("python", "rust"):  # HiCache's host tier: write-through, host eviction, load-back
        out.append(Config("swa", core, 4, 16, 96, 256, hicache="l2"))
    out.append(Config("deepseek-v4", "rust", 256, 128, 256 * 10, 2048, hicache="l2"))
    # and file storage (L3) behind it: prefetch, its progress, prefetch abort, a lost file
    out.append(Config("swa", "python", 4, 16, 96, 256, hicache="l3"))
    out.append(Config("deepseek-v4", "rust", 256, 128, 256 * 10, 2048, hicache="l3"))
    return tuple(out)


ALL = _all()
