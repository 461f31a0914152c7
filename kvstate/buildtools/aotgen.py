"""Ahead-of-time twins of the generated guards and search: writes ``impl/_aot.py``.

Every function built from the table at run time (``kvstate.spec.compile.define``: the fused
guards, their run forms, the hit search, each conjunct and rule) runs interpreted.  This module
records, for the default table of each preset geometry (:data:`GEOMETRIES`), every source the
generators produce while a small cache is built and serves a few misses and hits, and writes
them, each verbatim with type annotations added to its first lines, into one module that mypyc
compiles with the request path (``impl/native.py`` ``COMPILED``).  At run time
``kvstate.spec.compile.define`` returns a compiled twin (the registry: ``impl/twins.py``) only for a source that hashes to the
twin's key (SHA-256 of the exact source it was made from), so a changed table, a mutant, a
seeded bug or another geometry runs its own generated source as before.

The annotations come from the table's variable declarations and the implementation's layout,
nothing else: a global or request scalar is an ``int`` (not the booleans), a parameter is an
``int``, ``N`` is an ``int``, a block column of the direct form (``M.X``, the metadata's live
``list[int]``) is a ``list[int]``, one read from the state (``v.X``: a record-indexed list or a
view's tuple) a ``Sequence[int]``, as are the chain's record ids (``R``) and a run form's
blocks (``bs``), a cap read from the state's constants (``k_pin_cap = v.k.pin_cap``:
``kvstate.spec.compile.RUNTIME_CONSTS``) an ``int``; every other name stays ``Any``.  (Typed, mypyc indexes natively: the search
over 256 blocks runs about 5x faster than interpreted; untyped it ran slower.)

    python -m kvstate.buildtools.aotgen            # rewrite impl/_aot.py
    python -m kvstate.buildtools.aotgen --check    # exit 1 if impl/_aot.py is not what it would write

After rewriting, reinstall (``pip install -e .``) so the compiled build matches it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kvstate.impl
from kvstate.impl.twins import recording
from kvstate.spec.compile import CONST_PREFIX, RUNTIME_CONSTS
from kvstate.spec.geometry import Geometry, deepseek_v4_flash, small
from kvstate.spec.table import Consts, Scope, Table

TARGET = Path(kvstate.impl.__file__).resolve().parent / "_aot.py"  # impl/_aot.py
COMMAND = "python -m kvstate.buildtools.aotgen"
GEOMETRIES: tuple[Callable[[], Geometry], ...] = (deepseek_v4_flash, small)

_ASSIGN = re.compile(r"^    (\w+) = (.+)$")
_DEF = re.compile(r"^def (\w+)\(([\w, ]*)\):$")


def twins() -> dict[str, object]:
    """The twins ``impl/_aot.py`` holds, keyed by the SHA-256 of each one's source (what a
    check of the generated module reads, without importing its private name)."""
    from kvstate.impl import _aot

    return dict(_aot.TWINS)


def collect(geometry: Geometry) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Every generated source (key -> (name, source, env names)) a cache of ``geometry``'s
    default table asks for while it is built and serves misses, hits and evictions."""
    from kvstate.impl import HeterogeneousKVCache

    L = geometry.lcm_tokens
    blocks = 4
    with recording() as rec:
        cache = HeterogeneousKVCache(
            geometry,
            device="cpu",
            executors="manual",
            device_blocks=blocks + 2,
            host_blocks=1,
            disk_blocks=4,
            max_requests=4,
            writer=None,
            max_model_len=blocks * L + 64,
        )
        try:
            for family in range(3):  # the second and third families evict the one before
                prefix = (np.arange(blocks * L, dtype=np.int64) * 7919 + 13) % 50_000
                prefix[0] = 100_000 + family
                for r in range(3):  # a miss, then two hits
                    tail = 1_000_000 + (family * 3 + r) * 64 + np.arange(64, dtype=np.int64)
                    req = cache.request(np.concatenate([prefix, tail]), lifetime=1)
                    adm = cache.admit(req)
                    with cache.use(adm):
                        pass
                    cache.tick()
        finally:
            cache.close()
    return rec


def _types(table: Table) -> dict[str, str]:
    """What each generated name is, where the table says: ``t_<var>`` / ``r<n>_<field>``."""
    out: dict[str, str] = {}
    for v in table.vars:
        if v.ghost or v.is_bool:
            continue
        if v.scope is Scope.BLOCK:
            out[f"t_{v.name}"] = "Sequence[int]"  # a record-indexed list or a view's tuple
        elif v.scope is Scope.GLOBAL:
            out[f"t_{v.name}"] = "int"
        elif v.scope is Scope.REQ:
            out[f"r_{v.name}"] = "int"
    for c in RUNTIME_CONSTS:  # the caps a deployment sets, read from the state's ``k``
        if Consts.__annotations__.get(c) in (int, "int"):
            out[CONST_PREFIX + c] = "int"
    return out


