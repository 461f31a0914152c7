"""The hit rule: the four validation layers, each a list of named rules over blocks or the hit.

A request may compute from a prefix hit of length ``h`` tokens only when every rule holds.
Each rule names its layer (L1 LCM whole-block, L2 kernel ABI, L3 multi-group intersection,
L4 byte alignment), the cache state and group it concerns, and a *scope*: which blocks of the
hit it constrains.  The scope is what differs between groups (compressed KV needs every block,
SWA only the last window, the tail only the boundary), so writing it as data lets three readers
derive their own form from one definition:

* the model's guard and invariant (:meth:`HitRule.holds`, :meth:`HitRule.block_ok`),
* the Z3 encoder (the same callables on symbolic terms),
* the implementation's longest-hit search (walks the rules and reports which one shortened
  the hit, by how much).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .expr import AND, CDIV, FDIV, IMPLIES, IN, MOD, forall_blocks
from .geometry import Geometry, KernelCombo
from .phases import CKV, Fmt, Indexer, Pipe, Swa, Tail

Fn = Callable[..., Any]


class RuleScope(enum.Enum):
    """Blocks a rule constrains, for a hit of ``h`` tokens (``nb = cdiv(h, L)`` blocks)."""

    ALL = "every block"  # [0, nb)
    WINDOW = "last window"  # [nb - W, nb)
    BOUNDARY = "boundary block"  # [nb - 1, nb)
    HIT = "the hit length"  # no block: a predicate on h itself


@dataclass(frozen=True)
class Rule:
    name: str
    layer: str  # "L1" .. "L4"
    state: str  # which cache state (or "lease", "layout")
    group: str  # which cache group
    scope: RuleScope
    pred: Fn  # pred(s, r, b) for block scopes, pred(s, r, h) for HIT
    doc: str = ""

    @cached_property
    def qualname(self) -> str:  # cached: the hit search names rules on every admission
        return f"{self.layer}.{self.name}"


def scope_range(rule: Rule, s: Any, h: Any) -> tuple[Any, Any]:
    """Block index range ``[lo, hi)`` that ``rule`` constrains for a hit of ``h`` tokens."""
    nb = CDIV(h, s.k.L)
    if rule.scope is RuleScope.ALL:
        return 0, nb
    if rule.scope is RuleScope.WINDOW:
        return nb - s.k.W, nb
    if rule.scope is RuleScope.BOUNDARY:
        return nb - 1, nb
    raise ValueError(f"rule {rule.qualname} has no block range")


@dataclass(frozen=True)
class HitRule:
    rules: tuple[Rule, ...]

    def rule(self, qualname: str) -> Rule:
        for r in self.rules:
            if r.qualname == qualname or r.name == qualname:
                return r
        raise KeyError(qualname)

    def layers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.layer for r in self.rules))

    def rule_holds(self, rule: Rule, s: Any, r: int, h: Any) -> Any:
        if rule.scope is RuleScope.HIT:
            return rule.pred(s, r, h)
        lo, hi = scope_range(rule, s, h)
        return forall_blocks(s, lo, hi, lambda b: rule.pred(s, r, b))

    def holds(self, s: Any, r: int, h: Any, *, layer: str | None = None) -> Any:
        """All rules (of one layer, if given) for request ``r`` at hit ``h``."""
        return AND(
            *[self.rule_holds(x, s, r, h) for x in self.rules if layer is None or x.layer == layer]
        )

    def block_ok(self, s: Any, r: int, h: Any, b: Any) -> Any:
        """The block-scoped rules at one block ``b`` (the per-block form for invariants)."""
        parts = []
        for x in self.rules:
            if x.scope is RuleScope.HIT:
                continue
            lo, hi = scope_range(x, s, h)
            parts.append(IMPLIES(AND(lo <= b, b < hi), x.pred(s, r, b)))
        return AND(*parts)

    def scalar_ok(self, s: Any, r: int, h: Any) -> Any:
        return AND(*[x.pred(s, r, h) for x in self.rules if x.scope is RuleScope.HIT])


def supported_formats(g: Geometry) -> tuple[int, ...]:
    """Fmt values whose block form, spliced with the tail and window, has a fused kernel."""
    forms = {
        Fmt.PRIMARY: g.primary_combo,
        Fmt.BF16: KernelCombo("bf16", "fp32", "bf16", g.compressed_block_tokens),
        Fmt.LEGACY: KernelCombo("fp8_e4m3/v1_576", "fp32", "bf16", g.compressed_block_tokens),
    }
    return tuple(int(f) for f, combo in forms.items() if combo in g.kernel_combos)


def _aligned(s: Any, r: int, h: Any) -> Any:
    """Byte offset of the splice point in every compressed group's paged layout is aligned."""
    k = s.k
    parts = []
    for ratio, page in zip((k.csa_ratio, k.hca_ratio), k.page_bytes, strict=True):
        per_block = k.block_tokens // ratio
        entries = FDIV(h, ratio)
        offset = FDIV(entries, per_block) * page + MOD(entries, per_block) * k.entry_bytes
        parts.append(MOD(offset, k.align) == 0)
        parts.append(page % k.align == 0)
    return AND(*parts)


DEFAULT_HIT_RULE = HitRule(
    (
        Rule("lcm_aligned", "L1", "all", "all", RuleScope.HIT,
             lambda s, r, h: AND(h >= 0, MOD(h, s.k.L) == 0, h <= s.N * s.k.L),
             "the hit is a whole number of LCM blocks of every group's block size and ratio"),
        Rule("lease_covers", "L1", "residency", "all", RuleScope.ALL,
             lambda s, r, b: s.lease[b] >= s.req(r).deadline,
             "every block's residency lease outlives the request (no prefix about to be evicted)"),
        Rule("kernel_abi", "L2", "Compressed KV", "csa+hca", RuleScope.ALL,
             lambda s, r, b: IN(s.fmt[b], s.k.supported_fmts),
             "compressed form + tail + window has a fused kernel"),
        Rule("ckv_ready", "L3", "Compressed KV", "csa+hca", RuleScope.ALL,
             lambda s, r, b: s.ckv[b] == CKV.READY,
             "every compressed block is on device and committed"),
        Rule("disk_loaded", "L3", "On-disk Prefix", "disk", RuleScope.ALL,
             lambda s, r, b: AND(s.prog[b] == s.k.load_steps, s.ldpipe[b] == Pipe.NONE),
             "no load is still in flight for a block of the hit"),
        Rule("indexer_synced", "L3", "Indexer State", "indexer", RuleScope.ALL,
             lambda s, r, b: AND(s.idx[b] == Indexer.PRESENT, s.iver[b] == s.ver[b]),
             "every indexer page is present and at the compressed KV's version"),
        Rule("swa_window", "L3", "SWA Window", "swa", RuleScope.WINDOW,
             lambda s, r, b: s.swa[b] == Swa.VALID,
             "the last window's SWA blocks are valid (older positions may be the null block)"),
        Rule("tail_sealed", "L3", "Uncompressed Tail", "compressor", RuleScope.BOUNDARY,
             lambda s, r, b: s.tail[b] == Tail.SEALED,
             "the compressor state was saved at this boundary"),
        Rule("splice_aligned", "L4", "Uncompressed Tail", "csa+hca", RuleScope.HIT, _aligned,
             "the tail/compressed splice offset and page strides meet the byte alignment"),
    )
)  # fmt: skip
