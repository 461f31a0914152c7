"""vLLM's scheduler and :mod:`.standalone`, imported with this repository off ``sys.path``.

The manager-only target's :mod:`kvstate.targets.vllm.imports` does the shadow-free import (our
``kernels/`` folder would otherwise stand in for the Hugging Face ``kernels`` package);
:mod:`.standalone` imports vLLM at its top, so it is imported the same way.
"""

from __future__ import annotations

import sys
from types import ModuleType

from kvstate.targets.vllm.imports import VLLMUnavailable, load

__all__ = ["VLLMUnavailable", "loaded_version", "standalone"]

STANDALONE = "kvstate.targets.vllm_scheduler.standalone"


def standalone() -> ModuleType:
    """The standalone module (vLLM imported); raises VLLMUnavailable without vLLM."""
    mod = sys.modules.get(STANDALONE)
    if mod is None:
        import logging

        logging.getLogger("vllm").setLevel(logging.CRITICAL)  # load failures log errors
        mod = load("vllm.v1.core.sched.scheduler", STANDALONE)[1]
    return mod


def loaded_version() -> str:
    """The version of the vLLM whose modules are loaded (not only the installed metadata)."""
    mod = sys.modules.get("vllm")
    return str(getattr(mod, "__version__", "unknown")) if mod is not None else "not loaded"
