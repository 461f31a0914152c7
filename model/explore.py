"""Directed random exploration of the concrete model, and trace shrinking.

Finding a witness trace (an action that fires, an invariant that breaks in a mutated table) by
random walks is much cheaper than asking Z3 for one at depth 10; the proofs then confirm every
trace found here in the symbolic encoding, so the two interpreters are also checked against
each other.  Walks use swarm testing (each walk enables a random subset of actions) and bias
hit lengths towards whole LCM blocks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Action, ParamKind

from .concrete import GuardError, Machine

Goal = Callable[[Machine, ConcreteState, str], bool]
StepT = tuple[str, dict[str, int]]


@dataclass
class Found:
    steps: list[StepT]
    walks: int


def _sample_params(m: Machine, a: Action, rng: random.Random) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in a.params:
        dom = m.domain(p.kind)
        if p.kind is ParamKind.TOKENS and rng.random() < 0.8:
            out[p.name] = m.k.L * rng.randint(0, m.N)
        elif p.kind is ParamKind.TICKS and rng.random() < 0.5:
            out[p.name] = 1
        else:
            out[p.name] = rng.choice(list(dom))
    return out


def random_walk_search(
    m: Machine,
    goal: Goal,
    *,
    walks: int = 4000,
    max_len: int = 24,
    seed: int = 0,
    tries_per_step: int = 12,
) -> Found | None:
    """First walk whose last step reaches ``goal``; ``None`` if none within the budget."""
    rng = random.Random(seed)
    actions = list(m.table.actions)
    init = m.init()
    for w in range(walks):
        swarm = [a for a in actions if rng.random() < 0.75] or actions
        s = init
        steps: list[StepT] = []
        for _ in range(max_len):
            moved = False
            for _ in range(tries_per_step):
                a = rng.choice(swarm)
                params = _sample_params(m, a, rng)
                if m.is_enabled(s, a, params):
                    s = m.step(s, a, params)
                    steps.append((a.name, params))
                    moved = True
                    break
            if not moved:
                break
            if goal(m, s, steps[-1][0]):
                return Found(steps, w + 1)
    return None


def shrink(m: Machine, steps: Sequence[StepT], goal: Goal) -> list[StepT]:
    """Greedy one-step deletion while the trace still replays and still reaches the goal."""

    def ok(trace: Sequence[StepT]) -> bool:
        if not trace:
            return False
        try:
            states = m.run([(a, dict(p)) for a, p in trace])
        except GuardError:
            return False
        return goal(m, states[-1], trace[-1][0])

    cur = list(steps)
    changed = True
    while changed:
        changed = False
        for i in range(len(cur) - 1, -1, -1):
            cand = cur[:i] + cur[i + 1 :]
            if ok(cand):
                cur = cand
                changed = True
    return cur


def fires(action: str) -> Goal:
    return lambda m, s, last: last == action


def violates(invariant: str) -> Goal:
    def goal(m: Machine, s: ConcreteState, last: str) -> bool:
        inv = [i for i in m.table.invariants if i.name == invariant]
        return bool(m.violations(s, inv))

    return goal


def find(m: Machine, goal: Goal, **kw: Any) -> list[StepT] | None:
    found = random_walk_search(m, goal, **kw)
    if found is None:
        return None
    return shrink(m, found.steps, goal)
