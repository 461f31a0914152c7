"""The table's rules projected onto what vLLM's KV cache manager exposes.

Nothing here restates a rule.  The hit rule's layers come from ``spec/layers.py``: each rule is
evaluated by the spec's own ``HitRule.rule_holds`` (its predicate over its scope) on a
*projected state* built from vLLM's answer, in LCM blocks (``L`` = the scheduler block, the LCM
of vLLM's group block sizes).  The invariants come from ``spec/default.py`` by name; each one
vLLM can be held to has a projection below, and the ones it cannot are listed with the reason.
A change to the table that adds a rule or an invariant without a projection or a reason fails
at import (``_check_coverage``), so the two cannot drift apart silently.

What the projection decides is only *which tokens of an LCM block a vLLM group reads* at a hit
boundary ``h`` (vLLM geometry: full attention every token, a sliding window its last
``window - 1`` tokens, a Mamba or compressor state the block ending at ``h``); the spec's rule
scope decides which LCM blocks must be ready (every block, the last window, the boundary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from math import lcm
from types import SimpleNamespace
from typing import Any

from kvstate.spec.default import default_table
from kvstate.spec.layers import DEFAULT_HIT_RULE, Rule
from kvstate.spec.phases import CKV, Indexer, Swa, Tail

# vLLM group kind -> the spec rules' ``group`` it stands for, and the column its readiness fills.
COLUMN = {"csa+hca": "ckv", "indexer": "idx", "swa": "swa", "compressor": "tail"}
READY = {"ckv": int(CKV.READY), "idx": int(Indexer.PRESENT), "swa": int(Swa.VALID),
         "tail": int(Tail.SEALED)}  # fmt: skip
NOT_READY = {"ckv": int(CKV.FREE), "idx": int(Indexer.ABSENT), "swa": int(Swa.NULL),
             "tail": int(Tail.NONE)}  # fmt: skip

# Hit-rule rules with no counterpart in vLLM's manager, and why.
RULES_NOT_PROJECTED = {
    "L1.lease_covers": "vLLM has no residency lease; its pin is ref_cnt (refcount, toctou)",
    "L2.kernel_abi": "vLLM stores one block form per group: no per-block format to check",
    "L3.disk_loaded": "no disk tier in the manager; a KV connector's external tokens are its own",
    "L4.splice_aligned": "byte offsets are the worker's layout, not the manager's",
}
# Invariants: the check classes that project each one, or why none does.
INVARIANT_PROJECTION = {
    "refcount": ("refcount", "free_queue"),
    "ghost_counters": ("free_queue",),
    "toctou": ("toctou", "exclusive", "window"),
    "hit_soundness": ("L1", "L3", "soundness"),
    # ghost truth: the content a hit names is the prompt's (the hash chain) and a held block's
    # content does not change while it is held
    "hit_truth": ("soundness",),
    "reading_truth": ("toctou", "exclusive", "window"),
}
INVARIANTS_NOT_PROJECTED = {
    "graph_topology": "no CUDA graph in the manager",
    "admission_cap": "no disk I/O queue; vLLM's admission gate is allocate_slots returning None",
    "separation": "no recovery pipelines in the manager",
    "load_integrity": "no partial loads in the manager",
    "request_hygiene": "checked as refcount (holders) and toctou",
    "domains": "typing of the spec's own phase variables",
    "graph_truth": "no CUDA graph in the manager",
    "load_truth": "no partial loads in the manager (a connector's transfer is its own)",
    "mechanism_truth": "relates the spec's own mechanism variables to its ghost truth",
}
CHECK_CLASSES = (
    "refcount",
    "free_queue",
    "exclusive",
    "toctou",
    "L1",
    "L3",
    "soundness",
    "completeness",
    "window",  # window.py
    "eviction",  # evict.py
    "reset",  # reset.py
    "events",  # events.py
    "separation",  # tenants.py
)


def _check_coverage() -> None:
    names = {r.qualname for r in DEFAULT_HIT_RULE.rules}
    projected = {r.qualname for r in projected_rules()}
    missing = names - projected - set(RULES_NOT_PROJECTED)
    invs = {i.name for i in default_table().invariants}
    missing_inv = invs - set(INVARIANT_PROJECTION) - set(INVARIANTS_NOT_PROJECTED)
    if missing or missing_inv:
        raise RuntimeError(f"vLLM projection misses table entries: {missing | missing_inv}")


def projected_rules() -> tuple[Rule, ...]:
    """The hit rule's rules vLLM can be held to: L1 alignment and the L3 group rules."""
    return tuple(
        r
        for r in DEFAULT_HIT_RULE.rules
        if r.qualname not in RULES_NOT_PROJECTED and (r.layer == "L1" or r.group in COLUMN)
    )


