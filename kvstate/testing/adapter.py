"""Conformance-harness target: the real cache driven one spec action at a time.

``make_target(table, N)`` (also reachable as ``kvstate.testing.adapter:make_target``) builds a
:class:`HeterogeneousKVCache` over real tensors and a temporary disk directory, with manual
pipelines so every job step is one harness action, and one prefix chain of ``N`` LCM blocks
(deterministic tokens) whose records are registered up front.  Each method forwards one action
to the cache's transition of the same name, so the semantics are the library's own; the adapter
only translates indices (block ``b`` -> the chain's record, request ``r`` -> request slot ``r``)
and reads the state back in the table's shape (:meth:`Target.observe`).

Protocol details: a refused action raises a subclass of ``ActionRefused`` and changes nothing;
actions with output parameters return the values the cache chose: ``allocate(b)`` the device
slot it took and the stored form of the writer, ``load_done(b)`` the address and stored form the
load came back in (``{"a": ..., "f": ...}`` both);
addresses are device slot numbers (block ``b`` starts at slot ``b``).  ``bugs`` plants seeded
bugs: the cache then comes from the staged copy of ``impl/`` with their edits
(:mod:`kvstate.testing.seeded`, plain Python), otherwise it is ``kvstate.impl``'s own.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kvstate.impl.cache import HeterogeneousKVCache, Request, UseContext
from kvstate.impl.errors import AlreadyReleased
from kvstate.impl.testdata import harness_tokens
from kvstate.spec.phases import CKV
from kvstate.spec.table import Scope, Table

from . import seeded
from .datacheck import verify_run

NAMESPACE = "kvstate-harness"


class Target:
    def __init__(
        self,
        table: Table,
        N: int,
        *,
        bugs: Iterable[str] = (),
        cache_dir: str | Path | None = None,
        device: str | None = None,
    ) -> None:
        k = table.consts
        self.table = table
        self.N = N
        self.R = k.R
        self.cache: HeterogeneousKVCache = seeded.cache(
            bugs=bugs,
            table=table,
            executors="manual",
            max_requests=k.R,
            device_blocks=2 * N + 8,
            host_blocks=N + 4,
            disk_blocks=N + 4,
            cache_dir=cache_dir,
            device=device,
        )
        self.view = self.cache.inspect()  # what the table's state is read from
        self._act = self.cache.test_hooks().act  # each action performed by name
        self.chain = self.cache.chain(harness_tokens(N * k.L), NAMESPACE)
        self.rids = self.cache.register(self.chain)
        # one C call gathers a column over the chain (observe() runs after every fuzz step)
        pick = operator.itemgetter(*self.rids)
        self._gather: Callable[[list[Any]], tuple[Any, ...]] = (
            pick if len(self.rids) > 1 else (lambda col: (pick(col),))
        )
        self._observe = observe_reader(table, N)
        self._reqs: list[Request | None] = [None] * self.R
        self._ctx: list[UseContext | None] = [None] * self.R
        self._slots = self.view.slots[: self.R]  # live views of the slots (their fields change)

    def close(self) -> None:
        self.cache.close()

    # ---- block actions --------------------------------------------------------------------
    def _rid(self, b: int) -> int:
        return self.rids[b]

    def allocate(self, b: int) -> dict[str, int]:
        rid = self._rid(b)
        f = int(self._act("allocate", rid))
        return {"a": int(self.view.meta.addr[rid]), "f": f}

    def commit(self, b: int) -> None:
        self._act("commit", self._rid(b))

    def discard(self, b: int) -> None:
        self._act("discard", self._rid(b))

    def seal(self, b: int) -> None:
        self._act("seal", self._rid(b))

    def slide(self, b: int) -> None:
        self._act("slide", self._rid(b))

    def index_update(self, b: int) -> None:
        self._act("index_update", self._rid(b))

    def rebuild_start(self, b: int) -> None:
        self._act("rebuild_start", self._rid(b))

    def rebuild_done(self, b: int) -> None:
        self._act("rebuild_done", self._rid(b))

    def offload(self, b: int) -> None:
        self._act("offload", self._rid(b))

    def offload_done(self, b: int) -> None:
        self._act("offload_done", self._rid(b))

    def offload_cancel(self, b: int) -> None:
        self._act("offload_cancel", self._rid(b))

    def spill(self, b: int) -> None:
        self._act("spill", self._rid(b))

    def load_start(self, b: int) -> None:
        self._act("load_start", self._rid(b))

    def load_progress(self, b: int) -> None:
        self._act("load_progress", self._rid(b))

    def load_done(self, b: int) -> dict[str, int]:
        a, f = self._act("load_done", self._rid(b))
        return {"a": int(a), "f": int(f)}

    def load_fail(self, b: int) -> None:
        self._act("load_fail", self._rid(b))

    def drop(self, b: int) -> None:
        self._act("drop", self._rid(b))

    def evict_start(self, b: int) -> None:
        self._act("evict_start", self._rid(b))

    def evict_done(self, b: int) -> None:
        self._act("evict_done", self._rid(b))

    def touch(self, b: int, t: int) -> None:
        self._act("touch", self._rid(b), t)

    def tick(self, t: int) -> None:
        self._act("tick", t)

    def capture(self) -> None:
        self._act("capture")

    def replay(self) -> None:
        self._act("replay")

    def recapture(self) -> None:
        self._act("recapture")

    # ---- request actions ------------------------------------------------------------------
    def admit(self, r: int, t: int) -> None:
        req = self._reqs[r]
        if req is None:
            req = self._reqs[r] = self.cache.request(
                self.chain.tokens, namespace=NAMESPACE, lifetime=t
            )
        self._act("admit", req, t, r)
        req.lifetime = t

    def match(self, r: int, h: int) -> None:
        self._act("match", r, h)

    def pin(self, r: int) -> None:
        self._act("pin", r)

    def validate(self, r: int) -> None:
        self._act("validate", r)

    def use(self, r: int) -> None:
        req = self._reqs[r]
        if req is None:
            use = self.cache.table.action("use")  # a request never admitted: no conjunct holds
            raise AlreadyReleased(
                "use", [c.name for c in use.guard], f"request slot {r} was never admitted"
            )
        ctx = self.cache.use(req, store=False)
        ctx.__enter__()
        self._ctx[r] = ctx

    def release(self, r: int) -> None:
        ctx = self._ctx[r]
        if ctx is not None and self.view.slots[r].request is ctx.request:
            ctx.finish()
        else:
            self._act("release", r)
        self._ctx[r] = None

    def abort(self, r: int) -> None:
        ctx = self._ctx[r]
        if ctx is not None and self.view.slots[r].request is ctx.request:
            ctx.abort()
        else:
            self._act("abort", r)
        self._ctx[r] = None

    def downgrade(self, r: int) -> None:
        self._act("downgrade", r)

    # ---- observation ----------------------------------------------------------------------
    def check_data(self) -> list[str]:
        """Byte-exact check of everything each running request reads (optional protocol hook)."""
        out: list[str] = []
        tokens = None  # the chain's tokens, made when a running request is there to check
        for r, ctx in enumerate(self._ctx):
            if (
                ctx is not None
                and ctx.run is not None
                and self.view.slots[r].request is ctx.request
            ):
                if tokens is None:
                    tokens = harness_tokens(self.N * self.table.consts.L)
                out.extend(f"request {r}: {p}" for p in verify_run(ctx.run, tokens))
        return out

    def observe(self) -> dict[str, Any]:
        view = self.view
        return self._observe(view, view.meta, self._gather, self._slots)


_READERS: dict[tuple[int, int, bool], tuple[Table, Callable[..., dict[str, Any]]]] = {}


def observe_reader(table: Table, N: int, *, pad: bool = False) -> Callable[..., dict[str, Any]]:
    """``observe()``'s body for ``table`` and ``N``, generated from its variables once: one
    dictionary display reading each shown variable where the library keeps it (a block
    column gathered over the chain, a request field of each slot, a global of the cache's
    inspection view).
    The loop it replaces tested each variable's scope at every call, and ``observe()`` runs
    before and after every refusal check (24,000 times a ``ci`` run).  Ghost truth is not
    shown: the harness tracks it.  Table names are identifiers (``spec/validate.py``).  A
    request's per-block row is shown as the slot keeps it, or ``N`` zeros when empty; with
    ``pad`` (the API harness) cut or padded with zeros to ``N`` (a request grown past the
    modelled chain by appends pins blocks the model does not have).  Called as
    ``reader(view, view.meta, gather, slots)`` (``view``: :meth:`HeterogeneousKVCache.inspect`), ``gather`` picking the chain's records and
    ``slots`` the table's ``R`` request slots (exactly ``R``: they are unpacked once, and a
    request variable is read slot by slot, not by a comprehension per variable)."""
    hit = _READERS.get((id(table), N, pad))
    if hit is not None and hit[0] is table:
        return hit[1]
    R = table.consts.R
    slots = [f"s{r}" for r in range(R)]

    def per_slot(expr: str) -> str:  # a tuple display of ``expr`` over the slots (``@``)
        return "(" + "".join(expr.replace("@", sl) + ", " for sl in slots) + ")"

    shown = {v.name for v in table.vars if not v.ghost}
    items = []
    for v in table.vars:
        name = v.name
        if v.ghost:
            continue
        if v.scope is Scope.BLOCK:
            expr = "ckv" if name == "ckv" else f"gather(m.{name})"
        elif v.scope is Scope.GLOBAL:
            if name == "nfree":
                expr = "ckv.count(FREE)"
            elif name == "graph":
                expr = "view.graph.phase"
            else:
                expr = f"view.{name}"
        elif v.scope is Scope.REQ:
            expr = per_slot(f"@.{name}")  # names are identifiers: no ``@`` in them
        elif pad:
            expr = per_slot(f"tuple(@.{name})[:N] + (0,) * (N - len(@.{name}))")
        else:
            expr = per_slot(f"(tuple(@.{name}) or zeros)")
        items.append(f"        {name!r}: {expr},\n")
    src = (
        "def observe(view, m, gather, slots):\n"
        + (f"    {', '.join(slots)}, = slots\n" if slots else "    () = slots\n")
        # the ckv column once: ``nfree`` counts it (the same list, read in the same call)
        + ("    ckv = gather(m.ckv)\n" if shown & {"ckv", "nfree"} else "")
        + "    return {\n"
        + "".join(items)
        + "    }\n"
    )
    scope: dict[str, Any] = {"FREE": CKV.FREE, "zeros": (0,) * N, "N": N}
    exec(compile(src, f"<kvstate.testing.adapter observe {table.name}>", "exec"), scope)  # noqa: S102
    fn: Callable[..., dict[str, Any]] = scope["observe"]
    if len(_READERS) >= 16:
        _READERS.clear()
    _READERS[id(table), N, pad] = (table, fn)
    return fn


def make_target(table: Table, N: int, bugs: Iterable[str] = ()) -> Target:
    """Factory for ``kvstate fuzz --target kvstate.testing.adapter:make_target``."""
    return Target(table, N, bugs=bugs)
