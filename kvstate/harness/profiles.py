"""The profiles every target runs under (ci / dev / nightly) and the seeds ci runs pin.

``ci`` is derandomized: the same examples every run.  Hypothesis derives a derandomized seed
from the digest of the state machine's source, so an edit of a machine's text used to change
every ci walk; each target now pins its ci seed explicitly (:func:`pin`: Hypothesis' ``@seed``
on the machine), prints it, and the walks follow the seed, not the source.  A target's sizes
(examples x steps) are its own: an operation of one target is a different amount of work from
another's, so each target declares its sizes per profile in :data:`SIZES` here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hypothesis
from hypothesis import settings

NAMES = ("ci", "dev", "nightly")

# target -> profile -> (examples, steps per example)
SIZES: dict[str, dict[str, tuple[int, int]]] = {
    "block": {"ci": (60, 40), "dev": (300, 50), "nightly": (5000, 100)},
    "vllm": {
        "ci": (336, 60),
        "dev": (280, 80),
        "nightly": (2800, 120),
    },  # 24 ci examples per configuration (14)
    "vllm-scheduler": {
        "ci": (500, 60),
        "dev": (2000, 80),
        "nightly": (20000, 120),
    },  # 50 ci examples per configuration
    "kvstate-api": {"ci": (20, 25), "dev": (150, 40), "nightly": (2000, 80)},
    "sglang": {"ci": (126, 60), "dev": (600, 80), "nightly": (6000, 120)},  # 6 ci per config
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


@contextmanager
def seed_only() -> Iterator[None]:
    """Draws that depend on the seed alone while the block runs.

    Hypothesis takes 5% of its integer, float, bytes and string draws from a pool of constants
    it collects from the source of the *local* modules loaded at that moment (its providers'
    ``_get_local_constants``; local: outside site-packages and the standard library, so
    kvstate's own modules and a caller's script).  The same pinned seed then walks differently
    in a process that imported other modules: the command line against ``kvstate.fuzz.run``
    or a test session, or a module imported in the middle of a run.  Here the pool is empty,
    and the cache of the constants each draw may take is emptied on entry and exit.  On a
    Hypothesis without the pool (older, or renamed) this changes nothing.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover: a Hypothesis without that module
        yield
        return
    pool = getattr(providers, "_get_local_constants", None)
    cache = getattr(getattr(providers, "CONSTANTS_CACHE", None), "cache", None)
    if pool is None or cache is None or not hasattr(providers, "Constants"):
        yield
        return
    empty = providers.Constants()
    cache.clear()
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = pool
        cache.clear()
