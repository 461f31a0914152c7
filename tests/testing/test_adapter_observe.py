"""The adapter's generated ``observe()`` reads what a plain loop over the table's variables reads."""

from __future__ import annotations

import random
from typing import Any

from kvstate.model.concrete import Machine
from kvstate.spec.default import default_table
from kvstate.spec.phases import CKV
from kvstate.spec.table import ParamKind, Scope
from kvstate.testing.adapter import Target, make_target


def _plain(x: Target) -> dict[str, Any]:
    core, m = x.view, x.view.meta
    slots = core.slots[: x.R]
    out: dict[str, Any] = {}
    for v in x.table.vars:
        if v.ghost:
            continue
        if v.scope is Scope.BLOCK:
            out[v.name] = tuple(getattr(m, v.name)[i] for i in x.rids)
        elif v.scope is Scope.GLOBAL:
            if v.name == "nfree":
                out[v.name] = sum(1 for i in x.rids if m.ckv[i] == CKV.FREE)
            elif v.name == "graph":
                out[v.name] = core.graph.phase
            else:
                out[v.name] = getattr(core, v.name)
        elif v.scope is Scope.REQ:
            out[v.name] = tuple(getattr(s, v.name) for s in slots)
        else:
            out[v.name] = tuple(tuple(getattr(s, v.name)) or (0,) * x.N for s in slots)
    return out


def test_generated_observe_matches_a_plain_read() -> None:
    table = default_table()
    n = table.geometry.model_blocks
    x, m = make_target(table, n), Machine(table, n)
    s, rng, seen = m.init(), random.Random(1), 0
    try:
        for _ in range(80):
            assert list(x.observe().items()) == list(_plain(x).items())
            moves = [
                (a, p)
                for a, p in m.enabled(s, tokens_step=table.consts.L)
                if all(
                    q.kind not in (ParamKind.ADDR, ParamKind.FMT) for q in table.action(a).params
                )
            ]
            a, p = rng.choice(moves)
            getattr(x, a)(**p)
            s = m.step(s, a, p)
            seen += 1
    finally:
        x.close()
    assert seen == 80
