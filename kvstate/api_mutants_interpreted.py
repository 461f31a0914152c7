"""Planted bugs of the guard paths only a table whose guards do not compile reaches, closed by
``kvstate/targets/api/interpreted.py`` (an example on the table derived with every conjunct kept
interpreted): the gate's block views and a guard with no fused accept test.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (``kvstate/api_planted.py`` imports this list).
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "uncompiled_guard_accepts",
        "guards: an action with no fused accept test taken as allowed",
        "impl/guards.py",
        "            if whole is not None and whole(view, params):",
        "            if whole is None or whole(view, params):",
    ),
    (
        "block_view_reads_no_graph",
        "guards: a block view that reads the CUDA graph's phase as 0",
        "impl/gate.py",
        "            now=self.now,\n            graph=self.graph.phase,",
        "            now=self.now,\n            graph=0,",
    ),
    (
        "block_view_at_the_record_id",
        "guards: a block guard read on a one-block view at the record's id",
        "impl/gate.py",
        "        return self.block_view(rid), 0",
        "        return self.block_view(rid), rid",
    ),
)
