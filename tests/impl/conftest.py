"""The ``cache`` fixture of the library's tests: a fresh cache (``cache_checks.make``), closed
after the test (a module that defines its own ``cache`` fixture uses that one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cache_checks import make

from kvstate.impl import HeterogeneousKVCache


@pytest.fixture
def cache() -> Iterator[HeterogeneousKVCache]:
    c = make()
    yield c
    c.close()
