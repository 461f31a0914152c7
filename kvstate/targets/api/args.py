"""Every public entry point's documented refusals, and the argument forms it must accept alike.

:mod:`kvstate.targets.api.inputs` sends one bad value per entry point and requires ``InvalidArgument``.
The README's contract is wider: each entry point refuses a wrong type, a NumPy bool, a value out
of range, a released or foreign handle and a closed cache with its *own* documented error
(``InvalidArgument``, ``UnknownRequest``, ``AlreadyReleased``, ``Refused``, ``CacheClosed``,
``LayoutError``), in both builds, and changes nothing.  A check that lets a bad value through is
invisible to refinement when the value means something (a NaN timeout waits forever, a
``max_requests`` of a NumPy 0 builds a cache that admits nothing), so ``refuse_arg(k)`` sends the
``k``-th case of :data:`CASES` and requires exactly the documented error; the harness then checks,
as for every refusal, that nothing changed and no event was emitted.

The other half: a NumPy integer is an int and a torch tensor or a list is a prompt (args.py,
hashing.py).  A case whose error is ``"same"`` answers a pair (the call with the other form, the
call with the plain form) and the two must be equal: a conversion that loses a value, or a
memoized answer kept under the wrong key, is seen only by comparing the answers.  The ``*_np``
maintenance operations (:data:`DECLS`) pass NumPy integers to ``tick``/``evict``/... and are
explained by the model like the plain ones.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.inputs import _cache

Step = tuple[str, dict[str, int]]

NAN = float("nan")
_SKIP = object()
SAME = "same"


def _live(h: Any) -> Any:
    """A request the harness holds (in use, if one is); None when there is none."""
    lives = [lv for lv in h.live if lv is not None]
    return next((lv for lv in lives if lv.run is not None), lives[0] if lives else None)


def _hit_run(h: Any) -> Any:
    """A live Run with a hit of at least one block (None when none is)."""
    return next(
        (
            lv.run
            for lv in h.live
            if lv is not None and lv.run is not None and lv.run.live and lv.run.hit_tokens >= h.L
        ),
        None,
    )


def _done(h: Any) -> Any:
    """A request whose pins were released (finished or aborted)."""
    return next((lv.req for lv in h.done if lv is not None and lv.req.slot is None), None)


def _with(get: Callable[[Any], Any], call: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    def run(h: Any) -> Any:
        x = get(h)
        return _SKIP if x is None else call(h, x)

    return run


def _req(call: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    return _with(lambda h: (lambda lv: None if lv is None else lv.req)(_live(h)), call)


def _closed(call: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``call`` on a cache built like the harness's and closed (twice: a no-op)."""

    def run(h: Any) -> Any:
        from kvstate.impl.cache import HeterogeneousKVCache

        d = tempfile.mkdtemp(prefix="kvstate-closed-")
        try:
            c = HeterogeneousKVCache(table=h.table, cache_dir=d, executors="manual")
            req = c.request(np.arange(h.L + 1))
            c.close()
            c.close()
            return call((c, req))
        finally:
            for name in os.listdir(d):
                os.unlink(os.path.join(d, name))
            os.rmdir(d)

    return run


