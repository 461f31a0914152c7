"""The pytest plugin (``pytest --kvstate-spec module:table``), run as a user runs it: a spec
module of their own, pytest in a fresh directory (``pytester``), JUnit XML read back."""

from __future__ import annotations

from importlib.metadata import entry_points
from xml.etree import ElementTree as ET

import pytest

from kvstate.proofs.obligations import Config, plan
from kvstate.spec import default_table, small

pytest_plugins = ["pytester"]

# A user's spec module: the default table on the small geometry, and a table with a seeded bug
# (the reference-count guard of eviction dropped: proofs/corpus.py).
SPEC = """
from kvstate.proofs.corpus import evict_without_refcount
from kvstate.spec import default_table, small

table = default_table(small())
buggy = evict_without_refcount
"""
# HypoFuzz runs the items that are pytest functions whose object is a Hypothesis test.
HYPOFUZZ_VIEW = """
import pytest

def pytest_collection_finish(session):
    for item in session.items:
        if item.name == "fuzz/kvstate":
            hyp = getattr(item.obj, "is_hypothesis_test", False)
            print(f"FUZZ-ITEM function={isinstance(item, pytest.Function)} hypothesis={hyp}")
"""


def _cases(path) -> dict[str, ET.Element]:
    return {c.get("name"): c for c in ET.parse(path).getroot().iter("testcase")}


def test_the_plugin_is_a_pytest11_entry_point():
    assert any(ep.value == "kvstate.pytest_plugin" for ep in entry_points(group="pytest11"))


def test_obligations_and_fuzz_targets_are_items_in_junit(pytester: pytest.Pytester):
    pytester.makepyfile(myspec=SPEC)
    pytester.makeconftest(HYPOFUZZ_VIEW)
    xml = pytester.path / "report.xml"
    args = ["--kvstate-spec", "myspec:table", "--kvstate-only", "init", "--kvstate-pool", "2"]
    res = pytester.runpytest_subprocess(
        *args, "--junitxml", str(xml), "--hypothesis-show-statistics", "-s"
    )
    expected = [f"prove/{u.name}" for u in plan(default_table(small()), Config(), "init")]
    assert len(expected) > 5
    res.assert_outcomes(passed=len(expected) + 2)
    cases = _cases(xml)
    # one test case per obligation, then the fuzz target's coverage pass and exploration
    assert list(cases) == [*expected, "fuzz/kvstate/coverage", "fuzz/kvstate"]
    assert all(c.get("classname") == "kvstate" for c in cases.values())
    res.stdout.fnmatch_lines(["FUZZ-ITEM function=True hypothesis=True"])
    res.stdout.fnmatch_lines(["*kvstate::fuzz/kvstate:*", "*Stopped because*max_examples=60*"])

    # -k and -m select among the items as among any tests
    res = pytester.runpytest_subprocess(*args, "-k", "init and refcount", "--kvstate-fuzz", "none")
    res.assert_outcomes(passed=1)
    res = pytester.runpytest_subprocess(*args, "-m", "kvstate_fuzz", "--co", "-q")
    res.stdout.fnmatch_lines(
        ["kvstate::fuzz/kvstate/coverage", "kvstate::fuzz/kvstate", "2/* tests collected*"]
    )


def test_seeded_bugs_fail_their_items(pytester: pytest.Pytester):
    """The table without eviction's reference-count guard fails its induction step, which
    names the invariant; the allocator with a planted bug fails the coverage pass, with the
    minimized trace and a replay command."""
    pytester.makepyfile(myspec=SPEC)
    xml = pytester.path / "prove.xml"
    res = pytester.runpytest_subprocess(
        "--kvstate-spec", "myspec:buggy", "--kvstate-only", "evict_start", "--kvstate-no-traces",
        "--kvstate-fuzz", "none", "-k", "inductive", "--junitxml", str(xml),
    )  # fmt: skip
    res.assert_outcomes(failed=1)
    ((name, case),) = _cases(xml).items()
    assert name == "prove/inductive/*/evict_start"
    failure = case.find("failure")
    assert failure is not None and "inductive/refcount/evict_start" in failure.text

    xml = pytester.path / "fuzz.xml"
    res = pytester.runpytest_subprocess(
        "--kvstate-spec", "myspec:table", "--kvstate-only", "init", "-m", "kvstate_fuzz",
        "--kvstate-pool", "2", "--kvstate-bug", "use_before_load_complete", "-k", "coverage",
        "--junitxml", str(xml),
    )  # fmt: skip
    res.assert_outcomes(failed=1)
    ((name, case),) = _cases(xml).items()
    assert name == "fuzz/kvstate/coverage"
    failure = case.find("failure")
    assert failure is not None and "accepted-disabled: load_done[complete]" in failure.text
    res.stdout.fnmatch_lines(
        ["*replay: kvstate fuzz --spec myspec:table*--replay '*load_done(b=0)'"]
    )


def test_a_spec_that_does_not_load_is_a_collection_error(pytester: pytest.Pytester):
    res = pytester.runpytest_subprocess("--kvstate-spec", "nosuchmodule:table")
    res.stdout.fnmatch_lines(["*--kvstate-spec nosuchmodule:table: cannot load spec*"])
    assert res.ret == pytest.ExitCode.INTERRUPTED
