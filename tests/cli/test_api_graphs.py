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


# a finish that stores the whole chain while a graph is captured: every block moves, and the
# first one stored (block 0, in chain order) stales the graph.  The table lets the blocks be
# stored in any order (each one's steps are independent), so the end state alone is explained
# as well by an order that moves block 1 first; the stale_graph event tells them apart.
STALE_BY_STORE = (
    "pools(k=4);request(i=0, n=65, life=1);admit(i=0);use(i=0);finish(i=0);tick(t=4);"
    "variant(p=1, n=65);variant(p=0, n=33);variant(p=1, n=65);request(i=1, n=65, life=1);"
    "admit(i=1);drain();use(i=1);read(i=1);tick(t=2);spill_fills(n=2);use(i=1);"
    "spill_default();read(i=0);bad_input(k=14);capture();damage(b=3, part=0);offload(n=1);"
    "bad_input(k=17);evict(n=2);tick(t=3);tick(t=4);spill_fills(n=3);read(i=0);capture();"
    "read_released(i=1);evict_default();read(i=1);recapture();finish(i=1);drain()"
)


def test_a_store_that_stales_the_graph_is_explained_in_the_library_s_order() -> None:
    from kvstate.targets.api import parse_ops

    assert _run(parse_ops(STALE_BY_STORE)) is None


def test_a_stale_graph_event_no_step_explains_is_still_a_finding() -> None:
    """Steering the explanation by the events never hides one: a second ``stale_graph`` event
    (for a block whose move did not stale the graph) is reported."""
    from kvstate.targets.api import parse_ops

    ops = parse_ops(STALE_BY_STORE)
    k = next(j for j in range(len(ops) - 1, -1, -1) if ops[j].name == "finish")

    def plant(h: ApiHarness) -> None:  # the library also names block 3 when block 0 moves
        first, other = h.chain.keys[0], h.chain.keys[3]
        said: list[bool] = []

        def cb(ev) -> None:  # type: ignore[no-untyped-def]
            if ev.kind is EventKind.STALE_GRAPH and ev.key == first and not said:
                said.append(True)
                h.cache.events.emit(EventKind.STALE_GRAPH, other, "device")

        h.cache.events.subscribe(cb)

    found = _run(ops[: k + 1], plant)
    assert found is not None and found.kind == "events", found
