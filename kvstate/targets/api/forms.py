"""The build's other form of the generated guards and search, under the model's eye.

Every guard, fused guard, run form and the hit search the cache runs is a function made from the
table's terms (``kvstate.spec.compile.define``).  The compiled build answers with the twins
``impl/_aot.py`` carries for the exact sources of the default tables (``impl/twins.py``); the
pure build runs the generated sources.  So each build's fuzz saw only one of the two forms: a
twin answering for the wrong source, or a registry that swaps them, was never compared with
the model in the pure build, and the generated sources never in the compiled one.

``forms``, drawn by the state machine's initializer for a quarter of the examples (before any
other operation; a no-op anywhere else), reopens the example's fresh cache with the other
form: in the pure build with the shipped twins registered while it is built
(``twins.using_twins(twins.shipped_twins())``), in the compiled build with none (every source
run as generated).  The walk then compares every answer with the model as in any example.  It
also reads :func:`kvstate.impl.native_modules` against the modules' own files (the modules of
``native.COMPILED`` this process imported from an extension file): the public answer of which
build runs, and the switch that decides whether the twins are registered at all; and where the
process did not ask for the sources and the build is fresh (``native.stale()`` empty), that
every module of ``COMPILED`` runs compiled.
"""

from __future__ import annotations

import importlib.machinery
import sys
from typing import Any

from kvstate.targets.api.declare import OpDecl


def _from_extension(name: str) -> bool:
    path = getattr(sys.modules.get(name), "__file__", None) or ""
    return path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def native_read(h: Any) -> None:
    """``native_modules()`` names exactly the compiled modules imported from extension files."""
    from kvstate.impl import native, native_modules

    package = native.__name__.rpartition(".")[0]
    want = tuple(m for m in native.COMPILED if _from_extension(f"{package}.{m}"))
    got = native_modules()
    if got != want:
        raise h.fail(
            "native-modules",
            ["forms"],
            f"native_modules() {got}; the modules imported from extension files: {want}",
        )
    if not native.pure_requested() and native.extensions() and not native.stale():
        # a fresh compiled build, not asked for the sources: every compiled module runs so
        if got != native.COMPILED:
            raise h.fail(
                "native-modules",
                ["forms"],
                f"a fresh compiled build runs {got} compiled, not {native.COMPILED}",
            )
        h.cov.add("check: a fresh compiled build runs every compiled module compiled")
    h.cov.add("check: native_modules() against the modules' files")


def do_forms(h: Any, o: Any) -> int | None:
    if any(s.name not in ("pools", "forms") for s in h.steps[:-1]):  # a running cache: no-op
        h.call_override = "read"
        return None
    from kvstate.impl import native_modules
    from kvstate.impl.twins import recording, shipped_twins, using_twins

    native_read(h)
    twins = {} if "_aot" in native_modules() else shipped_twins()
    h.cache.close()
    with recording() as asked, using_twins(twins):
        h._open()
    for c in h.checks:  # a new cache, as after a restart (its events subscribed again)
        c.restart(h)
    if not asked:  # every cache asks for its guards' sources (none kept across the registry)
        raise h.fail(
            "twins-recording", ["forms"], "a cache was built and define was asked for nothing"
        )
    answered = sum(key in twins for key in asked)
    form = "the twins" if twins else "the generated sources"
    h.cov.add(f"check: examples on the build's other form ({form})")
    if twins:
        h.cov.add("check: generated sources answered by a shipped twin", answered)
    return None


# the cache reopened: only the state machine's initializer draws it, before any other
# operation (kvstate/targets/api/machine.py), so it is no rule of its own
DECLS: tuple[OpDecl, ...] = (OpDecl("forms", do_forms, "read", rule=False),)
