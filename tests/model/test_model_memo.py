"""The fuzzers' shortcuts return what the full checks return.

``Machine(memo=True).violations`` skips an invariant whose read-set values it has seen it hold
on; that is sound only if ``invariant_reads`` covers every variable an evaluation really reads,
and only if the memo reports the same list as a full evaluation, violations included.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvstate.model.concrete import Machine
from kvstate.spec.compile import invariant_reads
from kvstate.spec.default import default_table
from kvstate.spec.state import ConcreteState, ReqView

TABLE = default_table()


class _Req(ReqView):
    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        self._s.reads.add(name)  # type: ignore[attr-defined]
        return super().__getattr__(name)


class _Recording(ConcreteState):
    """A plain state (short-circuits like the fuzz's) that records the variables read."""

    __slots__ = ("reads",)
    _direct = False  # every read goes through __getattr__, where it is recorded

    def __init__(self, s: ConcreteState) -> None:
        super().__init__(s._v, s.N, s.k, s._req_names)
        self.reads: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.reads.add(name)
        return super().__getattr__(name)

    def req(self, r: int) -> ReqView:
        super().req(r)
        return _Req(self, r)


def _walk(m: Machine, steps: int, seed: int) -> list[ConcreteState]:
    rng = random.Random(seed)
    s = m.init()
    out = [s]
    for _ in range(steps):
        moves = list(m.enabled(s, tokens_step=TABLE.consts.L))
        if not moves:
            break
        name, params = rng.choice(moves)
        s = m.step(s, name, params)
        out.append(s)
    return out


def _perturb(s: ConcreteState, rng: random.Random) -> ConcreteState:
    """``s`` with one cell of one variable changed: often a state that breaks an invariant."""
    vals: dict[str, Any] = dict(s._v)
    name = rng.choice(sorted(vals))
    v = vals[name]
    if isinstance(v, tuple) and v and isinstance(v[0], tuple):
        r = rng.randrange(len(v))
        b = rng.randrange(len(v[r]))
        row = list(v[r])
        row[b] = int(row[b]) + rng.choice((-1, 1, 2))
        vals[name] = v[:r] + (tuple(row),) + v[r + 1 :]
    elif isinstance(v, tuple) and v:
        b = rng.randrange(len(v))
        vals[name] = v[:b] + (int(v[b]) + rng.choice((-1, 1, 2)),) + v[b + 1 :]
    elif isinstance(v, bool):
        vals[name] = not v
    elif isinstance(v, int):
        vals[name] = v + rng.choice((-1, 1, 2))
    return ConcreteState(vals, s.N, s.k, s._req_names)


def test_invariant_reads_cover_what_evaluations_read() -> None:
    """Every variable an invariant reads on a reached (or damaged) state is in its read set."""
    m = Machine(TABLE)
    rng = random.Random(7)
    states = _walk(m, 60, seed=1)
    states += [_perturb(s, rng) for s in states]
    static = {inv.name: invariant_reads(TABLE, inv) for inv in TABLE.invariants}
    for s in states:
        for inv in TABLE.invariants:
            rec = _Recording(s)
            m.violations(rec, [inv])
            assert rec.reads, inv.name
            assert rec.reads <= static[inv.name], (inv.name, rec.reads - static[inv.name])


def test_memo_reports_what_a_full_check_reports() -> None:
    full, memo = Machine(TABLE), Machine(TABLE, memo=True)
    rng = random.Random(3)
    broken = 0
    for seed in range(3):
        for s in _walk(full, 40, seed=seed):
            for t in (s, _perturb(s, rng), s):
                want = full.violations(t)
                assert memo.violations(t) == want
                broken += bool(want)
    assert broken > 0  # the damaged states did break invariants: the comparison saw failures


def test_explainer_answers_again_what_it_searched() -> None:
    """``Explainer.explain`` keeps its answers: asked again, it returns an equal explanation
    whose steps are fresh objects (a caller's edit never reaches a later answer), and a
    different question is searched, not answered from the memo."""
    from kvstate.model.apimap import Explainer

    m = Machine(TABLE, 2)
    ex = Explainer(m)
    before = m.init()
    after = m.step(before, "tick", {"t": 1})
    first = ex.explain("tick", before, after.values, ticks=1)
    assert first.steps == [("tick", {"t": 1})]
    assert len(ex._answers) == 1
    first.steps[0][1]["t"] = 99  # a caller's edit
    again = ex.explain("tick", before, after.values, ticks=1)
    assert again.steps == [("tick", {"t": 1})] and again.searched == first.searched
    assert len(ex._answers) == 1
    other = ex.explain("tick", before, before.values, ticks=1)  # nothing changed: no tick
    assert other.steps != again.steps and len(ex._answers) == 2


@pytest.mark.parametrize("kept", [1 << 12, 3])
def test_lockstep_machine_answers_what_the_plain_machine_answers(
    kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_LockstepMachine`` keeps guard answers and successors per state value: on reached and
    damaged states (equal values as fresh objects too) every answer is the plain machine's,
    refusals (``GuardError``) are raised every time, and a damaged state is not answered from
    an undamaged one's memo; also when the memo is cleared every few states (``kept=3``:
    states keep using the answers they hold, successors are keyed by live answer sets only)."""
    from kvstate.model import concrete
    from kvstate.model.concrete import GuardError
    from kvstate.targets.block.target import _LockstepMachine

    monkeypatch.setattr(concrete, "_STATES_KEPT", kept)

    plain, kept = Machine(TABLE), _LockstepMachine(TABLE, memo=True)
    rng = random.Random(5)
    enabled = disabled = 0
    for seed in range(2):
        for s in _walk(plain, 30, seed=seed):
            twin = ConcreteState(dict(s._v), s.N, s.k, s._req_names)  # equal, not identical
            for t in (s, _perturb(s, rng), twin, s):
                for a in TABLE.actions:
                    for params in plain.param_space(a, tokens_step=TABLE.consts.L):
                        want = plain.failed_conjuncts(t, a, params)
                        assert kept.failed_conjuncts(t, a, params) == want
                        assert kept.is_enabled(t, a, params) is (not want)
                        if want:
                            disabled += 1
                            with pytest.raises(GuardError):
                                kept.step(t, a, params)
                        else:
                            enabled += 1
                            assert kept.step(t, a, params) == plain.step(t, a, params)
    assert enabled and disabled


def test_diff_shortcut_reports_what_the_full_comparison_reports() -> None:
    """``diff`` answers "no difference" without renaming when every variable the target shows
    equals the model's; the full comparison (``_diff``) agrees on reached states, on damaged
    observations, and on observations with a variable missing."""
    from kvstate.targets.block.observe import _diff, _facts_of, diff

    assert _facts_of(TABLE).mechanism_first  # the default table's mechanism addresses come first
    shown = [v.name for v in TABLE.vars if not v.ghost]
    rng = random.Random(11)
    differ = 0
    for s in _walk(Machine(TABLE), 40, seed=4):
        model = s.values
        observed = {n: model[n] for n in shown}
        damaged = {n: _perturb(s, rng)._v[n] for n in shown}
        missing = dict(observed)
        missing.pop(rng.choice(shown))
        for obs in (observed, damaged, missing):
            want = _diff(model, obs, TABLE)
            assert diff(model, obs, TABLE) == want
            differ += bool(want)
    assert differ  # the comparison saw differences too


def _ghosts_plain(model: dict[str, Any], observed: dict[str, Any]) -> dict[str, Any]:
    """``with_ghosts`` as a plain loop over the table's variables (the oracle)."""
    from kvstate.spec.table import Scope, address_vars

    out = dict(observed)
    to_target: dict[int, int] = {}
    addresses = address_vars(TABLE)
    for var in addresses:
        if var in observed and not TABLE.var(var).ghost:
            a, b = model[var], observed[var]
            if TABLE.var(var).scope is Scope.REQ_BLOCK:
                a = tuple(x for row in a for x in row)
                b = tuple(x for row in b for x in row)
            for x, y in zip(a, b, strict=False):
                to_target.setdefault(x, y)
    for v in TABLE.vars:
        if v.ghost:
            val = model[v.name]
            if v.name in addresses and v.scope is Scope.BLOCK:
                val = tuple(to_target.get(x, x) for x in val)
            out[v.name] = val
    return out


def test_with_ghosts_translates_as_the_plain_loop() -> None:
    """The observed state completed with the model's ghosts, ghost addresses translated into
    the target's names: the same as the plain loop, for targets that name addresses as the
    model does, rename them (a bijection), or show some of them wrong."""
    from kvstate.spec.table import Scope, address_vars
    from kvstate.targets.block.observe import with_ghosts

    shown = [v.name for v in TABLE.vars if not v.ghost]
    mechanism = [a for a in address_vars(TABLE) if not TABLE.var(a).ghost]
    rng = random.Random(5)
    renamed = 0
    for s in _walk(Machine(TABLE), 60, seed=9):
        model = s.values
        same = {n: model[n] for n in shown}
        shift = rng.randrange(1, 50)  # the target's address x + shift for the model's x
        moved = dict(same)
        for var in mechanism:
            if TABLE.var(var).scope is Scope.REQ_BLOCK:
                moved[var] = tuple(tuple(x + shift for x in row) for row in model[var])
            else:
                moved[var] = tuple(x + shift for x in model[var])
        damaged = {n: _perturb(s, rng)._v[n] for n in shown}
        for obs in (same, moved, damaged):
            got = with_ghosts(model, obs, TABLE)
            assert list(got.items()) == list(_ghosts_plain(model, obs).items())
            renamed += got != {**obs, **{k: model[k] for k in got if k not in obs}}
    assert renamed  # some walks translated a ghost address
