"""Every entry point's documented refusals and argument forms (kvstate/targets/api/args.py): the
witness passes on the library, and each kind of wrong answer is a finding."""

from __future__ import annotations

from typing import Any

import pytest

import kvstate.targets.api.args as api_args
from kvstate.harness.finding import Nonconformance
from kvstate.spec import default_table
from kvstate.targets.api import OPS, ApiHarness, op, witnesses

TABLE = default_table()
N = 4
L = TABLE.consts.L
LM = TABLE.consts.lease_max
WITNESS = "documented refusals of every entry point"
STORE = [
    op("request", i=0, n=N * L + 1, life=1),
    op("admit", i=0),
    op("use", i=0),
    op("finish", i=0),
    op("tick", t=LM),
]


def _run(ops: list[Any]) -> Nonconformance | None:
    h = ApiHarness(TABLE, N)
    try:
        for o in ops:
            h.apply(o)
        h.quiesce()
    except Nonconformance as exc:
        return exc
    finally:
        h.close()
    return None


def test_the_witness_passes_and_sends_every_case() -> None:
    w = witnesses(N, L, LM)[WITNESS]
    assert sum(o.name == "refuse_arg" for o in w) == len(api_args.CASES)
    assert _run(w) is None


@pytest.mark.parametrize(
    "case",
    [
        ("tick(1) taken", "InvalidArgument", lambda h: h.cache.tick(1)),  # accepted
        ("a wrong error", "InvalidArgument", lambda h: h.cache.get_request(1 << 40)),
        ("answers differ", api_args.SAME, lambda h: (1, 2)),
        ("a raw error", "InvalidArgument", lambda h: [][0]),
    ],
    ids=["accepted", "wrong-class", "differ", "undocumented"],
)
def test_each_wrong_answer_is_a_finding(monkeypatch: pytest.MonkeyPatch, case: Any) -> None:
    monkeypatch.setattr(api_args, "CASES", (case,))
    found = _run([op("refuse_arg", k=0)])
    assert found is not None and found.kind == "bad-input", found


def test_an_eviction_that_stops_short_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run([*STORE, op("evict_default"), op("evict_np", n=N)]) is None

    def evicts_nothing(h: Any, o: Any) -> None:  # as a default of n=0 would
        h.maint_done = ("evict", 1, h.cache.evict(0))

    monkeypatch.setitem(OPS, "evict_default", evicts_nothing)
    found = _run([*STORE, op("evict_default")])
    assert found is not None and found.kind == "maintenance-count", found
