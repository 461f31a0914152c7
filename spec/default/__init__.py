"""The default transition table for a DeepSeek-V4-style heterogeneous KV cache.

The abstract state follows one shared prefix chain of LCM blocks (block ``b`` covers tokens
``[b*L, (b+1)*L)``) through the five cache states, plus the requests that hit it, the recovery
pipelines and one captured CUDA graph.  Every guard conjunct is named: the proofs cite them, the
anti-vacuity checks drop them, and seeded-bug variants are derived by removing one.

Read it as the allocator's contract; ``ARCHITECTURE.md`` explains how each reader derives its
own form (guards, Z3 terms, Hypothesis rules, phase graphs, the implementation's hit search).
"""

from __future__ import annotations

from kvstate.spec.geometry import Geometry, small
from kvstate.spec.layers import DEFAULT_HIT_RULE, HitRule
from kvstate.spec.table import Action, Table

from .blocks import block_actions
from .declarations import COMPLETENESS, COVERAGE, LOCALITY, RECOVERY, reads
from .equivalent import EQUIVALENT
from .ghosts import with_ghosts
from .invariants import invariants
from .requests import request_actions
from .tiers import tier_actions
from .variables import variables

__all__ = ["EQUIVALENT", "actions", "default_table", "small"]


def actions(hit_rule: HitRule) -> list[Action]:
    """The 32 actions, in the table's order, each with its ghost effects."""
    acts = [*block_actions(), *tier_actions(), *request_actions(hit_rule)]
    return [with_ghosts(a) for a in acts]


def default_table(geometry: Geometry | None = None, hit_rule: HitRule | None = None) -> Table:
    """The default table, on the small geometry unless another is given."""
    g = geometry or small()
    rule = hit_rule or DEFAULT_HIT_RULE
    return Table.build(
        f"default[{g.name}]",
        g,
        variables(),
        actions(rule),
        invariants(rule),
        rule,
        EQUIVALENT,
        reads(),
        COMPLETENESS,
        LOCALITY,
        RECOVERY,
        COVERAGE,
    )