def _other_cache(call: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
    """``call(h, req)`` with ``req`` a live request of another open cache (built like the
    harness's): a cache refuses another's request as unknown, whatever its fields say."""

    def run(h: Any) -> Any:
        from kvstate.impl.cache import HeterogeneousKVCache

        d = tempfile.mkdtemp(prefix="kvstate-other-")
        try:
            with HeterogeneousKVCache(table=h.table, cache_dir=d, executors="manual") as c:
                return call(h, c.request(np.array(h.tokens[: h.L + 1])))
        finally:
            for name in os.listdir(d):
                os.unlink(os.path.join(d, name))
            os.rmdir(d)

    return run


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _max_timeout() -> int:
    """The longest timeout the library documents (``args.MAX_TIMEOUT``), as an int."""
    from kvstate.impl.args import MAX_TIMEOUT

    return int(MAX_TIMEOUT)


def _foreign_request(h: Any) -> Any:
    """A request this cache forgot: every call taking a request must refuse it as unknown."""
    r = h.cache.request(np.arange(3))
    h.cache.forget(r)
    return r


def _chains(h: Any) -> Any:
    import torch

    t = list(h.tokens[: 2 * h.L + 1])
    a = h.cache.chain(np.array(t, dtype=np.int32), namespace="np")
    b = h.cache.chain(torch.tensor(t), namespace="np")
    c = h.cache.chain(t, namespace="np")
    return ([a.keys, b.keys], [c.keys, c.keys])


def _window(h: Any, run: Any) -> Any:
    import torch

    return (
        bool(torch.equal(run.read_window(np.int64(0)), run.read_window(0))),
        True,
    )


def _pins(h: Any, run: Any) -> Any:
    """A validated admission's pins (``state_data_ptrs``) are its run's blocks: block ``b``'s
    pin names the run's ``b``-th record and the slot its block table reads."""
    pins = run.request.admission.pins
    return (
        [(p.block, p.rid, p.slot) for p in pins],
        [(b, r, s) for b, (r, s) in enumerate(zip(run.rids, run.block_table(), strict=True))],
    )


def _explanation(h: Any, run: Any) -> Any:
    adm = run.request.admission
    e = adm.explanation
    return (
        (str(e), e.lines()[0], e.requested, adm.hit_tokens <= e.requested),
        (
            "\n".join(e.lines()),
            f"requested {e.requested} tokens",
            h.cache.max_hit(run.request),
            True,
        ),
    )


def _closed_with(h: Any) -> Any:
    """A cache used as a context manager is closed at the block's end: then every call refuses."""
    from kvstate.impl.cache import HeterogeneousKVCache

    d = tempfile.mkdtemp(prefix="kvstate-closed-")
    try:
        with HeterogeneousKVCache(table=h.table, cache_dir=d, executors="manual") as c:
            pass
        return c.evict(1)
    finally:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)


