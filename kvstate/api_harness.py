"""``--target kvstate-api``: the public API in lockstep with the model, by its usual names.

The harness is split by job (ARCHITECTURE.md): the shared pieces and the hook protocol
(:mod:`kvstate.api_base`), the harness's state and step (:mod:`kvstate.api_state`), the
operations (:mod:`kvstate.api_ops`), the fault installers (:mod:`kvstate.api_faults`), the
witnesses (:mod:`kvstate.api_witnesses`), Hypothesis and minimization
(:mod:`kvstate.api_explore`), the run shared with a forked process (:mod:`kvstate.api_beside`)
and the run's driver (:mod:`kvstate.api_run`).  This module only re-exports their public
names; nothing under ``kvstate/`` imports it (no module of the harness imports it back).
"""

from __future__ import annotations

from kvstate.api_base import FAULT_KINDS, NAMESPACE, OTHER_NAMESPACE, Coverage, Live, Op, op
from kvstate.api_explore import PROFILES, build_machine, explore_settings, minimize_ops, replay
from kvstate.api_ops import FAULT_OPS, MAPPING, OPS, parse_ops
from kvstate.api_run import RunResult, run_api, run_api_cli, summary_lines
from kvstate.api_state import ApiHarness
from kvstate.api_witnesses import witnesses

__all__ = [
    "FAULT_KINDS",
    "FAULT_OPS",
    "MAPPING",
    "NAMESPACE",
    "OPS",
    "OTHER_NAMESPACE",
    "PROFILES",
    "ApiHarness",
    "Coverage",
    "Live",
    "Op",
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
