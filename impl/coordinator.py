"""The longest valid hit, found by running the spec's hit rules as data, and why it is shorter.

Like vLLM's ``HybridKVCacheCoordinator``, every group can only lower the hit.  The search walks
``hit_rule.rules`` and reads each rule's scope with :func:`kvstate.spec.layers.scope_range`:

1. rules of scope ALL (every block of the hit) are prefix-closed, so one pass over the blocks
   finds the first block where any of them fails; the hit is cut to the LCM boundary before it;
2. rules of scope HIT, WINDOW and BOUNDARY are checked at the current length; when one fails
   the length steps down to the previous LCM boundary and they are checked again (ALL rules keep
   holding on a shorter prefix, so they are not re-run).

Each cut is recorded as a :class:`Shortening` (layer, rule, state, group, first failing block,
from and to lengths): the library reports *why* a hit was shortened (vllm-ascend 16270: an LCM
of 4096 silently gave a 0% hit rate).  The same search on a *projected* view (what the state will
be once the recovery pipelines have run) gives the hit worth recovering, and the difference
between the two is the :class:`RecoveryPlan`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from kvstate.spec.compile import CompiledHitRule
from kvstate.spec.layers import HitRule, Rule, RuleScope, scope_range

from .errors import InternalError


class Shortening(NamedTuple):
    """One rule that cut the hit: from ``from_tokens`` down to ``to_tokens``."""

    rule: str  # qualified name, e.g. "L3.ckv_ready"
    layer: str
    state: str
    group: str
    block: int | None  # first failing block (None: a rule on the hit length itself)
    from_tokens: int
    to_tokens: int
    doc: str = ""

    def __str__(self) -> str:
        where = f" at block {self.block}" if self.block is not None else ""
        return (
            f"{self.rule} [{self.state}, group {self.group}]{where}: "
            f"{self.from_tokens} -> {self.to_tokens} tokens ({self.doc})"
        )


class HitSearch(NamedTuple):
    """The result of one search (named tuples: one or two are built per admission)."""

    requested: int
    hit: int
    shortenings: tuple[Shortening, ...]
    rejected: Shortening | None = None  # a length rule fails even at 0: no hit at all


def _short(rule: Rule, block: int | None, frm: int, to: int) -> Shortening:
    return Shortening(rule.qualname, rule.layer, rule.state, rule.group, block, frm, to, rule.doc)


class Coordinator:
    """Hit search over a ``ChainView`` with the rules of one :class:`HitRule`."""

    def __init__(self, hit_rule: HitRule, compiled: CompiledHitRule | None = None) -> None:
        self.hit_rule = hit_rule
        self.all_rules = tuple(r for r in hit_rule.rules if r.scope is RuleScope.ALL)
        self.point_rules = tuple(r for r in hit_rule.rules if r.scope is not RuleScope.ALL)
        self._point_info = tuple(
            (x, x.qualname, x.scope is RuleScope.HIT) for x in self.point_rules
        )
        # compiled forms (kvstate.spec.compile) where the rule compiled; the table's callable
        # otherwise.  Naming the rules that failed at a block always uses the callables.
        self._pred: dict[str, Any] = {}
        self._pred_direct: dict[str, Any] = {}
        self._scan: Any = None
        self._points: Any = None
        self._scan_direct: Any = None
        self._points_direct: Any = None
        self._search: Any = None
        self._search_direct: Any = None
        if compiled is not None:
            self._search = compiled.search
            self._search_direct = compiled.search_direct
            self._pred = {q: c.fn for q, c in compiled.rules.items()}
            self._pred_direct = dict(compiled.rules_direct)
            if compiled.all_rules == self.all_rules:
                self._scan = compiled.first_bad
                self._scan_direct = compiled.first_bad_direct
            self._points = compiled.points_hold
            self._points_direct = compiled.points_hold_direct

    def _first_bad(self, rule: Rule, view: Any, r: int, h: int) -> int | None | bool:
        """False if ``rule`` holds at ``h``; else the first failing block (None: HIT scope)."""
        preds = self._pred_direct if getattr(view, "_direct", False) else self._pred
        pred = preds.get(rule.qualname, rule.pred)
        if rule.scope is RuleScope.HIT:
            return False if pred(view, r, h) else None
        lo, hi = scope_range(rule, view, h)
        for b in range(max(lo, 0), min(hi, view.N)):
            if not pred(view, r, b):
                return b
        return False

    def search(self, view: Any, r: int, h_max: int) -> HitSearch:
        direct = getattr(view, "_direct", False)
        whole = self._search_direct if direct else self._search
        if whole is None:
            return self.search_generic(view, r, h_max)
        # the whole search compiled with every rule inlined (kvstate.spec.compile); the same
        # algorithm as search_generic, which tests/impl/test_impl_search.py checks it against
        h, cuts, rejected = whole(view, r, h_max)
        rules = self.hit_rule.rules
        return HitSearch(
            h_max,
            h,
            tuple(_short(rules[i], b, frm, to) for i, b, frm, to in cuts),
            _short(rules[rejected[0]], rejected[1], 0, 0) if rejected is not None else None,
        )

    def search_generic(self, view: Any, r: int, h_max: int) -> HitSearch:
        """The search over the rules one by one (the compiled scan and point test where the
        rules compiled, the table's callables otherwise)."""
        L = view.k.L
        direct = getattr(view, "_direct", False)
        h = h_max
        cuts: list[Shortening] = []
        if self.all_rules and h > 0:
            lo, hi = scope_range(self.all_rules[0], view, h)
            lo, hi = max(lo, 0), min(hi, view.N)
            first = -1
            # one fused loop (the direct form on a view of live lists); the callables only name
            # the culprits
            scan = self._scan_direct if direct else self._scan
            if scan is not None:
                first = scan(view, r, lo, hi)
                lo, hi = (first, first + 1) if first >= 0 else (hi, hi)
            # compiled per-rule forms name the culprits (the table's callables where none)
            by_name = self._pred_direct if direct else self._pred
            for b in range(lo, hi):
                bad = [x for x in self.all_rules if not by_name.get(x.qualname, x.pred)(view, r, b)]
                if bad:
                    cuts.extend(_short(x, b, h, b * L) for x in bad)
                    h = b * L
                    break
            else:
                if first >= 0:
                    raise InternalError(
                        f"compiled hit rule fails block {first} where the table's rules hold"
                    )
        points = self._points_direct if direct else self._points
        while True:
            if points is not None and points(view, r, h):
                return HitSearch(h_max, h, tuple(cuts))
            failing: tuple[Rule, int | None] | None = None
            preds = self._pred_direct if direct else self._pred
            for rule, qualname, on_length in self._point_info:  # _first_bad, inline
                pred = preds.get(qualname, rule.pred)
                if on_length:
                    if not pred(view, r, h):
                        failing = (rule, None)
                        break
                    continue
                lo, hi = scope_range(rule, view, h)
                at = next(
                    (b for b in range(max(lo, 0), min(hi, view.N)) if not pred(view, r, b)), -1
                )
                if at >= 0:
                    failing = (rule, at)
                    break
            if failing is None:
                if points is not None:
                    raise InternalError(
                        f"compiled point rules fail at {h} tokens where the table's rules hold"
                    )
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

    def failures(self, view: Any, r: int, h: int) -> list[Shortening]:
        """Every rule that fails at exactly ``h`` (for explaining a refused validation)."""
        out = []
        for rule in self.hit_rule.rules:
            where = self._first_bad(rule, view, r, h)
            if where is not False:
                block = where if isinstance(where, int) and not isinstance(where, bool) else None
                out.append(_short(rule, block, h, h))
        return out