# (what is sent, the documented error's class name or SAME, the call)
CASES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    # the constructor: checked before anything is built (the directory left as found)
    ("HeterogeneousKVCache(geometry='small')", "InvalidArgument", _cache(geometry="small")),
    ("HeterogeneousKVCache(table=1)", "InvalidArgument", _cache(table=1)),
    ("HeterogeneousKVCache(cache_dir=3)", "InvalidArgument", _cache(cache_dir=3)),
    ("HeterogeneousKVCache(device='cuda:99')", "InvalidArgument", _cache(device="cuda:99")),
    (
        "HeterogeneousKVCache(device='cuda') without CUDA",
        "InvalidArgument",
        lambda h: _SKIP if _has_cuda() else _cache(device="cuda")(h),
    ),
    ("HeterogeneousKVCache(device='meta')", "InvalidArgument", _cache(device="meta")),
    ("HeterogeneousKVCache(device='no device')", "InvalidArgument", _cache(device="no device")),
    ("HeterogeneousKVCache(writer=5)", "InvalidArgument", _cache(writer=5)),
    ("HeterogeneousKVCache(disk_key='key')", "InvalidArgument", _cache(disk_key="key")),
    ("HeterogeneousKVCache(max_model_len=0)", "InvalidArgument", _cache(max_model_len=0)),
    (
        "HeterogeneousKVCache(max_requests=np.int64(0))",
        "InvalidArgument",
        _cache(max_requests=np.int64(0)),
    ),
    (
        "HeterogeneousKVCache(device_blocks=2**31)",
        "InvalidArgument",
        _cache(device_blocks=1 << 31),
    ),
    (
        "HeterogeneousKVCache(host_blocks=np.True_)",
        "InvalidArgument",
        _cache(host_blocks=np.True_),
    ),
    ("HeterogeneousKVCache(executors=None)", "InvalidArgument", _cache(executors=None)),
    (
        "HeterogeneousKVCache(derive_index=np.int64(1))",
        "InvalidArgument",
        _cache(derive_index=np.int64(1)),
    ),
    ("HeterogeneousKVCache(memory_limit=1)", "LayoutError", _cache(memory_limit=1)),
    # a request's calls: bad flags and timeouts, refused before anything is looked at
    ("use(timeout=nan)", "InvalidArgument", _req(lambda h, r: h.cache.use(r, timeout=NAN))),
    ("use(timeout=-1.0)", "InvalidArgument", _req(lambda h, r: h.cache.use(r, timeout=-1.0))),
    ("use(timeout=True)", "InvalidArgument", _req(lambda h, r: h.cache.use(r, timeout=True))),
    ("use(timeout='1')", "InvalidArgument", _req(lambda h, r: h.cache.use(r, timeout="1"))),
    ("use(timeout=1e12)", "InvalidArgument", _req(lambda h, r: h.cache.use(r, timeout=1e12))),
    (
        "use(timeout=np.float32(-2))",
        "InvalidArgument",
        _req(lambda h, r: h.cache.use(r, timeout=np.float32(-2))),
    ),
    ("use(store=1)", "InvalidArgument", _req(lambda h, r: h.cache.use(r, store=1))),
    ("use(a str)", "InvalidArgument", lambda h: h.cache.use("request")),
    (
        "Admission.wait(timeout=-0.5)",
        "InvalidArgument",
        _with(
            lambda h: (lambda lv: None if lv is None else lv.req.admission)(_live(h)),
            lambda h, a: a.wait(timeout=-0.5),
        ),
    ),
    ("finish(store=None)", "InvalidArgument", _req(lambda h, r: h.cache.finish(r, store=None))),
    ("admit(recover=1)", "InvalidArgument", _req(lambda h, r: h.cache.admit(r, recover=1))),
    ("max_hit('x')", "InvalidArgument", lambda h: h.cache.max_hit("x")),
    ("register(5)", "InvalidArgument", lambda h: h.cache.register(5)),
    ("chain(namespace=5)", "InvalidArgument", lambda h: h.cache.chain([1, 2], namespace=5)),
    ("events_of(None)", "InvalidArgument", lambda h: h.cache.events_of(None)),
    ("append(negative token)", "InvalidArgument", _req(lambda h, r: h.cache.append(r, [1, -1]))),
    ("forget(a str)", "InvalidArgument", lambda h: h.cache.forget("request")),
    (
        "request(float tensor)",
        "InvalidArgument",
        lambda h: h.cache.request(__import__("torch").zeros(3)),
    ),
    (
        "request(2-D tensor)",
        "InvalidArgument",
        lambda h: h.cache.request(
            __import__("torch").zeros((2, 2), dtype=__import__("torch").long)
        ),
    ),
    ("request(a str)", "InvalidArgument", lambda h: h.cache.request("1 2 3")),
    ("tick(np.int64(0))", "InvalidArgument", lambda h: h.cache.tick(np.int64(0))),
    ("evict(np.int8(-1))", "InvalidArgument", lambda h: h.cache.evict(np.int8(-1))),
    ("drop(np.float64(1))", "InvalidArgument", lambda h: h.cache.drop(np.float64(1))),
    ("offload(np.True_)", "InvalidArgument", lambda h: h.cache.offload(np.True_)),
    ("tick(2**70)", "InvalidArgument", lambda h: h.cache.tick(1 << 70)),
    # released, foreign and unknown handles
    ("finish(a released request)", "AlreadyReleased", _with(_done, lambda h, r: h.cache.finish(r))),
    ("abort(a released request)", "AlreadyReleased", _with(_done, lambda h, r: h.cache.abort(r))),
    ("forget(a request in a slot)", "Refused", _req(lambda h, r: h.cache.forget(r))),
    ("get_request(2**40)", "UnknownRequest", lambda h: h.cache.get_request(1 << 40)),
    ("get_request(-1)", "UnknownRequest", lambda h: h.cache.get_request(-1)),
    ("admit(a forgotten request)", "UnknownRequest", lambda h: h.cache.admit(_foreign_request(h))),
    ("use(a forgotten request)", "UnknownRequest", lambda h: h.cache.use(_foreign_request(h))),
    (
        "admit(another cache's request)",
        "UnknownRequest",
        _other_cache(lambda h, r: h.cache.admit(r)),
    ),
    (
        "abort(another cache's request)",
        "UnknownRequest",
        _other_cache(lambda h, r: h.cache.abort(r)),
    ),
    (
        "forget(another cache's request)",
        "UnknownRequest",
        _other_cache(lambda h, r: h.cache.forget(r)),
    ),
    # a Run's readers: a layer out of range, a boundary inside a block
    (
        "Run.prefix(half a block)",
        "InvalidArgument",
        _with(_hit_run, lambda h, run: run.prefix(h.L // 2)),
    ),
    (
        "Run.prefix(past the hit)",
        "InvalidArgument",
        _with(_hit_run, lambda h, run: run.prefix(run.hit_tokens + h.L)),
    ),
    (
        "Run.read_compressed('csa', 2**20)",
        "InvalidArgument",
        _with(_hit_run, lambda h, run: run.read_compressed("csa", 1 << 20)),
    ),
    (
        "Run.read_window(np.int64(2**20))",
        "InvalidArgument",
        _with(_hit_run, lambda h, run: run.read_window(np.int64(1 << 20))),
    ),
    ("Run.read_tail('0')", "InvalidArgument", _with(_hit_run, lambda h, run: run.read_tail("0"))),
    # a closed cache refuses every call
    ("tick() on a closed cache", "CacheClosed", _closed(lambda cr: cr[0].tick(1))),
    ("admit() on a closed cache", "CacheClosed", _closed(lambda cr: cr[0].admit(cr[1]))),
    ("evict() after a with block", "CacheClosed", _closed_with),
    ("stats() on a closed cache", "CacheClosed", _closed(lambda cr: cr[0].stats())),
    # the same answer for another form of the same argument
    ("chain(NumPy int32, torch, list tokens)", SAME, _chains),
    (
        "get_request(np.int64(id))",
        SAME,
        _req(lambda h, r: (h.cache.get_request(np.int64(r.id)), r)),
    ),
    (
        "Run.prefix(np.int64(L)) against prefix(L)",
        SAME,
        _with(
            _hit_run,
            lambda h, run: (run.prefix(np.int64(h.L)).block_table(), run.block_table()[:1]),
        ),
    ),
    (
        "Run.prefix(hit) against the run",
        SAME,
        _with(
            _hit_run,
            lambda h, run: (
                (run.prefix(run.hit_tokens).block_table(), run.prefix(run.hit_tokens).blocks),
                (run.block_table(), run.blocks),
            ),
        ),
    ),
    ("Run.read_window(np.int64(0)) against (0)", SAME, _with(_hit_run, _window)),
    (
        "use(timeout=the documented limit, an int) names the request",
        SAME,
        _req(lambda h, r: (h.cache.use(r, timeout=_max_timeout()).request, r)),
    ),
    (
        "use(timeout=np.int64(5)) names the request",
        SAME,
        _req(lambda h, r: (h.cache.use(r, timeout=np.int64(5)).request, r)),
    ),
    (
        "Admission.wait(np.float64(1)) of a validated admission",
        SAME,
        _with(
            lambda h: next(
                (
                    lv.req.admission
                    for lv in h.live
                    if lv is not None
                    and lv.req.admission is not None
                    and lv.req.admission.state != "pending"
                ),
                None,
            ),
            lambda h, a: (a.wait(np.float64(1)), a),
        ),
    ),
    ("Admission.pins against the Run's block table", SAME, _with(_hit_run, _pins)),
    ("Admission.explanation read as lines", SAME, _with(_hit_run, _explanation)),
    (
        "requests() holds every request the harness holds",
        SAME,
        lambda h: (
            {r.id for r in h.cache.requests()} >= {lv.req.id for lv in h.live if lv is not None},
            True,
        ),
    ),
    (
        "max_hit(request) against its tokens",
        SAME,
        _req(lambda h, r: (h.cache.max_hit(r), max(len(r.tokens) - 1, 0))),
    ),
    # the disk tier's own refusal: an empty name is no directory (not the current one)
    ("HeterogeneousKVCache(cache_dir='')", "InvalidArgument", _cache(cache_dir="")),
)


def do_refuse_arg(h: Any, o: Any) -> int | None:
    return run_case(h, *CASES[o.arg("k") % len(CASES)])


def run_case(h: Any, what: str, want: str, call: Callable[[Any], Any]) -> int | None:
    """One case: ``call(h)`` must raise exactly ``want`` (a ``KVStateError``'s class name), or
    answer a pair of equal values (``SAME``), or be skipped (``_SKIP``)."""
    from kvstate.impl import errors

    h.bad_input_left = []
    h.call_override = "read"
    try:
        got = call(h)
    except errors.KVStateError as exc:
        name = type(exc).__name__
        if want == SAME or name != want:
            raise h.fail(
                "bad-input",
                [what],
                f"{what} raised {name}: {exc} (the contract: "
                f"{'the same answer as the plain form' if want == SAME else want})",
            ) from exc
        if h.bad_input_left:
            raise h.fail(
                "bad-input",
                [what],
                f"{what} raised {name} but left files behind: {h.bad_input_left}",
            ) from None
        h.cov.add("check: documented refusals of each entry point")
        raise
    except Exception as exc:  # noqa: BLE001 - any other error breaks the contract
        raise h.fail(
            "bad-input",
            [what],
            f"{what} raised {type(exc).__name__}: {exc} (the contract: {want})",
        ) from exc
    if got is _SKIP:
        return None
    if want != SAME:
        raise h.fail(
            "bad-input",
            [what],
            f"{what} was accepted (returned {got!r}): it must raise {want}",
        )
    a, b = got
    if not (a is b or a == b):
        raise h.fail("bad-input", [what], f"{what}: {a!r} differs from {b!r}")
    h.cov.add("check: argument forms answered alike")
    return None


def _np_tick(h: Any, o: Any) -> int | None:
    h.cache.tick(np.int64(o.arg("t")))
    return None


def _default_tick(h: Any, o: Any) -> int | None:
    h.cache.tick()  # the documented default: one tick (the op's ``t`` is 1)
    return None


def _np_maint(name: str) -> Callable[[Any, Any], int | None]:
    def do(h: Any, o: Any) -> int | None:
        h.maint_done = (name, o.arg("n"), getattr(h.cache, name)(np.int32(o.arg("n"))))
        return None

    return do


def _default_maint(name: str) -> Callable[[Any, Any], int | None]:
    def do(h: Any, o: Any) -> int | None:
        h.maint_done = (name, 1, getattr(h.cache, name)())  # the documented default: n=1
        return None

    return do


# the operations of this module, each declared once (kvstate/targets/api/declare.py): the
# refused arguments, and the NumPy-integer and default forms of tick and the maintenance calls,
# each explained by the call it is a form of
_MAINT = ("evict", "offload", "spill", "drop")
DECLS: tuple[OpDecl, ...] = (
    # refused, or a read answered alike
    OpDecl("refuse_arg", do_refuse_arg, "read", lambda s: {"k": st.integers(0, 127)}),
    OpDecl("tick_np", _np_tick, "tick", lambda s: {"t": st.integers(1, s.lease_max)}),
    OpDecl("tick_default", _default_tick, "tick", lambda s: {"t": st.just(1)}),
    *(OpDecl(f"{m}_np", _np_maint(m), m, lambda s: {"n": st.integers(1, s.N)}) for m in _MAINT),
    *(OpDecl(f"{m}_default", _default_maint(m), m) for m in _MAINT),
)
# the table actions that take one block for each maintenance call (what its count counts)
_TAKES = {"evict": "evict_start", "offload": "offload", "spill": "spill", "drop": "drop"}


class MaintCount(CallCheck):
    """``evict(n)``/``offload``/``spill``/``drop`` return how many blocks they took, at most
    ``n``: never fewer than the chain's blocks the call's explanation took (foreign blocks,
    outside the model, may add to it), never more than ``n``; an eviction that took fewer than
    ``n`` left no chain block the table would let it evict (``evict`` stops only when none is
    left; the others may also stop for want of room in the next tier, which foreign blocks
    outside the model share)."""

    def before(self, h: Any, o: Any) -> None:
        h.maint_done = None

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        done = getattr(h, "maint_done", None)
        if done is None:
            return
        name, n, got = done
        took = sum(1 for a, _ in steps if a == _TAKES[name])
        if got.__class__ is not int or not took <= got <= n:
            raise h.fail(
                "maintenance-count",
                [o.name],
                f"{o.render()} returned {got!r}; the explanation took {took} of the chain's "
                f"blocks and the call may take at most {n}",
            )
        if name == "evict" and got < n:  # it stopped early: no block was left to evict
            left = [b for b in range(h.N) if h.machine.is_enabled(end, _TAKES[name], {"b": b})]
            if left:
                raise h.fail(
                    "maintenance-count",
                    [o.name],
                    f"{o.render()} evicted {got} of up to {n} blocks, yet the table still "
                    f"allows evicting chain blocks {left}",
                )
        h.cov.add("check: maintenance counts against the explanation")
