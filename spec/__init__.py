"""kvstate.spec: the declarative transition table, the single source of truth.

Everything else (the reference model, the Z3 proofs, the conformance fuzzer and the
implementation's hit search) is derived from what is declared here.
"""

from .default import default_table
from .errors import GeometryError, SpecError
from .expr import AND, IMPLIES, ITE, NOT, OR, array, forall_blocks, store
from .geometry import Geometry, KernelCombo, deepseek_v4_flash, preset, small
from .layers import DEFAULT_HIT_RULE, HitRule, Rule, RuleScope
from .phases import CKV, LIFECYCLES, Fmt, Graph, Indexer, Pipe, Req, Swa, Tail
from .state import ConcreteState, initial_state
from .table import Action, Conjunct, Consts, Invariant, Param, ParamKind, Scope, Table, Var

TABLES = {
    "default": lambda: default_table(small()),
    "small": lambda: default_table(small()),
    "deepseek-v4-flash": lambda: default_table(deepseek_v4_flash()),
}


def table_named(name: str) -> Table:
    """A built-in table by name (``default`` is the default table on the small geometry)."""
    try:
        return TABLES[name]()
    except KeyError:
        raise SpecError(f"unknown spec {name!r}; known: {', '.join(sorted(TABLES))}") from None


__all__ = [
    "AND",
    "IMPLIES",
    "ITE",
    "NOT",
    "OR",
    "array",
    "forall_blocks",
    "store",
    "Action",
    "CKV",
    "ConcreteState",
    "Conjunct",
    "Consts",
    "DEFAULT_HIT_RULE",
    "Fmt",
    "Geometry",
    "GeometryError",
    "Graph",
    "HitRule",
    "Indexer",
    "Invariant",
    "KernelCombo",
    "LIFECYCLES",
    "Param",
    "ParamKind",
    "Pipe",
    "Req",
    "Rule",
    "RuleScope",
    "Scope",
    "SpecError",
    "Swa",
    "TABLES",
    "Table",
    "Tail",
    "Var",
    "deepseek_v4_flash",
    "default_table",
    "initial_state",
    "preset",
    "small",
    "table_named",
]
