"""A store refused partway: an example on the table derived so that ``allocate`` refuses a block
of a run whose earlier blocks it allows.

On the default table ``allocate``'s guard is ``ckv == FREE``, and a store offers only FREE
records, so a store run is never refused: the implementation's path for a run whose guard
check fails partway (``BlockStore.store_run``: the blocks before the refused one stored, it and
the rest left FREE on the tombstones, ``Refused`` naming its conjuncts; ``GuardGate.check_run``
naming the refused block of a run test, ``GuardGate.first_refused`` finding it) never runs.
``regen(k)``, an example's first operation (a no-op anywhere else, like ``pincap``), rebuilds
the example on the table derived with one more ``allocate`` conjunct, ``first_generation``
(``gen[b] == 0``: a block's slot is allocated once; an evicted block is not stored again), kept
compiled (``k`` 0) or interpreted (``k`` 1, :func:`kvstate.targets.api.interpreted.interpreted`:
no run test, the gate judges the run block by block).  ``store_blocks(lo, hi)`` stores the
chain's blocks ``[lo, hi)`` through ``cache.test_hooks().store_run`` (a prefix of ``hi``
blocks where ``w``, else no window policy) and checks it against the model:

* the blocks stored are those of the run before the first one whose ``allocate`` the model
  refuses (FREE blocks only; the others are left as they are), no other;
* where the model refuses one, the call raises ``Refused`` for ``allocate`` naming the
  conjuncts the model finds false there, and the refused block and the rest stay FREE;
  otherwise it returns the count of blocks it stored;
* the change is explained by ``spec/api.py``'s ``STORE`` macro, once per block stored.

Nothing is restated: the conjunct is the derived table's own, read by the model and compiled
(or interpreted) by the implementation alike.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.model.apimap import compile_patterns
from kvstate.spec.api import MACROS
from kvstate.spec.parts import Conjunct
from kvstate.spec.phases import CKV
from kvstate.spec.table import Table
from kvstate.targets.api.base import derive_once, first_in_example, op, renew_on
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.interpreted import interpreted

ACTION = "allocate"
CONJUNCT = "first_generation"
CALL = "store_run"  # the explainer's call: STORE once per block stored


def first_generation(table: Table) -> Table:
    """``table`` whose ``allocate`` also requires ``gen[b] == 0`` (kept)."""
    return derive_once(table, CONJUNCT, _make)


def _make(table: Table) -> Table:
    a = table.action(ACTION)
    extra = Conjunct(
        CONJUNCT,
        lambda s, p: s.gen[p.b] == 0,
        "a block's slot is allocated once (a derived table: a store refused partway)",
    )
    return table.derive(
        name=f"{table.name}@{CONJUNCT}", replace_action=[replace(a, guard=(*a.guard, extra))]
    )


def do_regen(h: Any, o: Any) -> int | None:
    if not first_in_example(h):  # a running cache keeps its table
        return None
    t = first_generation(h.table)
    renew_on(h, interpreted(t) if o.arg("k") else t, "check: examples whose stores refuse partway")
    return None


def _fail(h: Any, o: Any, detail: str) -> Exception:
    return h.fail("store-run", [ACTION], f"{o.render()}: {detail}")


def _pattern(h: Any) -> str:
    ex = h.explainer
    if CALL not in ex.nfas:
        ex.nfas[CALL] = compile_patterns(("STORE*",), [a.name for a in h.table.actions])
        ex.rewritten[CALL] = ex._rewritten(ex.nfas[CALL][0])
    assert "STORE" in MACROS  # (spec/api.py's macro, expanded by compile_patterns)
    return CALL


def do_store_blocks(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import Refused

    h.call_override = "read"
    if h.threads or h.model is None:
        return None  # (the workers step the jobs: the model's state is not the call's)
    N, L = h.N, h.L
    lo = min(o.arg("lo"), N - 1)
    hi = max(lo + 1, min(o.arg("hi"), N))
    ckv = h.model.values["ckv"]
    free = [b for b in range(lo, hi) if ckv[b] == int(CKV.FREE)]
    p = {"a": 0, "f": 0}
    refused = next(
        (b for b in free if not h.machine.is_enabled(h.model, ACTION, {**p, "b": b})), None
    )
    want = free if refused is None else free[: free.index(refused)]
    chain = h.chain
    blocks = [
        (chain.keys[b], np.ascontiguousarray(chain.block_tokens_of(b)), b * L)
        for b in range(lo, hi)
    ]
    try:
        got: int | None = h.hooks.store_run(blocks, 1, hi if o.arg("w") else -1)
    except Refused as exc:
        if refused is None:
            raise _fail(h, o, f"refused ({exc}), but the model allows every block") from exc
        false = h.machine.failed_conjuncts(h.model, ACTION, {**p, "b": refused})
        if exc.action != ACTION or list(exc.failed) != list(false):
            raise _fail(
                h, o, f"raised {exc!r} at block {refused}; the model refuses {ACTION} for {false}"
            ) from exc
        got = None
        h.cov.add("check: a store run refused partway" if want else "check: a store run refused")
    else:
        if refused is not None:
            raise _fail(h, o, f"stored {got}; the model refuses {ACTION} at block {refused}")
        if got != len(want):
            raise _fail(h, o, f"returned {got}; the run's FREE blocks are {want}")
    obs = h.observe()["ckv"]
    stored = [b for b in free if obs[b] != int(CKV.FREE)]
    if stored != want:
        raise _fail(h, o, f"stored blocks {stored}; the model stores {want} of {free}")
    h.call_override = _pattern(h)
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses on the derived table, compiled and interpreted: a block stored alone and
    evicted, then a run over it refused there (the blocks before it stored), a hit on them."""
    if N < 3:
        return {}
    out = {}
    # compiled: one-block heads ([1] of [1, 2]; then [0] of [0, 2, 3], block 1 already
    # stored); interpreted: a two-block head ([0, 1] of [0, 1, 2]), then nothing stored
    for k, how, runs in (
        (0, "its run test", ((1, 3), (0, N))),
        (1, "block by block", ((0, 3), (2, N))),
    ):
        out[f"a store run refused partway ({how})"] = [
            op("regen", k=k),
            op("store_blocks", lo=2, hi=3, w=0),  # no window policy (``end`` -1)
            op("tick", t=lease_max),
            op("evict", n=N),
            *(op("store_blocks", lo=lo, hi=hi, w=1) for lo, hi in runs),
            op("request", i=1, n=2 * L + 1, life=1),
            op("admit", i=1),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        ]
    return out


DECLS = (
    OpDecl("regen", do_regen, "read", lambda s: {"k": st.integers(0, 1)}, rule=False),
    OpDecl(
        "store_blocks",
        do_store_blocks,
        "read",  # refused: nothing may change; otherwise STORE per block (checked here)
        lambda s: {"lo": s.block, "hi": st.integers(1, s.N), "w": st.integers(0, 1)},
        rule=False,
    ),
)
