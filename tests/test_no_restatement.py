"""No phase set and no list of action names is written by hand outside ``spec/``.

A phase set (``(CKV.HOST, CKV.DISK)``) or a list of action names (``("load_start",
"load_done")``) written a second time next to the table drifts from it the day the table
changes: such facts are read off the table (an action's guard, ``Table.recovery``,
``Var.address``, ``Table.coverage``).  This test walks the AST of every module of the packages
that interpret or implement the table and fails on a literal tuple, list or set of two or more
members that are all phases of one of the spec's phase enums, or all names of actions of the
default table, and on a literal tuple, list or set of one or more guard conjunct names of the
default table (``("idle",)``: a refusal naming the conjunct that failed, written instead of
asking the guard which conjuncts are false), or of a single phase of one enum
(``(Req.USING,)``, a phase set of one).  A single bare name is a binding (an effect bound to
its action, a phase compared with), not a restatement, and is allowed.

``proofs/corpus.py`` is exempt: it is a corpus of hand-written *counterexample* tables and
traces, which name actions on purpose.  The checking tools under ``kvstate/`` are scanned
too; ``numerics/`` (end-to-end scenarios, whose step lists are traces) is not.
"""

from __future__ import annotations

import ast
import enum
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvstate.spec.phases as phases
from kvstate.spec.default import default_table

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("impl", "model", "proofs", "kernels", "kvstate")
EXEMPT = {"proofs/corpus.py"}

PHASE_ENUMS = {
    name
    for name, obj in vars(phases).items()
    if isinstance(obj, type) and issubclass(obj, enum.IntEnum) and obj is not enum.IntEnum
}
ACTION_NAMES = {a.name for a in default_table().actions}
CONJUNCT_NAMES = {c.name for a in default_table().actions for c in a.guard}


def _phase(node: ast.expr) -> str | None:
    """``CKV.HOST`` or ``phases.CKV.HOST`` -> ``CKV``."""
    if isinstance(node, ast.Attribute):
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in PHASE_ENUMS:
            return owner.id
        if isinstance(owner, ast.Attribute) and owner.attr in PHASE_ENUMS:
            return owner.attr
    return None


def restatements(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.Tuple | ast.List | ast.Set) or not node.elts:
            continue
        kinds = {_phase(e) for e in node.elts}
        if len(kinds) == 1 and None not in kinds:
            yield node.lineno, f"phase set {ast.unparse(node)}"
            continue
        names = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
        if (len(names) >= 2 or isinstance(node, ast.Tuple)) and all(
            n in CONJUNCT_NAMES for n in names
        ):
            yield node.lineno, f"conjunct names {ast.unparse(node)}"
        elif len(names) >= 2 and all(n in ACTION_NAMES for n in names):
            yield node.lineno, f"action names {ast.unparse(node)}"


def _modules() -> list[Path]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in EXEMPT:
                out.append(path)
    return out


def test_the_check_can_fail() -> None:
    src = (
        "MOVING = (CKV.HOST, CKV.DISK)\nRECOVERY = ['load_start', 'load_done']\nx = ('a', 'b')\n"
        "raise Refused('admit', ('idle',), 'busy')\nONE = (Req.USING,)\ny = ('admit',)\n"
    )
    found = [why for _, why in sorted(restatements(ast.parse(src)))]
    assert found == [
        "phase set (CKV.HOST, CKV.DISK)",
        "action names ['load_start', 'load_done']",
        "conjunct names ('idle',)",
        "phase set (Req.USING,)",
    ]


# Restatements known and not derived yet, by file: the count must match exactly (a new one
# fails, and so does one removed without lowering the count here).  The API harness's world
# model keeps a few phase sets and action lists of its own.
KNOWN = {
    "kvstate/targets/api/accounting.py": 1,
    "kvstate/targets/api/state.py": 4,
    "kvstate/targets/api/orders.py": 1,
    "kvstate/targets/api/ready.py": 1,
}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_restatement(path: Path) -> None:
    found = list(restatements(ast.parse(path.read_text(), str(path))))
    known = KNOWN.get(path.relative_to(ROOT).as_posix(), 0)
    if known:
        assert len(found) == known, "\n".join(
            [f"{path.relative_to(ROOT)}: {len(found)} restatements, {known} known (update KNOWN)"]
            + [f"  line {line}: {why}" for line, why in found]
        )
        return
    assert not found, "\n".join(
        f"{path.relative_to(ROOT)}:{line}: {why} restates the table" for line, why in found
    )
