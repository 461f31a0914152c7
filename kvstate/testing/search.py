"""The longest-hit search, rule by rule over the table's callables: the test oracle of the one
search the implementation runs (``kvstate.impl.fastforms.compile_search``, every rule inlined).

Never imported by ``impl/``.  The algorithm, step for step as the generated search must take it:

1. rules of scope ALL (every block of the hit) are prefix-closed, so one pass over the blocks
   finds the first block where any of them fails; every rule failing there is recorded and the
   hit is cut to the LCM boundary before it;
2. rules of scope HIT, WINDOW and BOUNDARY are checked in table order at the current length;
   the first that fails (at its first failing block) steps the length down to the previous LCM
   boundary, consecutive cuts by the same rule merged, and they are checked again (ALL rules
   keep holding on a shorter prefix, so they are not re-run); a failure at length 0 rejects.
"""

from __future__ import annotations

from typing import Any

from kvstate.impl.coordinator import HitSearch, Shortening
from kvstate.spec.layers import HitRule, Rule, RuleScope, scope_range


def _short(rule: Rule, block: int | None, frm: int, to: int) -> Shortening:
    return Shortening(rule.qualname, rule.layer, rule.state, rule.group, block, frm, to, rule.doc)


def first_failure(rule: Rule, view: Any, r: int, h: int) -> int | None | bool:
    """False if ``rule`` holds at ``h``; else its first failing block (None: HIT scope)."""
    if rule.scope is RuleScope.HIT:
        return False if rule.pred(view, r, h) else None
    lo, hi = scope_range(rule, view, h)
    for b in range(max(lo, 0), min(hi, view.N)):
        if not rule.pred(view, r, b):
            return b
    return False


def search(hit_rule: HitRule, view: Any, r: int, h_max: int) -> HitSearch:
    """The search over the table's callables, one rule and one block at a time."""
    L = view.k.L
    h = h_max
    cuts: list[Shortening] = []
    alls = [x for x in hit_rule.rules if x.scope is RuleScope.ALL]
    if alls and h > 0:
        lo, hi = scope_range(alls[0], view, h)
        for b in range(max(lo, 0), min(hi, view.N)):
            bad = [x for x in alls if not x.pred(view, r, b)]
            if bad:
                cuts.extend(_short(x, b, h, b * L) for x in bad)
                h = b * L
                break
    while True:
        failing: tuple[Rule, int | None] | None = None
        for rule in hit_rule.rules:
            if rule.scope is RuleScope.ALL:
                continue
            at = first_failure(rule, view, r, h)
            if at is not False:
                failing = (rule, None if at is None or isinstance(at, bool) else at)
                break
        if failing is None:
            return HitSearch(h_max, h, tuple(cuts))
        rule, block = failing
        if h <= 0:
            return HitSearch(h_max, 0, tuple(cuts), _short(rule, block, 0, 0))
        to = ((h - 1) // L) * L
        last = cuts[-1] if cuts else None
        if last is not None and last.rule == rule.qualname and last.to_tokens == h:
            cuts[-1] = _short(rule, block, last.from_tokens, to)
        else:
            cuts.append(_short(rule, block, h, to))
        h = to
