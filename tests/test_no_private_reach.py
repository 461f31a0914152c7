"""Checkers and tests read the cache through its inspection interface, never through its parts.

``HeterogeneousKVCache.inspect()`` (a read-only view) and ``test_hooks()`` (the fault-injection
seams) are the one documented surface a checker under ``kvstate/`` or a test under ``tests/``
may use (``impl/inspection.py``).  A reach past it (``cache.core``, a part's private name such as
``disk._pread``) pins the parts' layout in the checkers: every change of a part then breaks
them, and nothing tells a reader which names are a contract.  An AST walk finds each:

* an attribute ``.core`` or ``._core`` of anything (the cache's core; a job's old back
  reference);
* a private name (one underscore) that ``impl/`` defines and that no other tree defines for
  itself (a name the checkers' own classes also use, ``_open``, ``_check``, is theirs), read as
  an attribute of anything but ``self``/``cls``, or imported from ``kvstate.impl``.

Unit tests of a part build that part (or a ``CacheCore``, a public class) themselves and call
its public methods.  ``ALLOWED`` lists what is left, each with its reason; an entry no longer
needed fails too, so the list only shrinks."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("tests", "kvstate")
# the other trees: a private name one of them defines for itself is not impl's alone
OWN_TREES = ("spec", "model", "proofs", "kernels", "numerics", "kvstate", "tests")

# (file, name): reaches still allowed, and why
ALLOWED: dict[tuple[str, str], str] = {
    # argparse's own private list of a parser's actions (impl/core.py has an ``_actions`` too)
    ("tests/cli/test_exit_codes.py", "_actions"): "argparse's parser._actions, not impl's",
    ("tests/test_readme.py", "_actions"): "argparse's parser._actions, not impl's",
    # the twin registry's own unit test plants a twin and takes it out again
    ("tests/impl/test_impl_aot.py", "_TWINS"): "the registry's own test",
    # the build tool that writes impl/_aot.py reads back the twins it wrote
    ("kvstate/buildtools/aotgen.py", "_aot"): "the generator reads the module it writes",
    # SGLang's radix-tree core (python or rust) of a configuration, not the cache's parts
    ("kvstate/targets/sglang/configs.py", "core"): "SGLang's tree core, a config field",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _files(root: Path, trees: Iterable[str]) -> Iterable[Path]:
    for tree in trees:
        yield from sorted((root / tree).rglob("*.py"))


def impl_private_names(root: Path = ROOT) -> set[str]:
    """Private names ``impl/`` defines (functions, classes, attributes, module globals, its
    private modules) that no other tree defines for itself."""
    names: set[str] = set()
    for p in _files(root, ["impl"]):
        if _private(p.stem):
            names.add(p.stem)
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            else:
                continue
            if _private(name):
                names.add(name)
    own: set[str] = set()
    for p in _files(root, OWN_TREES):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
    return names - own


def reaches(source: str, private: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each reach in one module's source."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            if node.attr in ("core", "_core"):
                out.append((node.lineno, node.attr))
            elif node.attr in private and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            ):
                out.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            parts = node.module.split(".")
            if "impl" in parts or (node.level and parts[:1] == ["impl"]):
                out += [(node.lineno, a.name) for a in node.names if _private(a.name)]
                out += [(node.lineno, p) for p in parts if _private(p)]
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if "impl" in parts:
                    out += [(node.lineno, p) for p in parts if _private(p)]
    return sorted(set(out))


def all_reaches(root: Path = ROOT) -> dict[tuple[str, str], list[int]]:
    private = impl_private_names(root)
    found: dict[tuple[str, str], list[int]] = {}
    for p in _files(root, CHECKED):
        rel = p.relative_to(root).as_posix()
        for line, name in reaches(p.read_text(), private):
            found.setdefault((rel, name), []).append(line)
    return found


def test_no_checker_or_test_reaches_past_the_inspection_interface() -> None:
    found = all_reaches()
    bad = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not bad, "reaches past cache.inspect() / cache.test_hooks():\n" + "\n".join(
        f"  {f}:{lines[0]}: .{name}" + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else "")
        for (f, name), lines in sorted(bad.items())
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED entries no longer needed (remove them): {stale}"


def test_the_walk_finds_each_kind_of_reach(tmp_path: Path) -> None:
    """A planted tree: a cache's core, a part's private method, a private import and a private
    module of impl are found; the checker's own private names and ``self._x`` are not."""
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "disk.py").write_text(
        "class DiskTier:\n    def _pread(self):\n        self._fd = 1\n_SECRET = 2\n"
    )
    (tmp_path / "impl" / "_gen.py").write_text("X = 1\n")
    for tree in (*OWN_TREES, *CHECKED):
        (tmp_path / tree).mkdir(exist_ok=True)
    (tmp_path / "kvstate" / "harness.py").write_text(
        "class H:\n    def _open(self):\n        self._fd = 0\n"
    )
    (tmp_path / "tests" / "test_x.py").write_text(
        "from kvstate.impl.disk import _SECRET\n"
        "from kvstate.impl import _gen\n"
        "def test(cache, h):\n"
        "    m = cache.core.meta\n"
        "    cache.core.disk._pread()\n"
        "    h._open()\n"
        "    return h._fd\n"
    )
    found = all_reaches(tmp_path)
    assert found == {
        ("tests/test_x.py", "_SECRET"): [1],
        ("tests/test_x.py", "_gen"): [2],
        ("tests/test_x.py", "core"): [4, 5],
        ("tests/test_x.py", "_pread"): [5],
    }
