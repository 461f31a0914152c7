"""No import cycles between the project's modules, type-only imports included.

A cycle (``impl/blocks.py`` -> ``pipelines.py`` -> ``recovery.py`` -> ``blocks.py``, where the
jobs called back into ``Recovery``; ``kvstate/targets/api/`` <-> ``targets/api/machine.py``) means no
module of it can be read, tested or replaced alone, and an import order decides what works.
The walk reads every ``import`` of every module under the checked folders (top level, under
``if TYPE_CHECKING:``, and inside functions: a deferred import is still a dependency) and
fails on each strongly connected set of more than one module.  An import of a package's
submodule is an edge to that submodule only (Python's implicit import of the parent packages is
not a dependency the module chose)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> import name (pyproject.toml's package-dir)
PACKAGES = {
    "spec": "kvstate.spec",
    "model": "kvstate.model",
    "impl": "kvstate.impl",
    "proofs": "kvstate.proofs",
    "kernels": "kvstate.kernels",
    "kvstate": "kvstate",
}


def modules(root: Path) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        base = root / folder
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*.py")):
            rel = p.relative_to(base).with_suffix("").parts
            if folder == "kvstate" and rel and rel[0] in PACKAGES:
                continue  # (a folder of another package's name, not the case in this repository)
            parts = [name, *rel]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (anywhere in its source)."""
    pkg = name if _is_package(path) else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    found.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            for a in node.names:  # ``from pkg import sub`` names a submodule
                sub = f"{mod}.{a.name}"
                if sub in known:
                    found.add(sub)
                elif mod in known:
                    found.add(mod)
    found.discard(name)
    return found


def cycles(root: Path = ROOT) -> list[list[str]]:
    """Each strongly connected set of more than one module (Tarjan), sorted."""
    known = modules(root)
    graph = {m: imports(m, p, known) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # iterative enough for a few hundred modules
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _write(root: Path, files: Iterable[tuple[str, str]]) -> None:
    for rel, text in files:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


# cycles still there: each must shrink away, none may grow or appear (an entry no longer found
# fails too).  None is left.
KNOWN: list[list[str]] = []


def test_no_import_cycles() -> None:
    found = cycles()
    new = [c for c in found if c not in KNOWN]
    assert not new, "import cycles:\n" + "\n".join("  " + " <-> ".join(c) for c in new)
    gone = [c for c in KNOWN if c not in found]
    assert not gone, f"KNOWN cycles no longer there (remove them): {gone}"


def test_the_walk_finds_a_type_only_and_a_deferred_cycle(tmp_path: Path) -> None:
    _write(
        tmp_path,
        [
            ("impl/__init__.py", ""),
            (
                "impl/a.py",
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
            ),
            ("impl/b.py", "from . import c\n"),
            ("impl/c.py", "def f():\n    from kvstate.impl.a import A\n"),
            ("impl/d.py", "from .a import x\n"),  # into the cycle, not part of it
            ("kvstate/__init__.py", ""),
            ("kvstate/h.py", "import kvstate.m\n"),
            ("kvstate/m.py", "from .h import H\n"),
        ],
    )
    assert cycles(tmp_path) == [
        ["kvstate.h", "kvstate.m"],
        ["kvstate.impl.a", "kvstate.impl.b", "kvstate.impl.c"],
    ]
