"""``spec.apply`` (the table's updates on a concrete state) and ``spec.apply.holds`` (its
guard) agree with the model's step on random walks of the default table, so what the recovery
projection applies is the table's own transition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.model.concrete import Machine
from kvstate.spec import default_table
from kvstate.spec.apply import apply, holds

TABLE = default_table()
MACHINE = Machine(TABLE, 2)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=12))
def test_apply_is_the_models_step(choices: list[int]) -> None:
    s = MACHINE.init()
    for c in choices:
        enabled = list(MACHINE.enabled(s))
        if not enabled:
            break
        name, params = enabled[c % len(enabled)]
        action = TABLE.action(name)
        assert holds(action, s, params)
        nxt = MACHINE.step(s, name, params)
        assert apply(action, s, params) == nxt
        s = nxt


def test_holds_skips_named_conjuncts() -> None:
    s = MACHINE.init()
    load = TABLE.action("load_start")
    assert not holds(load, s, {"b": 0})  # nothing offloaded in the initial state
    assert holds(load, s, {"b": 0}, skip=[c.name for c in load.guard])
