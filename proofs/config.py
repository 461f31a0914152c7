"""The prover's settings (depths, pool sizes, timeouts), apart from the obligations that read
them: the units of work (:mod:`kvstate.proofs.units`) read them too, and the obligations run
those units."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Config:
    depth: int = 4  # BMC depth on the default pool
    bmc_pool: int = 2
    search_depth: int = 15  # deepest witness / counterexample search
    k_pools: tuple[int, ...] = (1, 2, 3)
    timeout_ms: int = 60000
    update_witnesses: bool = False
    completeness_bounds: tuple[tuple[int, int], ...] = ((1, 6), (2, 9))  # (pool, depth)
    find_traces: bool = True  # on a failed induction step, search a trace from Init (mutate: off)
    k_timeout_ms: int | None = None  # k-induction's own timeout (mutate: longer than the rest)
    first_failure: bool = False  # stop a unit at its first failed obligation (mutate: on)
    # mutate: each lifecycle's phase edges per (action, request) instance of the unchanged
    # actions, reused by the structure check instead of enumerated again
    known_edges: Mapping[str, Mapping[tuple[str, int | None], Any]] | None = field(
        default=None, compare=False
    )
