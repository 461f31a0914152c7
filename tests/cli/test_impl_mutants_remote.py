"""``python -m kvstate.impl_mutants`` with a second killing test, the remote tier's walk: a
mutant on a line only that walk runs gets it alone, one on a line both run gets both, one on a
line neither runs gets the API walk as before; the walk runs on a ``redis-server`` the run
started itself, flushed before each mutant; under ``CI=true`` a missing server fails the run.

The scratch package has a function only the "remote" killer calls: its mutants die by that
walk alone (without it, they would survive: the verdicts cannot be a constant)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

if os.environ.get("CI") == "true":  # installed by the dev extra: missing is a failure there
    import cosmic_ray  # noqa: F401
else:
    pytest.importorskip("cosmic_ray", reason="the mutants extra: pip install -e '.[mutants]'")

from kvstate.impl_mutants import main  # noqa: E402

CALC = """\
def add(a, b):
    return a + b


def fetch(n):
    return n * 3 if n >= 0 else 0


def unused(x):
    return x - 5
"""

KILLERS = """\
import os


def killer(profile):
    from scratchpkg.calc import add

    ok = add(2, 3) == 5
    return {"killed": not ok, "kind": "" if ok else "wrong answer", "seconds": 0.001}


def remote(profile):
    import redis

    from scratchpkg.calc import add, fetch

    r = redis.Redis.from_url(os.environ["KVSTATE_MUTANT_REDIS"])
    dirty = r.dbsize() != 0  # an earlier mutant's key left behind: the server was not flushed
    r.set("scratch:left-behind", b"x")
    ok = fetch(2) == 6 and add(1, 1) == 2
    kind = "dirty server" if dirty else ("" if ok else "wrong fetch")
    return {"killed": dirty or not ok, "kind": kind, "seconds": 0.002}


def both(profile):
    first = killer(profile)
    return first if first["killed"] else remote(profile)
"""


def _redis_server() -> None:
    if shutil.which("redis-server") or os.path.exists("/usr/bin/redis-server"):
        return
    why = "redis-server is not installed (apt-get install -y redis-server)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"under CI: {why}")
    pytest.skip(why)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    pkg = tmp_path / "scratchpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "calc.py").write_text(CALC)
    (tmp_path / "scratchkill.py").write_text(KILLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("scratch")]:
        monkeypatch.delitem(sys.modules, name)
    return [
        "--folder", str(pkg), "--package", "scratchpkg", "--killer", "scratchkill:killer",
        "--remote-killer", "scratchkill:remote", "--both-killer", "scratchkill:both",
        "--store", str(tmp_path / "store"),
    ]  # fmt: skip


def _records(store: Path) -> dict[str, dict[str, object]]:
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(store / "results-ci.sqlite"), WorkDB.Mode.open) as db:
        return {j.split("@")[0]: json.loads(r.output) for j, r in db.results}


def test_each_mutant_gets_the_walks_that_run_its_line(scratch: list[str], tmp_path: Path) -> None:
    _redis_server()
    assert main(["run", *scratch, "--timeout", "20"]) == 0
    rec = _records(tmp_path / "store")
    fetch = rec["calc.py:6:ReplaceBinaryOperator_Mul_Add#0"]  # n * 3 -> n + 3: 5, not 6
    assert (fetch["verdict"], fetch["walks"], fetch["kind"]) == ("killed", "remote", "wrong fetch")
    add = rec["calc.py:2:ReplaceBinaryOperator_Add_Sub#0"]  # both walks run it: the API one kills
    assert (add["verdict"], add["walks"]) == ("killed", "api+remote")
    unused = rec["calc.py:10:ReplaceBinaryOperator_Sub_Add#0"]
    assert (unused["verdict"], unused["walks"]) == ("survived", "api")
    # every remote walk met an empty server (each left a key behind), and some passed
    remote = [r for r in rec.values() if "remote" in str(r["walks"])]
    assert len(remote) >= 4 and all(r["kind"] != "dirty server" for r in remote)
    assert any(r["verdict"] == "survived" for r in remote)
    # the same store without the remote walk: another context, so every mutant runs again, and
    # the mutants only the remote walk kills survive
    assert main(["run", *scratch, "--timeout", "20", "--no-remote"]) == 0
    again = _records(tmp_path / "store")
    assert again["calc.py:6:ReplaceBinaryOperator_Mul_Add#0"]["verdict"] == "survived"
    assert again["calc.py:6:ReplaceBinaryOperator_Mul_Add#0"]["walks"] == "api"


def test_under_ci_a_missing_redis_server_fails_the_run(
    scratch: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvstate.testing import redisserver

    def missing() -> str:
        raise redisserver.ServerMissing("redis-server is not installed (test)")

    monkeypatch.setattr(redisserver, "executable", missing)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(SystemExit) as exc:
        main(["run", *scratch, "--timeout", "20"])
    assert exc.value.code == 2
    assert "under CI: redis-server is not installed" in capsys.readouterr().err
    # elsewhere the remote walk is left out, saying so, and the run goes on
    monkeypatch.setenv("CI", "false")
    assert main(["run", *scratch, "--timeout", "20"]) == 0
    assert "the remote walk is left out" in capsys.readouterr().err
