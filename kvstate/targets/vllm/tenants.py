"""Check class ``separation``: inputs other than the token ids keep their caches apart.

Two requests with the same token ids share KV only if the model computed the same thing for
both: a different cache salt (tenant isolation), LoRA adapter or image behind the same
placeholder tokens must never hit each other's blocks, and a request asking for prompt logprobs
must not read the cache at all (its logprobs need every prompt token computed).  The
``tenants`` configuration sends the same prompt families under such inputs; the driver keeps
each block's content *as the model saw it* (:func:`keyed_tokens`), so a hit across inputs is a
soundness failure that this module names for what it is.
"""

from __future__ import annotations

from typing import Any

from .checks import Violation

TENANTS = 8  # 0 plain; 1-2 cache salts; 3-4 LoRA adapters; 5-6 images; 7 prompt logprobs

# Standalone source (exec'd by the driver and pasted into reproducers), after the prelude.
SOURCE = '''\
HASH_BLOCK, SCHED_BLOCK, MAX_LEN = 16, 16, 512
def make_manager(num_blocks, use_eagle):
    fa = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
    groups = [KVCacheGroupSpec(["attn"], fa)]
    return manager_from_groups(groups, num_blocks, use_eagle, MAX_LEN, SCHED_BLOCK, HASH_BLOCK)
IMAGE_AT, IMAGE_LEN, PLACEHOLDER = 8, 16, 50001
def make_tenant_request(rid, tokens, tenant):
    """The same tokens under inputs that must not share KV: tenants 1-2 cache salts, 3-4 LoRA
    adapters, 5-6 two images over tokens [8, 24), 7 prompt logprobs; 0 none of them."""
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    tokens, extra = list(tokens), {}
    params = SamplingParams(max_tokens=4096, prompt_logprobs=1 if tenant == 7 else None)
    if tenant in (1, 2):
        extra["cache_salt"] = f"salt-{tenant}"
    elif tenant in (3, 4):
        extra["lora_request"] = LoRARequest(f"adapter-{tenant}", tenant, f"/adapters/{tenant}")
    elif tenant in (5, 6) and len(tokens) >= IMAGE_AT + IMAGE_LEN:
        tokens[IMAGE_AT:IMAGE_AT + IMAGE_LEN] = [PLACEHOLDER] * IMAGE_LEN
        extra["mm_features"] = [MultiModalFeatureSpec(
            data=None, modality="image", identifier=f"image-{tenant}",
            mm_position=PlaceholderRange(offset=IMAGE_AT, length=IMAGE_LEN))]
    hasher = get_request_block_hasher(HASH_BLOCK, sha256)
    return kw(Request, rid, tokens, params, None, block_hasher=hasher, **extra)
'''


def keyed_tokens(req: Any) -> list[Any]:
    """The request's tokens as the model sees them: under its salt or adapter, images by id."""
    toks: list[Any] = list(req.all_token_ids)
    tag = None
    if getattr(req, "cache_salt", None):
        tag = ("salt", req.cache_salt)
    lora = getattr(req, "lora_request", None)
    if lora is not None:
        tag = ("lora", lora.lora_name, lora.lora_path)
    if tag is not None:
        toks = [(tag, t) for t in toks]
    for f in getattr(req, "mm_features", None) or []:
        o, n = f.mm_position.offset, f.mm_position.length
        for i in range(o, min(o + n, len(toks))):
            toks[i] = ("mm", f.identifier, i - o)
    return toks


def reads_no_cache(req: Any) -> bool:
    """Prompt logprobs need every prompt token computed: such a request reads no cache."""
    sp = getattr(req, "sampling_params", None)
    return sp is not None and getattr(sp, "prompt_logprobs", None) is not None


def separation_violations(
    req: Any,
    hit: int,
    blocks: tuple[list[Any], ...],
    block_sizes: list[int],
    content: dict[int, tuple[Any, ...]],
    raw: dict[int, tuple[int, ...]],
) -> list[Violation]:
    """A hit on a block computed for the same token ids under other inputs, or any hit at all
    for a request that must not read the cache."""
    if reads_no_cache(req) and hit:
        return [
            Violation(
                "separation",
                f"request {req.request_id} asks for prompt logprobs yet read {hit} tokens "
                f"from the prefix cache",
            )
        ]
    keyed = keyed_tokens(req)
    toks = req.all_token_ids
    for g, (lst, bs) in enumerate(zip(blocks, block_sizes, strict=True)):
        for j, b in enumerate(lst):
            if b.is_null:
                continue
            end = (j + 1) * bs
            have = content.get(b.block_id)
            if (
                have is not None
                and have != tuple(keyed[:end])
                and raw.get(b.block_id) == tuple(toks[:end])
            ):
                return [
                    Violation(
                        "separation",
                        f"request {req.request_id} hit block {b.block_id} (group {g}, index "
                        f"{j}): the same {end} token ids, computed under other inputs "
                        f"(cache salt, LoRA adapter or image) than its own",
                    )
                ]
    return []