@dataclass
class Group:
    """One vLLM KV cache group as the projection sees it."""

    index: int
    block_size: int
    kind: tuple[str, ...]  # spec groups it stands for ("csa+hca", "indexer", "swa", "compressor")
    reads_last: int | None  # tokens before the boundary it reads (None: every token)
    cacheable: bool = True


def classify(index: int, spec: Any, layer_names: list[str], block_size: int) -> Group:
    """Map a vLLM spec (by its class) to the spec group(s) whose rules it must meet."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    first = getattr(spec, "first_spec", spec)  # UniformTypeKVCacheSpecs wraps one kind
    cacheable = bool(getattr(spec, "prefix_cacheable", True))
    state = any("compressor" in n for n in layer_names)
    if isinstance(first, MambaSpec):
        return Group(index, block_size, ("compressor",), block_size, cacheable)
    if isinstance(first, SlidingWindowSpec):
        kind = ("compressor",) if state else ("swa",)
        return Group(index, block_size, kind, first.sliding_window - 1, cacheable)
    if isinstance(first, FullAttentionSpec):
        kind = ("csa+hca", "indexer") if any("indexer" in n for n in layer_names) else ("csa+hca",)
        return Group(index, block_size, kind, None, cacheable)
    return Group(index, block_size, ("csa+hca",), None, cacheable)


class _Projected(SimpleNamespace):
    """The projected state: the spec's state shape, with ConcreteState's block quantifier."""

    def forall_blocks(self, lo: int, hi: int, body: Any) -> bool:
        return all(body(b) for b in range(max(lo, 0), min(hi, self.N)))


@dataclass
class Violation:
    check: str
    message: str


@dataclass
class Geometry:
    groups: list[Group]
    L: int  # LCM of the cacheable groups' block sizes (vLLM's scheduler block)
    hash_block: int
    max_len: int
    use_eagle: bool
    W: int = field(init=False)  # the longest window in LCM blocks (spec scope WINDOW)

    def __post_init__(self) -> None:
        longest = max((g.reads_last or 1 for g in self.groups if g.reads_last), default=1)
        self.W = max(1, -(-longest // self.L))


def geometry_of(manager: Any, use_eagle: bool) -> Geometry:
    groups = []
    for i, g in enumerate(manager.kv_cache_config.kv_cache_groups):
        bs = manager.coordinator.single_type_managers[i].block_size
        groups.append(classify(i, g.kv_cache_spec, list(g.layer_names), bs))
    L = lcm(*[g.block_size for g in groups if g.cacheable])
    hash_block = manager.block_pool.hash_block_size
    return Geometry(groups, L, hash_block, manager.max_model_len, use_eagle)


# ---------------------------------------------------------------------------------------------
# Completeness.  The proofs add a completeness rule to the table in parallel; this is the one
# place that computes what that rule promises for vLLM's geometry, so it can be pointed at the
# table's rule once both are merged.
# ---------------------------------------------------------------------------------------------
@cache
def _completeness() -> Any:
    rule = default_table().completeness
    assert rule is not None, "the default table states completeness"
    return rule


def expected_complete_hit(geo: Geometry, prompt_len: int, computed_common: int) -> int:
    """COMPLETENESS: the hit a re-sent prompt must get when nothing was evicted since it ran:
    the table's completeness rule, projected onto vLLM's admission.

    ``computed_common`` is how many of its tokens an earlier request computed (and cached).  The
    hit is capped one token short of the prompt (its last token is recomputed for logits),
    rounded down to whole LCM blocks (L1), and with EAGLE one LCM block less: the drafter's KV at
    a block's last position depends on the token after it, so the last block is not reusable.
    """
    cap = min(prompt_len - 1, computed_common)
    # the table's completeness rule (spec: Completeness.expected_hit), on vLLM's LCM
    rule = _completeness()
    h = rule.expected_hit(cap, SimpleNamespace(lcm_tokens=geo.L))  # type: ignore[arg-type]
    if geo.use_eagle:
        h = max(0, h - geo.L)
    return h


def hit_violations(
    geo: Geometry,
    hit: int,
    blocks: tuple[list[Any], ...],
    tokens: list[int],
    content: dict[int, tuple[int, ...]],
) -> list[Violation]:
    """L1, L3 and soundness of one answer of ``get_computed_blocks``, via the spec's rules."""
    out: list[Violation] = []
    nb = hit // geo.L if geo.L else 0
    # L3 (all groups agree): each cacheable group covers exactly the reported hit.
    for g in geo.groups:
        if not g.cacheable:
            continue
        got = len(blocks[g.index])
        if hit % g.block_size or got != hit // g.block_size:
            out.append(
                Violation(
                    "L3",
                    f"group {g.index} ({'/'.join(g.kind)}, block {g.block_size}) returned {got} "
                    f"blocks for a hit of {hit} tokens (expected {hit / g.block_size:g})",
                )
            )
    # Soundness: every returned (non-null) block holds exactly the prompt's prefix it stands for.
    for g in geo.groups:
        for j, b in enumerate(blocks[g.index]):
            if b.is_null:
                continue
            want = tuple(tokens[: (j + 1) * g.block_size])
            have = content.get(b.block_id)
            if have != want:
                what = "was never computed" if have is None else "holds another prefix"
                out.append(
                    Violation(
                        "soundness",
                        f"hit block {b.block_id} (group {g.index}, index {j}) {what}: its content "
                        f"does not match the prompt's first {(j + 1) * g.block_size} tokens",
                    )
                )
    # The projected state in LCM blocks, and the spec's rules on it.
    n_cap = max(nb, geo.max_len // geo.L) + 1
    cols: dict[str, list[int]] = {c: [READY[c]] * n_cap for c in READY}
    for g in geo.groups:
        if not g.cacheable:
            continue
        lo = 0 if g.reads_last is None else max(0, hit - g.reads_last)
        for lb in range(nb):
            a, z = max(lb * geo.L, lo), (lb + 1) * geo.L
            ok = a < z  # an LCM block the group does not read at all holds nothing of it
            for t0 in range(a - a % g.block_size, z, g.block_size) if ok else ():
                j = t0 // g.block_size
                lst = blocks[g.index]
                blk = lst[j] if j < len(lst) else None
                if (
                    blk is None
                    or blk.is_null
                    or content.get(blk.block_id) != tuple(tokens[: (j + 1) * g.block_size])
                ):
                    ok = False
                    break
            for kind in g.kind:
                c = COLUMN[kind]
                if not ok:
                    cols[c][lb] = NOT_READY[c]
    s = _Projected(
        k=SimpleNamespace(L=geo.L, W=geo.W),
        N=n_cap,
        ckv=cols["ckv"],
        idx=cols["idx"],
        iver=[0] * len(cols["idx"]),
        ver=[0] * len(cols["idx"]),
        swa=cols["swa"],
        tail=cols["tail"],
    )
    for rule in projected_rules():
        if rule.layer != "L1" and (hit == 0 or not any(rule.group in g.kind for g in geo.groups)):
            continue  # an empty hit needs no state; a rule for a group this model lacks is moot
        if not bool(DEFAULT_HIT_RULE.rule_holds(rule, s, 0, hit)):
            out.append(
                Violation(
                    rule.layer,
                    f"{rule.qualname} fails at hit {hit} (L={geo.L}): {rule.doc}",
                )
            )
    return out


_check_coverage()
