"""The inspection view's contract beyond what the checks read: the reads no check needed and the
refusals no check provoked (``impl/inspection.py``, docs/library.md).

The checks read the view's columns, pools and jobs after every call, and
:func:`kvstate.targets.api.facade._contract` tries its setters and mutating methods; what none
of them did -- a private name asked of a wrapped part or the metadata, a part's ``repr``, a
dictionary attribute of a part (it must come back read-only), a scalar field of the metadata,
the device copy of a block (``tiers.device_block``), the pipelines' mode, the generated hit
search, and the test hooks' own refusals (a disk method that is not public; the host copy of a
block that has none; ``act('admit')`` of what is not a request) and the records they find for
the chain's keys (``register``, ``record``: the ones registered) -- went unchecked.  ``view_contract``, an operation that changes nothing,
checks each against what the view documents and what the harness knows independently (the
cache's configuration, the model's phases).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from kvstate.spec.phases import CKV
from kvstate.targets.api.base import chain, op
from kvstate.targets.api.declare import OpDecl

# (part of the view, a private attribute the part has): the wrapper must refuse each
PRIVATE = (("graph", "_width"), ("meta", "_free"), ("tiers", "_blocks"))


def _raises(fn: Any, exc: Any) -> bool:
    try:
        fn()
    except exc:
        return True
    return False


def _contract(h: Any) -> list[str]:
    view, hooks, bad = h.view, h.hooks, []
    # private names the parts do have (asked by name: a checker never reads them), and one
    # no part has: each refused as not part of the interface
    asks = [
        (
            f"view.{part}.{name} (a private name of a part)",
            lambda p=part, n=name: getattr(getattr(view, p), n),
        )
        for part, name in PRIVATE
    ]
    for what, fn in (
        *asks,
        ("view.disk._unlisted (a private name no part has)", lambda: view.disk._unlisted),
        (
            "replace_disk_method('_check') (not public)",
            lambda: hooks.replace_disk_method("_check", None),
        ),
        (
            "replace_disk_method('nothing') (no such method)",
            lambda: hooks.replace_disk_method("nothing", None),
        ),
    ):
        if not _raises(fn, AttributeError):
            bad.append(f"{what} was not refused with AttributeError")
    from kvstate.impl.errors import InvalidArgument

    if not _raises(lambda: hooks.act("admit", object()), InvalidArgument):
        bad.append("test_hooks().act('admit', not a request) was not refused with InvalidArgument")
    # the chain's records, asked again: the ones it was registered with (a known key is found)
    if list(hooks.register(h.chain)) != list(h.rids):
        bad.append(f"register(chain) {hooks.register(h.chain)}, registered {list(h.rids)}")
    L = h.L
    for b, rid in enumerate(h.rids):
        got = hooks.record(h.chain.keys[b], h.chain.block_tokens_of(b), b * L)
        if got != rid:
            bad.append(f"record(key of block {b}) {got}, registered {rid}")
    if not repr(view.graph).startswith("ReadOnly("):
        bad.append(f"a wrapped part's repr is {repr(view.graph)[:40]!r}")
    fp = view.disk.fingerprint
    if not isinstance(fp, MappingProxyType) or not _raises(
        lambda: fp.__setitem__("x", 1), (TypeError, AttributeError)
    ):
        bad.append(f"the disk tier's fingerprint came back as a writable {type(fp).__name__}")
    if view.meta.load_steps != view.consts.load_steps:
        bad.append(f"meta.load_steps {view.meta.load_steps}, the table's {view.consts.load_steps}")
    want_mode = "threads" if h.threads else "manual"
    if view.pipeline_mode != want_mode:
        bad.append(f"pipeline_mode {view.pipeline_mode!r}, the cache was built {want_mode!r}")
    if not callable(view.hit_search):
        bad.append(f"hit_search is {type(view.hit_search).__name__}, not the search it runs")
    ckv = h.model.values["ckv"] if h.model is not None else ()
    meta, tiers = view.meta, view.tiers
    with view.lock:
        for b, rid in enumerate(h.rids):
            if b < len(ckv) and ckv[b] == CKV.READY and meta.slot[rid] >= 0:
                got = tiers.device_block(meta.slot[rid], meta.swa_pages[rid])
                want = [g.device_data[:, g.dev_index(meta.slot[rid])] for g in tiers.slot_groups]
                if len(got) != len(want) + bool(meta.swa_pages[rid]) or any(
                    x.data_ptr() == y.data_ptr() or not bool((x == y).all())
                    for x, y in zip(got, want, strict=False)
                ):
                    bad.append(f"device_block of block {b} is not a copy of its pages")
                h.cov.add("check: view device_block")
            if meta.hslot[rid] < 0 and not _raises(
                lambda r=rid: hooks.host_copy("csa", r), ValueError
            ):
                bad.append(f"host_copy of block {b}, which has no host copy, was not refused")
    return bad


def do_view_contract(h: Any, o: Any) -> int | None:
    if h.threads:
        return None
    bad = _contract(h)
    if bad:
        raise h.fail("inspection", ["view_contract"], f"{o.render()}: " + "; ".join(bad[:4]))
    h.cov.add("check: the view's contract")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: the contract on an empty cache, beside a stored chain, and with host copies."""
    c = chain(N, L, lease_max)
    return {
        "the inspection view's contract": [
            op("view_contract"),
            *c.store,
            op("view_contract"),
            *c.to_host[len(c.store) :],
            op("view_contract"),
        ]
    }


DECLS = (OpDecl("view_contract", do_view_contract, "read", rule=False),)
