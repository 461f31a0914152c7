"""``--target kvstate-api``: kvstate's public API in lockstep with the model.

The target is split by job (ARCHITECTURE.md): the shared pieces and the hook protocol
(:mod:`.base`), the harness's state and step (:mod:`.state`), the form an operation is declared
in (:mod:`.declare`), the core operations (:mod:`.ops`), every module's operations gathered and
the tables derived from them (:mod:`.registry`), the fault installers (:mod:`.faults`), the witnesses (:mod:`.witnesses`), Hypothesis and
minimization (:mod:`.explore`), the run shared with a forked process (:mod:`.beside`) and the
run's driver (:mod:`.run`); the other modules are checks, one class of path each.  This module
re-exports the names tests and users reach for; no module of the target imports it back.
"""

from __future__ import annotations

from kvstate.targets.api.base import NAMESPACE, OTHER_NAMESPACE, Coverage, Live, op
from kvstate.targets.api.explore import PROFILES, explore_settings, minimize_ops, replay
from kvstate.targets.api.machine import build_machine
from kvstate.targets.api.registry import (
    DEFAULT_OPS,
    FAULT_KINDS,
    FAULT_OPS,
    MAPPING,
    OPS,
    parse_ops,
)
from kvstate.targets.api.run import RunResult, run_api, run_api_cli, summary_lines
from kvstate.targets.api.state import ApiHarness
from kvstate.targets.api.witnesses import witnesses

__all__ = [
    "FAULT_KINDS",
    "DEFAULT_OPS",
    "FAULT_OPS",
    "MAPPING",
    "NAMESPACE",
    "OPS",
    "OTHER_NAMESPACE",
    "PROFILES",
    "ApiHarness",
    "Coverage",
    "Live",
    "RunResult",
    "build_machine",
    "explore_settings",
    "minimize_ops",
    "op",
    "parse_ops",
    "replay",
    "run_api",
    "run_api_cli",
    "summary_lines",
    "witnesses",
]
