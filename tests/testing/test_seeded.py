"""The seeded bugs live only in ``kvstate.testing.seeded``: source edits of a staged copy of
``impl/``.  The production package names none of them, never imports the testing package, and
accepts no ``bugs=`` argument; every edit still applies to the current sources (a refactor of
``impl/`` that moves the code must move the edit with it); a staged cache shares the real error
and event classes.  That each bug is still *caught* is shown where it was before:
``tests/impl/test_impl_conformance.py``, ``tests/impl/test_impl_seeded_bugs.py``,
``tests/impl/test_impl_stress.py``, ``tests/cli/test_fuzz_cli.py``."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvstate.impl import EventKind, HeterogeneousKVCache, InvalidArgument, Refused
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.testing import seeded

ROOT = Path(__file__).resolve().parents[2]
IMPL = ROOT / "impl"


def test_impl_names_no_seeded_bug() -> None:
    """No file of impl/ mentions a seeded bug by name, the switch API, or the old module."""
    pattern = re.compile(
        "|".join([*map(re.escape, seeded.BUGS), r"bugs\.on\b", r"\bBugs\b", r"\.bugs\b"])
    )
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for p in sorted(IMPL.glob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, hits
    assert not (IMPL / "bugs.py").exists()


def test_impl_never_imports_the_testing_package() -> None:
    for path in sorted(IMPL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            for n in names:
                assert "testing" not in n.split("."), (path.name, n)


def test_the_allocator_path_never_loads_the_testing_package(tmp_path: Path) -> None:
    """Importing kvstate.impl, building a cache and serving a hit from it loads neither
    kvstate.testing nor a staged copy (a fresh interpreter: this one has both)."""
    code = (
        "import sys, tempfile\n"
        "import kvstate.impl\n"
        "from kvstate.impl import HeterogeneousKVCache\n"
        "from kvstate.impl.testdata import DeterministicWriter, harness_tokens\n"
        "from kvstate.spec.geometry import small\n"
        "g = small()\n"
        "c = HeterogeneousKVCache(\n"
        "    g, cache_dir=tempfile.mkdtemp(), executors='manual', writer=DeterministicWriter()\n"
        ")\n"
        "toks = harness_tokens(2 * g.lcm_tokens + 1)\n"
        "with c.use(c.admit(c.request(toks))):\n"
        "    pass\n"
        "a = c.admit(c.request(toks))\n"
        "assert a.hit_tokens == 2 * g.lcm_tokens, a.hit_tokens\n"
        "with c.use(a):\n"
        "    pass\n"
        "c.evict(1)\n"
        "c.close()\n"
        "print(sorted(m for m in sys.modules if m.startswith(('kvstate.testing', 'kvstate._seeded'))"
        " or m == 'kvstate.impl.bugs'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=os.environ
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_the_cache_takes_no_bugs_argument() -> None:
    with pytest.raises(TypeError):
        HeterogeneousKVCache(small(), executors="manual", bugs=(), writer=DeterministicWriter())  # type: ignore[call-arg]


@pytest.mark.parametrize("bug", sorted(seeded.BUGS))
def test_each_edit_applies_to_todays_sources(bug: str) -> None:
    """Each hunk of each bug occurs exactly once in the file it names, and changes it."""
    for e in seeded.BY_NAME[bug].edits:
        src = (ROOT / e.path).read_text()
        assert src.count(e.old) == 1, f"{bug}: {src.count(e.old)} occurrences in {e.path}"
        assert e.old != e.new
    patched = seeded.patched_sources([bug])
    for mod, text in patched.items():
        ast.parse(text)  # the patched module still parses
        assert text != (IMPL / f"{mod}.py").read_text()


def test_all_edits_apply_together() -> None:
    """The bugs edit disjoint code: any set of them can be planted at once."""
    patched = seeded.patched_sources(seeded.BUGS)
    assert set(patched) == {"blocks", "gate", "groups", "recovery", "requests"}
    for text in patched.values():
        ast.parse(text)
    c = seeded.cache(small(), bugs=tuple(seeded.BUGS), executors="manual")
    c.close()


def test_a_moved_edit_is_reported(tmp_path: Path) -> None:
    for p in IMPL.glob("*.py"):
        (tmp_path / p.name).write_text(p.read_text())
    src = (tmp_path / "blocks.py").read_text()
    old = seeded.BY_NAME["skip_indexer_version"].edits[0].old
    (tmp_path / "blocks.py").write_text(src.replace(old, old.replace("m.iver", "m .iver")))
    with pytest.raises(seeded.SeededEditError, match="skip_indexer_version: .* 0 times"):
        seeded.patched_sources(["skip_indexer_version"], tmp_path)


def test_unknown_bug_names_raise() -> None:
    for bad in (("no_such_bug",), "evict_ignores_pins", (1,)):
        with pytest.raises(InvalidArgument):
            seeded.cache(small(), bugs=bad, executors="manual")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        seeded.package(["typo"])
    with pytest.raises(InvalidArgument):
        seeded.witness("typo", 8)


def test_no_bug_is_the_real_package() -> None:
    assert seeded.package(()) is sys.modules["kvstate.impl"]
    c = seeded.cache(small(), bugs=(), executors="manual")
    try:
        assert type(c) is HeterogeneousKVCache
    finally:
        c.close()


def test_the_staged_package_shares_identity_and_is_cached() -> None:
    """Staged: the edited modules and what imports them, plain Python.  Shared: the rest, so
    the error and event classes are the real ones."""
    bug = "swa_offset_by_one_block"
    pkg = seeded.package([bug])
    assert seeded.package((bug,)) is pkg and pkg.__name__ == seeded.package_name(frozenset([bug]))
    for mod in ("core", "groups", "tiers", "cache"):
        m = sys.modules[f"{pkg.__name__}.{mod}"]
        assert m.__name__ == f"{pkg.__name__}.{mod}" and str(m.__file__).endswith(".py"), mod
    for mod in ("errors", "events", "hashing", "meta", "coordinator", "testdata", "args"):
        assert sys.modules[f"{pkg.__name__}.{mod}"] is sys.modules[f"kvstate.impl.{mod}"], mod
    real = HeterogeneousKVCache(small(), executors="manual", writer=DeterministicWriter())
    c = seeded.cache(small(), bugs=[bug], executors="manual")
    try:
        assert type(c).__module__ == f"{pkg.__name__}.cache"
        # the view shows the staged package's own group (its repr names the class's module)
        assert f"{seeded.module([bug], 'groups').__name__}.SWAGroup object" in repr(
            c.inspect().tiers.swa
        )
        assert c.inspect().tiers.swa.remaps and not real.inspect().tiers.swa.remaps
        kinds: list[EventKind] = []
        c.events.subscribe(lambda e: kinds.append(e.kind))
        req = c.request(harness_tokens(2 * c.L + 1))
        with c.use(c.admit(req)):
            pass
        assert EventKind.STORED in kinds
        with pytest.raises(Refused):  # the real class, raised by the staged core
            c.test_hooks().act(
                "commit", c.inspect().resolve(req.chain)[0]
            )  # a stored block: commit is refused
    finally:
        c.close()
        real.close()


def test_staged_absolute_imports_are_rewritten() -> None:
    src = (
        "from kvstate.impl.errors import X\nimport kvstate.impl.meta as m\n"
        "def f():\n    from kvstate.impl import args\n"
    )
    out = seeded._rewrite(src, "kvstate._seeded_x")
    assert "kvstate.impl" not in out and out.count("kvstate._seeded_x") == 3
    assert seeded._imports(src) == {"errors", "meta", "args"}
