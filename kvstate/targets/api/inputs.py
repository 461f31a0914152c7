"""Bad input at every public entry point, as the API harness sends it.

The library's contract (docs/library.md, "The error contract"): every public entry point refuses a bad argument with
:class:`~kvstate.impl.errors.InvalidArgument` and changes nothing, in both builds.  A check that
lets a bad value through is invisible to refinement when the value happens to mean something
(``evict(True)`` evicting one block, ``tick(0)`` doing nothing), so ``bad_input(k)`` sends the
``k``-th value of :data:`CASES` and requires the documented error itself; the harness then
checks, as for every refusal, that nothing changed and no event was emitted.  A constructor
with a bad argument must leave its directory as it found it (nothing built).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl

NAN = float("nan")


def _cache(**kw: Any) -> Callable[[Any], Any]:
    def build(h: Any) -> Any:
        from kvstate.impl.cache import HeterogeneousKVCache

        d = tempfile.mkdtemp(prefix="kvstate-bad-input-")
        try:
            HeterogeneousKVCache(**{"table": h.table, "cache_dir": d, "executors": "manual", **kw})
        finally:
            left = os.listdir(d)
            for name in left:
                os.unlink(os.path.join(d, name))
            os.rmdir(d)
            if left:  # (raised after the cleanup; the caller reports it)
                h.bad_input_left = left

    return build


def _run(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A read through a running request's Run (skipped when none runs)."""

    def call(h: Any) -> Any:
        run = next((lv.run for lv in h.live if lv is not None and lv.run is not None), None)
        if run is None:
            return _SKIP
        return read(run)

    return call


def _req(tokens: Callable[[Any], Any] | None = None, **kw: Any) -> Callable[[Any], Any]:
    def call(h: Any) -> Any:
        t = np.array(h.tokens[: h.L + 1]) if tokens is None else tokens(h)
        return h.cache.request(t, **kw)

    return call


_SKIP = object()

# (what is sent, the call): each must raise InvalidArgument and change nothing
CASES: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("evict(True)", lambda h: h.cache.evict(True)),
    ("evict(-1)", lambda h: h.cache.evict(-1)),
    ("offload(1.0)", lambda h: h.cache.offload(1.0)),
    ("spill('1')", lambda h: h.cache.spill("1")),
    ("drop(None)", lambda h: h.cache.drop(None)),
    ("tick(0)", lambda h: h.cache.tick(0)),
    ("tick(np.True_)", lambda h: h.cache.tick(np.True_)),
    ("request(lifetime=0)", _req(lifetime=0)),
    ("request(lifetime=True)", _req(lifetime=True)),
    ("request(namespace=b'x')", _req(namespace=b"x")),
    ("request(namespace=lone surrogate)", _req(namespace="\ud800")),
    ("request(2-D tokens)", _req(tokens=lambda h: np.zeros((2, 2), dtype=np.int64))),
    ("request(float tokens)", _req(tokens=lambda h: np.zeros(3))),
    ("request(negative token)", _req(tokens=lambda h: np.array([1, -1]))),
    ("request(too long)", _req(tokens=lambda h: np.ones(len(h.tokens) + 1, dtype=np.int64))),
    ("admit(a str)", lambda h: h.cache.admit("request")),
    ("get_request(True)", lambda h: h.cache.get_request(True)),
    ("events_of('stored')", lambda h: h.cache.events_of("stored")),
    ("Run.read_compressed('nope', 0)", _run(lambda r: r.read_compressed("nope", 0))),
    ("Run.read_window(-1)", _run(lambda r: r.read_window(-1))),
    ("Run.read_tail(True)", _run(lambda r: r.read_tail(True))),
    ("Run.prefix(-1)", _run(lambda r: r.prefix(-1))),
    ("HeterogeneousKVCache(device=3)", _cache(device=3)),
    ("HeterogeneousKVCache(device='tpu')", _cache(device="tpu")),
    ("HeterogeneousKVCache(executors='x')", _cache(executors="x")),
    ("HeterogeneousKVCache(durable=1)", _cache(durable=1)),
    ("HeterogeneousKVCache(derive_index='no')", _cache(derive_index="no")),
    ("HeterogeneousKVCache(max_requests=0)", _cache(max_requests=0)),
    ("HeterogeneousKVCache(memory_limit=True)", _cache(memory_limit=True)),
    ("HeterogeneousKVCache(kernel_backend=5)", _cache(kernel_backend=5)),
    ("HeterogeneousKVCache(kernel_backend='nope')", _cache(kernel_backend="nope")),
    ("HeterogeneousKVCache(swa_blocks=2.0)", _cache(swa_blocks=2.0)),
)


def do_bad_input(h: Any, o: Any) -> int | None:
    from kvstate.impl.errors import InvalidArgument

    what, call = CASES[o.arg("k") % len(CASES)]
    h.bad_input_left = []
    try:
        got = call(h)
    except InvalidArgument:
        if h.bad_input_left:
            raise h.fail(
                "bad-input",
                [what],
                f"{what} raised InvalidArgument but left files behind: {h.bad_input_left}",
            ) from None
        h.cov.add("check: bad inputs refused")
        raise
    except Exception as exc:  # noqa: BLE001 - any other error breaks the contract
        raise h.fail(
            "bad-input",
            [what],
            f"{what} raised {type(exc).__name__}: {exc} (the contract: InvalidArgument)",
        ) from exc
    if got is _SKIP:
        h.call_override = "read"
        return None
    raise h.fail(
        "bad-input",
        [what],
        f"{what} was accepted (returned {got!r}): it must raise InvalidArgument",
    )


# refused, nothing changes (kvstate/targets/api/declare.py: the form)
DECLS: tuple[OpDecl, ...] = (
    OpDecl("bad_input", do_bad_input, "read", lambda s: {"k": st.integers(0, 63)}),
)
