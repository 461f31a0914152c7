"""The group layouts the vLLM target drives, each as standalone source built from vLLM's classes.

Each configuration is *source text* (exec'd here, and pasted verbatim into a finding's
reproducer) that defines ``make_manager(num_blocks, use_eagle)`` and the geometry constants
``HASH_BLOCK`` (tokens per block hash), ``SCHED_BLOCK`` (the scheduler block, the LCM of the
group block sizes) and ``MAX_LEN``.  DeepSeek-V4's layout is grouped by vLLM's own grouping
function (``get_kv_cache_groups``) from the spec classes its layers return: a full ``VllmConfig``
cannot be built without a device, so the four settings that function reads are given by a stub.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import tenants as vllm_tenants

PRELUDE = '''\
import inspect
import types

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config, get_request_block_hasher, init_none_hash,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus


def kw(fn, *args, **kwargs):
    """Call with the keyword arguments this vLLM release accepts."""
    params = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def manager_from_groups(groups, num_blocks, use_eagle, max_len, sched_block, hash_block,
                        **knobs):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cfg = generate_scheduler_kv_cache_config([cfg])  # what the engine core hands the scheduler
    return kw(KVCacheManager, cfg, max_model_len=max_len, scheduler_block_size=sched_block,
              hash_block_size=hash_block, enable_caching=True, use_eagle=use_eagle,
              enable_kv_cache_events=True, **knobs)


def group(names, spec, **flags):
    """A group, with the flags this release's ``KVCacheGroupSpec`` has (``is_eagle_group``)."""
    return kw(KVCacheGroupSpec, names, spec, **flags)


init_none_hash(sha256)


def make_request(manager_hash_block, rid, tokens):
    hasher = get_request_block_hasher(manager_hash_block, sha256)
    return kw(Request, rid, list(tokens), SamplingParams(max_tokens=4096), None,
              block_hasher=hasher)
'''

F16 = "torch.float16"

CONFIGS: dict[str, str] = {
    "full": f"""\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 16, 512
def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16})
    groups = [KVCacheGroupSpec(["attn"], fa)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)
""",
    "full-2sizes": f"""\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 32, 512
def make_manager(num_blocks, use_eagle):
    fa16 = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16})
    fa32 = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=4, dtype={F16})
    groups = [KVCacheGroupSpec(["attn.a"], fa16), KVCacheGroupSpec(["attn.b"], fa32)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)
""",
    "swa": f"""\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 16, 512
def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16})
    sw = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16},
                           sliding_window=32)
    groups = [KVCacheGroupSpec(["attn"], fa), KVCacheGroupSpec(["swa"], sw)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)
""",
    "mamba": f"""\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 16, 512
def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16})
    mb = MambaSpec(block_size=16, shapes=((2, 4),), dtypes=(torch.float32,),
                   mamba_cache_mode="align")
    groups = [KVCacheGroupSpec(["attn"], fa), KVCacheGroupSpec(["mamba"], mb)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)
""",
    "deepseek-v4": '''\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 4, 256, 2048
