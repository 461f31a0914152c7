"""The vLLM target's operations, declared once: their names, parameters and traffic weights.

An operation is the toolkit's :class:`~kvstate.harness.trace.TraceStep` (a name and integer
parameters), printed as a call (``admit(req=2, chunk=20, ext_blocks=0)``) and read back by
:func:`kvstate.calls.parse_calls` (``--replay``).  A drawn operation names its request by
``req``, an index into the live requests taken modulo their number when it runs, so any
sequence of operations is valid and a failing one can be cut down by deleting steps.  The
driver *resolves* each step it runs (:func:`resolved`): ``req`` becomes ``rid``, the number of
the request it acted on (request ``r7``, ``s7`` or ``q7`` is number 7: one counter names them
all), so deleting an arrival does not redirect later steps to another request.
"""

from __future__ import annotations

from collections.abc import Callable

from kvstate.harness.trace import TraceStep

# name -> its drawn parameters, in the order they are drawn ("req": a live request, modulo).
OPS: dict[str, tuple[str, ...]] = {
    "arrive": ("family", "shared", "tail", "extra"),
    "admit": ("req", "chunk", "ext_blocks"),
    "step": ("req", "chunk", "drafts", "accepted"),
    "finish": ("req",),
    "resend": ("k", "chunk"),
    "roundtrip": ("family", "shared", "tail", "extra", "chunk"),
    "preempt": ("req",),
    "evict": ("k",),
    "reset": (),
    "skip": ("req",),
    "cache": ("req",),
}
NAMES = tuple(OPS)
# Parameters a resolved or tenants trace adds: the request's number, a tenant's inputs.
EXTRA = {"arrive": ("rid", "tenant")}
NO_REQUEST = -1  # ``rid`` of a step that found no request to act on (a no-op on replay)


def op(name: str, *values: int) -> TraceStep:
    """``name`` with its drawn parameters given positionally, in :data:`OPS` order."""
    return TraceStep(name, dict(zip(OPS[name], values, strict=True)))


def draw_op(rand: Callable[[], float], rr: Callable[..., int], L: int) -> TraceStep:
    """One operation with traffic-like weights (arrivals, admissions and steps dominate)."""
    k = rand()
    if k < 0.22:
        return op("arrive", rr(3), rr(0, 12) * L // 2, 10 + rr(4), rr(1, 3 * L))
    if k < 0.42:
        return op("admit", rr(8), rr(1, 4 * L), rr(3) if rand() < 0.2 else 0)
    if k < 0.64:
        return op("step", rr(8), rr(1, 3 * L), rr(4), rr(4))
    if k < 0.72:
        return op("finish", rr(8))
    if k < 0.76:
        return op("resend", rr(8), rr(1, 4 * L))
    if k < 0.78:
        return op("roundtrip", rr(3), rr(0, 12) * L // 2, 10 + rr(4), rr(1, 3 * L), rr(1, 4 * L))
    if k < 0.82:
        return op("preempt", rr(8))
    if k < 0.87:
        return op("evict", rr(64))
    if k < 0.89:
        return op("reset")
    if k < 0.95:
        return op("skip", rr(8))
    return op("cache", rr(8))


def number(rid: str) -> int:
    """A request id's number (``r7`` -> 7)."""
    return int(rid[1:])


def resolved(step: TraceStep, picked: str | None, created: str | None) -> TraceStep:
    """``step`` naming the request it acted on (``picked``) or created (``created``)."""
    p = dict(step.inputs)
    if step.action == "arrive" and created is not None:
        p["rid"] = number(created)
    elif "req" in p:
        del p["req"]
        p["rid"] = NO_REQUEST if picked is None else number(picked)
    return TraceStep(step.action, p)


def parse(calls: list[tuple[str, list[tuple[str, int]]]]) -> list[TraceStep]:
    """Calls read by :func:`kvstate.calls.parse_calls` as operations; ValueError names a bad one."""
    out = []
    for name, args in calls:
        if name not in OPS:
            raise ValueError(f"unknown operation {name!r}; operations: {', '.join(OPS)}")
        p = dict(args)
        known = {*OPS[name], *EXTRA.get(name, ()), *(("rid",) if "req" in OPS[name] else ())}
        bad = sorted(set(p) - known)
        need = [q for q in OPS[name] if q != "req" and q not in p]
        if "req" in OPS[name] and not {"req", "rid"} & set(p):
            need.insert(0, "req or rid")
        if bad or need:
            raise ValueError(
                f"{name}: "
                + "; ".join(
                    [f"unknown {', '.join(bad)}"] * bool(bad)
                    + [f"lacks {', '.join(need)}"] * bool(need)
                )
            )
        out.append(TraceStep(name, p))
    return out
