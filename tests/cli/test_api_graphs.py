"""The CUDA-graph operations and the events checked at delivery (kvstate/targets/api/graphs.py,
kvstate/targets/api/delivery.py): they pass on the library and fail on a fault planted in a live cache."""

from __future__ import annotations

from kvstate.harness.finding import Nonconformance
from kvstate.impl.events import EventKind
from kvstate.spec import default_table
from kvstate.targets.api import ApiHarness, op, witnesses

TABLE = default_table()
N = 4
L = TABLE.consts.L
FULL = N * L + 1
USE = [op("request", i=0, n=FULL, life=1), op("admit", i=0), op("use", i=0)]


def _run(ops: list, plant=None) -> Nonconformance | None:  # type: ignore[no-untyped-def]
    h = ApiHarness(TABLE, N)
    try:
        for k, o in enumerate(ops):
            if plant is not None and k == len(ops) - 1:
                plant(h)
            h.apply(o)
        h.quiesce()
    except Nonconformance as exc:
        return exc
    finally:
        h.close()
    return None


def test_the_graph_witness_passes_and_reaches_a_stale_graph() -> None:
    w = witnesses(N, L, TABLE.consts.lease_max)["a graph staled by a load"]
    assert _run(w) is None
    kinds = [o.name for o in w]
    assert kinds.count("replay") >= 3 and "recapture" in kinds


def test_a_row_written_outside_a_use_is_a_finding() -> None:
    def plant(h: ApiHarness) -> None:  # another request slot's row, as a misdirected refill
        h.view.graph.block_tables[1, 0] = 3  # the live buffer (a tensor is not copied)

    found = _run([*USE, op("capture"), op("tick", t=1)], plant)
    assert found is not None and found.kind == "graph-row", found


def test_a_replay_refused_on_a_captured_graph_is_a_finding() -> None:
    def plant(h: ApiHarness) -> None:  # the graph forgets it was captured
        h.hooks.poke_graph("phase", 0)

    found = _run([*USE, op("capture"), op("replay")], plant)
    assert found is not None, "a replay refused on a captured graph passed"


def test_an_event_delivered_before_its_action_is_a_finding() -> None:
    """A ``stored`` event for a chain block that is not stored yet (delivered ahead of the
    commit it reports) is seen at delivery, whatever the call ends with."""
    from kvstate.targets.api.delivery import Delivery

    h = ApiHarness(TABLE, N)
    try:
        for o in USE:
            h.apply(o)
        d = next(c for c in h.checks if isinstance(c, Delivery))
        fin = op("finish", i=0)
        d.before(h, fin)
        h.cache.events.emit(EventKind.STORED, h.chain.keys[0], "device")  # block 0 is FREE
        assert d.seen and d.seen[0][:2] == ("stored", 0)
        from kvstate.spec.phases import Fmt

        a = h.model.values["addr"][0]
        writing = h.machine.step(h.model, "allocate", {"b": 0, "a": a, "f": int(Fmt.PRIMARY)})
        commit = [("commit", {"b": 0})]
        try:
            d.after(h, fin, writing, commit, h.machine.step(writing, *commit[0]))
        except Nonconformance as exc:
            assert exc.kind == "events" and "delivered while" in str(exc), exc
        else:
            raise AssertionError("an event ahead of its commit passed")
    finally:
        h.close()
