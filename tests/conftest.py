"""Test-wide set-up: the kernel simulator, the Hypothesis profile and torch's thread pool.

NUMBA_ENABLE_CUDASIM must be set before numba is first imported (kernel tests run under the
Numba CUDA simulator on machines without a GPU).  The Hypothesis profile comes from
HYPOTHESIS_PROFILE (ci, dev, nightly); CI uses the derandomized ``ci`` profile.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
os.environ.setdefault("KVSTATE_KERNEL_BACKEND", "torch")

# `kvstate fuzz` keeps found failures in an example database (.kvstate/examples by default) and
# replays them first; the tests run without one unless they ask for one, so no run depends on
# what an earlier run left behind.
os.environ.setdefault("KVSTATE_EXAMPLE_DB", "none")

from hypothesis import settings  # noqa: E402

import kvstate.harness.profiles  # noqa: E402,F401  (registers the ci/dev/nightly profiles)

settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from kvstate.testing.threads import single_intraop_thread  # noqa: E402

single_intraop_thread()  # the targets' tensors are tiny: see kvstate/testing/threads.py
