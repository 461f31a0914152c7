"""The profiles every target runs under (ci / dev / nightly) and the seeds ci runs pin.

``ci`` is derandomized: the same examples every run.  Hypothesis derives a derandomized seed
from the digest of the state machine's source, so an edit of a machine's text used to change
every ci walk; each target now pins its ci seed explicitly (:func:`pin`: Hypothesis' ``@seed``
on the machine), prints it, and the walks follow the seed, not the source.  A target's sizes
(examples x steps) are its own: an operation of one target is a different amount of work from
another's, so each target declares its sizes per profile in :data:`SIZES` here.
"""

from __future__ import annotations

from typing import Any

import hypothesis
from hypothesis import settings

NAMES = ("ci", "dev", "nightly")

# target -> profile -> (examples, steps per example)
SIZES: dict[str, dict[str, tuple[int, int]]] = {
    "block": {"ci": (60, 40), "dev": (300, 50), "nightly": (5000, 100)},
    "vllm": {
        "ci": (264, 60),
        "dev": (220, 80),
        "nightly": (2200, 120),
    },  # 24 ci examples per configuration
    "kvstate-api": {"ci": (20, 25), "dev": (150, 40), "nightly": (2000, 80)},
    "sglang": {"ci": (72, 60), "dev": (600, 80), "nightly": (6000, 120)},  # 6 ci per config
}

# Each profile derives from Hypothesis' built-in "default", not from whatever profile is loaded
# when this module is imported: registered under a loaded ``ci`` (HYPOTHESIS_PROFILE=ci, a
# plugin), ``dev`` would inherit ``derandomize=True`` and lose its example database.
_BASE = settings.get_profile("default")
for _name in NAMES:
    _examples, _steps = SIZES["block"][_name]
    settings.register_profile(
        _name,
        _BASE,
        derandomize=_name == "ci",
        max_examples=_examples,
        stateful_step_count=_steps,
        deadline=None,
        print_blob=True,
    )


def for_target(target: str, profile: str) -> settings:
    """The Hypothesis settings of ``profile`` sized for ``target``."""
    examples, steps = SIZES[target][profile]
    return settings(settings.get_profile(profile), max_examples=examples, stateful_step_count=steps)


def pin(machine: Any, seed: int) -> Any:
    """``machine`` (a state machine class) with its seed pinned: Hypothesis' ``@seed``."""
    return hypothesis.seed(seed)(machine)


def show(seed: int) -> str:
    """A pinned seed as printed in a run's header (hex: a ci seed is a 384-bit digest)."""
    return hex(seed) if seed >= 1 << 64 else str(seed)
