"""The killing tests, run in a forked child with the mutant in place (:mod:`kvstate.mutant_runner`).

Two walks of the API fuzz's ``ci`` (or ``dev``) profile:

* :func:`api_fuzz`, ``kvstate fuzz --target kvstate-api --profile PROFILE``: the walk every
  mutant gets (and, where that command runs them, the threaded mode's schedules);
* :func:`remote_fuzz`, ``kvstate fuzz --target kvstate-api --remote --profile PROFILE``: the
  remote tier's walk (``impl/remote.py``, ``impl/remotestore.py``, the entries' MACs), over the
  ``redis-server`` the parent started for this child (:mod:`kvstate.impl_mutants.walks`), whose
  URL the child finds in ``$KVSTATE_MUTANT_REDIS``.

:func:`both` runs the first, then the second where the first found nothing.  Each returns the
runner's verdict record: ``killed``, ``kind``, ``seconds`` to the first finding (the walks'
own clocks added), ``walks`` (which ran).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# the parent's server for this child: set by the parent in the child's environment only
SERVER_ENV = "KVSTATE_MUTANT_REDIS"


def prepare() -> None:
    """The parent's imports and process settings, those of ``kvstate fuzz`` (kvstate/cli.py)."""
    import hypothesis.stateful  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import z3  # noqa: F401

    import kvstate.model.apimap  # noqa: F401
    import kvstate.targets.block  # noqa: F401
    from kvstate.spec import default_table
    from kvstate.testing.scratch import ram_scratch
    from kvstate.testing.threads import single_intraop_thread

    single_intraop_thread()
    ram_scratch()
    default_table()


@contextmanager
def _long_lived() -> Iterator[None]:
    try:  # where the command's helpers live differs between versions of kvstate/cli
        from kvstate.cli.fuzz import long_lived_imports
    except ImportError:
        from kvstate.cli import long_lived_imports  # type: ignore[attr-defined]
    with long_lived_imports():
        yield


def _verdict(res: Any, walk: str) -> dict[str, Any]:
    f = res.finding
    return {
        "killed": f is not None,
        "kind": f.signature if f is not None else "",
        "detail": str(f)[:300] if f is not None else "",
        "origin": f"{walk}: {res.origin}" if f is not None else res.origin,
        "seconds": round(res.seconds, 3),
        "found_len": res.found_len,
        "walks": walk,
    }


def api_fuzz(profile: str) -> dict[str, Any]:
    """The killing test: ``kvstate fuzz --target kvstate-api --profile PROFILE`` (the dev walk
    with seed 0, so that a verdict can be repeated), without minimizing what it finds; where
    that command also runs the threaded mode's schedules after the walk, they run here too."""
    from kvstate.spec import default_table
    from kvstate.targets.api.run import run_api

    seed = None if profile == "ci" else 0
    with _long_lived():
        res = run_api(default_table(), 4, profile=profile, seed=seed, minimize=False)
        if res.finding is None:
            try:
                from kvstate.targets.api.schedule import run_profile
            except ImportError:
                run_profile = None  # type: ignore[assignment]
            if run_profile is not None:
                failed, lines = run_profile(default_table(), 4, profile, seed)
                if failed:
                    return {
                        "killed": True,
                        "kind": "threads",
                        "detail": "\n".join(lines)[:300],
                        "origin": "threaded schedules",
                        "seconds": round(res.seconds, 3),
                        "walks": "api",
                    }
    return _verdict(res, "api")


class _Restart:
    """A restart of the parent's server as the cache sees one: every key gone, every
    connection dropped.  The child must not kill the server (the parent's, for the next
    mutants too); the fuzz's restart is synchronous, so the moments a real restart refuses
    connections are never observed by the cache either."""

    def __init__(self, url: str) -> None:
        self.url = url

    def restart(self) -> None:
        import redis

        r = redis.Redis.from_url(self.url, socket_timeout=30)
        r.flushall()
        r.client_kill_filter(_type="normal", skipme=True)
        r.close()


def remote_fuzz(profile: str) -> dict[str, Any]:
    """``kvstate fuzz --target kvstate-api --remote --profile PROFILE`` over the server in
    ``$KVSTATE_MUTANT_REDIS``: the operations such a run draws (the store's faults, node B,
    another tenant), no forked helper (its faults act on the one server), no threaded mode
    (that command runs none over a remote tier)."""
    from kvstate.spec import default_table
    from kvstate.targets.api import remote
    from kvstate.targets.api.registry import drawn_ops
    from kvstate.targets.api.run import run_api

    url = os.environ.get(SERVER_ENV)
    if not url:  # the parent schedules this walk only with a server: a fault of the tool
        raise RuntimeError(f"the remote walk without ${SERVER_ENV}")
    seed = None if profile == "ci" else 0
    remote.WORLD = remote.World(url, _Restart(url), stalls=True)
    try:
        remote.WORLD.admin().ping()
        with _long_lived():
            res = run_api(
                default_table(), 4, profile=profile, seed=seed, ops=drawn_ops(),
                minimize=False, beside=False,
            )  # fmt: skip
    finally:
        if remote.WORLD.node is not None:  # node B's process (kvstate/targets/api/twonode.py)
            remote.WORLD.node.close()
        remote.WORLD = None
    return _verdict(res, "remote")


def both(profile: str) -> dict[str, Any]:
    """:func:`api_fuzz`, then :func:`remote_fuzz` where it found nothing (time to catch: the
    first walk's time added)."""
    first = api_fuzz(profile)
    if first["killed"]:
        return first
    second = remote_fuzz(profile)
    second["seconds"] = round(first["seconds"] + second["seconds"], 3)
    second["walks"] = "api+remote"
    return second
