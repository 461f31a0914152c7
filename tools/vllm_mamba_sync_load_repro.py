"""vLLM 0.33.0: one ``Scheduler.schedule()`` call raises ``ValueError`` from the block pool.

Mamba "align" mode under-counts the blocks of a KV connector's synchronous load
(docs/vllm-findings.md, Finding 1), reached through the scheduler's own call sequence: two
requests arrive (41 and 29 tokens), a KV connector holds the first 16 tokens of each and loads them synchronously,
and the first ``schedule()`` admits the first request, then calls ``allocate_slots`` for the
second, whose admission gate counts one Mamba block too few: ``get_new_blocks`` raises
``ValueError: Cannot get 1 free blocks from the pool``, which no caller catches (the engine core
dies).  Minimized by ``kvstate fuzz --target vllm-scheduler`` (ddmin) to three operations.

Needs only vLLM (CPU install: ``tools/install_vllm.sh``): ``python
tools/vllm_mamba_sync_load_repro.py`` (a script's own folder heads ``sys.path``, not the working
directory, so this repository's ``kernels/`` folder does not shadow the package transformers
imports).  Exit status 0 with
"reproduced" when the error is raised, 1 when ``schedule()`` returns normally.

``ModelConfig`` cannot be built on a CPU install (resolving the architecture imports
``vllm._C``); the ``VllmConfig`` is built without one and given a stub carrying the nine settings
the scheduler reads, none of which reaches the KV cache manager (see
kvstate/targets/vllm_scheduler/standalone.py, ``StubModelConfig``).
"""

import sys

import torch
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, SchedulerConfig, VllmConfig
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
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager


class SyncConnector(KVConnectorBase_V1, SupportsHMA):
    """Holds the first 16 tokens of every prompt and loads them synchronously."""

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return max(0, 16 - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    def build_connector_meta(self, scheduler_output):
        return KVConnectorMetadata()

    def request_finished_all_groups(self, request, block_ids):
        return False, None

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass


class StubModelConfig:
    """What the scheduler reads of the model configuration: a text-only generative model."""

    max_model_len = 80  # the longest request a pool of 8 blocks holds (vLLM's start-up check)
    skip_tokenizer_init = True
    uses_mrope = is_encoder_decoder = is_diffusion = supports_multimodal_inputs = False
    return_sampling_mask = False
    multimodal_config = None
    runner_type = "generate"


init_none_hash(sha256)
NUM_BLOCKS = 8  # one of them is vLLM's null block
cache = CacheConfig(block_size=16, enable_prefix_caching=True, mamba_cache_mode="align")
cfg = VllmConfig(
    device_config=DeviceConfig(device="cpu"),
    cache_config=cache,
    scheduler_config=SchedulerConfig(
        max_num_batched_tokens=48,
        max_num_seqs=6,
        max_model_len=StubModelConfig.max_model_len,
        is_encoder_decoder=False,
    ),
    kv_transfer_config=KVTransferConfig(
        kv_connector="SyncConnector", kv_role="kv_both", kv_connector_module_path=__name__
    ),
)
cfg.model_config = StubModelConfig()
cache.num_gpu_blocks = NUM_BLOCKS
fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
mb = MambaSpec(block_size=16, shapes=((2, 4),), dtypes=(torch.float32,), mamba_cache_mode="align")
groups = [KVCacheGroupSpec(["attn"], fa), KVCacheGroupSpec(["mamba"], mb)]
kv_cfg = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)
sched = Scheduler(
    vllm_config=cfg,
    kv_cache_config=generate_scheduler_kv_cache_config([kv_cfg]),
    structured_output_manager=StructuredOutputManager(cfg),
    block_size=16,
)
for k, (rid, n, max_tokens) in enumerate((("r0", 41, 11), ("r1", 29, 7))):
    sched.add_request(
        Request(
            rid,
            [(7919 * k + 104729 * i) % 50000 for i in range(n)],  # no prefix in common
            SamplingParams(max_tokens=max_tokens),
            None,
            block_hasher=get_request_block_hasher(16, sha256),
        )
    )
try:
    out = sched.schedule()
except ValueError as e:
    print(f"reproduced: schedule() raised ValueError: {e}")
    sys.exit(0)
print("not reproduced: schedule() returned", dict(out.num_scheduled_tokens))
sys.exit(1)
