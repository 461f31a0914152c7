"""The API target over a remote tier (``kvstate fuzz --target kvstate-api --remote``): its ci
run passes on a real redis-server and drives every store fault through the server, its checks
derive remote load outcomes from the remote table, and each planted bug of the remote path
(kvstate/testing/remote_bugs.py, remote_class_bugs.py) is caught by the fuzz, with the time it
took.

The server is started by the run itself (a Unix socket in a temporary directory, no
persistence); under CI (``CI=true``) a missing ``redis-server`` is a failure, elsewhere a skip
with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import FAULT_OPS
from kvstate.targets.api.registry import DEFAULT_OPS, REMOTE_ONLY, drawn_ops
from kvstate.testing.redisserver import ServerMissing, executable
from kvstate.testing.remote_bugs import REMOTE_BUGS
from kvstate.testing.remote_class_bugs import REMOTE_CLASS_BUGS

TABLE = default_table()
N = 4
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server_exe() -> str:
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    try:
        return executable()
    except ServerMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI: {exc}")
        pytest.skip(str(exc))


def test_remote_operations_are_drawn_only_with_a_remote_tier() -> None:
    assert REMOTE_ONLY and not REMOTE_ONLY & DEFAULT_OPS
    assert drawn_ops() == DEFAULT_OPS  # no server configured: the default run is unchanged
    kinds = {k for k, ops in FAULT_OPS.items() if set(ops) <= REMOTE_ONLY}
    assert {"remote_del_chunk", "remote_evict", "remote_restart", "remote_stall"} <= kinds


def test_ci_run_with_a_remote_tier(server_exe: str) -> None:
    """The ci profile over a server the run starts: no finding, every kind of store fault
    injected, cross-node hits, remote loads explained by the remote table's own actions."""
    from kvstate.targets.api import run_api
    from kvstate.targets.api.remote import remote_world

    with remote_world() as world:
        assert world.server is not None
        res = run_api(TABLE, N, profile="ci", ops=drawn_ops(), beside=False)
    assert res.finding is None, str(res.finding)
    c = res.coverage.counts
    for kind in ("remote_del_chunk", "remote_del_entry", "remote_overwrite_garbage",
                 "remote_overwrite_other_writer", "remote_evict", "remote_restart",
                 "remote_kill", "remote_stall", "remote_tenant", "remote_full"):  # fmt: skip
        assert c[f"fault {kind}"] > 0, (kind, dict(c))
    assert c["remote: cross-node hits"] > 0 and c["remote: rload_done"] > 0, dict(c)
    assert c["remote: rload_chunk"] >= c["remote: rload_done"] > 0
    assert c["loads failed"] > 0 and c["reads checked"] > 0
    assert c["remote: nodes over an explicit ChunkStore"] > 0
    assert c["check: documented refusals of each entry point"] > 0


def test_the_cli_runs_against_a_given_server(server_exe: str) -> None:
    """``--remote URL``: the run uses that server (restart: its keys deleted instead)."""
    from kvstate.cli import main
    from kvstate.testing.redisserver import RedisServer

    server = RedisServer()
    try:
        rc = main(["fuzz", "--target", "kvstate-api", "--remote", server.url,
                   "--profile", "ci", "--examples", "2", "--no-coverage"])  # fmt: skip
        assert rc == 0
        assert server.client().dbsize() == 0  # every example's keys deleted at its end
    finally:
        server.close()
    assert main(["fuzz", "--target", "kvstate-api", "--remote", "unix:///nonexistent/r.sock"]) == 2


CHILD = """
import json, sys, time
from kvstate.spec import default_table
from kvstate.targets.api import run_api
from kvstate.targets.api.registry import drawn_ops
from kvstate.targets.api.remote import remote_world
with remote_world():
    t0 = time.monotonic()
    res = run_api(default_table(), 4, profile="ci", ops=drawn_ops(), minimize=False, beside=False)
    f = res.finding
print(json.dumps({"killed": f is not None, "kind": f.signature if f else "",
                  "origin": res.origin, "seconds": round(time.monotonic() - t0, 2)}))
"""


@pytest.mark.parametrize("bug", [b.name for b in (*REMOTE_BUGS, *REMOTE_CLASS_BUGS)])
def test_the_planted_bug_is_caught_by_the_fuzz(server_exe: str, bug: str) -> None:
    """The bug planted in a staged copy of the package (its edits, as the remote tier's own
    tests plant it), the fuzz's ci run in a fresh interpreter on it: a finding."""
    from kvstate.api_mutants import PACKAGES, stage

    planted = next(b for b in (*REMOTE_BUGS, *REMOTE_CLASS_BUGS) if b.name == bug)
    root = stage()
    try:
        for e in planted.edits:
            folder, _, rest = e.path.partition("/")
            path = root / PACKAGES[folder] / rest
            src = path.read_text()
            assert src.count(e.old) == 1, (bug, e.path)
            path.write_text(src.replace(e.old, e.new))
        env = {**os.environ, "KVSTATE_PURE_PYTHON": "1", "PYTHONPATH": str(root)}
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", CHILD],
            cwd=root, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"\n{bug}: caught in {out['seconds']} s by {out['origin']} ({out['kind']})")
    assert out["killed"], out


# A writer's bytes over block 0's entry, then a request that hits it: the load fails, the hit is
# truncated, and the request's next block is allocated (a fresh content identity).
OVERWRITTEN_THEN_ALLOCATED = (
    "request(i=0, n=16, life=1); admit(i=0); use(i=0); finish(i=0); tick(t=1); offload(n=0); "
    "drain(); spill(n=0); offload(n=1); drain(); spill(n=1); remote_overwrite(b=0, kind=0); "
    "request(i=1, n=32, life=1); admit(i=1); drain(); use(i=1); finish(i=1)"
)


def test_a_writers_identity_is_never_a_contents_given_after_it(server_exe: str) -> None:
    """The store's writer takes a content identity the default model never sees: the remote
    table's lockstep still explains the next allocation (it named the fresh occupant one past
    the model's, and found no action for the step), and the writer's name stays above every
    name the model gave since."""
    from kvstate.targets.api import ApiHarness, Coverage
    from kvstate.targets.api.registry import parse_ops
    from kvstate.targets.api.remote import remote_world
    from kvstate.targets.api.remotecheck import RemoteOutcomes

    cov = Coverage()
    with remote_world():
        h = ApiHarness(TABLE, N, coverage=cov)
        try:
            for o in parse_ops(OVERWRITTEN_THEN_ALLOCATED):
                h.apply(o)
            h.quiesce()
            rc = next(c for c in h.checks if isinstance(c, RemoteOutcomes))
            s, d = rc.lift(h.model).values, h.model.values
        finally:
            h.close()
    assert cov.counts["remote: remote_overwrite"] == 1 and cov.counts["loads failed"] > 0
    given = {x for v in ("occ", "cid", "icid", "tcid", "wocc") for x in d[v]}
    assert s["scid"][0] > d["wseq"] and s["scid"][0] not in given, (s, d)