def annotate(src: str, types: dict[str, str], columns: frozenset[str]) -> str:
    """``src`` with types on its signature and first lines (see the module docstring)."""
    lines = src.rstrip("\n").split("\n")
    m = _DEF.match(lines[0])
    if m is None:
        raise ValueError(f"unexpected generated function header {lines[0]!r}")
    name, params = m.group(1), [p.strip() for p in m.group(2).split(",") if p.strip()]
    ints = {"r", "h_max"} if params == ["v", "r", "h_max"] else set()
    seqs = {"bs"}  # the run forms' record ids
    sig = ", ".join(
        f"{p}: {'int' if p in ints else 'Sequence[int]' if p in seqs else 'Any'}" for p in params
    )
    ret = "int" if params == ["v", "p", "bs"] or params == ["v", "bs"] else "Any"
    out = [f"def {name}({sig}) -> {ret}:"]
    for ln in lines[1:]:
        a = _ASSIGN.match(ln)
        ty = None
        if a is not None:
            var, rhs = a.groups()
            req = re.fullmatch(r"r\d+_(\w+)", var)
            col = re.fullmatch(r"M\.(\w+)", rhs)
            if col is not None and var == f"t_{col.group(1)}" and col.group(1) in columns:
                ty = "list[int]"
            elif (
                var == "R"
                and rhs == "v.rids"
                or var.startswith("R_")
                and rhs.startswith("v.rids_of(")
            ):
                ty = "Sequence[int]"  # the chain's record ids (a list, or a tuple)
            elif var == "N" and rhs == "v.N":
                ty = "int"
            elif var.startswith(CONST_PREFIX) and rhs == f"v.k.{var[len(CONST_PREFIX) :]}":
                ty = types.get(var)
            elif var.startswith("p_") and rhs == f"p[{var[2:]!r}]":
                ty = "int"
            elif req is not None:
                ty = types.get(f"r_{req.group(1)}")
            elif var.startswith("t_") and rhs == f"v.{var[2:]}":
                ty = types.get(var)
            elif var == "cuts" and rhs == "[]":
                ty = "list[Any]"
            elif var == "where" and rhs == "None":
                ty = "Any"
        out.append(f"    {a.group(1)}: {ty} = {a.group(2)}" if a is not None and ty else ln)
    return "\n".join(out) + "\n"


def emit() -> str:
    """The text of ``impl/_aot.py``."""
    from kvstate.spec.compile import block_columns
    from kvstate.spec.default import default_table

    funcs: dict[str, tuple[str, str]] = {}  # key -> (twin name, annotated source)
    for make in GEOMETRIES:
        g = make()
        table = default_table(g)
        types, columns = _types(table), block_columns(table)
        for key, (name, src, env) in collect(g).items():
            # a source that reads a name of its env cannot run without it: no twin
            if any(re.search(rf"(?<![\w.]){re.escape(e)}(?!\w)", src) for e in env):
                continue
            twin = f"{name}__{key[:16]}"
            funcs[key] = (
                twin,
                annotate(src.replace(f"def {name}(", f"def {twin}(", 1), types, columns),
            )
    order = sorted(funcs, key=lambda k: funcs[k][0])
    head = (
        f'"""Generated by ``{COMMAND}`` (kvstate/buildtools/aotgen.py): do not edit.\n\n'
        "Compiled twins of the generated guards and search of the default table for the preset\n"
        "geometries, keyed by the SHA-256 of the exact source each was made from.\n"
        '"""\n\n'
        "# ruff: noqa\n"
        "# fmt: off\n"
        "from collections.abc import Sequence\n"
        "from typing import Any\n\n\n"
    )
    body = "\n\n".join(funcs[k][1] for k in order)
    table_lines = "".join(f'    "{k}": {funcs[k][0]},\n' for k in order)
    return f"{head}{body}\n\nTWINS: dict[str, Any] = {{\n{table_lines}}}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    args = ap.parse_args(argv)
    text = emit()
    if args.check:
        have = TARGET.read_text() if TARGET.exists() else ""
        if have != text:
            print(
                f"{TARGET} is stale: regenerate it with `{COMMAND}`, then reinstall",
                file=sys.stderr,
            )
            return 1
        print(f"{TARGET} is fresh ({text.count(chr(10) + 'def ')} twins)")
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET} ({text.count(chr(10) + 'def ')} twins)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
