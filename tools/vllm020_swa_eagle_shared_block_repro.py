"""vLLM 0.20.0: one request holds the same block in two KV cache groups (fixed by 0.33.0).

Full attention + a sliding window of 32 (both block 16), EAGLE on, ``KVCacheManager`` driven on a
CPU: a request is preempted and re-admitted with a local prefix hit of 48 tokens plus 16 tokens
a KV connector loads (``num_external_computed_tokens=16``); afterwards block 7 is in its
full-attention block table and in its sliding-window block table at once, so the two groups'
layers would write one physical page.  Found by ``kvstate fuzz --target vllm`` (ci walks, 6
examples of ``swa+eagle/pool16``, minimized by ddmin) in a separate venv with vLLM 0.20.0
(``VLLM_VERSION=0.20.0 tools/install_vllm.sh``); ``swa-draft+eagle/pool16`` fails the same way.

Exit status 0 when reproduced (vLLM 0.20.0), 1 when not (vLLM 0.33.0 passes).  Run it from
outside the repository (its ``kernels/`` folder shadows a package vLLM imports).
"""

# vLLM 0.20.0 (from /tmp/venv-vllm020/lib/python3.11/site-packages/vllm, kv_cache_manager & co. sha256 30592a9c2daa) KVCacheManager, configuration swa+eagle/pool16;
# found by kvstate fuzz --target vllm. Runs on a CPU: no model, GPU or scheduler.
import inspect

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request, RequestStatus


def kw(fn, *args, **kwargs):
    """Call with the keyword arguments this vLLM release accepts."""
    params = inspect.signature(fn).parameters
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def manager_from_groups(groups, num_blocks, use_eagle, max_len, sched_block, hash_block, **knobs):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cfg = generate_scheduler_kv_cache_config([cfg])  # what the engine core hands the scheduler
    return kw(
        KVCacheManager,
        cfg,
        max_model_len=max_len,
        scheduler_block_size=sched_block,
        hash_block_size=hash_block,
        enable_caching=True,
        use_eagle=use_eagle,
        enable_kv_cache_events=True,
        **knobs,
    )


def group(names, spec, **flags):
    """A group, with the flags this release's ``KVCacheGroupSpec`` has (``is_eagle_group``)."""
    return kw(KVCacheGroupSpec, names, spec, **flags)


init_none_hash(sha256)


def make_request(manager_hash_block, rid, tokens):
    hasher = get_request_block_hasher(manager_hash_block, sha256)
    return kw(
        Request, rid, list(tokens), SamplingParams(max_tokens=4096), None, block_hasher=hasher
    )


HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 16, 512


def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
    sw = SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=32
    )
    groups = [KVCacheGroupSpec(["attn"], fa), KVCacheGroupSpec(["swa"], sw)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)


def tokens_of(family, start, stop):
    return [(family * 7919 + i * 104729) % 50000 for i in range(start, stop)]


def admit(kvm, req, n, external):
    """The scheduler's admission of ``req``: its prefix hit, ``n`` new tokens (lookahead 2 for
    EAGLE), ``external`` tokens a KV connector loads."""
    blocks, hit = kvm.get_computed_blocks(req)[:2]
    kw(
        kvm.allocate_slots,
        req,
        n,
        num_new_computed_tokens=hit,
        new_computed_blocks=blocks,
        num_lookahead_tokens=2,
        num_external_computed_tokens=external,
        full_sequence_must_fit=True,
    )
    req.status = RequestStatus.RUNNING
    return hit


def decode(kvm, req, n, computed, outputs):
    """One decode step of ``req``: ``n`` slots (lookahead 2), then its new output tokens."""
    kvm.new_step_starts()
    kw(kvm.allocate_slots, req, n, num_lookahead_tokens=2)
    req.num_computed_tokens = computed
    req.append_output_token_ids(outputs)


PROMPT = tokens_of(1, 0, 48) + tokens_of(12, 48, 59)  # 59 tokens: 3 full blocks and a part

kvm = make_manager(16, use_eagle=True)
r0 = make_request(HASH_BLOCK, "r0", PROMPT)
admit(kvm, r0, 27, external=32)  # hit 0
r0.num_computed_tokens = 59
r0.append_output_token_ids([59])
kvm.free(r0)
s1 = make_request(HASH_BLOCK, "s1", PROMPT)
admit(kvm, s1, 27, external=0)  # hit 32
s1.num_computed_tokens = 59
s1.append_output_token_ids([31090])
decode(kvm, s1, 3, 62, [31091, 31092, 31093])
decode(kvm, s1, 2, 63, [31094])
decode(kvm, s1, 3, 66, [31095, 31096, 31097])
s2 = make_request(HASH_BLOCK, "s2", PROMPT)
admit(kvm, s2, 27, external=0)  # hit 32
s2.num_computed_tokens = 59
s2.append_output_token_ids([31121])
kvm.free(s1)
s1.status = RequestStatus.PREEMPTED
s1.num_computed_tokens = 0
admit(kvm, s1, 3, external=16)  # hit 48: re-admitted after preemption
s1.num_computed_tokens = 67
s1.append_output_token_ids([31098])

# The last call breaks:
#   [exclusive] block 7 serves groups [('s1', 0, 3), ('s1', 1, 2)] at once


mgrs = kvm.coordinator.single_type_managers
ids = [[b.block_id for b in m.req_to_blocks.get("s1", []) if not b.is_null] for m in mgrs]
shared = sorted(set(ids[0]) & set(ids[1]))
print("s1 blocks per group:", ids)
if shared:
    print(f"reproduced: block(s) {shared} held by s1 in two groups at once")
    raise SystemExit(0)
print("not reproduced: no block in two groups")
raise SystemExit(1)
