"""Each component's lifecycle as a networkx graph, derived from the table by Z3.

An edge ``p -> q`` labelled ``action`` exists when some state satisfying every invariant lets
``action`` move the component's phase variable (at some block, or for request 0) from ``p`` to
``q``.  Edges are enumerated by blocking each found pair, so the graph is exactly what the guards
and updates allow over invariant states (an over-approximation of the reachable edges; the
reachability witnesses in :mod:`kvstate.proofs` show the actions really fire).

Structural checks: every phase is reachable from the initial one, and from every phase a
terminal ("at rest") phase is reachable, so no phase is a trap (such as a load that can never
complete or fail).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx
import z3

from kvstate.spec.phases import Lifecycle
from kvstate.spec.table import Scope, Table

from .symbolic import Instance, instances, step_query


def _phase_term(s: object, lc: Lifecycle, table: Table, sk: z3.ArithRef) -> z3.ArithRef:
    v = table.var(lc.var)
    val = s.get(lc.var)  # type: ignore[attr-defined]
    if v.scope is Scope.GLOBAL:
        return val
    if v.scope is Scope.BLOCK:
        return val[sk]
    if v.scope is Scope.REQ:
        return val[0]
    raise ValueError(f"lifecycle variable {lc.var!r} has unsupported scope {v.scope}")


def action_edges(
    table: Table, lc: Lifecycle, inst: Instance, timeout_ms: int = 10000
) -> list[tuple[str, str]]:
    """The phase moves of ``lc`` one action instance allows over invariant states."""
    invs = [i for i in table.invariants if not i.bounded]
    q = step_query(table, inst, invs, "inst")
    s, s2, sk = q.pre, q.post, q.skolem
    solver = z3.Solver()
    solver.set(timeout=timeout_ms)
    solver.add(*q.hypotheses)
    before, after = _phase_term(s, lc, table, sk), _phase_term(s2, lc, table, sk)
    solver.add(before != after)
    out = []
    while solver.check() == z3.sat:
        m = solver.model()
        a = m.eval(before, model_completion=True).as_long()
        b = m.eval(after, model_completion=True).as_long()
        out.append((lc.phases(a).name, lc.phases(b).name))
        solver.add(z3.Not(z3.And(before == a, after == b)))
    return out


def phase_graph(
    table: Table,
    lc: Lifecycle,
    timeout_ms: int = 10000,
    known: Mapping[tuple[str, int | None], Sequence[tuple[str, str]]] | None = None,
) -> nx.MultiDiGraph:
    """``known``: edges already enumerated per (action, request) instance, reused as they are
    (``kvstate mutate`` changes one action, so every other action's edges are the table's)."""
    g = nx.MultiDiGraph(name=lc.component)
    for ph in lc.members:
        g.add_node(ph.name)
    scope = table.var(lc.var).scope
    for inst in instances(table):
        if lc.var not in inst.action.modifies:
            continue
        if scope is Scope.REQ and inst.r != 0:
            continue
        key = (inst.action.name, inst.r)
        edges = known[key] if known is not None and key in known else None
        if edges is None:
            edges = action_edges(table, lc, inst, timeout_ms)
        for a, b in edges:
            g.add_edge(a, b, action=inst.action.name)
    return g


@dataclass
class StructureReport:
    component: str
    unreachable: list[str]
    traps: list[str]
    edges: int

    @property
    def ok(self) -> bool:
        return not self.unreachable and not self.traps


def check_structure(g: nx.MultiDiGraph, lc: Lifecycle) -> StructureReport:
    start = lc.initial.name
    reach = nx.descendants(g, start) | {start}
    unreachable = sorted(n for n in g.nodes if n not in reach)
    terminal = {t.name for t in lc.terminal}
    traps = []
    for n in g.nodes:
        if n in terminal:
            continue
        if not (nx.descendants(g, n) & terminal):
            traps.append(n)
    return StructureReport(lc.component, unreachable, sorted(traps), g.number_of_edges())


def to_dot(g: nx.MultiDiGraph, lc: Lifecycle) -> str:
    """Graphviz DOT text (written by hand: no pydot dependency for a few lines of text)."""
    name = lc.component.replace(" ", "_").replace("-", "_")
    lines = [f"digraph {name} {{", "  rankdir=LR;"]
    for n in g.nodes:
        shape = "doublecircle" if n in {t.name for t in lc.terminal} else "circle"
        lines.append(f'  "{n}" [shape={shape}];')
    merged: dict[tuple[str, str], list[str]] = {}
    for u, v, data in g.edges(data=True):
        merged.setdefault((u, v), []).append(data["action"])
    for (u, v), acts in sorted(merged.items()):
        lines.append(f'  "{u}" -> "{v}" [label="{", ".join(sorted(set(acts)))}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
