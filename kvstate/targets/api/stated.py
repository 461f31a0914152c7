"""What a refusal states: the figures and names in an error's message against the call's inputs.

An error's text is what a user reads to fix the call: a memory refusal that misstates the
bytes it needs or the limit it was given (a wrong unit, a doubled term) sends them to the wrong
fix, and an unknown-request refusal that does not name the request hides which one.  The
harness checked the error's class only.  ``stated(k)`` makes the ``k``-th refusal of
:data:`FORMS` beside the example's cache and compares what its message states with what the
call was given and what the cache allocates (the tensors, not a formula):

* the tiers over ``memory_limit`` (a plan of a few hundred MiB, refused before it allocates):
  the device and host blocks asked for, the GiB the plan needs (``planned_bytes``, which
  :mod:`kvstate.targets.api.poolstate` compares with the tiers' tensors) and the limit's GiB;
* the CUDA-graph block table: a limit that holds exactly what a cache of that shape allocates
  (its tiers' tensors and its graph table's, the host staging copy too where the table lives
  on a device) builds; one byte less is a ``LayoutError`` that states the requests, the
  table's width (a request is at most ``max_model_len`` tokens), the table's GiB, the tiers'
  GiB and the limit's;
* ``get_request`` of an id the cache never gave: ``UnknownRequest`` names that id;
* a disk key of the wrong length: the refusal states the lengths a key may have, and both
  ends of that range open a cache while one byte past either end is refused.
"""

from __future__ import annotations

import re
import tempfile
from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl

FORMS = (
    "the tiers over the memory limit",
    "the CUDA-graph table's bytes",
    "an unknown request",
    "the disk key's lengths",
)
_OPEN = dict(executors="manual", host_blocks=1, max_requests=1)
# a plan of about 0.3 GiB on the small geometry: its figures show at the message's 0.1 GiB
# (a wrong unit or a doubled term changes them); refused, it allocates nothing
_BIG_DEVICE = 8192
_BIG_HOST = 4096  # (about 0.17 GiB: a sum and a difference of the two show)
_BIG = {"device_blocks": _BIG_DEVICE, "host_blocks": _BIG_HOST}
_UNKNOWN_ID = (1 << 40) + 7


def _gib(n: int) -> str:
    """Bytes as the messages write them (GiB, one decimal)."""
    return f"{n / 2**30:.1f}"


def _fail(h: Any, o: Any, form: str, detail: str) -> Exception:
    return h.fail("stated", [form], f"{o.render()}: {detail}")


def _stated(h: Any, o: Any, form: str, msg: str, pattern: str, want: tuple[str, ...]) -> None:
    """``msg`` matches ``pattern`` and its groups are ``want``."""
    m = re.search(pattern, msg)
    got = m.groups() if m else None
    if got != want:
        raise _fail(h, o, form, f"the message {msg!r} states {got}, the inputs give {want}")


def _refused(h: Any, o: Any, form: str, g: Any, kw: dict[str, Any]) -> str:
    """The message of the ``LayoutError`` a cache of ``g`` opened with ``kw`` raises."""
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.errors import LayoutError

    try:
        c = HeterogeneousKVCache(g, **kw)
    except LayoutError as exc:
        return str(exc)
    c.close()
    raise _fail(h, o, form, "built, not refused with LayoutError")


def _tiers(h: Any, o: Any, form: str, g: Any) -> None:
    from kvstate.impl.tiers import planned_bytes

    dev, host = planned_bytes(g, _BIG_DEVICE, _BIG_HOST, _OPEN["max_requests"], None)
    limit = dev + host - 1
    with tempfile.TemporaryDirectory(prefix="kvstate-stated-") as d:
        msg = _refused(h, o, form, g, {"cache_dir": d, "memory_limit": limit, **_OPEN, **_BIG})
    _stated(
        h,
        o,
        form,
        msg,
        r"(\d+) device \+ (\d+) host blocks need ([\d.]+) GiB \(> memory_limit ([\d.]+) GiB\)",
        (str(_BIG_DEVICE), str(_BIG_HOST), _gib(dev + host), _gib(limit)),
    )


def _footprint(c: Any) -> tuple[int, int, int]:
    """(the tiers' bytes, the graph table's bytes, its width) as allocated: the tensors."""
    v = c.inspect()
    t = v.tiers
    tiers = sum(g.device_data.nbytes + g.host_data.nbytes for g in t.groups)
    bt, sp = v.graph.block_tables, v.graph.state_ptrs
    table = bt.nbytes + sp.nbytes
    if bt.is_cuda:  # the host staging copy the rows are refilled from
        table *= 2
    return tiers, table, int(bt.shape[1])


