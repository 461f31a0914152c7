"""Each planted bug of the remote path (kvstate/testing/remote_bugs.py) is caught by the remote
tier's tests on a real redis-server, two nodes of the bugged package sharing it; the time to
catch is printed (``pytest -s``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from redis_server import RedisServer, redis_server  # noqa: F401 (the fixture)
from test_impl_remote import (
    another_namespace,
    cap_counts_remote_loads,
    stalled,
    vanished_or_rewritten,
)

from kvstate.testing import seeded
from kvstate.testing.remote_bugs import REMOTE_BUGS

Scenario = Callable[[RedisServer, Any], None]

CATCHERS: dict[str, Scenario] = {
    "remote_chunk_mac_not_checked": lambda s, pkg: vanished_or_rewritten(s, "other_writer", pkg),
    "remote_vanished_chunk_as_zeros": lambda s, pkg: vanished_or_rewritten(s, "chunk", pkg),
    "remote_cap_ignores_remote_loads": cap_counts_remote_loads,
    "remote_load_under_lock": stalled,
    "remote_entry_keyed_without_namespace": another_namespace,
}


def test_every_planted_bug_has_a_catcher() -> None:
    assert set(CATCHERS) == {b.name for b in REMOTE_BUGS}
    assert len(REMOTE_BUGS) >= 5


@pytest.mark.parametrize("bug", sorted(CATCHERS))
def test_the_planted_bug_is_caught(redis_server: RedisServer, bug: str) -> None:  # noqa: F811
    pkg = seeded.package([bug])
    t0 = time.monotonic()
    with pytest.raises(AssertionError):
        CATCHERS[bug](redis_server, pkg)
    print(f"\n{bug}: caught in {time.monotonic() - t0:.2f} s")
