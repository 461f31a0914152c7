"""`kvstate fuzz`'s example databases: found failures kept under an explicit key and replayed
first, in a directory or on a Redis server shared by a campaign's workers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest
from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from kvstate.cli import main
from kvstate.examples_db import database_key, open_database, with_database
from kvstate.spec.errors import SpecError

# A bug Hypothesis finds by itself in the dev profile (no coverage pass, no warm-ups), at a
# later example than the first: seed 1 finds it at example 7 (docs/fuzz.md).
BUG = "skip_indexer_version"
WORKER = ["fuzz", "--pool", "2", "--bug", BUG, "--profile", "dev", "--no-coverage", "--no-warmup"]
FOUND = re.compile(r"^  found by:\s+Hypothesis, example (\d+)(.*)$", re.M)
FAILURE = re.compile(r"^  failure:\s+(.*)$", re.M)


def _missing(what: str) -> None:
    """A missing component: a failure under CI (``.ci/run`` installs it), a skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (.ci/run installs it)")
    pytest.skip(what)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A real redis-server on a Unix socket in a fresh directory, stopped afterwards."""
    exe = shutil.which("redis-server")
    if exe is None:
        _missing("redis-server is not installed (apt-get install redis-server)")
    try:
        import redis
    except ModuleNotFoundError:
        _missing("the redis client is not installed (pip install 'kvstate[redis]')")
    folder = tempfile.mkdtemp(prefix="kvr")  # short: a socket's path has at most 107 bytes
    sock = os.path.join(folder, "redis.sock")
    proc = subprocess.Popen(
        [exe, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700"]
        + ["--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(unix_socket_path=sock).ping()
                break
            except redis.RedisError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start (exit status {proc.poll()})")
                time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


def _worker(seed: int, db: str) -> tuple[int, str]:
    """One worker of a campaign: its own process, as a user starts it."""
    argv = [sys.executable, "-m", "kvstate", *WORKER, "--seed", str(seed), "--example-db", db]
    env = {k: v for k, v in os.environ.items() if k != "KVSTATE_EXAMPLE_DB"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    return done.returncode, done.stdout + done.stderr


def _found(out: str) -> tuple[int, str, str]:
    """(the example that failed, how it says it was found, the failure) of a report."""
    m, f = FOUND.search(out), FAILURE.search(out)
    assert m is not None and f is not None, out
    return int(m.group(1)), m.group(2), f.group(1)


def test_keys_are_explicit_stable_and_never_mix():
    key = database_key("kvstate", "default[small]", "small", 2, [BUG])
    assert key == database_key("kvstate", "default[small]", "small", 2, [BUG])  # stable
    assert key.startswith(b"kvstate-fuzz/v1;target=kvstate;")  # readable, not a digest
    others = {
        database_key("kvstate", "default[small]", "small", 2, []),  # no bug
        database_key("kvstate", "default[small]", "small", 2, ["evict_ignores_pins"]),
        database_key("kvstate-api", "default[small]", "small", 2, [BUG]),  # another target
        database_key("kvstate", "default[small]", "deepseek-v4-flash", 2, [BUG]),  # geometry
        database_key("kvstate", "default[small]", "small", 3, [BUG]),  # pool
        database_key("kvstate-api", "default[small]", "small", 2, [], ["restart"]),  # ops
    }
    assert key not in others and len(others) == 6


def test_ci_profile_runs_without_a_database_and_dev_with_one():
    db = InMemoryExampleDatabase()
    assert with_database(settings.get_profile("ci"), db).database is None  # derandomized
    assert with_database(settings.get_profile("dev"), db).database is db
    assert with_database(settings.get_profile("dev"), None).database is None


def test_database_specs(tmp_path):
    assert open_database("none") is None
    assert isinstance(open_database(str(tmp_path / "db")), DirectoryBasedExampleDatabase)
    for bad in ("ftp://host/x", f"unix://{tmp_path}/no.sock", str(tmp_path / "file")):
        (tmp_path / "file").write_text("")
        if bad.startswith("unix"):
            pytest.importorskip("redis")
        with pytest.raises(SpecError):
            open_database(bad)
    assert main(["fuzz", "--pool", "2", "--example-db", "ftp://host/x", "--profile", "dev"]) == 2


def test_a_found_failure_is_replayed_first_from_the_directory(tmp_path, capsys):
    """dev profile: seed 1 finds the bug at a later example; seed 2, given the same directory,
    fails at its first example, the saved one, the same way."""
    db = str(tmp_path / "examples")
    assert main([*WORKER, "--seed", "1", "--example-db", db]) == 1
    first, how, failure = _found(capsys.readouterr().out)
    assert first > 1 and "saved example" not in how
    assert main([*WORKER, "--seed", "2", "--example-db", db]) == 1
    again, how2, failure2 = _found(capsys.readouterr().out)
    assert (again, failure2) == (1, failure), (how2, failure2)
    assert "a saved example of the example database" in how2


def test_two_workers_share_a_redis_example_database(redis_url):
    """A campaign of two worker processes sharing a real Redis server: the failure worker 1
    found is the first example worker 2 runs (with another seed), and fails the same way.
    Without the server's example, worker 2 does not fail at its first example."""
    import redis

    rc, out1 = _worker(1, redis_url)
    assert rc == 1, out1
    first, how, failure = _found(out1)
    assert first > 1 and "saved example" not in how, out1
    client = redis.Redis.from_url(redis_url)
    assert client.keys(b"kvstate-example:kvstate-fuzz/v1;target=kvstate;*"), client.keys()

    rc, out2 = _worker(2, redis_url)
    assert rc == 1, out2
    assert "example database: 1 saved example(s), run before new ones" in out2, out2
    again, how2, failure2 = _found(out2)
    assert (again, failure2) == (1, failure), out2
    assert "a saved example of the example database" in how2, out2

    rc, alone = _worker(2, "none")  # the same worker without the campaign's database
    assert rc == 0 or _found(alone)[0] > 1, alone


def test_the_api_target_runs_with_a_database(tmp_path, capsys):
    """dev profile with a directory database: the run is not shared with a forked process (the
    dry run would delete saved failures) and conforms as before."""
    db = str(tmp_path / "examples")
    argv = ["fuzz", "--target", "kvstate-api", "--profile", "dev", "--seed", "1"]
    assert main([*argv, "--examples", "2", "--steps", "5", "--example-db", db]) == 0
    assert "kvstate fuzz: ok" in capsys.readouterr().out
