"""The façade's own seams against the model: guard reads, ``act``'s refusals, ``check_tail``.

Refinement sees what a call changed; it cannot see a read that changes nothing.  The cache
answers two such reads from the table's guards: ``inspect().can(action, rid)`` (the fused accept
test the pipelines ask before each step) and ``inspect().refused(action, rid)`` (the guard's
conjuncts one by one, the form that names a refusal).  A guard compiled with one conjunct
wrong, a conjunct's name attached to another's test, or a fused test that differs from its
conjuncts only shows when those answers are compared with the table's, so :class:`GuardReads`,
after every operation that changed the model's state, asks both for every block action whose
only input is its block (derived from the table's parameters) at every block of the chain, and
requires the model's answer (``Machine.failed_conjuncts``: the same conjuncts, interpreted).
It also tallies each conjunct it saw true and false (``guard A.C true/false``): the report's
``guards`` line says which conjuncts the run never saw both ways.

``refuse_facade(k)`` sends the ``k``-th case of :func:`cases`: the refusals of
``TestHooks.act`` (an unknown action; every block action without its record), of
``check_tail`` (a boundary not the record's end, the null record, a bool) and of
``CacheView.can``/``refused`` (an unknown action, a record out of range), each with its
documented error and nothing changed (the harness's refusal check); and the answers that must
agree (a NumPy record id read like an int; ``check_tail`` at a stored block's own end is True:
the test writer's tails splice, and a False would mark the block corrupt).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.spec.phases import CKV
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import ParamKind, Scope
from kvstate.targets.api.args import _SKIP, SAME, _hit_run, run_case
from kvstate.targets.api.base import CallCheck, chain, op
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]

_OUTPUTS = (ParamKind.ADDR, ParamKind.FMT)


def block_only(table: Any) -> list[Any]:
    """The table's actions whose one input is a block (what ``can``/``refused`` answer for)."""
    return [
        a
        for a in table.actions
        if [p.kind for p in a.params if p.kind not in _OUTPUTS] == [ParamKind.BLOCK]
    ]


def _outs(a: Any) -> dict[str, int]:
    return {p.name: 0 for p in a.params if p.kind in _OUTPUTS}


class GuardReads(CallCheck):
    """``can`` and ``refused`` of every block-only action at every chain block, against the
    model's conjuncts, after each operation that changed the model's state."""

    def __init__(self) -> None:
        self.last: Any = None

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.threads or end is None or (self.last is not None and end.values == self.last):
            return
        self.last = end.values
        m, view = h.machine, h.view
        bad = []
        with view.lock:
            for a in block_only(h.table):
                names = [c.name for c in a.guard]
                for b in range(h.N):
                    rid = h.rids[b]
                    want = list(m.failed_conjuncts(end, a, {"b": b, **_outs(a)}))
                    can = view.can(a.name, rid)
                    # (an accept both agree on has no conjuncts to name: one read, not two)
                    got = [] if can and not want else list(view.refused(a.name, rid))
                    if got != want or can != (not want):
                        bad.append(f"{a.name}(b={b}): can {can}, refused {got}; table: {want}")
                    for c in names:
                        h.cov.add(f"guard {a.name}.{c} {'false' if c in want else 'true'}")
        if bad:
            raise h.fail("guard-read", [o.name], f"after {o.render()}: " + "; ".join(bad[:4]))
        h.cov.add("check: guard reads against the model's conjuncts")


