"""The block-level target's projection of the table: an observation compared with the model up to
renaming of addresses (``diff``), and completed with the model's ghost truth (``with_ghosts``)
so the invariants can be checked on it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kvstate.spec.table import Scope, Table, address_vars

_canonical_last: list[Any] = [None, None, None]  # (values, table, result) of the last call


def canonical(values: Mapping[str, Any], table: Table) -> dict[str, Any]:
    """Addresses renamed by order of first appearance: equal iff equal up to a bijection."""
    if not isinstance(values, MappingProxyType):
        return _canonical(values, table)
    # A read-only snapshot (_ObservedTarget's): the same object is the same observation, and a
    # refusal check's "before" is the previous check's "after".
    last = _canonical_last
    if values is not last[0] or table is not last[1]:
        last[:] = [values, table, _canonical(values, table)]
    return dict(last[2])


class _Facts:
    """Per table, computed once (each observation needs them)."""

    __slots__ = ("table", "addresses", "names", "mechanism_first", "mechanism", "ghosts")

    def __init__(self, table: Table) -> None:
        names = {v.name for v in table.vars}
        self.table = table
        # the address variables with their scopes
        self.addresses = tuple(
            (var, table.var(var).scope) for var in address_vars(table) if var in names
        )
        # the names ``observe()`` must report (every non-ghost variable)
        self.names = frozenset(v.name for v in table.vars if not v.ghost)
        ghost = [table.var(var).ghost for var, _ in self.addresses]
        # no ghost address is renamed before a mechanism one: equal mechanism values are then
        # equal up to renaming too (see ``diff``)
        self.mechanism_first = ghost == sorted(ghost)
        # ``with_ghosts``: the mechanism's address variables (flattened when per request and
        # block), and each ghost with whether it is a per-block address (translated)
        self.mechanism = tuple(
            (var, scope is Scope.REQ_BLOCK)
            for var, scope in self.addresses
            if not table.var(var).ghost
        )
        addresses = address_vars(table)
        self.ghosts = tuple(
            (v.name, v.name in addresses and v.scope is Scope.BLOCK) for v in table.vars if v.ghost
        )


_facts_memo: dict[int, _Facts] = {}


def _facts_of(table: Table) -> _Facts:
    hit = _facts_memo.get(id(table))
    if hit is None or hit.table is not table:
        hit = _facts_memo[id(table)] = _Facts(table)
    return hit


def _canonical(values: Mapping[str, Any], table: Table) -> dict[str, Any]:
    names: dict[int, int] = {}

    def rn(x: int) -> int:
        return names.setdefault(x, len(names))

    out = dict(values)
    for var, scope in _facts_of(table).addresses:
        if var not in values:
            continue
        v = values[var]
        if scope is Scope.BLOCK:
            out[var] = tuple(rn(x) for x in v)
        elif scope is Scope.REQ_BLOCK:
            out[var] = tuple(tuple(rn(x) for x in row) for row in v)
    return out


_PLAIN = (dict, MappingProxyType)


def diff(model: Mapping[str, Any], observed: Mapping[str, Any], table: Table) -> list[str]:
    facts = _facts_of(table)
    names, mechanism_first = facts.names, facts.mechanism_first
    if model is observed or (
        len(model) == len(observed)
        and (
            model == observed  # dicts and their read-only views compare item by item, uncopied
            if type(model) in _PLAIN and type(observed) in _PLAIN
            else dict(model) == dict(observed)
        )
    ):  # equal as they stand (a refusal check's before and after): equal up to renaming too
        if names <= observed.keys():
            return []
    elif mechanism_first and names <= observed.keys() and names <= model.keys():
        # The model has ghosts the target lacks.  Every variable the target shows equal as it
        # stands: ``_diff`` would find no difference, because the renaming (by first
        # appearance, address variables in table order) meets the same values in the same
        # order on both sides until the first ghost address, and every mechanism address
        # variable comes before it (``mechanism_first``).
        if all(model[n] == observed[n] for n in names):
            return []
    return _diff(model, observed, table)


def _diff(model: Mapping[str, Any], observed: Mapping[str, Any], table: Table) -> list[str]:
    a, b = canonical(model, table), canonical(observed, table)
    out = []
    for v in table.vars:
        if v.ghost:  # ghost truth lives in the model only
            continue
        if v.name not in b:
            out.append(f"{v.name}: missing from observe()")
        elif a[v.name] != b[v.name]:
            out.append(f"{v.name}: model {a[v.name]!r} != target {b[v.name]!r}")
    return out


def with_ghosts(
    model: Mapping[str, Any], observed: Mapping[str, Any], table: Table
) -> dict[str, Any]:
    """The observed state completed with the model's ghost truth (the target has none), so the
    invariants over ghosts can be checked on it.  Ghost addresses are translated into the
    target's address names through the mechanism's address variables, which ``diff`` has just
    found equal up to a bijection."""
    out = dict(observed)
    facts = _facts_of(table)
    if not facts.ghosts:
        return out
    to_target: dict[int, int] = {}
    for var, flat in facts.mechanism:
        if var in observed:
            a, b = model[var], observed[var]
            if flat:
                a = tuple(x for row in a for x in row)
                b = tuple(x for row in b for x in row)
            if a == b:  # each x pairs with itself (the first pairing of an x stands)
                for x in a:
                    to_target.setdefault(x, x)
                continue
            for x, y in zip(a, b, strict=False):
                to_target.setdefault(x, y)
    # a ghost address not named by the mechanism keeps its name, as one paired with itself
    renames = any(x != y for x, y in to_target.items())
    for name, translate in facts.ghosts:
        val = model[name]
        if translate and renames:
            val = tuple(to_target.get(x, x) for x in val)
        out[name] = val
    return out