def dsv4_layer_specs():
    """The specs DeepSeek-V4's layers return (attention.py, compressor.py, sparse_swa.py)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec
    bf16 = torch.bfloat16
    specs = {}
    for i, ratio in enumerate([4, 128, 4, 128]):  # CSA and HCA layers alternate
        specs[f"l{i}.swa"] = SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=512, dtype=bf16,
            sliding_window=128, alignment=512, model_version="deepseek_v4")
        specs[f"l{i}.attn"] = MLAAttentionSpec(
            block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=512, dtype=bf16,
            tokens_per_state=ratio, alignment=512, model_version="deepseek_v4")
        coff = 1 + (ratio == 4)  # CSA's compressor keeps two overlapping windows
        specs[f"l{i}.compressor"] = SlidingWindowMLASpec(
            block_size=4 if ratio == 4 else 8, num_kv_heads=1, max_tp_shards=1,
            head_size=coff * 512 * 2, dtype=torch.float32, sliding_window=coff * ratio,
            alignment=512)
        if ratio == 4:
            specs[f"l{i}.indexer"] = MLAAttentionSpec(
                block_size=256, num_kv_heads=1, max_tp_shards=1, head_size=132,
                dtype=torch.uint8, tokens_per_state=4, alignment=512)
            specs[f"l{i}.indexer.compressor"] = SlidingWindowMLASpec(
                block_size=4, num_kv_heads=1, max_tp_shards=1, head_size=2 * 128 * 2,
                dtype=torch.float32, sliding_window=8, alignment=512)
    return specs
def dsv4_groups():
    """vLLM's own grouping; the stub carries the only settings it reads."""
    from vllm.config.cache import KVCacheLayout
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
    layout = next(x for x in KVCacheLayout if x.is_block_outermost)
    stub = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        attention_config=types.SimpleNamespace(hisparse_config=None),
        cache_config=types.SimpleNamespace(get_resolved_kv_cache_layout=lambda: layout),
        model_config=types.SimpleNamespace(supports_kv_cache_grouping=False),
    )
    return get_kv_cache_groups(stub, dsv4_layer_specs())
def make_manager(num_blocks, use_eagle):
    return manager_from_groups(dsv4_groups(), num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK,
                               HASH_BLOCK)
''',
    "tenants": vllm_tenants.SOURCE,
    # The EAGLE draft layers in a sliding-window group of their own (``is_eagle_group``): the
    # last-block drop applies to that group only, the full-attention group keeps its blocks.
    "swa-draft": f"""\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 16, 512
def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16})
    sw = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16},
                           sliding_window=32)
    groups = [group(["attn"], fa), group(["draft.swa"], sw, is_eagle_group=True)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)
""",
    # Two full-attention groups (one spec, two block tables) beside a sliding-window group.
    "full2-swa": f"""\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 16, 512
def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16})
    sw = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16},
                           sliding_window=32)
    groups = [group(["attn.a"], fa), group(["attn.b"], fa), group(["swa"], sw)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)
""",
    # Mamba "align" with the manager's shared-prefix checkpoint (a state kept at the junction
    # where requests sharing a prefix diverge) and speculative state blocks for EAGLE.
    "mamba-prefix": f"""\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 64, 512
def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype={F16})
    mb = kw(MambaSpec, block_size=64, shapes=((2, 4),), dtypes=(torch.float32,),
            mamba_cache_mode="align", num_speculative_blocks=2 if use_eagle else 0)
    groups = [group(["attn"], fa), group(["mamba"], mb, is_eagle_group=use_eagle)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK,
                               enable_mamba_shared_prefix_checkpoint=True)
""",
}

# Pools small enough that the fuzzer's traffic evicts (blocks, incl. the null block).
POOL = {"full": 14, "full-2sizes": 16, "swa": 16, "mamba": 24, "deepseek-v4": 320, "tenants": 14,
        "swa-draft": 16, "full2-swa": 20, "mamba-prefix": 24}  # fmt: skip


@dataclass(frozen=True)
class Config:
    name: str
    use_eagle: bool
    num_blocks: int

    @property
    def label(self) -> str:
        return f"{self.name}{'+eagle' if self.use_eagle else ''}/pool{self.num_blocks}"

    @property
    def source(self) -> str:
        return PRELUDE + "\n" + CONFIGS[self.name]


# Every layout of the first five with EAGLE off and on; the tenants' inputs (one full-attention
# group) once; then the later layouts, each once, with EAGLE where the layout is about it.
FIRST = ("full", "full-2sizes", "swa", "mamba", "deepseek-v4")
LATER = (("swa-draft", True), ("full2-swa", False), ("mamba-prefix", True))
ALL = (
    tuple(Config(n, e, POOL[n]) for n in FIRST for e in (False, True))
    + (Config("tenants", False, POOL["tenants"]),)
    + tuple(Config(n, e, POOL[n]) for n, e in LATER)
)