class InspectionReads(CallCheck):
    """The inspection view's other reads, after each operation that changed the model's state:
    the chain's records as the view resolves and indexes them, the table's state through
    ``chain_view`` (what the guards and hit rules read) against the model's, tombstones only on
    blocks the model has FREE, the configuration as the cache was built, a rule epoch that never
    goes back; and, once per cache, the view's read-only contract (no attribute set, no
    mutating method, columns read as tuples)."""

    def __init__(self) -> None:
        self.last: Any = None
        self.cache: Any = None
        self.epoch = 0
        self.before_epoch: tuple[Any, int] | None = None

    def before(self, h: Any, o: Any) -> None:
        self.before_epoch = None if h.threads else (h.cache, h.view.epoch)

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.threads or end is None or (self.last is not None and end.values == self.last):
            return
        self.last = end.values
        view, bad = h.view, []
        if self.cache is not h.cache:
            self.cache, self.epoch = h.cache, 0
            bad += _contract(h)
        with view.lock:
            rids = list(h.rids)
            if list(view.resolve(h.chain)) != rids:
                bad.append(f"resolve(chain) {view.resolve(h.chain)}, registered {rids}")
            index = view.index
            for b, key in enumerate(h.chain.keys):
                if index.get(key) != rids[b]:
                    bad.append(f"index[key of block {b}] {index.get(key)}, record {rids[b]}")
            cv = view.chain_view(rids)
            for v in h.table.vars:
                if v.scope is Scope.BLOCK and not v.ghost:
                    got = [getattr(cv, v.name)[b] for b in range(h.N)]
                    want = list(end.values[v.name][: h.N])
                    if got != want:
                        bad.append(f"chain_view.{v.name} {got}, the model's {want}")
            free = [b for b in range(h.N) if end.values["ckv"][b] == CKV.FREE]
            for rid in view.tombstones:
                if rid in rids and rids.index(rid) not in free:
                    bad.append(f"block {rids.index(rid)} is a tombstone but not FREE")
            if view.epoch < self.epoch:
                bad.append(f"the rule epoch went back from {self.epoch} to {view.epoch}")
            self.epoch = view.epoch
            # the rule epoch moves with every action whose frame meets what the hit rules read
            # (a search made before it is no longer a proof of the rules)
            reads, was = view.rule_reads, self.before_epoch
            moving = [
                n for n, _ in steps if reads is not None and h.table.action(n).modifies & reads
            ]
            if moving and was is not None and was[0] is h.cache and view.epoch <= was[1]:
                bad.append(f"{moving} wrote what the hit rules read; the rule epoch stayed")
            kw = h.open_kwargs()
            if (view.device_blocks, view.host_blocks) != (kw["device_blocks"], kw["host_blocks"]):
                bad.append("device_blocks/host_blocks differ from the constructor's")
            if view.table is not h.table or view.consts != h.table.consts:
                bad.append("the view's table or consts are not the cache's")
            if view.geometry != h.table.geometry:
                bad.append("the view's geometry is not the table's")
        if bad:
            raise h.fail("inspection", [o.name], f"after {o.render()}: " + "; ".join(bad[:4]))
        h.cov.add("check: inspection reads against the model")


def _contract(h: Any) -> list[str]:
    """The view's read-only contract (docs/library.md): what it must refuse."""
    view, bad = h.view, []
    meta, slot0 = view.meta, view.slots[0]
    for what, fn in (
        ("view.meta.ckv = ...", lambda: setattr(meta, "ckv", [])),
        ("view.meta.new (a method)", lambda: meta.new),
        ("view.slots[0].x = ...", lambda: setattr(slot0, "phase", 0)),
        ("view.tiers.slots.take (a mutating method)", lambda: view.tiers.slots.take),
        ("view.disk.delete (a mutating method)", lambda: view.disk.delete),
    ):
        try:
            fn()
        except AttributeError:
            continue
        bad.append(f"{what} was allowed on a read-only view")
    col = meta.ckv
    if len(col) != len(list(col)) or not repr(col).startswith("Column("):
        bad.append("a metadata column's length, iteration or repr disagree")
    if any(type(meta.swa_pages[i]) is list for i in range(len(meta.swa_pages))):
        bad.append("a list-valued column read as a list (a tuple is the read-only form)")
    groups = view.tiers.groups
    if [g.name for g in groups] != [getattr(view.tiers, g.name).name for g in groups]:
        bad.append("tiers.groups and the groups by name disagree")
    return bad


