"""Which killing test each mutant gets, and the ``redis-server`` the remote walk runs on.

Every mutant gets the API walk (:func:`kvstate.impl_mutants.killer.api_fuzz`), as it always
did.  A mutant on a line the remote tier's walk (``kvstate fuzz --target kvstate-api --remote``)
runs gets that walk too; only that walk where the API walk never runs the line (the API walk's
verdict there is the unmutated run's: it passes).  Which lines each walk runs is measured once
per run on the unmutated sources (the traced baselines).  The remote walk costs a few seconds a
mutant, so it is given only where it can change the verdict.

The remote walk needs a ``redis-server``: the run starts its own, one per job slot (``-j``), on
a Unix socket in a temporary directory (no persistence, ``DEBUG`` enabled), never shared with
another run, flushed (keys, connections, ``maxmemory``) before each mutant and started again if
a mutant left it dead.  Without ``redis-server`` the remote walk is left out, said on stderr;
under ``CI=true`` that is a failure instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from kvstate.mutant_runner import Target

CI_MISSING = 2  # the exit status of a run under CI=true without redis-server


def remote_on(args: argparse.Namespace, target: Target) -> bool:
    """Whether the remote walk is among the killing tests: the target has one, the run did not
    say ``--no-remote``, and ``redis-server`` is installed (under ``CI=true`` a missing one
    ends the command, status 2)."""
    if not target.remote or getattr(args, "no_remote", False):
        return False
    from kvstate.testing.redisserver import ServerMissing, executable

    try:
        executable()
    except ServerMissing as exc:
        if os.environ.get("CI") == "true":
            print(f"python -m kvstate.impl_mutants: under CI: {exc}", file=sys.stderr)
            raise SystemExit(CI_MISSING) from exc
        if not getattr(args, "_told", False):
            print(
                f"python -m kvstate.impl_mutants: {exc}: the remote walk is left out (the "
                "mutants of impl/remote*.py get the API walk only)",
                file=sys.stderr,
            )
            args._told = True
        return False
    return True


class ServerPool:
    """``redis-server`` processes for the children's remote walks, one per job slot: a slot's
    server serves one child at a time."""

    def __init__(self) -> None:
        self.free: list[Any] = []
        self.busy: dict[str, Any] = {}

    def take(self, job: str) -> Any:
        """A server for ``job``, emptied of what an earlier mutant left there."""
        from kvstate.testing.redisserver import RedisServer

        server = self.free.pop() if self.free else RedisServer()
        self._flush(server)
        self.busy[job] = server
        return server

    def give(self, job: str) -> None:
        server = self.busy.pop(job, None)
        if server is not None:
            self.free.append(server)

    @staticmethod
    def _flush(server: Any) -> None:
        try:
            r = server.client()
            r.flushall()
            r.config_set("maxmemory", server.maxmemory)
            r.config_resetstat()
            r.client_kill_filter(_type="normal", skipme=True)
            r.close()
        except Exception:  # noqa: BLE001 (a mutant left it dead, or stalled past the timeout)
            server.restart()

    def close(self) -> None:
        for s in [*self.free, *self.busy.values()]:
            s.close()
        self.free, self.busy = [], {}


@dataclass(frozen=True)
class Plan:
    """A mutant's killing test: the killer's spec and the walks it runs."""

    killer: str
    walks: str  # "api", "remote", "api+remote"


def plan(target: Target, in_api: bool, in_remote: bool) -> Plan:
    """The walks for a mutant on a line the API walk runs (``in_api``) and the remote walk runs
    (``in_remote``; False where the remote walk is off)."""
    if not in_remote:
        return Plan(target.killer, "api")
    if not in_api:
        return Plan(target.remote, "remote")
    return Plan(target.both, "api+remote")
