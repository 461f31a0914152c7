"""Z3 queries behind the obligations: induction, bounded unrolling, witnesses.

Every query gets a fresh solver.  Parametric queries use a symbolic pool size ``N`` and a Skolem
block, so an UNSAT answer holds for any pool size; bounded queries unroll from Init over a
concrete pool with one action selector per step, so every trace names its actions.
Counterexamples are decoded into concrete steps and replayed in the reference interpreter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import z3

from kvstate.model.concrete import GuardError, Machine
from kvstate.model.symbolic import (
    Instance,
    SymState,
    Vec,
    bind,
    fresh_params,
    fresh_state,
    guard,
    init_state,
    instances,
    inv_holds,
    inv_violated,
    post,
    successor,
)
from kvstate.spec.table import Invariant, ParamKind, Scope, Table

from .results import Step, Trace


def proof_invariants(table: Table) -> list[Invariant]:
    """Invariants proved for any pool size (the bounded ghost-counter ones are excluded)."""
    return [i for i in table.invariants if not i.bounded]


def _verdict(res: z3.CheckSatResult) -> str:
    if res == z3.unsat:
        return "proved"
    if res == z3.sat:
        return "cti"
    return "unknown"


def _solver(timeout_ms: int) -> z3.Solver:
    s = z3.Solver()
    s.set(timeout=timeout_ms)
    return s


# ---- 1-induction, parametric --------------------------------------------------------------
@dataclass
class InductionOutcome:
    status: str  # proved | cti | unknown
    mode: str
    trace: Trace | None = None
    detail: str = ""


def check_init(table: Table, inv: Invariant, timeout_ms: int = 20000) -> InductionOutcome:
    N = z3.Int("N")
    s = init_state(table, N, mode="goal")
    sk = z3.Int("sk")
    bad, _ = inv_violated(s, inv, sk)
    solver = _solver(timeout_ms)
    solver.add(N >= 1, bad)
    res = solver.check()
    if res == z3.unsat:
        return InductionOutcome("proved", "init")
    if res == z3.unknown:
        return InductionOutcome("unknown", "init", detail=solver.reason_unknown())
    return InductionOutcome("cti", "init", detail="Init violates the invariant")


def _cti_trace(
    table: Table, inv: Invariant, inst: Instance, hyps_invs: Sequence[Invariant], timeout_ms: int
) -> Trace | None:
    """A concrete counterexample to induction over a small pool (expanded, exact)."""
    for n in range(1, 5):
        s = fresh_state(table, "pre.", n, mode="expand")
        pp = fresh_params(table, "p.", n)
        p = bind(inst, pp)
        solver = _solver(timeout_ms)
        solver.add(*pp.domain)
        for other in hyps_invs:
            solver.add(inv_holds(s, other, []))
        solver.add(guard(s, inst, p))
        s2 = successor(s, inst, p)
        sk = z3.Int("sk")
        s2.mode = "goal"
        bad, _ = inv_violated(s2, inv, sk)
        solver.add(bad)
        if solver.check() == z3.sat:
            m = solver.model()
            start = decode_state(m, s, n)
            step = decode_step(m, inst, pp)
            return replay(table, n, [step], start=start)
    return None


# ---- bounded unrolling from Init ----------------------------------------------------------
@dataclass
class Unrolling:
    states: list[SymState]
    sels: list[Any]
    params: list[Any]
    insts: list[Instance]
    constraints: list[Any]
    N: int


def unroll(table: Table, depth: int, N: int) -> Unrolling:
    insts = instances(table)
    s0 = init_state(table, N, mode="expand")
    states = [s0]
    sels: list[Any] = []
    params: list[Any] = []
    cons: list[Any] = []
    for t in range(depth):
        s = states[-1]
        sel = z3.Int(f"sel{t}")
        pp = fresh_params(table, f"p{t}.", N)
        cons.extend(pp.domain)
        nxt = fresh_state(table, f"s{t + 1}.", N, mode="expand")
        options = [sel == -1]
        updates: dict[str, list[tuple[Any, Any]]] = {}
        for i, inst in enumerate(insts):
            p = bind(inst, pp)
            options.append(z3.And(sel == i, guard(s, inst, p)))
            for name, val in post(s, inst, p).items():
                updates.setdefault(name, []).append((sel == i, val))
        cons.append(z3.Or(*options))
        if t > 0:
            cons.append(z3.Implies(sels[-1] == -1, sel == -1))  # stutter only at the end
        for v in table.vars:
            cur = s.get(v.name)
            ups = updates.get(v.name, [])
            if v.scope in (Scope.REQ, Scope.REQ_BLOCK):
                for r in range(table.consts.R):
                    term = cur[r]
                    for c, val in ups:
                        term = _ite(c, val[r], term)
                    cons.append(_eq(nxt.get(v.name)[r], term))
            else:
                term = cur
                for c, val in ups:
                    term = _ite(c, val, term)
                cons.append(_eq(nxt.get(v.name), term))
        states.append(nxt)
        sels.append(sel)
        params.append(pp)
    return Unrolling(states, sels, params, insts, cons, N)


def _ite(c: Any, a: Any, b: Any) -> Any:
    if isinstance(a, Vec):
        return a.ite(c, b)
    return z3.If(c, a, b)


def _eq(a: Any, b: Any) -> Any:
    if isinstance(a, Vec):
        return a.eq(b)
    return a == b


def decode_trace(table: Table, m: z3.ModelRef, u: Unrolling) -> list[Step]:
    steps = []
    for sel, pp in zip(u.sels, u.params, strict=True):
        i = m.eval(sel, model_completion=True).as_long()
        if i < 0:
            break
        steps.append(decode_step(m, u.insts[i], pp))
    return steps


def decode_step(m: z3.ModelRef, inst: Instance, pp: Any) -> Step:
    params: dict[str, int] = {}
    for q in inst.action.params:
        if q.kind is ParamKind.REQ:
            assert inst.r is not None
            params[q.name] = inst.r
        else:
            params[q.name] = m.eval(pp.values[q.kind], model_completion=True).as_long()
    return Step(inst.action.name, params)


def decode_state(m: z3.ModelRef, s: SymState, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def val(term: Any) -> Any:
        v = m.eval(term, model_completion=True)
        return z3.is_true(v) if z3.is_bool(v) else v.as_long()

    for v in s.table.vars:
        t = s.get(v.name)
        if v.scope is Scope.GLOBAL:
            out[v.name] = val(t)
        elif v.scope is Scope.BLOCK:
            out[v.name] = tuple(val(t[i]) for i in range(n))
        elif v.scope is Scope.REQ:
            out[v.name] = tuple(val(x) for x in t)
        else:
            out[v.name] = tuple(tuple(val(x[i]) for i in range(n)) for x in t)
    return out


def replay(table: Table, n: int, steps: list[Step], start: dict[str, Any] | None = None) -> Trace:
    """Run the steps in the concrete interpreter; record the violations it sees at the end."""
    machine = Machine(table, n)
    try:
        s = machine.state(start) if start is not None else machine.init()
        for st in steps:
            s = machine.step(s, st.action, st.params)
    except (GuardError, Exception) as exc:  # noqa: BLE001 - a replay mismatch is reported, not raised
        return Trace(tuple(steps), n, start, (f"REPLAY FAILED: {exc}",), replayed=False)
    viol = tuple(str(v) for v in machine.violations(s))
    return Trace(tuple(steps), n, start, viol, replayed=True)


def bmc_find(
    table: Table, depth: int, N: int, goal: Any, timeout_ms: int = 60000
) -> tuple[str, Trace | None]:
    """``goal(unrolling)`` is a Z3 condition; returns sat/unsat/unknown and a replayed trace."""
    u = unroll(table, depth, N)
    solver = _solver(timeout_ms)
    solver.add(*u.constraints)
    solver.add(goal(u))
    res = solver.check()
    if res == z3.sat:
        steps = decode_trace(table, solver.model(), u)
        return "sat", replay(table, N, steps)
    return ("unsat" if res == z3.unsat else "unknown"), None


def violation_goal(inv: Invariant) -> Any:
    def goal(u: Unrolling) -> Any:
        sk = z3.Int("bmc!sk")
        last = u.states[-1]
        last.mode = "goal"
        bad, _ = inv_violated(last, inv, sk)
        last.mode = "expand"
        return bad

    return goal


def hit_use_goal() -> Any:
    """Some request starts using a non-empty validated hit: the whole hit path is reachable."""

    def goal(u: Unrolling) -> Any:
        parts = []
        for t, sel in enumerate(u.sels):
            for i, inst in enumerate(u.insts):
                if inst.action.name == "use" and inst.r is not None:
                    s = u.states[t]
                    parts.append(z3.And(sel == i, s.req(inst.r).hit > 0))
        return z3.Or(*parts)

    return goal


def fires_with_pinned_phase_goal(action: str, phase: int, var: str = "ckv") -> Any:
    """``action`` fires for a request that holds a pin on a block whose phase variable ``var``
    is ``phase``."""

    def goal(u: Unrolling) -> Any:
        parts = []
        L = u.states[0].k.L
        for t, sel in enumerate(u.sels):
            s = u.states[t]
            for i, inst in enumerate(u.insts):
                if inst.action.name == action and inst.r is not None:
                    pinned = s.req(inst.r).pinned
                    col = getattr(s, var)
                    held = [z3.And(b * L < pinned, col[b] == phase) for b in range(u.N)]
                    parts.append(z3.And(sel == i, z3.Or(*held)))
        return z3.Or(*parts)

    return goal


def fires_goal(action: str) -> Any:
    def goal(u: Unrolling) -> Any:
        idx = [i for i, inst in enumerate(u.insts) if inst.action.name == action]
        return z3.Or(*[z3.Or(*[sel == i for i in idx]) for sel in u.sels])

    return goal


# ---- k-induction over a concrete pool (any depth) -----------------------------------------
def k_induction(table: Table, inv: Invariant, N: int, k: int, timeout_ms: int = 60000) -> str:
    """Step case of k-induction: k steps satisfying every invariant reach a state satisfying
    ``inv``.  With the base case (BMC to depth k) it proves ``inv`` for pool size N, any depth."""
    insts = instances(table)
    states = [fresh_state(table, "k0.", N, mode="expand")]
    solver = _solver(timeout_ms)
    invs = list(table.invariants)
    for t in range(k):
        s = states[-1]
        for i in invs:
            solver.add(inv_holds(s, i, []))
        pp = fresh_params(table, f"kp{t}.", N)
        solver.add(*pp.domain)
        sel = z3.Int(f"ksel{t}")
        nxt = fresh_state(table, f"k{t + 1}.", N, mode="expand")
        opts = []
        for i, inst in enumerate(insts):
            p = bind(inst, pp)
            s2 = successor(s, inst, p)
            eqs = []
            for v in table.vars:
                a, b = nxt.get(v.name), s2.get(v.name)
                if isinstance(a, list):
                    eqs.extend(_eq(x, y) for x, y in zip(a, b, strict=True))
                else:
                    eqs.append(_eq(a, b))
            opts.append(z3.And(sel == i, guard(s, inst, p), *eqs))
        solver.add(z3.Or(*opts))
        states.append(nxt)
    last = states[-1]
    last.mode = "goal"
    bad, _ = inv_violated(last, inv, z3.Int("k!sk"))
    solver.add(bad)
    res = solver.check()
    return _verdict(res)


# ---- action-level read safety -------------------------------------------------------------
def _read_ok(s: Any, rs: Any, p: Any, b: Any) -> Any:
    parts = []
    if rs.scalar is not None:
        parts.append(_as_bool(rs.scalar(s, p)))
    if rs.per_block is not None:
        parts.append(_as_bool(rs.per_block(s, p, b)))
    return z3.And(*parts, z3.BoolVal(True))


def _as_bool(x: Any) -> Any:
    return z3.BoolVal(x) if isinstance(x, bool) else x


def _read_cti_concrete(table: Table, rs: Any, inst: Instance, timeout_ms: int) -> bool:
    """A counterexample on a concrete pool (N = 1..3, quantifiers expanded: exact)."""
    invs = proof_invariants(table)
    for n in range(1, 4):
        s = fresh_state(table, "pre.", n, mode="expand")
        pp = fresh_params(table, "p.", n)
        p = bind(inst, pp)
        sk = z3.Int("sk")
        solver = _solver(timeout_ms)
        solver.add(*pp.domain, sk >= 0, sk < n)
        solver.add(*[inv_holds(s, inv, []) for inv in invs])
        solver.add(guard(s, inst, p))
        solver.add(z3.Not(_read_ok(s, rs, p, sk)))
        if solver.check() == z3.sat:
            return True
    return False


def check_read(table: Table, rs: Any, timeout_ms: int = 20000) -> tuple[str, str]:
    """Invariants and the action's guard imply the read property at a Skolem block (any pool
    size).  Instantiated quantifiers first, real ``ForAll`` when that is not enough."""
    a = table.action(rs.action)
    invs = proof_invariants(table)
    worst, label = "proved", ""
    for inst in instances(table, [a]):
        status = "unknown"
        for mode in ("inst", "forall"):
            N = z3.Int("N")
            s = fresh_state(table, "pre.", N, mode=mode)
            pp = fresh_params(table, "p.", N)
            p = bind(inst, pp)
            sk = z3.Int("sk")
            terms = [sk] + [pp.values[ParamKind.BLOCK]] * any(
                q.kind is ParamKind.BLOCK for q in a.params
            )
            s.inst_terms = terms
            solver = _solver(timeout_ms if mode == "inst" else min(timeout_ms, 10000))
            solver.add(N >= 1, *pp.domain, sk >= 0, sk < N)
            solver.add(*[inv_holds(s, inv, terms) for inv in invs])
            solver.add(guard(s, inst, p))
            solver.add(z3.Not(_read_ok(s, rs, p, sk)))
            status = _verdict(solver.check())
            if status == "proved":
                break
            if mode == "inst" and status == "cti":
                # the instantiated counterexample may be spurious: a concrete one on a small
                # pool (exact) settles it before real quantifiers are tried
                if _read_cti_concrete(table, rs, inst, timeout_ms):
                    break
                status = "unknown"
        if status == "unknown" and _read_cti_concrete(table, rs, inst, timeout_ms):
            status = "cti"  # real quantifiers gave up; a small concrete pool has one
        if status != "proved":
            worst, label = status, inst.label
            break
    return worst, label


def _pre(table: Table, inst: Instance, mode: str) -> tuple[SymState, Any, Any, Any, list[Any]]:
    """A parametric pre-state (symbolic pool, Skolem block) with the invariants as hypotheses."""
    N = z3.Int("N")
    s = fresh_state(table, "pre.", N, mode=mode)
    pp = fresh_params(table, "p.", N)
    p = bind(inst, pp)
    sk = z3.Int("sk")
    terms = [sk] + [pp.values[ParamKind.BLOCK]] * any(
        q.kind is ParamKind.BLOCK for q in inst.action.params
    )
    s.inst_terms = terms
    hyps = [N >= 1, *pp.domain, sk >= 0, sk < N]
    hyps += [inv_holds(s, inv, terms) for inv in proof_invariants(table)]
    return s, p, sk, terms, hyps


def check_enabled(table: Table, action_name: str, timeout_ms: int = 20000) -> str:
    """``sat``: some instance's guard holds together with the invariants (instantiated at the
    Skolem and acting blocks: a necessary condition for a reach witness); ``dead``: none can
    (UNSAT is sound: the hypotheses are weaker than the invariants); ``unknown``."""
    a = table.action(action_name)
    worst = "dead"
    for inst in instances(table, [a]):
        s, p, _sk, _t, hyps = _pre(table, inst, "inst")
        solver = _solver(timeout_ms)
        solver.add(*hyps, guard(s, inst, p))
        res = solver.check()
        if res == z3.sat:
            return "sat"
        if res == z3.unknown:
            worst = "unknown"
    return worst


def check_tight(
    table: Table, owner: str, a_name: str, c_name: str, timeout_ms: int = 20000
) -> tuple[str, str]:
    """The conjunct refuses only steps that would break the property it protects: in every
    invariant state where the action's other conjuncts hold and this one fails, firing the
    action anyway breaks the invariant ``owner`` (or, for ``read:<action>.<name>``, the action-level
    property fails).  ``proved`` when UNSAT; ``cti`` names an instance that is refused needlessly."""
    a = table.action(a_name)
    for inst in instances(table, [a]):
        s, p, sk, terms, hyps = _pre(table, inst, "inst")
        solver = _solver(timeout_ms)
        solver.add(*hyps)
        solver.add(guard(s, inst, p, skip=(c_name,)))
        solver.add(z3.Not(_as_bool(a.conjunct(c_name).fn(s, p))))
        if owner.startswith("read:"):
            rs = next(x for x in table.reads if f"{x.action}.{x.name}" == owner[5:])
            # the property holds everywhere: at the Skolem block and the acting block
            for t in terms:
                solver.add(_read_ok(s, rs, p, t))
        else:
            nxt = successor(s, inst, p)
            solver.add(inv_holds(nxt, table.invariant(owner), terms))
        status = _verdict(solver.check())
        if status != "proved":
            return status, inst.label
    return "proved", ""


def check_local(table: Table, loc: Any, timeout_ms: int = 20000) -> tuple[str, str]:
    """``proved`` when changing every (mechanism) block variable at one block ``j`` outside the
    declared scope never changes the action's guard, in any invariant state (any pool size;
    quantifiers instantiated, negations at the free Skolem block, as in the equivalence check).
    """
    a = table.action(loc.action)
    for inst in instances(table, [a]):
        s, p, _sk, terms, hyps = _pre(table, inst, "inst")
        j = z3.Int("j")
        terms.append(j)  # the guards' quantifiers are instantiated at j too
        s2 = SymState(
            table,
            s.N,
            s.mode,
            s.nmax,
            s.inst_terms,
            dict(s._v),
            {k: list(v) for k, v in s._req.items()},
        )
        for v in table.vars:
            if v.ghost:
                continue
            srt = z3.BoolSort() if v.is_bool else z3.IntSort()
            if v.scope is Scope.BLOCK:
                s2._v[v.name] = z3.Store(s._v[v.name], j, z3.Const(f"j!{v.name}", srt))
            elif v.scope is Scope.REQ_BLOCK:
                s2._req[v.name] = [
                    z3.Store(x, j, z3.Const(f"j!{v.name}[{r}]", srt))
                    for r, x in enumerate(s._req[v.name])
                ]
        solver = _solver(timeout_ms)
        solver.add(*hyps, j >= 0, j < s.N, z3.Not(_as_bool(loc.within(s, p, j))))
        solver.add(guard(s, inst, p) != guard(s2, inst, p))
        status = _verdict(solver.check())
        if status != "proved":
            return status, inst.label
    return "proved", ""


def check_guard_equivalence(
    table: Table, mutant: Table, action_name: str, timeout_ms: int = 20000
) -> str:
    """``proved`` when, in every state satisfying the table's invariants (any pool size), the
    mutant's guard of ``action_name`` accepts exactly what the table's does:
    a guard-only mutant is then the same transition system on every reachable state."""
    a0, a1 = table.action(action_name), mutant.action(action_name)
    for inst in instances(table, [a0]):
        # Quantifiers instantiated at the Skolem block and the acting block: sound here, since
        # a guard's quantifier in a positive position becomes weaker (a hypothesis), and in a
        # negated one it is instantiated at the free Skolem block (a witness if one exists).
        s, p, _sk, _t, hyps = _pre(table, inst, "inst")
        solver = _solver(timeout_ms)
        solver.add(*hyps)
        solver.add(guard(s, inst, p) != guard(s, Instance(a1, inst.r), p))
        status = _verdict(solver.check())
        if status != "proved":
            return status
    return "proved"


def read_violation_goal(rs: Any) -> Any:
    """Some instance of the reading action is enabled in the last state while its read
    property fails at some block."""

    def goal(u: Unrolling) -> Any:
        last = u.states[-1]
        parts = []
        for i, inst in enumerate(u.insts):
            if inst.action.name != rs.action:
                continue
            pp = fresh_params(last.table, f"rv{i}.", u.N)
            p = bind(inst, pp)
            sk = z3.Int(f"rv{i}!sk")
            parts.append(
                z3.And(
                    *pp.domain, sk >= 0, sk < u.N, guard(last, inst, p),
                    z3.Not(_read_ok(last, rs, p, sk)),
                )
            )  # fmt: skip
        return z3.Or(*parts, z3.BoolVal(False))

    return goal


def read_violated_concretely(table: Table, rs: Any, trace: Trace) -> bool:
    """Replay: in the last state some enabled instance of the action reads unsafely."""
    import itertools
    from types import SimpleNamespace

    if not trace.replayed:
        return False
    m = Machine(table, trace.pool_size)
    s = m.run([(st.action, st.params) for st in trace.steps])[-1]
    a = table.action(rs.action)
    domains = {
        ParamKind.BLOCK: range(m.N),
        ParamKind.REQ: range(table.consts.R),
    }
    names = [q.name for q in a.params]
    for combo in itertools.product(*[domains.get(q.kind, (1,)) for q in a.params]):
        p = SimpleNamespace(**dict(zip(names, combo, strict=True)))
        if not all(c.fn(s, p) for c in a.guard):
            continue
        for b in range(m.N):
            ok = (rs.scalar is None or rs.scalar(s, p)) and (
                rs.per_block is None or rs.per_block(s, p, b)
            )
            if not ok:
                return True
    return False


# ---- completeness: the write path enables the read path (bounded) --------------------------
def check_completeness(
    table: Table, N: int, depth: int, timeout_ms: int = 60000
) -> tuple[str, Trace | None]:
    """BMC over traces of the write-path actions only (``N`` blocks, up to ``depth`` steps):
    no reachable state has ``stored(s, n)`` for some ``n`` while the read path's probe
    (admit, match at the expected hit, pin, validate) is refused.  ``holds`` when UNSAT."""
    from types import SimpleNamespace

    c = table.completeness
    assert c is not None
    wt = Table.build(
        f"{table.name}|write path",
        table.geometry,
        table.vars,
        [a for a in table.actions if a.name in c.write_path],
        table.invariants,
        table.hit_rule,
    )
    u = unroll(wt, depth, N)
    last = u.states[-1]
    bad = []
    for n in range(1, N + 1):
        s = last
        conds = []
        probe = c.probe(n, table.geometry)
        for a_name, params in probe:
            a = table.action(a_name)
            inst = Instance(a, params.get("r") if a.request_scoped else None)
            p = SimpleNamespace(**{k: z3.IntVal(v) if k != "r" else v for k, v in params.items()})
            conds.append(guard(s, inst, p))
            s = successor(s, inst, p)
        # validated at the full length, not at a shorter one
        conds.append(s.req(0).hit == c.expected_hit(n * table.consts.L, table.geometry))
        bad.append(z3.And(_as_bool(c.stored(last, n)), z3.Not(z3.And(*conds))))
    solver = _solver(timeout_ms)
    solver.add(*u.constraints)
    solver.add(z3.Or(*bad))
    res = solver.check()
    if res == z3.sat:
        steps = decode_trace(wt, solver.model(), u)
        return "violated", replay(table, N, steps)
    return ("holds" if res == z3.unsat else "unknown"), None