def guard_line(counts: Any) -> str:
    """The report's line: the conjuncts :class:`GuardReads` compared, and those it never saw
    both true and false ("" when it compared none)."""
    seen: dict[str, set[str]] = {}
    for k, v in counts.items():
        if k.startswith("guard ") and v:
            name, value = k[6:].rsplit(" ", 1)
            seen.setdefault(name, set()).add(value)
    if not seen:
        return ""
    never_f = sorted(n for n, vs in seen.items() if "false" not in vs)
    never_t = sorted(n for n, vs in seen.items() if "true" not in vs)
    both = sum(1 for vs in seen.values() if len(vs) == 2)
    return (
        f"  guards: {both} of {len(seen)} conjuncts of the block actions' guards seen true and "
        f"false (never false: {', '.join(never_f) or 'none'}; never true: "
        f"{', '.join(never_t) or 'none'})"
    )


# ---- refusals and answers of the façade's seams -----------------------------------------------


def _closed_hooks(h: Any) -> Any:
    """A closed cache's hooks and view (every seam refuses with CacheClosed)."""
    import os
    import tempfile

    from kvstate.impl.cache import HeterogeneousKVCache

    d = tempfile.mkdtemp(prefix="kvstate-closed-")
    try:
        c = HeterogeneousKVCache(table=h.table, cache_dir=d, executors="manual")
        c.close()
        return c
    finally:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)


def _every_block_action_bare(h: Any) -> Any:
    """``act(a)`` without its record, for every block action: InvalidArgument each time."""
    from kvstate.impl.errors import InvalidArgument

    names = [a.name for a in h.table.actions if any(p.kind is ParamKind.BLOCK for p in a.params)]
    last: BaseException | None = None
    for name in names:
        try:
            h.hooks.act(name)
        except InvalidArgument as exc:
            last = exc
            continue
        raise h.fail("bad-input", [name], f"act({name!r}) without a record was performed")
    if last is None:
        return _SKIP
    raise last


def _stored_tail(h: Any) -> Any:
    """``check_tail`` at the end of a live run's hit (the hit rule required its tail there):
    True, and nothing marked."""
    run = _hit_run(h)
    if run is None:
        return _SKIP
    end = run.hit_tokens
    b = end // h.L - 1
    if b in h.tail_damaged:
        return _SKIP
    return (h.hooks.check_tail(run.rids[b], end), True)


def _offdevice_tail(h: Any) -> Any:
    """``check_tail`` of a block the model holds only on host (no device pages to decode):
    False, and the record not marked corrupt (nothing was read)."""
    ckv = h.model.values["ckv"]
    away = [b for b in range(h.N) if ckv[b] == CKV.HOST]
    if not away:
        return _SKIP
    b = away[0]
    rid = int(h.rids[b])
    before = bool(h.view.meta.corrupt[rid])
    got = h.hooks.check_tail(rid, (b + 1) * h.L)
    return ((got, bool(h.view.meta.corrupt[rid])), (False, before))


def _rid(h: Any) -> int:
    return int(h.rids[0])


def _last(h: Any) -> Any:
    return block_only(h.table)[0].name


def _fresh(call: Callable[[Any], Any], **kw: Any) -> Callable[[Any], Any]:
    """``call(cache, tokens)`` on a new test-writer cache over a new directory (``kw``: more
    constructor arguments)."""

    def run(h: Any) -> Any:
        import os
        import tempfile

        from kvstate.impl.cache import HeterogeneousKVCache
        from kvstate.impl.testdata import DeterministicWriter

        d = tempfile.mkdtemp(prefix="kvstate-facade-")
        try:
            with HeterogeneousKVCache(
                **{
                    "table": h.table,
                    "cache_dir": d,
                    "executors": "manual",
                    "writer": DeterministicWriter(),
                    **kw,
                }
            ) as c:
                return call(c, h.tokens[: 2 * h.L + 1])
        finally:
            for name in os.listdir(d):
                os.unlink(os.path.join(d, name))
            os.rmdir(d)

    return run


def _admitted_twice(c: Any, toks: Any) -> Any:
    req = c.request(toks)
    c.admit(req)
    try:
        c.admit(req)
    finally:
        c.abort(req)


def _stale(c: Any, toks: Any) -> Any:
    """``use`` of an Admission from before the request was admitted again."""
    req = c.request(toks)
    old = c.admit(req)
    c.abort(req)
    c.admit(req)
    try:
        c.use(old)
    finally:
        c.abort(req)


