"""The proof obligations' units of work: one function per kind, each returning its results.

:mod:`.obligations` plans them (which units a table has) and dispatches to them (``run_unit``);
each builds fresh solvers, so the runner can farm them out across processes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from kvstate.model.graph import check_structure, phase_graph
from kvstate.model.symbolic import (
    Instance,
    instances,
    inv_violated,
    step_query,
)
from kvstate.spec.compile import invariant_reads
from kvstate.spec.phases import LIFECYCLES
from kvstate.spec.table import Invariant, Table

from . import witnesses
from .config import Config
from .engine import (
    _cti_trace,
    _verdict,
    bmc_find,
    check_completeness,
    check_enabled,
    check_init,
    check_local,
    check_read,
    check_tight,
    fires_goal,
    fires_with_pinned_phase_goal,
    hit_use_goal,
    k_induction,
    proof_invariants,
    read_violated_concretely,
    read_violation_goal,
    replay,
    violation_goal,
)
from .results import Result, Trace

UNBOUNDED = "unbounded: any pool size, any depth (requests expanded: R={R})"


# ---- units ---------------------------------------------------------------------------------
def structure(table: Table, cfg: Config, component: str) -> list[Result]:
    t0 = time.perf_counter()
    lc = next(lc for lc in LIFECYCLES if lc.component == component)
    known = cfg.known_edges.get(component) if cfg.known_edges is not None else None
    g = phase_graph(table, lc, known=known)
    rep = check_structure(g, lc)
    detail = f"{len(lc.members)} phases, {rep.edges} edges"
    if rep.unreachable:
        detail += f"; unreachable from {lc.initial.name}: {', '.join(rep.unreachable)}"
    if rep.traps:
        detail += f"; trap phases (no way back to rest): {', '.join(rep.traps)}"
    return [
        Result(
            f"structure/{component}",
            "structure",
            "phase graph from guards (Z3) + networkx",
            "unbounded: every state satisfying the invariants",
            "proved" if rep.ok else "violated",
            rep.ok,
            time.perf_counter() - t0,
            detail=detail,
        )
    ]


def init(table: Table, cfg: Config, inv_name: str) -> list[Result]:
    t0 = time.perf_counter()
    inv = table.invariant(inv_name)
    if inv.bounded:
        from kvstate.model.concrete import Machine

        bad = [
            n for n in cfg.k_pools if Machine(table, n).violations(Machine(table, n).init(), [inv])
        ]
        ok = not bad
        return [
            Result(
                f"init/{inv_name}",
                "init",
                "concrete evaluation",
                f"bounded: N in {list(cfg.k_pools)}",
                "proved" if ok else "violated",
                ok,
                time.perf_counter() - t0,
                invariant=inv_name,
                detail="" if ok else f"Init violates it at N={bad}",
            )
        ]
    out = check_init(table, inv, cfg.timeout_ms)
    ok = out.status == "proved"
    return [
        Result(
            f"init/{inv_name}",
            "init",
            "Z3 (parametric N)",
            UNBOUNDED.format(R=table.consts.R),
            out.status if out.status != "cti" else "violated",
            ok,
            time.perf_counter() - t0,
            invariant=inv_name,
            detail=out.detail,
        )
    ]


def inductive(table: Table, cfg: Config, action_name: str) -> list[Result]:
    """All invariants against one action; hypotheses built once per request instance."""
    a = table.action(action_name)
    insts = instances(table, [a])
    invs = proof_invariants(table)
    results: dict[str, Result] = {}
    # Frame rule: an action that modifies none of the variables an invariant reads preserves it.
    framed = [inv for inv in invs if not (invariant_reads(table, inv) & a.modifies)]
    for inv in framed:
        results[inv.name] = Result(
            f"inductive/{inv.name}/{action_name}",
            "inductive",
            "frame: modifies none of its variables",
            UNBOUNDED.format(R=table.consts.R),
            "proved",
            True,
            0.0,
            invariant=inv.name,
            action=action_name,
        )
    invs_to_check = [inv for inv in invs if inv not in framed]
    for inst in insts if invs_to_check else []:
        prepared = {mode: _prepare(table, inst, invs, mode, cfg) for mode in ("inst",)}
        for inv in invs_to_check:
            t0 = time.perf_counter()
            status, mode = _check_prepared(prepared["inst"], inv, cfg)
            tried_concrete = status == "cti" and not cfg.find_traces
            if tried_concrete:
                # mutate: a concrete counterexample to induction on a small pool (exact) settles
                # it before real quantifiers are tried (they mostly time out on a broken step)
                if _cti_trace(table, inv, inst, invs, cfg.timeout_ms) is not None:
                    status = "confirmed"
            if status == "confirmed":
                status = "cti"
            elif status != "proved":
                # Instantiation is incomplete: confirm with real quantifiers (briefly; a trace
                # search follows anyway if it is still not proved).
                prep_f = _prepare(table, inst, invs, "forall", cfg)
                status, mode = _check_prepared(
                    prep_f, inv, cfg, timeout_ms=min(cfg.timeout_ms, 10000)
                )
            prev = results.get(inv.name)
            dt = time.perf_counter() - t0 + (prev.seconds if prev else 0.0)
            method = "Z3 1-induction, Skolem block" + (
                " + instantiation" if mode == "inst" else " + ForAll"
            )
            if status == "proved":
                if prev is None or prev.ok:
                    results[inv.name] = Result(
                        f"inductive/{inv.name}/{action_name}",
                        "inductive",
                        method,
                        UNBOUNDED.format(R=table.consts.R),
                        "proved",
                        True,
                        dt,
                        invariant=inv.name,
                        action=action_name,
                    )
                else:
                    prev.seconds = dt
                continue
            if status == "unknown" and not cfg.find_traces and not tried_concrete:
                # mutate: real quantifiers gave up; a concrete counterexample to induction on
                # a small pool (exact) decides it
                if _cti_trace(table, inv, inst, invs, cfg.timeout_ms) is not None:
                    status = "cti"
            trace, how = (
                _find_real_trace(table, inv, inst, invs, cfg) if cfg.find_traces else (None, "")
            )
            label = inst.label
            if trace is not None and how == "bmc":
                res = Result(
                    f"inductive/{inv.name}/{action_name}",
                    "inductive",
                    method + "; BMC trace",
                    f"bounded trace: depth {len(trace.steps)}, N={trace.pool_size}",
                    "violated",
                    False,
                    dt,
                    invariant=inv.name,
                    action=action_name,
                    trace=trace,
                    detail=f"{label} breaks {inv.name}; reachable from Init",
                )
            else:
                res = Result(
                    f"inductive/{inv.name}/{action_name}",
                    "inductive",
                    method,
                    UNBOUNDED.format(R=table.consts.R),
                    "not-inductive" if status == "cti" else status,
                    False,
                    dt,
                    invariant=inv.name,
                    action=action_name,
                    trace=trace,
                    detail=f"{label}: counterexample to induction (no trace from Init within "
                    f"depth {cfg.search_depth}); strengthen with an auxiliary invariant",
                )
            results[inv.name] = res
            if cfg.first_failure:
                return list(results.values())
    return list(results.values())


@dataclass
class _Prepared:
    solver_parts: list[Any]
    post: Any
    skolem: Any
    mode: str


def _prepare(
    table: Table, inst: Instance, invs: list[Invariant], mode: str, cfg: Config
) -> _Prepared:
    q = step_query(table, inst, invs, mode)
    q.post.mode = "goal"
    return _Prepared(q.hypotheses, q.post, q.skolem, mode)


def _check_prepared(
    prep: _Prepared, inv: Invariant, cfg: Config, timeout_ms: int | None = None
) -> tuple[str, str]:
    solver = z3.Solver()
    solver.set(timeout=timeout_ms or cfg.timeout_ms)
    solver.add(*prep.solver_parts)
    bad, _ = inv_violated(prep.post, inv, prep.skolem)
    solver.add(bad)
    res = solver.check()
    return _verdict(res), prep.mode


_TRACE_MEMO: dict[tuple[str, str], Trace | None] = {}


def _find_real_trace(
    table: Table, inv: Invariant, inst: Instance, invs: list[Invariant], cfg: Config
) -> tuple[Trace | None, str]:
    key = (table.name, inv.name)
    if key not in _TRACE_MEMO:

        def check(tr: Trace) -> bool:
            return tr.replayed and any(v.startswith(inv.name) for v in tr.violated)

        found = witnesses.witness(
            table,
            f"violation/{inv.name}",
            lambda t: violation_goal(t.invariant(inv.name)),
            check,
            max_depth=cfg.search_depth,
            scale_caps=False,
            timeout_ms=cfg.timeout_ms,
            update=cfg.update_witnesses,
        )
        _TRACE_MEMO[key] = found[0] if found else None
    trace = _TRACE_MEMO[key]
    if trace is not None:
        return trace, "bmc"
    return _cti_trace(table, inv, inst, invs, cfg.timeout_ms), "cti"


def kinduction(table: Table, cfg: Config, inv_name: str) -> list[Result]:
    t0 = time.perf_counter()
    inv = table.invariant(inv_name)
    failed = []
    unknown = False
    for n in cfg.k_pools:
        status = "cti"
        for k in (1, 2):
            status = k_induction(table, inv, n, k, cfg.k_timeout_ms or cfg.timeout_ms)
            if status == "proved":
                break
        if status != "proved":
            failed.append(f"N={n}: {status}")
            unknown |= status == "unknown"
            if cfg.first_failure and status != "unknown":
                break  # mutate: one refuted pool size is enough
    ok = not failed
    return [
        Result(
            f"k-induction/{inv_name}",
            "k-induction",
            "Z3 k-induction (k<=2) on concrete pools",
            f"bounded: pool sizes N in {list(cfg.k_pools)}, any depth",
            "proved" if ok else ("unknown" if unknown else "not-inductive"),
            ok,
            time.perf_counter() - t0,
            invariant=inv_name,
            detail="; ".join(failed),
        )
    ]


def bmc(table: Table, cfg: Config, inv_name: str) -> list[Result]:
    t0 = time.perf_counter()
    inv = table.invariant(inv_name)
    res, trace = bmc_find(table, cfg.depth, cfg.bmc_pool, violation_goal(inv), cfg.timeout_ms)
    status = {"unsat": "holds", "sat": "violated"}.get(res, "unknown")
    return [
        Result(
            f"bmc/{inv_name}",
            "bmc",
            "Z3 BMC, one action selector per step",
            f"bounded: depth {cfg.depth}, N={cfg.bmc_pool}, R={table.consts.R}",
            status,
            res == "unsat",
            time.perf_counter() - t0,
            invariant=inv_name,
            trace=trace,
        )
    ]


def reach(
    table: Table,
    cfg: Config,
    action_name: str,
    with_hit: bool = False,
    pinned_phase: int | None = None,
    pinned_var: str = "ckv",
) -> list[Result]:
    t0 = time.perf_counter()
    table.action(action_name)
    name = f"reach/{action_name}" + ("+hit" if with_hit else "")
    if pinned_phase is not None:
        domain = table.var(pinned_var).domain
        name += f"@{domain(pinned_phase).name if domain is not None else pinned_phase}"

    def check(tr: Trace) -> bool:
        if not (tr.replayed and bool(tr.steps) and tr.steps[-1].action == action_name):
            return False
        if with_hit:  # the request using the hit must have been validated with a non-empty hit
            return any(s.action == "match" and s.params.get("h", 0) > 0 for s in tr.steps)
        if pinned_phase is not None:
            from kvstate.model.concrete import Machine

            m = Machine(table, tr.pool_size)
            before = m.run([(st.action, st.params) for st in tr.steps[:-1]])[-1]
            r = tr.steps[-1].params["r"]
            pinned = before.req(r).pinned
            return any(
                b * table.consts.L < pinned and getattr(before, pinned_var)[b] == pinned_phase
                for b in range(m.N)
            )
        return True

    if with_hit:
        goal = hit_use_goal()
    elif pinned_phase is not None:
        goal = fires_with_pinned_phase_goal(action_name, pinned_phase, pinned_var)
    else:
        goal = fires_goal(action_name)
    dead: list[bool] = []

    def hopeless() -> bool:
        # A guard that holds in no state satisfying the invariants can fire in no reachable
        # one: one query (a fraction of a second) instead of BMC at growing depths on three
        # shapes, each query UNSAT (minutes).  The invariants themselves are other obligations.
        dead.append(check_enabled(table, action_name, cfg.timeout_ms) == "dead")
        return dead[-1]

    found = witnesses.witness(
        table,
        name,
        lambda t: goal,
        check,
        max_depth=cfg.search_depth,
        scale_caps=False,
        timeout_ms=cfg.timeout_ms,
        update=cfg.update_witnesses,
        hopeless=hopeless,
    )
    if dead and dead[-1]:
        return [
            Result(
                name,
                "reach",
                "Z3: invariants and the guard unsatisfiable together (no search run)",
                UNBOUNDED.format(R=table.consts.R),
                "dead",
                False,
                time.perf_counter() - t0,
                action=action_name,
                detail=f"dead action: {action_name}'s guard holds in no state satisfying the "
                "invariants, so in no reachable state",
            )
        ]
    trace = None
    how = f"Z3 BMC witness (depth <= {cfg.search_depth})"
    if found is not None:
        # Traces of the one-request shape are traces of the table itself: replay them there.
        trace = replay(table, found[1].pool, list(found[0].steps))
        how = found[2]
    ok = trace is not None and check(trace)
    scope = (
        f"bounded: witness of depth {len(trace.steps)}, N={trace.pool_size}"
        if trace
        else f"bounded: none within depth {cfg.search_depth}"
    )
    return [
        Result(
            name,
            "reach",
            how,
            scope,
            "witness" if ok else "no-witness",
            ok,
            time.perf_counter() - t0,
            action=action_name,
            trace=trace,
            detail="" if ok else "the action is never enabled in a reachable state (dead action)",
        )
    ]


def _read(table: Table, key: str) -> Any:
    """A read-safety declaration by ``<action>.<name>`` (or by its name alone when unique)."""
    for rs in table.reads:
        if key in (rs.name, f"{rs.action}.{rs.name}"):
            return rs
    raise KeyError(key)


def action_safety(table: Table, cfg: Config, name: str) -> list[Result]:
    t0 = time.perf_counter()
    rs = _read(table, name)
    status, label = check_read(table, rs, cfg.timeout_ms)
    ok = status == "proved"
    return [
        Result(
            f"action-safety/{rs.action}.{rs.name}",
            "action-safety",
            "Z3: invariants + guard => read property, Skolem block",
            UNBOUNDED.format(R=table.consts.R),
            "proved" if ok else ("violated" if status == "cti" else status),
            ok,
            time.perf_counter() - t0,
            action=rs.action,
            detail=rs.doc
            if ok
            else f"{label}: the guard allows a read where '{rs.name}' fails (counterexample)",
        )
    ]


def enabled(table: Table, cfg: Config, action_name: str) -> list[Result]:
    t0 = time.perf_counter()
    status = check_enabled(table, action_name, cfg.timeout_ms)
    ok = status != "dead"
    return [
        Result(
            f"enabled/{action_name}",
            "enabled",
            "Z3: invariants and the guard satisfiable together (instantiated)",
            UNBOUNDED.format(R=table.consts.R),
            {"sat": "satisfiable", "dead": "violated"}.get(status, status),
            ok,
            time.perf_counter() - t0,
            action=action_name,
            detail="" if ok else "no state satisfying the invariants enables it (dead action)",
        )
    ]


def local(table: Table, cfg: Config, action_name: str) -> list[Result]:
    t0 = time.perf_counter()
    loc = next(x for x in table.locality if x.action == action_name)
    status, label = check_local(table, loc, cfg.timeout_ms)
    ok = status == "proved"
    return [
        Result(
            f"local/{action_name}",
            "local",
            "Z3: one block outside the scope changed => the same verdict",
            UNBOUNDED.format(R=table.consts.R),
            "proved" if ok else ("violated" if status == "cti" else status),
            ok,
            time.perf_counter() - t0,
            action=action_name,
            detail=loc.doc
            if ok
            else f"{label}: the guard's verdict depends on a block outside its scope",
        )
    ]


def tight(table: Table, cfg: Config, owner: str, a_name: str, c_name: str) -> list[Result]:
    t0 = time.perf_counter()
    status, label = check_tight(table, owner, a_name, c_name, cfg.timeout_ms)
    ok = status == "proved"
    what = owner[5:] if owner.startswith("read:") else owner
    return [
        Result(
            f"tight/{owner}/{a_name}.{c_name}",
            "tight",
            "Z3: invariants + the other conjuncts + not this one => the property fails",
            UNBOUNDED.format(R=table.consts.R),
            "proved" if ok else ("violated" if status == "cti" else status),
            ok,
            time.perf_counter() - t0,
            invariant=what,
            action=a_name,
            detail=f"{a_name}.{c_name} refuses only what would break {what}"
            if ok
            else f"{label}: {a_name}.{c_name} refuses a step that keeps {what} (stricter "
            "than it needs to be)",
        )
    ]


def completeness(table: Table, cfg: Config, n: int, depth: int) -> list[Result]:
    t0 = time.perf_counter()
    status, trace = check_completeness(table, n, depth, cfg.timeout_ms)
    ok = status == "holds"
    c = table.completeness
    assert c is not None
    return [
        Result(
            f"completeness/N={n}",
            "completeness",
            "Z3 BMC over write-path traces; read-path probe at the last state",
            f"bounded: depth {depth}, N={n}",
            status,
            ok,
            time.perf_counter() - t0,
            trace=trace,
            detail=c.doc
            if ok
            else "a stored, sealed, indexed prefix is refused a hit at its full LCM length",
        )
    ]


def antivacuity(table: Table, cfg: Config, inv_name: str, a_name: str, c_name: str) -> list[Result]:
    t0 = time.perf_counter()
    if inv_name.startswith("read:"):
        return _antivacuity_read(table, cfg, inv_name[5:], a_name, c_name, t0)
    mutated = table.derive(name=f"{table.name} - {a_name}.{c_name}", drop_guard=[(a_name, c_name)])

    def check(tr: Trace) -> bool:
        return tr.replayed and any(v.startswith(inv_name) for v in tr.violated)

    found = witnesses.witness(
        mutated,
        f"anti-vacuity/{inv_name}",
        lambda t: violation_goal(t.invariant(inv_name)),
        check,
        max_depth=cfg.search_depth,
        scale_caps=True,
        timeout_ms=cfg.timeout_ms,
        update=cfg.update_witnesses,
    )
    ok = found is not None
    trace = found[0] if found else None
    scope = (
        f"bounded: witness of depth {len(trace.steps)}, {found[1].describe()}"
        if found and trace
        else f"bounded: none within depth {cfg.search_depth}"
    )
    return [
        Result(
            f"anti-vacuity/{inv_name}/{a_name}.{c_name}",
            "anti-vacuity",
            "drop the conjunct: " + (found[2] if found else "Z3 BMC"),
            scope,
            "falsifiable" if ok else "vacuous?",
            ok,
            time.perf_counter() - t0,
            invariant=inv_name,
            action=a_name,
            trace=trace,
            detail=f"without {a_name}.{c_name}, {inv_name} fails"
            if ok
            else f"removing {a_name}.{c_name} did not break {inv_name} within depth {cfg.search_depth}",
        )
    ]


def _antivacuity_read(
    table: Table, cfg: Config, name: str, a_name: str, c_name: str, t0: float
) -> list[Result]:
    rs = _read(table, name)
    weakened = table.action(a_name)
    if len(weakened.guard) == 1:  # the whole guard: the action is then always enabled
        mutated = table.derive(
            name=f"{table.name} - {a_name}.{c_name}",
            replace_guard={(a_name, c_name): lambda s, p: True},
        )
    else:
        mutated = table.derive(
            name=f"{table.name} - {a_name}.{c_name}", drop_guard=[(a_name, c_name)]
        )
    found = witnesses.witness(
        mutated,
        f"anti-vacuity/read:{name}",
        lambda t: read_violation_goal(rs),
        lambda tr: read_violated_concretely(mutated, rs, tr),
        max_depth=cfg.search_depth,
        scale_caps=True,
        timeout_ms=cfg.timeout_ms,
        update=cfg.update_witnesses,
    )
    ok = found is not None
    trace = found[0] if found else None
    return [
        Result(
            f"anti-vacuity/{rs.action}.{name}/{a_name}.{c_name}",
            "anti-vacuity",
            "drop the conjunct: " + (found[2] if found else "Z3 BMC"),
            f"bounded: witness of depth {len(trace.steps)}, {found[1].describe()}"
            if found and trace
            else f"bounded: none within depth {cfg.search_depth}",
            "falsifiable" if ok else "vacuous?",
            ok,
            time.perf_counter() - t0,
            action=a_name,
            trace=trace,
            detail=f"without {a_name}.{c_name}, {a_name} can read where '{name}' fails"
            if ok
            else f"removing {a_name}.{c_name} did not make {a_name}'s read unsafe",
        )
    ]
