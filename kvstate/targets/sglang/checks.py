"""The table's rules projected onto what SGLang's unified radix cache and its pools expose.

Nothing here restates a rule.  The hit rule's rules come from ``spec/layers.py`` and are
evaluated by the spec's own ``HitRule.rule_holds`` on a *projected state* built from SGLang's
answer (one LCM block per SGLang page): a page's column is ready when every state buffer of that
column holds, at the slots the hit names, the markers of the new request's own prefix (the
driver writes them where the forward pass would).  The invariants come from the default table by
name; each one SGLang can be held to names the check classes that project it, the others say
why not.  A table that gains a rule or an invariant with neither fails at import
(``_check_coverage``), so the two cannot drift apart silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any

from kvstate.spec.default import default_table
from kvstate.spec.layers import DEFAULT_HIT_RULE, Rule
from kvstate.spec.phases import CKV, Indexer, Swa, Tail

# SGLang state buffer (a configuration's STATES key) -> the spec column its markers fill
COLUMN = {"full": "ckv", "ckv": "ckv", "indexer": "idx", "swa": "swa"}
READY = {"ckv": int(CKV.READY), "idx": int(Indexer.PRESENT), "swa": int(Swa.VALID),
         "tail": int(Tail.SEALED)}  # fmt: skip
NOT_READY = {"ckv": int(CKV.FREE), "idx": int(Indexer.ABSENT), "swa": int(Swa.NULL),
             "tail": int(Tail.NONE)}  # fmt: skip
GROUP = {"ckv": "csa+hca", "idx": "indexer", "swa": "swa"}  # column -> the rules' group

RULES_NOT_PROJECTED = {
    "L1.lease_covers": "no residency lease: a match is pinned by tree.lock (checked as locks)",
    "L2.kernel_abi": "one page form per pool: no per-page format to check",
    "L3.tail_sealed": "compressor state lives in per-request/SWA-addressed rings the forward "
    "rewrites; no page of it is named by a hit",
    "L4.splice_aligned": "byte offsets are the attention kernels' layout, not the cache's",
}
# rules checked outside the projected state, by the check classes named
RULES_BY_CLASS = {
    # HiCache's load-back (host L2, and L3 through it): the forward waits on the load's event,
    # so the rule is that the event completes (class "load") and that what the hit then names
    # holds every state's markers (L3's other rules, on the loaded prefix)
    "L3.disk_loaded": ("load",),
}
INVARIANT_PROJECTION = {
    "refcount": ("conservation", "freed-referenced", "tombstone"),
    "ghost_counters": ("conservation",),
    "toctou": ("freed-referenced", "L3"),
    "hit_soundness": ("L1", "L3"),
    # markers: the content a hit names is the prompt's own prefix (a Mamba stack's state too)
    "hit_truth": ("L3", "mamba"),
    "reading_truth": ("freed-referenced",),
    "request_hygiene": ("locks",),
    # SGLang captures its CUDA graphs once, at startup, over the pools' buffers and never
    # recaptures: the graph is always CAPTURED, so every buffer must stay where it was
    "graph_topology": ("addresses",),
    "graph_truth": ("addresses",),
    "load_integrity": ("load", "L3"),
    "load_truth": ("load", "L3"),
}
INVARIANTS_NOT_PROJECTED = {
    "admission_cap": "no disk I/O queue in the device tier",
    "separation": "no recovery pipelines in the device tier",
    "domains": "typing of the spec's own phase variables",
    "mechanism_truth": "relates the spec's own mechanism variables to its ghost truth",
}
CHECK_CLASSES = ("conservation", "freed-referenced", "tombstone", "L1", "L3", "sidecar",
                 "mamba", "locks", "completeness", "addresses", "load", "crash")  # fmt: skip


def projected_rules() -> tuple[Rule, ...]:
    skip = set(RULES_NOT_PROJECTED) | set(RULES_BY_CLASS)
    return tuple(r for r in DEFAULT_HIT_RULE.rules if r.qualname not in skip)


def _check_coverage() -> None:
    names = {r.qualname for r in DEFAULT_HIT_RULE.rules}
    missing = names - {r.qualname for r in projected_rules()} - set(RULES_NOT_PROJECTED)
    missing -= set(RULES_BY_CLASS)
    invs = {i.name for i in default_table().invariants}
    missing |= invs - set(INVARIANT_PROJECTION) - set(INVARIANTS_NOT_PROJECTED)
    if missing:
        raise RuntimeError(f"SGLang projection misses table entries: {sorted(missing)}")


@dataclass
class Violation:
    check: str
    message: str


class _Projected(SimpleNamespace):
    """The projected state: the spec's state shape, with ConcreteState's block quantifier."""

    def forall_blocks(self, lo: int, hi: int, body: Any) -> bool:
        return all(body(b) for b in range(max(lo, 0), min(hi, self.N)))


def hit_violations(
    page: int, window: int, hit: int, ready: dict[str, list[bool]], max_len: int
) -> list[Violation]:
    """L1 and L3 of one match: ``ready[state][p]`` says whether page ``p`` of the hit holds the
    new request's markers in that state buffer (only the pages a state must hold are asked)."""
    n_cap = max(hit // page, max_len // page) + 1
    cols = {c: [READY[c]] * n_cap for c in READY}
    for name, pages in ready.items():
        c = COLUMN[name]
        for p, ok in enumerate(pages):
            if not ok:
                cols[c][p] = NOT_READY[c]
    s = _Projected(
        k=SimpleNamespace(L=page, W=max(1, -(-window // page))),
        N=n_cap,
        ckv=cols["ckv"],
        idx=cols["idx"],
        iver=[0] * n_cap,
        ver=[0] * n_cap,
        swa=cols["swa"],
        tail=cols["tail"],
    )
    groups = {GROUP[COLUMN[n]] for n in ready}
    out = []
    for rule in projected_rules():
        if rule.layer != "L1" and (hit == 0 or rule.group not in groups):
            continue  # an empty hit needs no state; a rule for a state this stack lacks is moot
        if not bool(DEFAULT_HIT_RULE.rule_holds(rule, s, 0, hit)):
            bad = [n for n, pages in ready.items() if not all(pages)]
            out.append(
                Violation(
                    rule.layer,
                    f"{rule.qualname} fails at hit {hit} (page {page}, window {window}): "
                    f"{rule.doc}; pages without the prompt's markers in {', '.join(bad) or '-'}",
                )
            )
    return out


def window_pages(page: int, window: int, hit: int) -> range:
    """The pages of a hit the SWA state must hold: the spec's WINDOW scope, in pages."""
    w = max(1, -(-window // page))
    return range(max(0, hit // page - w), hit // page)


@cache
def _completeness() -> Any:
    rule = default_table().completeness
    assert rule is not None, "the default table states completeness"
    return rule


def expected_complete_hit(page: int, prompt_len: int, stored: int) -> int:
    """COMPLETENESS: the hit a request for a stored prefix must get when nothing was evicted
    since: the table's rule on SGLang's page, capped one token short of the prompt (its last
    token is recomputed for logits, ``Req._compute_max_prefix_len``)."""
    cap = min(prompt_len - 1, stored)
    return int(_completeness().expected_hit(cap, SimpleNamespace(lcm_tokens=page)))


def conservation(name: str, available: int, evictable: int, protected: int, private: int,
                 size: int) -> list[Violation]:  # fmt: skip
    """The pool's slots are each free, cached and evictable, cached and locked, or a running
    request's own (the scheduler's own leak check, ``SchedulerInvariantChecker``)."""
    if available + evictable + protected + private == size and min(evictable, protected) >= 0:
        return []
    return [
        Violation(
            "conservation",
            f"{name} pool: available {available} + evictable {evictable} + protected "
            f"{protected} + private {private} = "
            f"{available + evictable + protected + private} != size {size}",
        )
    ]


def moved_buffers(
    captured: dict[str, tuple[int, tuple[int, ...]]], now: dict[str, tuple[int, tuple[int, ...]]]
) -> list[Violation]:
    """GRAPH_TOPOLOGY on a stack whose graphs were captured at build: each buffer's address and
    shape (``captured``: name -> (data_ptr, shape)) are the ones a replay reads and writes."""
    moved = [n for n in captured if now.get(n) != captured[n]]
    if not moved:
        return []
    return [
        Violation(
            "addresses",
            f"{len(moved)} buffer(s) a captured CUDA graph reads moved or changed shape: "
            + ", ".join(f"{n} {captured[n]} -> {now.get(n)}" for n in moved[:4]),
        )
    ]


_check_coverage()
