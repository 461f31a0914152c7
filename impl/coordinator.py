"""The longest valid hit, found by running the spec's hit rules as data, and why it is shorter.

Like vLLM's ``HybridKVCacheCoordinator``, every group can only lower the hit.  The search is
generated from ``hit_rule.rules`` (:func:`kvstate.impl.fastforms.compile_search`: every rule
inlined, each scope read with :func:`kvstate.spec.layers.scope_range`):

1. rules of scope ALL (every block of the hit) are prefix-closed, so one pass over the blocks
   finds the first block where any of them fails; the hit is cut to the LCM boundary before it;
2. rules of scope HIT, WINDOW and BOUNDARY are checked at the current length; when one fails
   the length steps down to the previous LCM boundary and they are checked again (ALL rules keep
   holding on a shorter prefix, so they are not re-run).

Each cut is recorded as a :class:`Shortening` (layer, rule, state, group, first failing block,
from and to lengths): the library reports *why* a hit was shortened (vllm-ascend 16270: an LCM
of 4096 silently gave a 0% hit rate).  The same search on a *projected* view (what the state will
be once the recovery pipelines have run) gives the hit worth recovering, and the difference
between the two is the recovery plan (:class:`kvstate.impl.projection.RecoveryPlan`).  ``kvstate/testing/search.py`` is the search's
rule-by-rule oracle (tests/impl/test_impl_search.py).
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from kvstate.spec.layers import HitRule, Rule, RuleScope, scope_range
from kvstate.spec.table import Table

from .fastforms import CompiledSearch


class Shortening(NamedTuple):
    """One rule that cut the hit: from ``from_tokens`` down to ``to_tokens``."""

    rule: str  # qualified name, e.g. "L3.ckv_ready" (a failed recovery: the table's "load_fail")
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


# a named tuple built by ``tuple.__new__`` directly: its own ``__new__`` is interpreted code (also
# in the compiled build), about as costly as the search itself on a short hit
_tuple_new: Final[Any] = tuple.__new__


def _named(rule: Rule) -> tuple[str, str, str, str, str]:
    """A rule's own fields of a :class:`Shortening`, read once: a miss's search records a cut
    per rule that fails, and reading them off the (interpreted, frozen) rule costs ~3k
    instructions a cut in the compiled build."""
    return (rule.qualname, rule.layer, rule.state, rule.group, rule.doc)


def _shortening(
    named: tuple[str, str, str, str, str], block: int | None, frm: int, to: int
) -> Shortening:
    """The one place a :class:`Shortening` is put together (its field order)."""
    q, layer, state, group, doc = named
    return _tuple_new(Shortening, (q, layer, state, group, block, frm, to, doc))  # type: ignore[no-any-return]


def _short(rule: Rule, block: int | None, frm: int, to: int) -> Shortening:
    return _shortening(_named(rule), block, frm, to)


# the table's transition of a recovery job that failed (a binding, like the action map's)
FAILED_LOAD: Final = "load_fail"


def failed_recovery(table: Table) -> tuple[str, str, str, str, str]:
    """The fields of the cut a failed recovery makes (:meth:`RequestTable.truncate`), read off
    the table: its failed load (the transition's name, the state it concerns and its doc, which
    says the hit is truncated and recomputed), under the layer and group of the hit rule over
    that state (no such rule: no layer or group)."""
    fail = table.action(FAILED_LOAD)
    over = next((r for r in table.hit_rule.rules if r.state == fail.component), None)
    layer, group = (over.layer, over.group) if over is not None else ("", "")
    return (fail.name, layer, fail.component, group, fail.doc)


def recovery_cut(named: tuple[str, str, str, str, str], frm: int, to: int) -> Shortening:
    """The cut of a failed recovery (``named``: :func:`failed_recovery`), from ``frm`` tokens
    to the longest valid prefix ``to``: on no one block, the rest is recomputed."""
    return _shortening(named, None, frm, to)


class Coordinator:
    """Hit search over a ``ChainView`` with the rules of one :class:`HitRule`."""

    def __init__(self, hit_rule: HitRule, compiled: CompiledSearch) -> None:
        self.hit_rule = hit_rule
        # the one search (.fastforms): every rule inlined, the table's callable where a rule
        # did not translate; the direct form for direct views
        self._search = compiled.search
        self.search_direct = compiled.search_direct
        self._named = [_named(r) for r in hit_rule.rules]

    def _cut(self, i: int, block: int | None, frm: int, to: int) -> Shortening:
        return _shortening(self._named[i], block, frm, to)

    def search(self, view: Any, r: int, h_max: int) -> HitSearch:
        whole = self.search_direct if getattr(view, "_direct", False) else self._search
        h, cuts, rejected = whole(view, r, h_max)
        fields = (
            h_max,
            h,
            tuple([self._cut(i, b, frm, to) for i, b, frm, to in cuts]) if cuts else (),
            self._cut(rejected[0], rejected[1], 0, 0) if rejected is not None else None,
        )
        return _tuple_new(HitSearch, fields)  # type: ignore[no-any-return]

    def failures(self, view: Any, r: int, h: int) -> list[Shortening]:
        """Every rule that fails at exactly ``h`` (no search: the explanation of a refused
        validation names each of them, with its first failing block), by the table's
        callables."""
        out = []
        for rule in self.hit_rule.rules:
            if rule.scope is RuleScope.HIT:
                if not rule.pred(view, r, h):
                    out.append(_short(rule, None, h, h))
                continue
            lo, hi = scope_range(rule, view, h)
            bad = next(
                (b for b in range(max(lo, 0), min(hi, view.N)) if not rule.pred(view, r, b)), None
            )
            if bad is not None:
                out.append(_short(rule, bad, h, h))
        return out
