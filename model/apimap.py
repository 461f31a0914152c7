"""Interpreting the API refinement mapping (``spec/api.py``) on the reference model.

:func:`explain` answers the harness's question after every public call: is there a sequence of
the table's actions, allowed by the call's patterns, whose guards hold one after the other from
the model's state before the call, and that ends in the state the library shows after it?  The
patterns are compiled to a small NFA over action names; the search is a bounded best-first walk
over (model state, NFA states), trying for each action only the parameters that can move the
model towards the observed state (a block whose modified variables already agree is skipped, an
output parameter -- address, stored form -- is the one the library shows), and keeping the
parameters the library chose.  The patterns are compiled in :mod:`kvstate.model.apipatterns`;
the model's side of a process crash, :func:`after_restart`, is :mod:`kvstate.model.apirestart`.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvstate.spec.api import API, SECTIONS
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Action, ParamKind, Scope, Table

from .apipatterns import Nfa, compile_patterns
from .apirestart import after_restart, with_ghosts
from .concrete import KeptMachine, Machine

# (the patterns' compiler and the restart are their own modules; their callers import them here)
__all__ = [
    "Explainer", "Explanation", "Steer", "Step", "after_restart", "compile_patterns", "state_diff",
    "with_ghosts",
]  # fmt: skip

Step = tuple[str, dict[str, int]]


class Steer(Protocol):
    """What else the library shows about a call besides its end state (its events, say),
    as a rule on single steps: a search that is steered never takes a step the rule refuses.
    Where the patterns allow several orders of the same actions (blocks stored one after the
    other), the end state cannot tell them apart but what happened in between can: which
    block's move staled a captured graph is the first one moved.  Hashable: it is part of
    the question an answer is kept for."""

    def allows(
        self, cur: ConcreteState, name: str, p: Mapping[str, int], new: ConcreteState
    ) -> bool: ...


@dataclass
class Explanation:
    steps: list[Step] | None  # None: nothing in the patterns explains the change
    searched: int  # search nodes expanded
    exhausted: bool  # the bound stopped the search before it was complete


def state_diff(model: Mapping[str, Any], observed: Mapping[str, Any], table: Table) -> list[str]:
    a, b = model, observed
    return [
        f"{v.name}: model {a[v.name]!r} != library {b[v.name]!r}"
        for v in table.vars
        if not v.ghost and a[v.name] != b[v.name]  # ghost truth: the model's alone
    ]


ANSWERS_KEPT = 4096  # explanations an Explainer keeps (each a few hundred bytes)


class Explainer:
    """:func:`explain` with the compiled patterns of every call cached (one per table)."""

    def __init__(self, machine: Machine) -> None:
        self.m = machine
        self.table = machine.table
        names = [a.name for a in self.table.actions]
        self.nfas = {call: compile_patterns(c.patterns, names) for call, c in API.items()}
        for call, extra in SECTIONS.items():  # one critical section of a multi-section call
            self.nfas[f"{call}/section"] = compile_patterns((*API[call].patterns, *extra), names)
        self.scope = {v.name: v.scope for v in self.table.vars}
        self.rewritten = {call: self._rewritten(nfa) for call, (nfa, _, _) in self.nfas.items()}
        # explain is a pure function of its arguments (the machine and patterns are fixed): a
        # fuzz run asks the same question again and again (the ci profile: 1123 searches, 339
        # distinct), so answers are kept, bounded, keyed by the arguments' frozen values
        self._answers: OrderedDict[Any, Explanation] = OrderedDict()

    def _rewritten(self, nfa: Nfa) -> frozenset[str]:
        """The actions of one call whose request variables another step of the same call may
        write again (``admit ... abort admit``): the observed end state need not show their
        write, so the search must not skip a request that looks untouched there."""
        req = {n for n, sc in self.scope.items() if sc in (Scope.REQ, Scope.REQ_BLOCK)}
        writes: dict[str, int] = {}
        steps = [tok for edges in nfa.edges for tok, _ in edges]
        for tok in steps:
            for var in self.table.action(tok).modifies & req:
                writes[var] = writes.get(var, 0) + 1
        return frozenset(
            tok
            for tok in steps
            if any(writes[v] > 1 for v in self.table.action(tok).modifies & req)
        )

    def accepts(self, call: str, names: Sequence[str]) -> bool:
        """Whether the action names ``names``, in this order, are a word of ``call``'s
        patterns (the harness composes a call's explanation from explained parts)."""
        nfa, start, accept = self.nfas[call]
        states = nfa.closure([start])
        for name in names:
            nxt = nfa.moves(states).get(name)
            if nxt is None:
                return False
            states = nxt
        return accept in states

    def _cells(self, values: Mapping[str, Any]) -> dict[tuple[str, Any], Any]:
        out: dict[tuple[str, Any], Any] = {}
        for name, v in values.items():
            sc = self.scope[name]
            if sc is Scope.GLOBAL:
                out[(name, None)] = v
            elif sc is Scope.REQ_BLOCK:
                for r, row in enumerate(v):
                    for b, x in enumerate(row):
                        out[(name, (r, b))] = x
            else:
                for i, x in enumerate(v):
                    out[(name, i)] = x
        return out

    @staticmethod
    def _distance_by_var(cur: Mapping[str, Any], want: list[_VarGoal]) -> int:
        """Cells of ``cur`` that differ from a goal grouped by variable (a missing cell is
        ``None``).  A successor state shares every value its action did not write (the same
        object), so a variable's count is reused while its value is the one last counted: a
        search step costs the variables it changed."""
        total = 0
        for g in want:
            v = cur.get(g.name, _MISSING)
            if v is not g.last:
                g.last, g.count = v, g.mismatches(v)
            total += g.count
        return total

    def explain(
        self,
        call: str,
        before: ConcreteState,
        observed: Mapping[str, Any],
        *,
        req: int | None = None,
        forbid: Iterable[tuple[str, int]] = (),
        ignore: Iterable[tuple[str, Any]] = (),
        ticks: int | None = None,
        fmts: Mapping[tuple[str, int], int] | None = None,
        max_nodes: int = 4000,
        steer: Steer | None = None,
    ) -> Explanation:
        """A sequence of ``call``'s patterns from ``before`` to ``observed`` (see module doc).

        ``req``: the request slot the call acted on (``None``: any); ``forbid``: (action,
        block) pairs the world rules out (a load of a corrupt entry never completes, a load
        of a sound one never fails unless a read error was injected); ``ignore``: cells
        ``(variable, index)`` the library does not keep (a request's ``state_data_ptrs`` past
        its own chain); ``ticks``: the value every ticks parameter must take (the call's
        binding, ``ApiCall.ticks``); ``fmts``: (action, block) -> the stored form its output
        parameter must be (known to the world: the writer's, the file's); other outputs are
        the ones the library shows.  States are compared exactly (addresses are the library's slots).
        ``steer``: a rule every step of the answer keeps (:class:`Steer`).
        """
        rest = (
            req,
            frozenset(forbid),
            frozenset(ignore),
            ticks,
            frozenset(fmts.items()) if fmts else None,
            max_nodes,
            steer,
        )
        key = (call, tuple(before.mapping.items()), tuple(observed.items()), *rest)
        try:
            got = self._answers.get(key)  # hashes the values once: ints and tuples, as a rule
        except TypeError:  # a list among them: the frozen form is the key
            key = (call, _frozen_items(before.mapping), _frozen_items(observed), *rest)
            got = self._answers.get(key)
        if got is None:
            got = self._search(
                call, before, observed, req, key[4], key[5], ticks, fmts, max_nodes, steer
            )
            self._answers[key] = got
            if len(self._answers) > ANSWERS_KEPT:
                self._answers.popitem(last=False)
        else:
            self._answers.move_to_end(key)
        steps = None if got.steps is None else [(n, dict(p)) for n, p in got.steps]
        return Explanation(steps, got.searched, got.exhausted)

    def _search(
        self,
        call: str,
        before: ConcreteState,
        observed: Mapping[str, Any],
        req: int | None,
        forbid: frozenset[tuple[str, int]],
        ignore: frozenset[tuple[str, Any]],
        ticks: int | None,
        fmts: Mapping[tuple[str, int], int] | None,
        max_nodes: int,
        steer: Steer | None = None,
    ) -> Explanation:
        """The search :meth:`explain` answers with (one per distinct question).

        Best-first on (cells still different, steps taken, order pushed); the first state
        popped that equals the observed one where the patterns may end is the answer.  Three
        things are never pushed, none of which can change that answer or the order of the
        states that are popped: a state already expanded (it would be skipped when popped); a
        state already pushed with no more steps (same distance, earlier push: it pops first);
        and a dead state, one where a cell differs that no action the patterns still allow
        may write (none of its successors can equal the observed state either).  The bound
        counts the states expanded, and a dead one is not."""
        nfa, start, accept = self.nfas[call]
        ask = _Ask(self, observed, req, forbid, ticks, fmts, self.rewritten[call])
        table = self.table
        goal = self._cells(observed)
        for cell in ignore:
            goal.pop(cell, None)
        s0 = nfa.closure([start])
        tie = itertools.count()
        want = _by_var(goal)
        # per NFA state set: the goal's variables no action still allowed from it writes
        stuck: dict[frozenset[int], list[_VarGoal]] = {}

        def frozen(states: frozenset[int]) -> list[_VarGoal]:
            got = stuck.get(states)
            if got is None:
                writes = set[str]().union(
                    *(table.action(n).modifies for n in nfa.labels_after(states))
                )
                got = stuck[states] = [g for g in want if g.name not in writes]
            return got

        # each distinct state value is numbered once (one hash of its items): the keys below
        # are (number, pattern states), cheap to hash again and again
        numbers: dict[tuple[tuple[str, Any], ...], int] = {}

        def number(values: Mapping[str, Any]) -> int:
            try:
                return numbers.setdefault(tuple(values.items()), len(numbers))
            except TypeError:  # a list among the values: its frozen form is the key
                return numbers.setdefault(_frozen_items(values), len(numbers))

        d0 = self._distance_by_var(before._v, want)
        k0 = (number(before._v), s0)
        # a dead state: a cell differs that no action still allowed writes (the counts are
        # those of the state last measured)
        dead0 = any(g.count for g in frozen(s0))
        heap: list[Any] = [] if dead0 else [(d0, 0, next(tie), before, s0, [], k0)]
        seen: set[tuple[int, frozenset[int]]] = set()
        shortest: dict[tuple[int, frozenset[int]], int] = {}
        succ: dict[int, dict[str, list[tuple[dict[str, int], ConcreteState, int]]]] = {}
        step = self.m.step
        nodes = 0
        while heap and nodes < max_nodes:
            dist, depth, _, cur, states, path, key = heapq.heappop(heap)
            # states of one search share their variables' order (a step copies the dict), so
            # no sort: a state seen in another order is only searched twice, never missed
            if key in seen:
                continue
            seen.add(key)
            nodes += 1
            if dist == 0 and accept in states:
                return Explanation(path, nodes, False)
            depth += 1
            # a state met again with other pattern states has the same successors
            mine = succ.get(key[0])
            if mine is None:
                mine = succ[key[0]] = {}
            for name, nxt in nfa.moves(states).items():
                kids = mine.get(name)
                if kids is None:
                    a = table.action(name)
                    kids = mine[name] = [
                        (p, new, number(new._v))
                        for p in ask.candidates(a, cur)
                        for new in (step(cur, a, p),)
                    ]
                fixed = frozen(nxt)
                for p, new, num in kids:
                    nkey = (num, nxt)
                    if nkey in seen:
                        continue
                    if steer is not None and not steer.allows(cur, name, p, new):
                        continue  # (the rule is the step's: the state may be reached otherwise)
                    was = shortest.get(nkey)
                    if was is not None and was <= depth:
                        continue
                    d = self._distance_by_var(new._v, want)
                    if d and fixed and any(g.count for g in fixed):
                        seen.add(nkey)  # deadness is the key's: never push it again
                        continue
                    shortest[nkey] = depth
                    heapq.heappush(heap, (d, depth, next(tie), new, nxt, [*path, (name, p)], nkey))
        return Explanation(None, nodes, nodes >= max_nodes)


def _frozen_items(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``values``' items, each value in its frozen form (:func:`_freeze`): as they stand when
    they hash (a model state's values are ints and tuples of them), else frozen one by one."""
    items = tuple(values.items())
    try:
        hash(items)
    except TypeError:
        return tuple([(k, _freeze(v)) for k, v in items])
    return items


def _freeze(v: Any) -> Any:
    if type(v) is tuple:
        try:
            hash(v)  # no list inside: already its own frozen form
            return v
        except TypeError:
            pass
    return tuple(_freeze(x) for x in v) if isinstance(v, (tuple, list)) else v


_MISSING = object()


class _VarGoal:
    """One variable's cells of a search goal, and the mismatch count of the value last seen."""

    __slots__ = ("name", "cells", "last", "count")

    def __init__(self, name: str, cells: list[tuple[Any, Any]]) -> None:
        self.name = name
        self.cells = cells  # (index as _cells keys it, wanted value)
        self.last: Any = _MISSING
        self.count = 0

    def mismatches(self, v: Any) -> int:
        n = 0
        for idx, want in self.cells:
            if v is _MISSING:
                x = None
            elif idx is None:
                x = v
            elif type(idx) is tuple:
                r, b = idx
                x = v[r][b] if r < len(v) and b < len(v[r]) else None
            else:
                x = v[idx] if idx < len(v) else None
            if x != want:
                n += 1
        return n


def _by_var(goal: Mapping[tuple[str, Any], Any]) -> list[_VarGoal]:
    groups: dict[str, list[tuple[Any, Any]]] = {}
    for (name, idx), want in goal.items():
        groups.setdefault(name, []).append((idx, want))
    return [_VarGoal(name, cells) for name, cells in groups.items()]


class _Ask:
    """One search's fixed question (observed state, request, bans, bindings) and what it keeps
    while the search walks: per action, what of its parameter domains does not depend on the
    state; per variable, the blocks where the value last seen differs from the observed one (a
    successor shares every value its action did not write, so a column is compared again only
    when a step wrote it)."""

    def __init__(
        self,
        ex: Explainer,
        obs: Mapping[str, Any],
        req: int | None,
        forbid: set[tuple[str, int]] | frozenset[tuple[str, int]],
        ticks: int | None,
        fmts: Mapping[tuple[str, int], int] | None,
        rewritten: frozenset[str],
    ) -> None:
        self.ex = ex
        self.m = ex.m
        self.obs = obs
        self.req = req
        self.forbid = forbid
        self.ticks = ticks
        self.fmts = fmts or {}
        self.rewritten = rewritten
        self._plans: dict[str, _Plan] = {}
        self._diff: dict[str, tuple[Any, frozenset[int]]] = {}

    def _plan(self, a: Action) -> _Plan:
        got = self._plans.get(a.name)
        if got is None:
            got = self._plans[a.name] = _Plan(self, a)
        return got

    def changed_blocks(self, name: str, mine: Any) -> frozenset[int]:
        """The blocks where the value ``mine`` of block variable ``name`` differs from what
        the library shows."""
        last = self._diff.get(name)
        if last is not None and last[0] is mine:
            return last[1]
        shown = self.obs[name]
        got = (
            frozenset()
            if mine == shown  # a column equal as a whole: one C comparison
            else frozenset(b for b in range(self.m.N) if mine[b] != shown[b])
        )
        self._diff[name] = (mine, got)
        return got

    def candidates(self, a: Action, cur: ConcreteState) -> list[dict[str, int]]:
        """Parameters worth trying: the ones that change something the library shows."""
        plan = self._plan(a)
        vals = cur._v
        doms: list[Sequence[int]] = []
        for kind, static in plan.kinds:
            dom: Sequence[int]
            if static is not None:
                dom = static
            elif kind is ParamKind.BLOCK:
                # the blocks where some variable the action writes differs from what the library
                # shows (none written: every block the world does not rule out)
                mod = plan.blocks_mod
                if len(mod) == 1:
                    changed: frozenset[int] | set[int] = self.changed_blocks(mod[0], vals[mod[0]])
                    dom = [b for b in plan.allowed if b in changed] if changed else ()
                elif mod:
                    changed = set()
                    for n in mod:
                        changed.update(self.changed_blocks(n, vals[n]))
                    dom = [b for b in plan.allowed if b in changed]
                else:
                    dom = plan.allowed
            else:  # ParamKind.REQ
                obs = self.obs
                dom = [r for r in plan.reqs if any(vals[n][r] != obs[n][r] for n in plan.req_mod)]
            if not dom:
                return []  # no combination: most actions at most states (nothing to change)
            doms.append(dom)
        out = []
        m = self.m
        # the guard answers the machine keeps for this state (a KeptMachine's), asked directly:
        # is_enabled on a miss (which keeps its answer there)
        kept = m.answers_for(cur) if isinstance(m, KeptMachine) else None
        name = a.name
        names = plan.names
        for combo in itertools.product(*doms) if len(doms) != 1 else zip(doms[0]):
            p = dict(zip(names, combo, strict=True))
            if plan.outputs:
                b = p.get("b")
                if b is not None:
                    p.update(plan.output_values(b))
            got = None if kept is None else kept.get(("?", name, tuple(p.items())))
            if got is None:
                got = m.is_enabled(cur, a, p)
            if got:
                out.append(p)
        return out


class _Plan:
    """One action's parameter domains for one search: a domain fixed by the question is kept
    (``doms[i]``), one that depends on the state is ``None`` and built per state."""

    __slots__ = (
        "names",
        "doms",
        "kinds",
        "blocks_mod",
        "allowed",
        "req_mod",
        "reqs",
        "outputs",
        "_ask",
        "_name",
        "_out",
    )

    def __init__(self, ask: _Ask, a: Action) -> None:
        ex, m, obs = ask.ex, ask.m, ask.obs
        scope = ex.scope
        self.names = tuple(q.name for q in a.params)
        # ghost truth is not observable: only what the library shows steers the search
        self.blocks_mod = [n for n in a.modifies if scope[n] is Scope.BLOCK and n in obs]
        self.req_mod = [
            n for n in a.modifies if scope[n] in (Scope.REQ, Scope.REQ_BLOCK) and n in obs
        ]
        self.allowed = [b for b in range(m.N) if (a.name, b) not in ask.forbid]
        self.reqs = [ask.req] if ask.req is not None else list(range(ex.table.consts.R))
        self.outputs = [
            (q.name, q.kind) for q in a.params if q.kind in (ParamKind.ADDR, ParamKind.FMT)
        ]
        L = ex.table.consts.L
        doms: list[Sequence[int] | None] = []
        for q in a.params:
            dom: Sequence[int] | None
            if q.kind is ParamKind.BLOCK:
                dom = None
            elif q.kind is ParamKind.REQ:
                # a request whose written variables already agree is skipped, unless another
                # step of the call may write them again
                dom = None if self.req_mod and a.name not in ask.rewritten else self.reqs
            elif q.kind is ParamKind.TOKENS:
                dom = sorted(
                    set(range(0, m.N * L + 1, L))
                    | {x for x in obs.get("hit", ()) if isinstance(x, int)}
                )
            elif q.kind is ParamKind.TICKS and ask.ticks is not None:
                dom = [ask.ticks]
            elif q.kind in (ParamKind.ADDR, ParamKind.FMT):
                dom = [-1]  # filled from the observed block
            else:
                dom = list(m.domain(q.kind))
            doms.append(dom)
        self.doms = doms
        self.kinds = [(q.kind, dom) for q, dom in zip(a.params, doms, strict=True)]
        self._ask, self._name = ask, a.name
        self._out: dict[int, dict[str, int]] = {}

    def output_values(self, b: int) -> dict[str, int]:
        """The output parameters at block ``b``: the address the library shows; the stored form
        the world knows (``fmts``), else the one the library shows."""
        got = self._out.get(b)
        if got is None:
            ask = self._ask
            got = {}
            for name, kind in self.outputs:
                if kind is ParamKind.ADDR:
                    got[name] = max(int(ask.obs["addr"][b]), 0)
                else:
                    known = ask.fmts.get((self._name, b))
                    got[name] = int(ask.obs["fmt"][b]) if known is None else known
            self._out[b] = got
        return got
