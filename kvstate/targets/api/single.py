"""One table action fired by name through ``cache.test_hooks().act``, checked against the model.

The library's own calls reach the allocator's parts through fused transactions (a store run,
an admission in one critical section); the per-action entry points the block-level target
drives (``BlockStore.allocate``/``commit``/``discard``/``seal``/``slide``/``index_update``/
``evict_start``/``evict_done``/``touch``, ``RequestTable.begin``/``match``/``pin``/``validate``/
``use``/``release``/``abort``/``downgrade``, ``GuardGate.tick``, dispatched by
``CacheCore.act``) are a public seam of the cache too (``TestHooks.act``, docs/library.md), and
an engine that drives the cache by the table's actions goes through them.  ``act(a, k, on)``
picks the ``a``-th action of the table among those fired here and, with ``on``, the ``k``-th of
its inputs the model enables now (without, the ``k``-th it refuses):

* an enabled action is performed; the harness explains the change by that one action alone
  (an allocation may first make room: ``spec/api.py``'s ``ROOM``), and :class:`ActCheck`
  holds the explanation to the inputs chosen (the action on another block or slot is a
  finding); a refusal is a finding, except ``OutOfCapacity`` for an allocation (the device
  slots the model does not see, held by other namespaces' blocks);
* a refused action must raise the documented ``Refused`` and change nothing (the harness's
  refusal check).

Request actions act only on slots no harness request holds: idle ones (``admit`` takes one of
this module's own requests over the harness chain) and those this module admitted.  The
pipeline jobs' actions (loads, offloads, spills, drops, rebuilds) are left out: a job steps
them itself, and one fired behind its back is not a call an engine makes.  :func:`settle`,
before quiescence, aborts this module's requests and ends what its actions left half done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from kvstate.model.apimap import compile_patterns
from kvstate.spec.api import API, MACROS
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Action, ParamKind
from kvstate.targets.api.base import NAMESPACE, CallCheck, op
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]

# the parts' actions fired one at a time (impl/actions.py: the store's, the gate's tick, the
# request table's); the pipeline jobs' own are left out (see the module doc)
_PARTS = ("store", "requests")
_GATE = ("tick",)
OUTPUTS = (ParamKind.ADDR, ParamKind.FMT)


def _words(pattern: str) -> list[str]:
    """The action names of a ``spec/api.py`` pattern, in order (macros, ``*``/``?`` left out)."""
    return [t for t in pattern.split() if t.isidentifier() and not t.isupper()]


def _settling() -> tuple[str, ...]:
    """What :func:`settle` fires, in this order: ``abort`` (the call's pattern), the step a
    store takes after ``allocate`` (a write left open is committed) and the one an eviction
    takes after it starts (``spec/api.py``'s ``STORE`` and ``EVICT``)."""
    store, evict = _words(MACROS["STORE"]), _words(MACROS["EVICT"])
    return (*_words(API["abort"].patterns[0]), store[store.index("allocate") + 1], evict[-1])


def actions(table: Any) -> list[Action]:
    """The table's actions this operation fires, in the table's order."""
    from kvstate.impl.actions import ACTIONS

    return [a for a in table.actions if ACTIONS[a.name][0] in _PARTS or a.name in _GATE]


class _State:
    """This module's requests of the current cache: slot -> Request."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.reqs: dict[int, Any] = {}
        self.chosen: tuple[str, dict[str, int]] | None = None


def _state(h: Any) -> _State:
    st = getattr(h, "_single", None)
    if st is None or st.cache is not h.cache:  # a new cache (a restart, other pools)
        st = h._single = _State(h.cache)
    return st


def _free_slots(h: Any, st: _State) -> set[int]:
    """Slots the request actions may act on: idle ones and this module's own."""
    out = set()
    with h.view.lock:
        for r, s in enumerate(h.view.slots[: h.R]):
            req = s.request
            if req is None or st.reqs.get(r) is req:
                out.add(r)
    return out


def _inputs(h: Any, a: Action, st: _State, enabled: bool) -> list[dict[str, int]]:
    """The inputs of ``a`` the model enables (``enabled``) or refuses now, outputs left out."""
    m = h.machine
    outs = {q.name: 0 for q in a.params if q.kind in OUTPUTS}
    rq = [q.name for q in a.params if q.kind is ParamKind.REQ]
    free = _free_slots(h, st) if rq else set()
    forbid = h._forbid(None)
    res = []
    for p in m.param_space(a):
        if any(p[n] for n in outs):
            continue
        if rq and p[rq[0]] not in free:
            continue
        if (a.name, p.get("b", -1)) in forbid:
            continue
        if m.is_enabled(h.model, a, {**p, **outs}) == enabled:
            res.append({q.name: p[q.name] for q in a.params if q.kind not in OUTPUTS})
    return res


def _pattern(h: Any, name: str) -> str:
    """The explainer's call for one action: the action alone; an allocation may make room
    first (``ROOM``: the library's pools hold other namespaces' blocks besides the chain)."""
    call = f"act {name}"
    ex = h.explainer
    if call not in ex.nfas:
        names = [a.name for a in h.table.actions]
        pat = f"ROOM* {name}" if name == "allocate" else name
        assert "ROOM" in MACROS  # (spec/api.py's macro, expanded by compile_patterns)
        ex.nfas[call] = compile_patterns((pat,), names)
        ex.rewritten[call] = ex._rewritten(ex.nfas[call][0])
    return call


def _args(h: Any, st: _State, a: Action, p: dict[str, int]) -> list[Any]:
    """``TestHooks.act``'s arguments: a block's record id, a slot, a request for ``admit``."""
    out: list[Any] = []
    if a.name == "admit":
        r = p["r"]
        req = h.cache.request(h.tokens[: h.N * h.L], namespace=NAMESPACE, lifetime=p["t"])
        return [req, p["t"], r]
    for q in a.params:
        if q.kind in OUTPUTS:
            continue
        v = p[q.name]
        out.append(h.rids[v] if q.kind is ParamKind.BLOCK else v)
    return out


def do_act(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import KVStateError, OutOfCapacity, Refused

    st = _state(h)
    st.chosen = None
    acts = actions(h.table)
    a = acts[o.arg("a") % len(acts)]
    on = bool(o.arg("on"))
    h.call_override = "read"  # a refusal, or nothing to fire: nothing may change
    if h.threads:
        return None  # (the workers step the jobs: the model's state is not the call's)
    opts = _inputs(h, a, st, on)
    if not opts:
        return None
    p = opts[o.arg("k") % len(opts)]
    args = _args(h, st, a, p)
    h.act_tried = (a.name, p)  # (kvstate/targets/api/whyrefused.py)
    r = p.get("r")
    if not on:
        try:
            h.hooks.act(a.name, *args)
        except Refused:
            h.cov.add(f"check: act refused {a.name}")
            raise
        except KVStateError as exc:  # another documented error: not the guard's refusal
            raise h.fail(
                "act-refused",
                [a.name],
                f"{o.render()}: {a.name}{p} raised {type(exc).__name__} ({exc}); the table "
                "refuses it here, which act reports as Refused",
            ) from exc
        raise h.fail(
            "act-not-refused",
            [a.name],
            f"{o.render()}: {a.name}{p} was performed, but the table refuses it here "
            f"({', '.join(h.machine.failed_conjuncts(h.model, a, _with_outs(a, p)))})",
        )
    try:
        h.hooks.act(a.name, *args)
    except OutOfCapacity:
        if a.name != "allocate":
            raise h.fail(
                "act-refused", [a.name], f"{o.render()}: {a.name}{p} ran out of room"
            ) from None
        h.cov.add("act allocate out of room")
        raise
    except KVStateError as exc:  # Refused, or any other documented error
        raise h.fail(
            "act-refused",
            [a.name],
            f"{o.render()}: {a.name}{p} was refused ({exc}), but the table allows it here",
        ) from exc
    if a.name == "admit":
        st.reqs[p["r"]] = args[0]
    st.chosen = (a.name, p)
    h.call_override = _pattern(h, a.name)
    if not any(q.kind in OUTPUTS for q in a.params):
        nxt = h.machine.step(h.model, a, p)
        if nxt.values == h.model.values:  # a step that changes nothing: the empty word
            st.chosen = None  # (the explainer finds an action only where something changed)
            h.call_override = "read"
            h.cov.add("act with no effect")
    h.cov.add(f"act {a.name}")
    return r


def _with_outs(a: Action, p: dict[str, int]) -> dict[str, int]:
    return {**p, **{q.name: 0 for q in a.params if q.kind in OUTPUTS}}


class ActCheck(CallCheck):
    """The explanation of an ``act`` is the chosen action on the chosen inputs."""

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        st = getattr(h, "_single", None)
        if o.name != "act" or st is None or st.chosen is None:
            return
        name, p = st.chosen
        st.chosen = None
        last = steps[-1] if steps else None
        if last is None or last[0] != name or any(last[1].get(k) != v for k, v in p.items()):
            raise h.fail(
                "act-other",
                [name],
                f"{o.render()}: asked for {name}{p}, the change is explained by {list(steps)}",
            )
        h.cov.add("check: act explained by the action asked")


def settle(h: Any) -> None:
    """Before quiescence: this module's requests aborted, its half-done writes discarded and
    evictions completed (each an ``act`` the harness checks like any other)."""
    st = getattr(h, "_single", None)
    if st is None or st.cache is not h.cache or h.threads:
        return
    acts = actions(h.table)
    for name in _settling():
        i = next(j for j, a in enumerate(acts) if a.name == name)
        for _ in range(4 * h.N + h.R):
            opts = _inputs(h, acts[i], st, True)
            if any(q.kind is ParamKind.REQ for q in acts[i].params):
                opts = [p for p in opts if p["r"] in st.reqs]
            if not opts:
                break
            k = _inputs(h, acts[i], st, True).index(opts[0])
            h.apply(op("act", a=i, k=k, on=1))


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: every action of :func:`actions` fired enabled and refused, round after round,
    over an empty cache and over a stored chain with a hit in use (the action map is the
    implementation's: ``impl/actions.py``, checked against the table when a cache is built)."""
    from kvstate.impl.actions import ACTIONS

    n = sum(1 for part, _ in ACTIONS.values() if part in _PARTS) + len(_GATE)
    # the actions in the table's order, then backwards (a write discarded before its commit)
    rounds = [
        op("act", a=a, k=k, on=on)
        for k in range(6)
        for on in (1, 0)
        for a in (range(n) if k % 2 == 0 else reversed(range(n)))
    ]
    full = N * L + 1
    hit = [
        op("request", i=0, n=full, life=1),
        op("admit", i=0),
        op("use", i=0),
        op("finish", i=0),
        op("request", i=1, n=full, life=lease_max),
        op("admit", i=1),
        op("use", i=1),
    ]
    from kvstate.spec import default_table

    at = {a.name: i for i, a in enumerate(actions(default_table()))}
    # a hit given up matched (``admit``'s second pattern: admit, match, downgrade), then one
    # pinned first (its first pattern's admit, match, pin), ended by ``abort``
    up = _words(API["admit"].patterns[1])
    pinned = _words(API["admit"].patterns[0])
    seq = [*up, *_words(API["abort"].patterns[0]), *pinned[: pinned.index("pin") + 1], up[-1]]
    give_up = [op("act", a=at[name], k=0, on=1) for name in seq]
    return {
        "single actions by name on an empty cache": rounds,
        "single actions: hits given up": [*hit[:4], *give_up],
        "single actions by name beside a hit in use": [*hit, *rounds, op("finish", i=1)],
    }


def limit_walks(N: int, L: int) -> dict[str, list[Any]]:
    """Witness: over the stored chain, a request of ``act``'s own (``N * L`` tokens) admitted
    and matched with a hit of every one of its tokens, the longest the table's ``match``
    allows (the library's own calls leave the last token to compute), then pinned and
    validated by name."""
    from kvstate.spec import default_table

    at = {a.name: i for i, a in enumerate(actions(default_table()))}
    full = N * L + 1
    return {
        "single actions: a hit of every token of the request": [
            op("request", i=0, n=full, life=1),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("act", a=at["admit"], k=0, on=1),
            op("act", a=at["match"], k=N * L, on=1),
            op("act", a=at["pin"], k=0, on=1),
            op("act", a=at["validate"], k=0, on=1),
        ],
    }


DECLS = (
    OpDecl(
        "act",
        do_act,
        "read",  # refused; performed: the action alone (checked by ActCheck)
        lambda s: {"a": st.integers(0, 31), "k": st.integers(0, 15), "on": st.integers(0, 3)},
    ),
)
