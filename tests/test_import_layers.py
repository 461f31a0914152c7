"""Imports between the packages run one way: the table knows nobody, the model and the proofs
read the table, the library never reads the model or the proofs.  An AST walk over every module
(imports inside functions included), so a new edge against the layering fails here."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# folder -> the kvstate packages it may import (besides itself); anything not listed is refused
ALLOWED: dict[str, frozenset[str]] = {
    "spec": frozenset(),
    "kernels": frozenset(),
    "model": frozenset({"spec"}),
    "proofs": frozenset({"spec", "model"}),
    "impl": frozenset({"spec", "kernels"}),
    # numerics/ (end-to-end checks of the allocator): its seeded-bug cases take their caches
    # from kvstate.testing.seeded
    "numerics": frozenset({"spec", "impl", "kernels", "testing"}),
    # kvstate/testing/ (the conformance adapter, byte checks): on top of the allocator, below the
    # command line; nothing of the production path imports it
    "testing": frozenset({"spec", "impl", "kernels"}),
    # kvstate/harness/ (the lockstep toolkit every fuzz target uses): the table's errors only
    "harness": frozenset({"spec"}),
    # the command line, the fuzz targets and integrations sit on top of everything
    "kvstate": frozenset(
        {"spec", "kernels", "model", "proofs", "impl", "numerics", "testing", "harness"}
    ),
}
PACKAGES = frozenset(ALLOWED)
# packages that live under kvstate/ rather than at the top level
NESTED = {"testing": Path("kvstate") / "testing", "harness": Path("kvstate") / "harness"}


def imported_packages(path: Path, package: str) -> dict[str, int]:
    """kvstate package -> first line importing it (relative imports resolved)."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                continue  # a sibling module of the same package
            if node.level >= 2:
                mod = (node.module or "").split(".")[0]
                names = [f"kvstate.{mod}"] if mod else [f"kvstate.{a.name}" for a in node.names]
                if package in NESTED and node.level == 2:  # kvstate/testing/x.py: ``..`` is kvstate
                    names = [f"kvstate.{mod}" if mod else "kvstate"]
            else:
                names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] != "kvstate":
                continue
            target = parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "kvstate"
            if len(parts) == 1 and isinstance(node, ast.ImportFrom):  # from kvstate import spec
                target = next((a.name for a in node.names if a.name in PACKAGES), target)
            if target != package:
                out.setdefault(target, node.lineno)
    return out


def modules() -> list[tuple[str, Path]]:
    out = []
    for pkg in sorted(ALLOWED):
        root = ROOT / NESTED.get(pkg, Path(pkg))
        for f in sorted(root.rglob("*.py")):
            inner = next((n for n, sub in NESTED.items() if (ROOT / sub) in f.parents), None)
            if inner is None or inner == pkg:
                out.append((pkg, f))
    return out


@pytest.mark.parametrize("package,path", modules(), ids=lambda x: str(x))
def test_imports_follow_the_layers(package: str, path: Path) -> None:
    bad = {
        p: line for p, line in imported_packages(path, package).items() if p not in ALLOWED[package]
    }
    assert not bad, (
        f"{path.relative_to(ROOT)} imports "
        + ", ".join(f"kvstate.{p} (line {line})" for p, line in sorted(bad.items()))
        + f"; {package}/ may import only {sorted(ALLOWED[package]) or 'nothing of kvstate'}"
    )


def test_testing_is_walked_and_nothing_below_imports_it(tmp_path: Path) -> None:
    """kvstate/testing/ is its own layer: walked as ``testing`` (not as the command line), and
    an import of it from the production path is refused."""
    walked = {str(f.relative_to(ROOT)): pkg for pkg, f in modules()}
    assert walked.get("kvstate/testing/adapter.py") == "testing"
    assert "testing" not in ALLOWED["impl"] | ALLOWED["spec"] | ALLOWED["kernels"]
    f = tmp_path / "m.py"
    f.write_text("from kvstate.testing.datacheck import verify_run\nfrom kvstate import testing\n")
    assert set(imported_packages(f, "impl")) == {"testing"}
    assert set(imported_packages(f, "testing")) == set()


def test_the_walk_sees_a_violation(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from kvstate.model.fuzz import x\n    from ..proofs import y\n")
    assert set(imported_packages(f, "impl")) == {"model", "proofs"}


# what the verification stack and the kernels need, and the allocator does not
NOT_FOR_THE_ALLOCATOR = ("numba", "hypothesis", "pytest", "_pytest", "networkx")


def test_the_allocator_imports_only_what_it_uses(tmp_path: Path) -> None:
    """``import kvstate.impl`` and building a cache need torch, numpy, blake3 and z3 (the table's guards
    are compiled through their Z3 terms), never numba, Hypothesis, pytest or networkx: kernels
    are loaded on first launch, and only on a CUDA or simulator backend."""
    code = (
        "import sys, tempfile\n"
        "from kvstate.impl import HeterogeneousKVCache\n"
        "from kvstate.spec.geometry import small\n"
        "c = HeterogeneousKVCache(geometry=small(), cache_dir=tempfile.mkdtemp(), device_blocks=8,"
        " host_blocks=8)\n"
        "c.close()\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(NOT_FOR_THE_ALLOCATOR)!r}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM",)}
    env["KVSTATE_KERNEL_BACKEND"] = "auto"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