def _use_admission(c: Any, toks: Any) -> Any:
    """``use(admission)`` is ``use(request)``: the run names the request, and a request used
    through its Admission stores what a request used by itself does."""
    req = c.request(toks)
    with c.use(c.admit(req)) as run:
        named = run.request is req
    again = c.request(toks)
    with c.use(c.admit(again)) as run2:
        hit = run2.hit_tokens
    return (named, hit), (True, (len(toks) - 1) // c.L * c.L)


def _stores_and_hits(c: Any, toks: Any) -> Any:
    """A chain stored and hit again: what any constructor's forms must still do."""
    with c.use(c.admit(c.request(toks))):
        pass
    with c.use(c.admit(c.request(toks))) as run:
        return run.hit_tokens, (len(toks) - 1) // c.L * c.L


def _after(c: Any, toks: Any) -> tuple[Any, ...]:
    """What a request of ``toks`` finds next: its hit (then released), and the pinned count."""
    again = c.admit(c.request(toks))
    hit = again.hit_tokens
    c.abort(again.request)
    return hit, c.stats()["pinned_blocks"]


def _block_raises(c: Any, toks: Any) -> Any:
    """An exception leaving the ``use`` block aborts the request: nothing stored or pinned."""
    req = c.request(toks)
    try:
        with c.use(c.admit(req)):
            raise KeyError("the engine's forward pass failed")
    except KeyError:
        pass
    return (req.slot is None, *_after(c, toks)), (True, 0, 0)


def _ends_inside(finish: bool) -> Callable[[Any, Any], Any]:
    """``UseContext.finish``/``abort`` inside the block: the block's end then does nothing
    more; a finish stores the request's blocks, an abort nothing."""

    def call(c: Any, toks: Any) -> Any:
        req = c.request(toks)
        ctx = c.use(c.admit(req))
        with ctx:
            ctx.finish() if finish else ctx.abort()
        want = (len(toks) - 1) // c.L * c.L if finish else 0
        return (req.slot is None, *_after(c, toks)), (True, want, 0)

    return call


def _enter_released(c: Any, toks: Any) -> Any:
    """A ``use`` context entered after its request was aborted: AlreadyReleased."""
    req = c.request(toks)
    ctx = c.use(c.admit(req))
    c.abort(req)
    with ctx:
        pass


def _enter_closed(c: Any, toks: Any) -> Any:
    """A ``use`` context entered after the cache was closed: CacheClosed."""
    ctx = c.use(c.admit(c.request(toks)))
    c.close()
    with ctx:
        pass


def _torch_cpu() -> Any:
    import torch

    return torch.device("cpu")


CASES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    (
        "HeterogeneousKVCache(device=torch.device, kernel_backend, NumPy flags, bytearray key)",
        SAME,
        lambda h: _fresh(
            _stores_and_hits,
            device=_torch_cpu(),
            kernel_backend="torch",
            derive_index=np.True_,
            durable=np.False_,
            disk_key=bytearray(range(32)),
        )(h),
    ),
    ("HeterogeneousKVCache(remote=5)", "InvalidArgument", _fresh(_stores_and_hits, remote=5)),
    (
        "max_hit of a one-token request: every token but the last, none",
        SAME,
        _fresh(lambda c, toks: (c.max_hit(c.request(toks[:1])), 0)),
    ),
    ("an exception leaving the use block", SAME, _fresh(_block_raises)),
    ("UseContext.finish inside the block", SAME, _fresh(_ends_inside(True))),
    ("UseContext.abort inside the block", SAME, _fresh(_ends_inside(False))),
    ("a use context entered after its request aborted", "AlreadyReleased", _fresh(_enter_released)),
    ("a use context entered on a closed cache", "CacheClosed", _fresh(_enter_closed)),
    (
        "HeterogeneousKVCache(kernel_backend=5)",
        "InvalidArgument",
        _fresh(_stores_and_hits, kernel_backend=5),
    ),
    ("admit(an admitted request)", "Refused", _fresh(_admitted_twice)),
    ("use(an Admission admitted again since)", "StaleAdmission", _fresh(_stale)),
    ("use(admission) against use(request)", SAME, _fresh(_use_admission)),
    ("act('no such action')", "InvalidArgument", lambda h: h.hooks.act("no such action")),
    ("act(5)", "InvalidArgument", lambda h: h.hooks.act(5)),
    ("act(every block action) without a record", "InvalidArgument", _every_block_action_bare),
    (
        "act(a block action, the null record)",
        "InvalidArgument",
        lambda h: h.hooks.act(_last(h), 0),
    ),
    (
        "act(a block action, a bool record)",
        "InvalidArgument",
        lambda h: h.hooks.act(_last(h), True),
    ),
    (
        "check_tail(boundary inside the block)",
        "InvalidArgument",
        lambda h: h.hooks.check_tail(_rid(h), h.L // 2),
    ),
    (
        "check_tail(the next block's end)",
        "InvalidArgument",
        lambda h: h.hooks.check_tail(_rid(h), 2 * h.L),
    ),
    ("check_tail(the null record)", "InvalidArgument", lambda h: h.hooks.check_tail(0, h.L)),
    ("check_tail(boundary=True)", "InvalidArgument", lambda h: h.hooks.check_tail(_rid(h), True)),
    ("check_tail(a stored block's own end)", SAME, _stored_tail),
    ("check_tail(a block only on host)", SAME, _offdevice_tail),
    ("can('no such action')", "InvalidArgument", lambda h: h.view.can("no such action", 1)),
    ("can(a record out of range)", "InvalidArgument", lambda h: h.view.can(_last(h), 1 << 40)),
    ("can(a bool record)", "InvalidArgument", lambda h: h.view.can(_last(h), True)),
    ("refused(5, record)", "InvalidArgument", lambda h: h.view.refused(5, _rid(h))),
    (
        "can/refused(np.int64 record) against (int)",
        SAME,
        lambda h: (
            [
                (h.view.can(a.name, np.int64(r)), h.view.refused(a.name, np.int64(r)))
                for a in block_only(h.table)
                for r in h.rids
            ],
            [
                (h.view.can(a.name, r), h.view.refused(a.name, r))
                for a in block_only(h.table)
                for r in h.rids
            ],
        ),
    ),
    (
        "act() on a closed cache",
        "CacheClosed",
        lambda h: _closed_hooks(h).test_hooks().act("tick", 1),
    ),
    (
        "can() on a closed cache",
        "CacheClosed",
        lambda h: _closed_hooks(h).inspect().can(_last(h), 1),
    ),
)


def do_refuse_facade(h: Any, o: Any) -> int | None:
    what, want, call = CASES[o.arg("k") % len(CASES)]
    return run_case(h, what, want, call)


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: every case of :data:`CASES` on an empty cache, beside a stored chain a request
    holds a hit of, and once the chain is on host (the cases of a block off the device)."""
    c = chain(N, L, lease_max)
    full, store = c.full, c.finished
    hit = [op("request", i=1, n=full, life=lease_max), op("admit", i=1), op("use", i=1)]
    every = [op("refuse_facade", k=k) for k in range(len(CASES))]
    # hits that end exactly at a block boundary: one block (the block right after it not
    # cached, or only partly requested), and every block of the chain
    edges = [
        x
        for n in (L + 1, 2 * L, 2 * L + 1, full)
        for x in (
            op("request", i=1, n=n, life=1),
            op("admit", i=1),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
        )
    ]
    return {
        "the façade's seams refused and answered": [
            *every,
            *store,
            *hit,
            *every,
            op("finish", i=1),
            op("tick", t=lease_max),
            op("offload", n=N),
            op("drain"),
            *every,
        ],
        "hits that end at each block boundary": [*store, *edges],
    }


DECLS = (
    OpDecl(
        "refuse_facade",
        do_refuse_facade,
        "read",
        lambda s: {"k": st.integers(0, 31)},
        rule=False,  # scripted (walks): the ci walk's rules stay as they were
    ),
)
