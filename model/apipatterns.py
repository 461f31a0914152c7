"""The API refinement mapping's patterns (``spec/api.py``) compiled to one Thompson NFA per
call: the macros expanded, the regular expressions over action names parsed, every name checked
against the table's actions.  :class:`kvstate.model.apimap.Explainer` walks these NFAs."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from kvstate.spec.api import MACROS

_TOKEN = re.compile(r"\s*([A-Za-z_]\w*|[()|*+?])")


def _expand(pattern: str) -> str:
    for _ in range(8):
        new = re.sub(r"\b[A-Z][A-Z_]*\b", lambda m: f"({MACROS[m.group(0)]})", pattern)
        if new == pattern:
            return new
        pattern = new
    raise ValueError(f"macros nest too deep in {pattern!r}")


class Nfa:
    """Thompson NFA over action names: states are ints, ``eps`` and labelled edges."""

    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[str, int]]] = []
        self._moves: dict[frozenset[int], dict[str, frozenset[int]]] = {}
        self._after: dict[frozenset[int], frozenset[str]] = {}

    def new(self) -> int:
        self._moves.clear()  # still being built
        self._after.clear()
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        todo = list(seen)
        while todo:
            for t in self.eps[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    def moves(self, states: frozenset[int]) -> dict[str, frozenset[int]]:
        """The labelled moves out of ``states`` (closed); built once per state set (the NFA
        does not change once its patterns are compiled), so the caller must not edit it."""
        cached = self._moves.get(states)
        if cached is None:
            cached = self._moves[states] = self._moves_uncached(states)
        return cached

    def _moves_uncached(self, states: frozenset[int]) -> dict[str, frozenset[int]]:
        out: dict[str, set[int]] = {}
        for s in states:
            for name, t in self.edges[s]:
                out.setdefault(name, set()).add(t)
        return {k: self.closure(v) for k, v in out.items()}

    def labels_after(self, states: frozenset[int]) -> frozenset[str]:
        """The actions on some path out of ``states`` (closed): every step a continuation of
        the patterns may still take."""
        got = self._after.get(states)
        if got is None:
            todo, reached, out = [states], {states}, set[str]()
            while todo:
                for name, nxt in self.moves(todo.pop()).items():
                    out.add(name)
                    if nxt not in reached:
                        reached.add(nxt)
                        todo.append(nxt)
            got = self._after[states] = frozenset(out)
        return got


def _parse(nfa: Nfa, pat: str, known: set[str]) -> tuple[int, int]:
    toks = _TOKEN.findall(_expand(pat))
    pos = 0

    def alt() -> tuple[int, int]:
        nonlocal pos
        s, e = seq()
        while pos < len(toks) and toks[pos] == "|":
            pos += 1
            s2, e2 = seq()
            a, b = nfa.new(), nfa.new()
            nfa.eps[a] += [s, s2]
            nfa.eps[e].append(b)
            nfa.eps[e2].append(b)
            s, e = a, b
        return s, e

    def seq() -> tuple[int, int]:
        nonlocal pos
        s = e = nfa.new()
        while pos < len(toks) and toks[pos] not in "|)":
            a, b = atom()
            nfa.eps[e].append(a)
            e = b
        return s, e

    def atom() -> tuple[int, int]:
        nonlocal pos
        tok = toks[pos]
        pos += 1
        if tok == "(":
            s, e = alt()
            if pos >= len(toks) or toks[pos] != ")":
                raise ValueError(f"unbalanced parentheses in {pat!r}")
            pos += 1
        else:
            if tok not in known:
                raise ValueError(f"{tok!r} in API pattern {pat!r} is not an action")
            s, e = nfa.new(), nfa.new()
            nfa.edges[s].append((tok, e))
        while pos < len(toks) and toks[pos] in "*+?":
            op = toks[pos]
            pos += 1
            a, b = nfa.new(), nfa.new()
            nfa.eps[a].append(s)
            nfa.eps[e].append(b)
            if op in "*?":
                nfa.eps[a].append(b)
            if op in "*+":
                nfa.eps[e].append(s)
            s, e = a, b
        return s, e

    s, e = alt()
    if pos != len(toks):
        raise ValueError(f"cannot parse API pattern {pat!r} at {toks[pos]!r}")
    return s, e


def compile_patterns(patterns: Sequence[str], actions: Iterable[str]) -> tuple[Nfa, int, int]:
    """One NFA for the union of ``patterns`` (start, accept); names must be table actions."""
    known = set(actions)
    nfa = Nfa()
    start, accept = nfa.new(), nfa.new()
    for pat in patterns:
        s, e = _parse(nfa, pat, known)
        nfa.eps[start].append(s)
        nfa.eps[e].append(accept)
    return nfa, start, accept
