"""``impl/cache.py`` (and the handles it gives out, ``impl/handles.py``) is a façade over the core:
it calls the public methods of the core's parts and never a private name defined in another
module (``core._guard``, ``from .core import _USING``).  Private names of the façade's own
classes (``run._closed``) stay its own business.  The core and
its parts (the block store, recovery, the request table) talk to each other the same way; only
the guard gate reads the views' private layout flag.  An AST walk, so a new reach into another
module's private name fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def foreign_private_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of each private attribute read on another object that the module does not
    define itself, and each private name imported from another module."""
    tree = ast.parse(source)
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own.add(node.target.id)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and isinstance(node.value, ast.Tuple):
                    own |= {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
    bad: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                continue
            if node.attr not in own:
                bad.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            bad += [(node.lineno, a.name) for a in node.names if _private(a.name)]
    return bad


@pytest.mark.parametrize(
    "module",
    [
        "cache", "handles", "core", "actions", "inspection", "blocks", "recovery", "spills", "diskreads",
        "requests", "pipelines", "tiers",
    ],
)  # fmt: skip
def test_no_private_name_of_another_module(module: str) -> None:
    bad = foreign_private_names((ROOT / "impl" / f"{module}.py").read_text())
    assert not bad, f"impl/{module}.py reaches into private names: " + ", ".join(
        f"{n} (line {line})" for line, n in bad
    )


def test_the_walk_sees_a_reach() -> None:
    src = (
        "from .core import _USING\n"
        "class Run:\n"
        "    def __init__(self):\n"
        "        self._closed = False\n"
        "def f(core, run):\n"
        "    core._guard('use')\n"
        "    return run._closed\n"
    )
    assert foreign_private_names(src) == [(1, "_USING"), (6, "_guard")]
