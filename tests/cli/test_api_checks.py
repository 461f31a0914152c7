"""The API harness's checks beyond refinement (kvstate/targets/api/checks.py and its modules): each one
passes on the library and fails on a bug planted in a running cache."""

from __future__ import annotations

import numpy as np
import pytest

from kvstate.harness.finding import Nonconformance
from kvstate.impl.events import EventKind
from kvstate.spec import default_table
from kvstate.targets.api import ApiHarness, op, witnesses
from kvstate.targets.api.damage import PARTS, _offset
from kvstate.targets.api.inputs import CASES
from kvstate.targets.api.prefix import variant_tokens

TABLE = default_table()
N = 4
L = TABLE.consts.L
FULL = N * L + 1
STORE = [
    op("request", i=0, n=FULL, life=1),
    op("admit", i=0),
    op("use", i=0),
    op("finish", i=0),
    op("tick", t=TABLE.consts.lease_max),
]


def _run(ops: list, patch=None) -> Nonconformance | None:  # type: ignore[no-untyped-def]
    h = ApiHarness(TABLE, N)
    try:
        if patch is not None:
            patch(h)
        for o in ops:
            h.apply(o)
        h.quiesce()
    except Nonconformance as exc:
        return exc
    finally:
        h.close()
    return None


def test_new_witnesses_pass() -> None:
    w = witnesses(N, L, TABLE.consts.lease_max)
    for name in (
        "the documented orders: spill, drop, queued loads",
        "prompts that differ early and agree later",
        "bad input at every entry point",
        "the device runs out partway through a store",
        "damaged window section of a disk entry",
        "use tried at every step of a recovery",
    ):
        assert _run(w[name]) is None, name


def _stored() -> ApiHarness:
    h = ApiHarness(TABLE, N)
    for o in STORE:
        h.apply(o)
    return h


def test_an_eviction_that_passes_over_the_lru_block_is_an_order_finding() -> None:
    """A finish releases its chain deepest block first: block N-1 is the least recently used.
    Evicting block 0 while the table lets N-1 go is what a most-recent-first LRU does."""
    from kvstate.targets.api.orders import OrderHook

    h = _stored()
    try:
        check = next(c for c in h.checks if isinstance(c, OrderHook)).check
        s = h.model
        assert check.dev == list(range(N))[::-1]
        for b, ok in ((N - 1, True), (0, False)):
            steps = [("evict_start", {"b": b}), ("evict_done", {"b": b})]
            end = s
            for name, p in steps:
                end = h.machine.step(end, name, p)
            bad = check.picks(s, steps, end)
            assert (not bad) == ok, bad
    finally:
        h.close()


def test_an_event_not_delivered_as_logged_is_a_finding() -> None:
    from kvstate.targets.api.handout import Events

    h = ApiHarness(TABLE, N)
    try:
        ev = next(c for c in h.checks if isinstance(c, Events))
        o = op("request", i=0, n=FULL, life=1)
        h.apply(o)
        ev.before(h, o)
        h.cache.events.emit(EventKind.STORED, b"k" * 16, "device")
        ev._check(h, o)  # delivered as logged: passes
        ev.got.pop()  # a subscriber that did not receive it
        with pytest.raises(Nonconformance, match="delivered 0 events"):
            ev._check(h, o)
    finally:
        h.close()


def test_variant_differs_from_the_chain_in_one_token_of_block_0() -> None:
    tokens = np.arange(100, 100 + 3 * L)
    for p, at in ((0, 0), (1, L - 1)):
        v = variant_tokens(tokens, L, 2 * L + 1, p)
        diff = np.flatnonzero(v != tokens[: 2 * L + 1])
        assert diff.tolist() == [at]


def test_every_bad_input_is_refused_and_one_accepted_is_a_finding(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import kvstate.targets.api.inputs as inputs

    ops = [*STORE[:3], *[op("bad_input", k=k) for k in range(len(CASES))]]
    assert _run(ops) is None
    # a call the library takes (as a bug would take a bad one): the harness says so
    monkeypatch.setattr(inputs, "CASES", (("tick(1)", lambda h: h.cache.tick(1)),))
    found = _run([op("bad_input", k=0)])
    assert found is not None and found.kind == "bad-input", found


@pytest.mark.parametrize("part", PARTS)
def test_damage_lands_inside_its_section(part: str) -> None:
    w = witnesses(N, L, TABLE.consts.lease_max)["hit after a disk load and an indexer rebuild"]
    h = ApiHarness(TABLE, N)
    try:
        for o in w[: w.index(op("request", i=1, n=FULL, life=1))]:
            h.apply(o)
        e = h.view.disk_entries[h.rids[N - 1]]
        at = _offset(e, part)
        assert at is not None and 0 <= at < e.size - e.payload_offset
        if part == "window":
            assert e.swa_section[0] <= at < e.swa_section[1]
        elif part != "last byte":
            lo = 0
            for group, _, size in e.units:
                if group == part:
                    assert lo <= at < lo + size
                    break
                lo += size
    finally:
        h.close()
