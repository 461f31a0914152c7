"""The command line: exit codes, formats and error messages."""

import json
import subprocess
import sys

from kvstate.cli import main


def test_prove_only_one_invariant_json(capsys):
    rc = main(["prove", "--only", "graph_topology", "--format", "json", "-j", "1"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    assert all(r["invariant"] in (None, "graph_topology") for r in out["results"])


def test_prove_refutes_a_broken_spec_with_a_trace(capsys):
    rc = main(
        [
            "prove",
            "--spec",
            "kvstate.proofs.corpus:replay_without_recapture",
            "--only",
            "graph_topology",
            "-j",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1
    assert (
        "FAILED" in out
        and "load_done" in out
        and "capture" in out
        and "replayed in the concrete interpreter: yes" in out
    )


def test_junit_output(tmp_path):
    path = tmp_path / "r.xml"
    rc = main(["prove", "--only", "admission_cap", "--format", "junit", "-o", str(path), "-j", "1"])
    assert rc == 0 and "<testsuite" in path.read_text()


def test_bad_usage_exits_2(capsys):
    assert main(["prove", "--spec", "nope"]) == 2
    assert "unknown spec" in capsys.readouterr().err
    assert main(["prove", "--spec", "no.such.module:x"]) == 2
    assert main(["prove", "--depth", "0"]) == 2
    assert main(["prove", "--only", "no_such_thing"]) == 2


def test_argparse_errors_exit_2():
    p = subprocess.run(
        [sys.executable, "-m", "kvstate", "prove", "--format", "yaml"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_graphs_export(tmp_path):
    assert main(["graphs", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "compressed_kv.dot").read_text().startswith("digraph")


def test_long_lived_imports_puts_the_collector_back() -> None:
    """``kvstate fuzz`` tunes the collector for its run; a caller's process (this test session)
    gets its threshold and generations back, an error inside included."""
    import gc

    from kvstate.cli import long_lived_imports

    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    try:
        with long_lived_imports():
            assert gc.get_threshold()[0] == 50_000 and gc.get_freeze_count() > 0
            raise RuntimeError("inside the run")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
