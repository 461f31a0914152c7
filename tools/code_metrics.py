"""Size figures for the library's shape: the largest files, classes and functions, and the
private names that cross module boundaries (``obj._name`` where ``obj`` is not ``self``/``cls``,
or ``from m import _name``), read off the AST so the figures are reproducible before and after a
refactor.  Usage: ``python tools/code_metrics.py [folders...]`` (default: impl spec)."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _span(node: ast.AST) -> int:
    return int(getattr(node, "end_lineno", 0) or 0) - int(getattr(node, "lineno", 0) or 0) + 1


def _self_attrs(cls: ast.ClassDef) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                out.add(node.attr)
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out.add(stmt.target.id)
        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                if (
                    isinstance(t, ast.Name)
                    and t.id == "__slots__"
                    and isinstance(stmt.value, ast.Tuple)
                ):
                    out |= {e.value for e in stmt.value.elts if isinstance(e, ast.Constant)}
    return out


def main(argv: list[str]) -> None:
    folders = argv or ["impl", "spec"]
    files: list[tuple[int, str]] = []
    classes: list[tuple[int, int, int, str]] = []
    funcs: list[tuple[int, str]] = []
    crossing: Counter[str] = Counter()
    crossing_by_file: Counter[str] = Counter()
    reach: Counter[str] = (
        Counter()
    )  # file -> uses of ``core.X`` / ``self.core.X`` / ``self._core.X``
    reach_names: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            src = path.read_text()
            tree = ast.parse(src, rel)
            files.append((len(src.splitlines()), rel))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    methods = [
                        n
                        for n in node.body
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                    ]
                    classes.append(
                        (_span(node), len(methods), len(_self_attrs(node)), f"{rel}:{node.name}")
                    )
                    for m in methods:
                        funcs.append((_span(m), f"{rel}:{node.name}.{m.name}"))
                elif isinstance(node, ast.Module):
                    for n in node.body:
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            funcs.append((_span(n), f"{rel}:{n.name}"))
                if isinstance(node, ast.Attribute) and _is_private(node.attr):
                    base = node.value
                    if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                        crossing[f"{rel}: .{node.attr}"] += 1
                        crossing_by_file[rel] += 1
                if isinstance(node, ast.Attribute):
                    b = node.value
                    if (isinstance(b, ast.Name) and b.id == "core") or (
                        isinstance(b, ast.Attribute) and b.attr in ("core", "_core")
                    ):
                        reach[rel] += 1
                        reach_names.setdefault(rel, set()).add(node.attr)
                if isinstance(node, ast.ImportFrom):
                    for a in node.names:
                        if _is_private(a.name):
                            crossing[f"{rel}: import {a.name}"] += 1
                            crossing_by_file[rel] += 1
    print("== largest files (lines)")
    for n, rel in sorted(files, reverse=True)[:10]:
        print(f"{n:6d}  {rel}")
    print(f"  total {sum(n for n, _ in files)} lines in {len(files)} files")
    print("== largest classes (lines, methods, attributes)")
    for n, m, a, name in sorted(classes, reverse=True)[:10]:
        print(f"{n:6d} {m:4d}m {a:4d}a  {name}")
    print("== largest functions (lines)")
    for n, name in sorted(funcs, reverse=True)[:15]:
        print(f"{n:6d}  {name}")
    print("== private names crossing an object/module boundary (not self./cls.), per file")
    for rel, n in crossing_by_file.most_common():
        print(f"{n:6d}  {rel}")
    print(f"  total {sum(crossing.values())} uses, {len(crossing)} distinct (file, name)")
    for key, n in sorted(crossing.items()):
        print(f"    {n:4d}  {key}")
    print("== reach into the core (``core.X`` uses, distinct names), per file")
    for rel, n in reach.most_common():
        print(f"{n:6d} {len(reach_names[rel]):4d}  {rel}")


if __name__ == "__main__":
    main(sys.argv[1:])
