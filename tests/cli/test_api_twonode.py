"""Two nodes in two processes on one real redis-server (kvstate/targets/api/twonode.py): node
B's own process, its own cache, driven over a pipe; its bytes and hits judged by the harness.

The witnesses of the two-node walk pass with a sound node B: a cross-node hit, B's load paused
before its read while node A's chunk is deleted or replaced by another writer's bytes, paused
after its read while the chunk it read is deleted, both nodes storing the prefix at once.  A
bug planted in node B's process alone (a staged copy of the package first on its path; node A
runs this one) is caught through it: a chunk used without its MAC check, a vanished chunk read
as zeros.

The server is started by the test (a Unix socket in a temporary directory, no persistence);
under CI (``CI=true``) a missing ``redis-server`` is a failure, elsewhere a skip with the reason.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from kvstate.spec import default_table
from kvstate.testing.redisserver import ServerMissing, executable
from kvstate.testing.remote_bugs import REMOTE_BUGS

TABLE = default_table()
N = 4


@pytest.fixture
def server_exe() -> str:
    pytest.importorskip("redis", reason="the remote extra: pip install 'kvstate[remote]'")
    try:
        return executable()
    except ServerMissing as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"under CI: {exc}")
        pytest.skip(str(exc))


def _two_node_walks() -> dict[str, list]:
    from kvstate.targets.api.witnesses import witnesses

    ws = witnesses(N, TABLE.consts.L, TABLE.consts.lease_max)
    out = {k: v for k, v in ws.items() if k.startswith("two nodes:")}
    assert len(out) >= 4, sorted(ws)
    return out


def test_the_two_node_walks_are_witnesses_of_a_remote_run(server_exe: str) -> None:
    from kvstate.targets.api.registry import REMOTE_ONLY, drawn_ops
    from kvstate.targets.api.remote import remote_world
    from kvstate.targets.api.witnesses import witnesses

    assert {"node_b", "node_b_race", "node_b_store"} <= REMOTE_ONLY
    assert not any(k.startswith("two nodes") for k in witnesses(N, 16, 8))  # no server: none
    with remote_world():
        assert {"node_b", "node_b_race", "node_b_store"} <= drawn_ops()
        assert _two_node_walks()


def test_the_two_node_witnesses_pass_with_node_b_in_its_own_process(server_exe: str) -> None:
    from kvstate.targets.api import Coverage, replay
    from kvstate.targets.api.remote import remote_world

    cov = Coverage()
    with remote_world() as world:
        node_proc = world.node.proc  # started with the world, once for every walk
        for name, walk in _two_node_walks().items():
            found = replay(TABLE, N, walk, coverage=cov)
            assert found is None, f"{name}: {found}"
        where = world.node.call("where")
        assert world.node.proc is node_proc
    assert where["pid"] != os.getpid() and where["pid"] == node_proc.pid
    assert node_proc.poll() is not None  # stopped with the world
    c = cov.counts
    assert c["node B: cross-node hits"] >= 3 and c["node B: restores"] >= 8, dict(c)
    assert c["node B: loads paused at a read"] == 3
    assert c["node B: loads failed"] >= 1  # the chunk deleted before B read it
    assert c["node B: loads paused before its read, the store changed"] == 2
    assert c["node B: loads paused after its read, the store changed"] == 1
    assert c["node B: reads racing a change on a stalled server"] == 1
    assert c["node B: stores at once with node A"] == 1 and c["node B: blocks stored"] > 0
    assert c["node B: reads checked"] == c["node B: quiescence checks"] >= 6


def test_nodes_2_draws_node_b_and_prints_its_figures(
    server_exe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--remote --nodes 2``: node B's operation drawn by Hypothesis (not only scripted), the
    run's figures of node B printed; ``--nodes 2`` without ``--remote`` is refused."""
    from kvstate.cli import main

    rc = main(["fuzz", "--target", "kvstate-api", "--remote", "--nodes", "2",
               "--profile", "ci", "--examples", "3", "--no-coverage"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "node_b_fuzz " in out and "two nodes (node B in its own process): cross-node hits" in out
    assert "wrong bytes 0" in out and "leaked blocks in node B 0" in out
    assert main(["fuzz", "--target", "kvstate-api", "--nodes", "2"]) == 2
    assert "--nodes 2 needs --remote" in capsys.readouterr().err


def _staged_with(bug: str) -> Path:
    from kvstate.api_mutants import PACKAGES, stage

    planted = next(b for b in REMOTE_BUGS if b.name == bug)
    root = stage()
    for e in planted.edits:
        folder, _, rest = e.path.partition("/")
        path = root / PACKAGES[folder] / rest
        src = path.read_text()
        assert src.count(e.old) == 1, (bug, e.path)
        path.write_text(src.replace(e.old, e.new))
    return root


@pytest.mark.parametrize("bug", ["remote_chunk_mac_not_checked", "remote_vanished_chunk_as_zeros"])
def test_a_bug_planted_in_node_b_alone_is_caught_through_its_process(
    server_exe: str, bug: str
) -> None:
    """Node B runs the bugged copy, node A (this process) the package itself: the finding
    comes from B's answers, judged here."""
    import kvstate.impl
    from kvstate.targets.api import replay
    from kvstate.targets.api.remote import remote_world

    root = _staged_with(bug)
    env = {**os.environ, "PYTHONPATH": str(root), "KVSTATE_PURE_PYTHON": "1"}
    try:
        t0 = time.monotonic()
        found = []
        with remote_world(node_env=env, node_cwd=str(root)) as world:
            for name, walk in _two_node_walks().items():
                f = replay(TABLE, N, walk)
                if f is not None:
                    found.append((name, f))
                    break
            where = world.node.call("where")
        seconds = time.monotonic() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert where["impl"].startswith(str(root)), where  # B ran the bugged copy
    assert not kvstate.impl.__file__.startswith(str(root))  # A did not
    assert found, f"{bug}: no two-node witness caught it"
    name, f = found[0]
    print(f"\n{bug}: caught in {seconds:.1f} s by witness {name!r} ({f.signature})")
    assert "node B" in str(f), str(f)
    assert f.kind in ("data", "node-b-hit"), str(f)
