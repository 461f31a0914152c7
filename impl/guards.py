"""Refusals derived from the table: an action is allowed exactly when its guard conjuncts hold.

The implementation never restates a guard.  Before it performs a transition it evaluates that
action's named conjuncts (``table.action(name).guard``) on a :class:`~kvstate.impl.meta.ChainView`
of its own metadata and refuses with the names of the false ones, so a refusal matches the
model's by construction.  ``skip`` leaves named conjuncts out (the validate path checks the hit
rules' conjuncts separately); a seeded bug that "forgets a check" (``kvstate.testing.seeded``)
is a source edit that passes that conjunct's name at the one call site where the bug would live.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvstate.spec.table import Action, Table

from .errors import Refused
from .fastforms import FastGuards, fast_guards


class Guards:
    def __init__(self, table: Table, k: Any, mapped: frozenset[str] = frozenset()) -> None:
        self._actions: dict[str, Action] = {a.name: a for a in table.actions}
        # each action's conjuncts compiled from their Z3 terms (kvstate.spec.compile: every
        # action, a conjunct that did not translate kept as the table's callable; the fused and
        # direct forms: .fastforms) for views whose acting request is r = 0, which is how the
        # implementation lays out every view it asks about (requests.py ``_ACTING``); they
        # take the parameters as a dict.  ``_fused`` is each action's whole guard in one
        # function: the accept path costs one call, and only a refusal names its conjuncts.
        self._compiled: FastGuards = fast_guards(table, k, mapped)
        compiled = self._compiled
        self._fast: dict[str, tuple[tuple[str, Any], ...]] = dict(compiled.compiled.conjuncts)
        self._fused: dict[str, Any] = dict(compiled.fused)
        self._fused_direct: dict[str, Any] = dict(compiled.fused_direct)
        # what each compiled guard reads (.fastforms)
        self.locality: dict[str, str] = dict(compiled.locality)

    def accept_tests(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each action's whole guard as one function, ``(view, params) -> bool``, for the acting
        request r = 0: the form for record-indexed / slot / gathered states, and the direct
        form for direct views.  Only an accept is final: a False is re-evaluated conjunct by
        conjunct (:meth:`check`) to name the refusal."""
        return dict(self._fused), dict(self._fused_direct)

    def fused_without(self, action: str, skip: frozenset[str]) -> Any:
        """``action``'s guard without the conjuncts in ``skip``, as one accept test for
        record-indexed / slot / gathered states (None if one did not compile)."""
        if action not in self._compiled.compiled.conjuncts:
            return None  # pragma: no cover: its one caller asks of validate
        return self._compiled.fused_without(action, skip)

    @property
    def fast(self) -> FastGuards:
        """The compiled and fused forms of the table's guards."""
        return self._compiled

    def run_test(self, action: str) -> Any:
        """``action``'s guard over a run of blocks in one call, ``fn(state, params, rids) -> int``
        (position of the first refused block, -1: none) on the record-indexed state, or None
        where one check up front would not equal a check per block (see
        :meth:`~kvstate.impl.fastforms.FastGuards.fused_run`)."""
        a = self._actions.get(action)
        if a is None:
            return None  # pragma: no cover: the gate asks of table actions
        return self._compiled.fused_run(action, frozenset(a.modifies))

    def enabled_test(self, parts: tuple[tuple[str, frozenset[str]], ...]) -> Any:
        """Is any of the guards of ``parts`` (each ``(action, conjuncts to skip)``) enabled at
        a run of blocks, ``fn(state, rids) -> int`` (position of the first record where one
        is, -1: none) on the record-indexed state; None where they did not compile to one
        such test (see :meth:`~kvstate.impl.fastforms.FastGuards.enabled_run`)."""
        if not all(a in self._actions for a, _ in parts):
            return None  # pragma: no cover: projection's are table.action's
        return self._compiled.enabled_run(parts)

    def locality_without(self, action: str, skip: frozenset[str]) -> str | None:
        if action not in self._compiled.compiled.conjuncts:
            return None  # pragma: no cover: its one caller asks of validate
        return self._compiled.locality_without(action, skip)

    def has(self, action: str) -> bool:
        return action in self._actions

    def failed(
        self, action: str, view: Any, params: dict[str, int], skip: Iterable[str] = ()
    ) -> list[str]:
        conj = self._fast.get(action)
        if conj is None:  # pragma: no cover: Gate.can refuses an unknown action first
            raise Refused(action, (), "the table has no such action")
        # a direct view (no projected columns) is read by the direct forms: live lists
        # through the chain's record ids, no columns gathered
        direct = getattr(view, "_direct", False)
        if not skip:
            whole = (self._fused_direct if direct else self._fused).get(action)
            if whole is not None and whole(view, params):
                return []
            return [name for name, fn in conj if not fn(view, params)]
        skipped = skip if isinstance(skip, frozenset) else frozenset(skip)
        rest = self._compiled.fused_without(action, skipped, direct)
        if rest is not None and rest(view, params):
            return []
        return [name for name, fn in conj if name not in skipped and not fn(view, params)]

    def check(
        self,
        action: str,
        view: Any,
        params: dict[str, int],
        skip: Iterable[str] = (),
        exc: type[Refused] = Refused,
    ) -> None:
        bad = self.failed(action, view, params, skip)
        if bad:
            raise exc(action, bad)

    def allows(
        self, action: str, view: Any, params: dict[str, int], skip: Iterable[str] = ()
    ) -> bool:
        return action in self._actions and not self.failed(action, view, params, skip)
