"""The request path's phases as ints are converted in one module, ``impl/phasecodes.py``.

Each constant there is named ``<COMPONENT>_<MEMBER>`` and equals that member of the spec's
enum (a plain ``int``, what the metadata columns hold); no other module of ``impl/`` converts a
phase itself (``int(CKV.READY)``), so the copies under other names cannot come back."""

from __future__ import annotations

import ast
from pathlib import Path

import kvstate.impl.phasecodes as pc
import kvstate.spec.phases as ph

ROOT = Path(__file__).resolve().parents[2]
ENUMS = {
    "CKV": ph.CKV, "TAIL": ph.Tail, "SWA": ph.Swa, "IDX": ph.Indexer, "FMT": ph.Fmt,
    "PIPE": ph.Pipe, "REQ": ph.Req, "GRAPH": ph.Graph,
}  # fmt: skip
ENUM_NAMES = {e.__name__ for e in ENUMS.values()}
# conversions not moved yet, by file (exact: a new one fails, a removed one asks to lower it)
KNOWN = {"impl/handles.py": 1}


def conversions(source: str) -> list[int]:
    """Lines of ``int(<phase enum>.<MEMBER>)`` calls."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "int"
            and len(node.args) == 1
            and isinstance(node.args[0], ast.Attribute)
            and isinstance(node.args[0].value, ast.Name)
            and node.args[0].value.id in ENUM_NAMES
        ):
            out.append(node.lineno)
    return out


def test_each_code_is_its_phase() -> None:
    names = [n for n in vars(pc) if n.isupper() and n.split("_")[0] in ENUMS and "_" in n]
    assert len(names) >= 20
    for n in names:
        prefix, member = n.split("_", 1)
        value = getattr(pc, n)
        assert type(value) is int and value == ENUMS[prefix][member], n


def test_the_check_can_fail() -> None:
    assert conversions("A = int(CKV.READY)\nB = int(x)\nC = int(Req.IDLE)\n") == [1, 3]


def test_no_other_module_converts_a_phase() -> None:
    for path in sorted((ROOT / "impl").glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("impl/phasecodes.py", "impl/_aot.py"):
            continue
        found = conversions(path.read_text())
        assert len(found) == KNOWN.get(rel, 0), f"{rel}: phases converted at lines {found}"
