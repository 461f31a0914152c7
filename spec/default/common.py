"""What the default table's actions and invariants share: the parameters, the phase sets,
the conjunct and action constructors, and the terms several of them read (coverage by a request's
tokens, the pins on a block, the updates that give a request's pins up)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

from kvstate.spec.expr import AND, B2I, CDIV, ITE, array, store
from kvstate.spec.phases import Graph, Req
from kvstate.spec.table import Action, Conjunct, Param, ParamKind

Fn = Callable[..., Any]

B = Param("b", ParamKind.BLOCK)
R = Param("r", ParamKind.REQ)
H = Param("h", ParamKind.TOKENS)
A = Param("a", ParamKind.ADDR)
T = Param("t", ParamKind.TICKS)
F = Param("f", ParamKind.FMT)

HOLDS_PINS = (Req.PINNED, Req.VALIDATED, Req.USING)
CHECKED = (Req.VALIDATED, Req.USING)
ACTIVE = (Req.WAITING, Req.MATCHED, Req.PINNED, Req.VALIDATED, Req.USING, Req.RECOMPUTE)


def conj(name: str, fn: Fn, doc: str = "") -> Conjunct:
    return Conjunct(name, fn, doc)


def action(
    name: str,
    params: Iterable[Param],
    guard: Iterable[Conjunct],
    updates: dict[str, Fn],
    component: str,
    doc: str = "",
) -> Action:
    """An action whose frame is exactly the variables it updates (every action of the default
    table: none declares a variable it leaves alone)."""
    return Action(name, tuple(params), tuple(guard), updates, frozenset(updates), component, doc)


def is_at(var: str, phase: enum.IntEnum) -> Fn:
    """A guard conjunct's test: block variable ``var`` is in ``phase`` at the action's block."""
    return lambda s, p: getattr(s, var)[p.b] == phase


def at_b(**values: enum.IntEnum) -> dict[str, Fn]:
    """Updates that put each block variable named at the action's block in the given phase
    (``at_b(ckv=CKV.FREE, tail=Tail.NONE)``), in that order."""
    return {var: _put(var, int(phase)) for var, phase in values.items()}


def _put(var: str, phase: int) -> Fn:
    return lambda s, p: store(s, getattr(s, var), p.b, phase)


def covers(s: Any, b: Any, tokens: Any) -> Any:
    """Block ``b`` holds some of the first ``tokens`` tokens."""
    return b * s.k.L < tokens


def unpinned(s: Any, p: Any) -> Any:
    return s.ref[p.b] == 0


def lease_expired(s: Any, p: Any) -> Any:
    return s.lease[p.b] <= s.now


def moved_graph(s: Any, p: Any) -> Any:
    """A captured graph recorded the block's old address: moving the buffer to ``p.a`` makes it
    stale (shared by every action that may place a block in another device slot)."""
    return ITE(AND(s.graph == Graph.CAPTURED, p.a != s.addr[p.b]), int(Graph.STALE), s.graph)


def release_pins(s: Any, p: Any) -> Any:
    pinned = s.req(p.r).pinned
    return array(s, lambda b: s.ref[b] - B2I(covers(s, b, pinned)))


def give_up_pins(next_phase: Req) -> dict[str, Fn]:
    """Updates shared by release, abort and downgrade: drop every pin, forget the hit."""
    return {
        "phase": lambda s, p: int(next_phase),
        "ref": release_pins,
        "pinned": lambda s, p: 0,
        "hit": lambda s, p: 0,
    }


def pinned_blocks_total(s: Any) -> Any:
    total: Any = 0
    for r in range(s.k.R):
        total = total + CDIV(s.req(r).pinned, s.k.L)
    return total


def sum_pins(s: Any, b: Any) -> Any:
    """Pins on block ``b``: one per request whose pinned range covers it (requests expanded)."""
    total: Any = 0
    for r in range(s.k.R):
        total = total + B2I(covers(s, b, s.req(r).pinned))
    return total


def count_blocks(s: Any, pred: Callable[[Any], Any]) -> Any:
    """Number of pool blocks satisfying ``pred``: needs a concrete pool (bounded checks only)."""
    if not isinstance(s.N, int):
        raise TypeError("count_blocks needs a concrete pool size")
    total: Any = 0
    for b in range(s.N):
        total = total + B2I(pred(b))
    return total
