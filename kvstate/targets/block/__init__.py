"""The block-level target: the built-in allocator (``--target kvstate``), the reference
interpreter (``--target model``) or any ``module:factory``, one spec action at a time, in
lockstep with the table's model.  ``target``: the adapter protocol and the model as a target;
``observe``: the projection (observations compared up to address renaming, ghosts added);
``machine``: the generated Hypothesis state machine; ``replay``: the coverage pass, replays
and the minimizer; ``cli``: ``kvstate fuzz`` for these targets."""

import kvstate.harness.profiles  # noqa: F401  (registers ci/dev/nightly)
from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import Step, TraceStep

from .machine import CI_SEED, build_state_machine
from .observe import canonical, diff, with_ghosts
from .replay import Minimized, minimize, replay_seeds, replay_trace, run_conformance
from .target import OUTPUT_KINDS, ModelTarget, Target, TargetFactory

__all__ = [
    "CI_SEED",
    "OUTPUT_KINDS",
    "Minimized",
    "ModelTarget",
    "Nonconformance",
    "Step",
    "Target",
    "TargetFactory",
    "TraceStep",
    "build_state_machine",
    "canonical",
    "diff",
    "minimize",
    "replay_seeds",
    "replay_trace",
    "run_conformance",
    "with_ghosts",
]