def _graph(h: Any, o: Any, form: str, g: Any) -> None:
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.errors import LayoutError
    from kvstate.impl.tiers import planned_bytes

    L = g.lcm_tokens
    max_len = 37 * L + 1  # (a partial block: the table's width rounds up)
    kw = dict(device_blocks=2, max_model_len=max_len, **_OPEN)
    with tempfile.TemporaryDirectory(prefix="kvstate-stated-") as d:
        c = HeterogeneousKVCache(g, cache_dir=d, **kw)
        try:
            tiers, table, width = _footprint(c)
        finally:
            c.close()
        if width != -(-max_len // L):
            raise _fail(
                h, o, form, f"the graph table is {width} blocks wide for max_model_len {max_len}"
            )
        try:
            HeterogeneousKVCache(g, cache_dir=d, memory_limit=tiers + table, **kw).close()
        except LayoutError as exc:
            raise _fail(
                h,
                o,
                form,
                f"memory_limit {tiers + table} holds the tiers ({tiers} bytes) and the graph "
                f"table ({table} bytes) the cache allocates, yet it was refused: {exc}",
            ) from exc
        # one byte short; then a table of about 0.8 GiB (the bytes an entry takes, as
        # allocated above, times its entries) beside the tiers of the first form, under a
        # limit of those tiers and half the table, refused before it allocates: figures the
        # message's 0.1 GiB shows
        R = _OPEN["max_requests"]
        entry, rest = divmod(table, R * width)
        wide = (8 << 30) // (10 * entry * R)
        big_tiers = sum(planned_bytes(g, _BIG_DEVICE, _BIG_HOST, R, None))
        for w, t, tb, over in (
            (width, table, tiers, {}),
            (wide, entry * R * wide, big_tiers, _BIG),
        ):
            limit = tb + (t - 1 if not over else t // 2)
            big = {**kw, **over, "max_model_len": w * L}
            msg = _refused(h, o, form, g, {"cache_dir": d, "memory_limit": limit, **big})
            _stated(
                h,
                o,
                form,
                msg,
                r"(\d+) requests x (\d+) blocks of CUDA-graph block table need ([\d.]+) GiB "
                r"beside ([\d.]+) GiB of tiers \(> memory_limit ([\d.]+) GiB\)",
                (str(R), str(w), _gib(t), _gib(tb), _gib(limit)),
            )
        if rest:
            raise _fail(h, o, form, f"the graph table's {table} bytes are not per entry")


def _unknown(h: Any, o: Any, form: str) -> None:
    from kvstate.impl.errors import UnknownRequest

    try:
        h.cache.get_request(_UNKNOWN_ID)
    except UnknownRequest as exc:
        if str(_UNKNOWN_ID) not in str(exc):
            raise _fail(
                h, o, form, f"get_request({_UNKNOWN_ID}) refused as {str(exc)!r}: no id named"
            ) from exc
        return
    raise _fail(h, o, form, f"get_request({_UNKNOWN_ID}) answered a request")


def _key_lengths(h: Any, o: Any, form: str, g: Any) -> None:
    """A disk key of the wrong length is refused with a message that states the lengths it
    takes; both ends of that range open a cache, one byte past either end is refused."""
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.errors import InvalidArgument

    def opens(n: int) -> str:
        with tempfile.TemporaryDirectory(prefix="kvstate-stated-") as d:
            try:
                HeterogeneousKVCache(
                    g, cache_dir=d, disk_key=b"k" * n, device_blocks=2, **_OPEN
                ).close()
            except InvalidArgument as exc:
                return str(exc)
        return ""

    msg = opens(1)
    m = re.search(r"(\d+) to (\d+) bytes", msg)
    if m is None:
        raise _fail(h, o, form, f"a 1-byte disk key refused as {msg!r}: no lengths stated")
    lo, hi = int(m[1]), int(m[2])
    for n, ok in ((lo, True), (hi, True), (lo - 1, False), (hi + 1, False)):
        got = opens(n)
        if (got == "") != ok:
            raise _fail(
                h,
                o,
                form,
                f"the refusal states {lo} to {hi} bytes, yet a {n}-byte key was "
                f"{'refused: ' + got if got else 'taken'}",
            )


def do_stated(h: Any, o: Any) -> int | None:
    k = o.arg("k") % len(FORMS)
    form = FORMS[k]
    if h.threads:
        return None
    g = h.table.geometry
    if k == 0:
        _tiers(h, o, form, g)
    elif k == 1:
        _graph(h, o, form, g)
    elif k == 2:
        _unknown(h, o, form)
    else:
        _key_lengths(h, o, form, g)
    h.cov.add(f"check: what a refusal states ({form})")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    from kvstate.targets.api.base import op

    return {"what refusals state": [op("stated", k=k) for k in range(len(FORMS))]}


# scripted only (the walk above): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "stated",
        do_stated,
        "read",
        lambda s: {"k": st.integers(0, len(FORMS) - 1)},
        rule=False,
    ),
)
