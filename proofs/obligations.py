"""The proof obligations of a table, as independent units of work.

Each unit is small and self-contained so the runner can farm units out across cores; every
unit builds fresh solvers.  Units:

* ``structure``: each component's phase graph has no unreachable and no trap phase;
* ``init``: Init implies each invariant (any pool size);
* ``inductive``: for one action, every invariant is preserved (any pool size, any depth);
  one result per (invariant, action) pair so a failure names both;
* ``k-induction``: invariants that count over blocks, for each small concrete pool size;
* ``bmc``: no invariant fails within ``depth`` steps from Init on a concrete pool;
* ``reach``: each action fires in some reachable state (a replayed witness);
* ``anti-vacuity``: dropping a protecting guard conjunct makes the invariant fail (a witness).

Whenever an inductive step fails, the unit searches for a real trace from Init (bounded model
checking with iterative deepening on small pools) so the report shows a replayable trace rather
than only a counterexample to induction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstate.spec.compile import invariant_reads
from kvstate.spec.phases import LIFECYCLES
from kvstate.spec.table import Table

from . import units
from .config import Config
from .engine import replay
from .results import Result

UNBOUNDED = units.UNBOUNDED


@dataclass(frozen=True)
class Unit:
    kind: str
    name: str
    args: tuple[Any, ...] = ()


def plan(table: Table, cfg: Config, only: str | None = None) -> list[Unit]:
    units: list[Unit] = []
    for lc in LIFECYCLES:
        units.append(Unit("structure", f"structure/{lc.component}", (lc.component,)))
    for inv in table.invariants:
        units.append(Unit("init", f"init/{inv.name}", (inv.name,)))
    for a in table.actions:
        units.append(Unit("inductive", f"inductive/*/{a.name}", (a.name,)))
    # a dead action (no invariant state enables it) in one query per action, before any
    # witness search: the runner schedules these first, so a dead action is reported at once
    for a in table.actions:
        units.append(Unit("enabled", f"enabled/{a.name}", (a.name,)))
    for rs in table.reads:
        units.append(
            Unit(
                "action-safety",
                f"action-safety/{rs.action}.{rs.name}",
                (f"{rs.action}.{rs.name}",),
            )
        )
    for loc in table.locality:
        units.append(Unit("local", f"local/{loc.action}", (loc.action,)))
    for owner, a_name, c_name in tight_conjuncts(table):
        units.append(Unit("tight", f"tight/{owner}/{a_name}.{c_name}", (owner, a_name, c_name)))
    if table.completeness is not None:
        for n, d in cfg.completeness_bounds:
            units.append(Unit("completeness", f"completeness/N={n}", (n, d)))
    for inv in table.invariants:
        if inv.bounded:
            units.append(Unit("k-induction", f"k-induction/{inv.name}", (inv.name,)))
    for inv in table.invariants:
        units.append(Unit("bmc", f"bmc/{inv.name}", (inv.name,)))
    for a in table.actions:
        units.append(Unit("reach", f"reach/{a.name}", (a.name,)))
    if any(a.name == "use" for a in table.actions) and any(v.name == "hit" for v in table.vars):
        units.append(Unit("reach", "reach/use+hit", ("use", True)))
    # Phase coverage (the table's ``coverage`` goals): an action fires while its request holds a
    # pin on a block in each phase (the fuzzer replays these witnesses, so effects of
    # abort/downgrade mid-recovery are exercised).
    for cov in table.coverage:
        domain = table.var(cov.var).domain
        for a_name in cov.actions:
            if any(a.name == a_name for a in table.actions):
                for ph in cov.phases:
                    label = domain(ph).name if domain is not None else str(ph)
                    args = (a_name, False, int(ph), cov.var)
                    units.append(Unit("reach", f"reach/{a_name}@{label}", args))
    for inv in table.invariants:
        for a_name, c_name in inv.protected_by:
            if any(
                a.name == a_name and any(c.name == c_name for c in a.guard) for a in table.actions
            ):
                units.append(
                    Unit(
                        "anti-vacuity",
                        f"anti-vacuity/{inv.name}/{a_name}.{c_name}",
                        (inv.name, a_name, c_name),
                    )
                )
    for rs in table.reads:
        guard_names = {c.name for c in table.action(rs.action).guard}
        for c_name in (c for c in rs.protected_by if c in guard_names):
            units.append(
                Unit(
                    "anti-vacuity",
                    f"anti-vacuity/{rs.action}.{rs.name}/{rs.action}.{c_name}",
                    (f"read:{rs.name}", rs.action, c_name),
                )
            )
    if only:
        units = [u for u in units if _matches(u, only, table)]
    return units


# Cost order of the kinds ``kvstate mutate`` runs (cheapest first: most mutants die early).
KILL_ORDER = ("enabled", "inductive", "action-safety", "tight", "local", "k-induction",
              "completeness", "structure")  # fmt: skip


def tight_conjuncts(table: Table) -> list[tuple[str, str, str]]:
    """(invariant or ``read:<action>.<name>``, action, conjunct) for every declared tight conjunct that
    the table has (a dropped conjunct has nothing left to be tight)."""
    out = []
    names = {a.name: {c.name for c in a.guard} for a in table.actions}
    for inv in table.invariants:
        for a_name, c_name in inv.tight:
            if c_name in names.get(a_name, ()):
                out.append((inv.name, a_name, c_name))
    for rs in table.reads:
        for c_name in rs.tight:
            if c_name in names.get(rs.action, ()):
                out.append((f"read:{rs.action}.{rs.name}", rs.action, c_name))
    return out


def kill_units(
    original: Table, mutant: Table, action_name: str, *, liveness: bool = True
) -> list[Unit]:
    """The obligations a mutation of one action can change (for ``kvstate mutate``), cheapest
    first.

    Init and every other action's induction step read nothing the mutation changed, so they
    are skipped; the rest is what ``kvstate prove`` would run on the mutant for that action:
    its induction step, its action-level obligations, the tight conjuncts of its guard, the
    bounded invariants and the lifecycles whose variables it writes.  ``enabled`` (the guard
    is satisfiable in some invariant state: the symbolic necessary condition of ``reach``)
    stands in for the bounded reach witness.  ``liveness`` adds the completeness rule (bounded
    model checking: the expensive part)."""
    a = mutant.action(action_name)
    touched = set(original.action(action_name).modifies) | set(a.modifies)
    units: list[Unit] = [Unit("enabled", f"enabled/{action_name}", (action_name,))]
    for u in plan(mutant, Config()):
        if u.kind == "action-safety" and u.args[0].split(".")[0] == action_name:
            units.append(u)
        elif u.kind in ("tight", "local") and u.args[-2 if u.kind == "tight" else 0] == action_name:
            units.append(u)
        elif u.kind == "completeness" and liveness and mutant.completeness is not None:
            c = mutant.completeness
            # its BMC fires write-path actions only, and its probe the read path
            if action_name in (*c.write_path, *c.read_path):
                units.append(u)
    units.append(Unit("inductive", f"inductive/*/{action_name}", (action_name,)))
    for lc in LIFECYCLES:
        # a lifecycle's phase graph has edges only from the actions that write its variable
        if lc.var in touched:
            units.append(Unit("structure", f"structure/{lc.component}", (lc.component,)))
    for inv in mutant.invariants:
        if inv.bounded and invariant_reads(mutant, inv) & touched:
            units.append(Unit("k-induction", f"k-induction/{inv.name}", (inv.name,)))

    def cost(u: Unit) -> tuple[int, int]:
        # the small completeness pool is cheap; the larger one goes last of all
        if u.kind == "completeness" and u.args[0] > 1:
            return (len(KILL_ORDER), 0)
        return (KILL_ORDER.index(u.kind), 0)

    return sorted(units, key=cost)


def _matches(u: Unit, only: str, table: Table) -> bool:
    if only in u.name.split("/") or u.name.startswith(only) or u.kind == only:
        return True
    # "--only toctou" keeps inductive units (they report per invariant) too
    return u.kind == "inductive" and any(i.name == only for i in table.invariants)


def run_unit(table: Table, unit: Unit, cfg: Config, only: str | None = None) -> list[Result]:
    fn: Callable[..., list[Result]] = {
        "structure": units.structure,
        "init": units.init,
        "inductive": units.inductive,
        "k-induction": units.kinduction,
        "bmc": units.bmc,
        "reach": units.reach,
        "anti-vacuity": units.antivacuity,
        "action-safety": units.action_safety,
        "completeness": units.completeness,
        "enabled": units.enabled,
        "local": units.local,
        "tight": units.tight,
    }[unit.kind]
    t0 = time.perf_counter()
    try:
        results = fn(table, cfg, *unit.args)
    except Exception as exc:  # noqa: BLE001 - an obligation that crashes is reported, not fatal
        return [
            Result(
                unit.name,
                unit.kind,
                "-",
                "-",
                "error",
                False,
                time.perf_counter() - t0,
                detail=f"{type(exc).__name__}: {exc}",
            )
        ]
    if only and unit.kind == "inductive" and any(i.name == only for i in table.invariants):
        results = [r for r in results if r.invariant == only]
    return results


__all__ = ["Config", "Unit", "plan", "run_unit", "replay"]
