"""Kernel tests compare each Numba CUDA kernel, run under the simulator, with its torch reference.

``tests/conftest.py`` sets ``NUMBA_ENABLE_CUDASIM=1`` before numba is first imported; every
kernel test relies on it, so it is checked once here instead of at the top of each file."""

from __future__ import annotations

import numba
import pytest


@pytest.fixture(autouse=True, scope="session")
def _numba_simulator() -> None:
    assert numba.config.ENABLE_CUDASIM, (
        "numba was imported before NUMBA_ENABLE_CUDASIM=1 was set (see tests/conftest.py)"
    )
