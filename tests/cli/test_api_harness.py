"""The API harness (``kvstate fuzz --target kvstate-api``): its mapping, its checks, its ci run.

The ci-profile runs are the harness's CI gate: the full run (every operation) and a run without
the operations listed in ``OPEN_DEFECT_OPS`` (those that expose a defect still open; empty now:
``foreign``, a request in another namespace, joined when the table's ``allocate`` got an output
address, since a real allocator may hand a block any free device slot).
"""

from __future__ import annotations

import pytest

from kvstate.impl.testdata import DeterministicWriter
from kvstate.model.apimap import Explainer, compile_patterns
from kvstate.model.concrete import Machine
from kvstate.spec import default_table
from kvstate.spec.api import API
from kvstate.targets.api import (
    OPS,
    ApiHarness,
    Coverage,
    op,
    parse_ops,
    replay,
    run_api,
    summary_lines,
    witnesses,
)
from kvstate.targets.api.registry import DEFAULT_OPS

TABLE = default_table()
N = 4
L = TABLE.consts.L
# operations that expose open defects (see the module doc); shrink as they are fixed
OPEN_DEFECT_OPS: frozenset[str] = frozenset()


def test_every_api_pattern_compiles_over_the_table_actions() -> None:
    names = [a.name for a in TABLE.actions]
    for call in API.values():
        compile_patterns(call.patterns, names)
    with pytest.raises(ValueError, match="not an action"):
        compile_patterns(("admit frobnicate",), names)


def test_explain_accepts_the_library_path_and_rejects_a_wrong_state() -> None:
    m = Machine(TABLE, N)
    ex = Explainer(m)
    s0 = m.init()
    steps = [
        ("admit", {"r": 0, "t": 2}),
        ("match", {"r": 0, "h": 0}),
        ("pin", {"r": 0}),
        ("validate", {"r": 0}),
    ]
    s = s0
    for name, p in steps:
        s = m.step(s, name, p)
    got = ex.explain("admit", s0, s.values, req=0)
    assert got.steps is not None and [n for n, _ in got.steps] == [n for n, _ in steps]
    # the same change is not a ``finish`` (its patterns end in ``release``) ...
    assert ex.explain("finish", s0, s.values, req=0).steps is None
    # ... and an admission that also bumped a generation is explained by nothing
    bad = dict(s.values)
    bad["gen"] = (1, *bad["gen"][1:])
    assert ex.explain("admit", s0, bad, req=0).steps is None


def test_operations_render_and_parse_back() -> None:
    trace = [op("request", i=0, n=65, life=2), op("admit", i=0), op("drain")]
    text = "; ".join(o.render() for o in trace)
    assert parse_ops(text) == trace
    with pytest.raises(ValueError):
        parse_ops("admit(i=0); launch_missiles()")


@pytest.mark.parametrize(
    "name",
    [
        "hit after a host load",
        "hit after a disk load and an indexer rebuild",
        "crash and restart, then a disk hit",
        "corrupt entry: truncated to the valid prefix",
        "disk read error",
        "slide during a load",
        "an empty SWA pool slides the LRU window",
        "a host copy whose tail does not splice",
        "an admission cancels an offload in flight",
    ],
)
def test_witness_conforms_and_reaches_its_path(name: str) -> None:
    cov = Coverage()
    w = witnesses(N, L, TABLE.consts.lease_max)[name]
    assert replay(TABLE, N, w, coverage=cov) is None
    c = cov.counts
    assert c["quiescence checks"] == 1 and c["reads checked"] > 0
    want = {
        "hit after a host load": "host restores completed",
        "hit after a disk load and an indexer rebuild": "indexer rebuilds",
        "crash and restart, then a disk hit": "disk restores completed",
        "corrupt entry: truncated to the valid prefix": "loads failed",
        "disk read error": "fault read_error",
        "slide during a load": "slides during a load",
        "an empty SWA pool slides the LRU window": "windows slid to make room",
        "a host copy whose tail does not splice": "hits truncated to the valid prefix",
        "an admission cancels an offload in flight": "action offload_cancel",
    }[name]
    assert c[want] > 0, dict(c)
    assert c["hits used over restored blocks"] > 0 or name in (
        "slide during a load",
        "an empty SWA pool slides the LRU window",
        "corrupt entry: truncated to the valid prefix",
        "an admission cancels an offload in flight",
        "disk read error",  # block 0's load fails: the hit is cut to nothing
    )


def test_a_leaked_slot_is_found_within_a_few_operations() -> None:
    """Mutation check of the accounting: a device slot taken behind the library's back."""
    h = ApiHarness(TABLE, N)
    try:
        h.apply(op("request", i=0, n=N * L + 1, life=1))
        h.hooks.leak_device_slot()  # a slot nobody holds: what a leak looks like
        with pytest.raises(AssertionError, match="device slots"):
            h.apply(op("tick", t=1))
    finally:
        h.close()


def test_wrong_bytes_are_found() -> None:
    """Mutation check of the byte comparison: a stored page overwritten behind the cache."""
    h = ApiHarness(TABLE, N)
    try:
        for o in witnesses(N, L, TABLE.consts.lease_max)["hit after a host load"][:4]:
            h.apply(o)
        h.apply(op("request", i=1, n=N * L + 1, life=1))
        h.apply(op("admit", i=1))
        h.hooks.device_data("hca")[0].view(-1)[:8] ^= 1
        with pytest.raises(AssertionError, match="wrong bytes"):
            h.apply(op("use", i=1))
    finally:
        h.close()


def test_allocate_may_take_another_slot_under_foreign_pressure() -> None:
    """Another namespace's stores take block 0's slot, so its re-allocation lands elsewhere:
    the table's ``allocate`` must explain the new address (it failed before the output address)."""
    trace = parse_ops(
        "request(i=0, n=16, life=1); admit(i=0); use(i=0); foreign(ns=0, n=48); finish(i=0)"
    )
    h = ApiHarness(TABLE, N)
    try:
        for o in trace:
            h.apply(o)
        assert h.model.values["addr"][0] != 0  # the block did move: the case is exercised
    finally:
        h.close()


def test_a_job_step_that_ends_a_load_may_start_a_held_back_one() -> None:
    """``spec/api.py``'s JOB: a load that ends, completed or failed, retries the disk loads the
    I/O cap held back (what the library does when a load fails); a load start alone is no job
    step, and a drain's words are its job steps' words one after the other."""
    ex = Explainer(Machine(TABLE, N))
    for call in ("step", "drain"):
        assert ex.accepts(call, ["load_fail", "load_start"])
        assert ex.accepts(call, ["load_done", "rebuild_start", "evict_start", "evict_done"])
    assert not ex.accepts("step", ["load_start"])
    assert not ex.accepts("step", ["load_fail", "load_fail"])
    assert ex.accepts("drain", ["load_fail", "load_fail", "load_progress"])
    assert not ex.accepts("drain", ["admit"])


def _to_a_drain_of_loads() -> ApiHarness:
    """A harness whose next ``drain`` runs the disk loads of a whole chain, chunk by chunk."""
    h = ApiHarness(TABLE, N)
    for o in witnesses(N, L, TABLE.consts.lease_max)["disk read error"][:-4]:
        h.apply(o)
    return h


def test_drain_is_explained_job_step_by_job_step() -> None:
    """A drain's every job step is explained from the model's state after the previous one,
    and the parts together are a word of ``drain``: a change undone by a later job step of the
    same drain is found (one explanation of the whole drain would see only its end)."""
    import kvstate.targets.api.ops as ah

    h = _to_a_drain_of_loads()
    try:
        done = h.cov.counts["action load_done"]
        h.apply(op("drain"))
        assert h.drained is not None and len(h.drained) > 2  # it ran job step by job step
        assert h.cov.counts["action load_done"] == done + N
    finally:
        h.close()
    h = _to_a_drain_of_loads()
    real = ah._step_job
    count = [0]

    def meddling(h2: ApiHarness, e: object, job: object) -> None:
        real(h2, e, job)
        count[0] += 1
        rid = h2.rids[N - 1]
        if count[0] == 1:
            # a generation bumped by one job step ...
            h2.hooks.poke("gen", rid, h2.view.meta.gen[rid] + 1)
        elif count[0] == 2:
            # ... and put back by the next: the end looks right
            h2.hooks.poke("gen", rid, h2.view.meta.gen[rid] - 1)

    ah._step_job = meddling  # type: ignore[assignment]
    try:
        with pytest.raises(AssertionError, match=r"job step 1 of"):
            h.apply(op("drain"))
    finally:
        ah._step_job = real  # type: ignore[assignment]
        h.close()


def test_api_ci_profile_conforms() -> None:
    res = run_api(TABLE, N, profile="ci")
    assert res.finding is None, "\n".join(
        [str(res.finding), *(o.render() for o in res.minimized or [])]
    )


def test_api_ci_profile_conforms_without_the_open_defect_operations() -> None:
    res = run_api(TABLE, N, profile="ci", ops=DEFAULT_OPS - OPEN_DEFECT_OPS)
    assert res.finding is None, "\n".join(
        [str(res.finding), *(o.render() for o in res.minimized or [])]
    )
    c = res.coverage.counts
    print("\n".join(summary_lines(res)))
    # the run is not weak: every path the issue names is reached
    for k in (
        "disk restores completed",
        "host restores completed",
        "indexer rebuilds",
        "hits used over restored blocks",
        "slides during a load",
        "windows slid to make room",
        "loads failed",
        "fault crash",
        "fault bitflip",
        "fault truncate",
        "fault header",
        "fault read_error",
        "fault stall",
        "fault host_tail",
        "hits truncated to the valid prefix",
        "quiescence checks",
    ):
        assert c[k] > 0, (k, dict(c))


def test_planted_mutants_apply() -> None:
    """Every planted bug still edits the current sources: its text occurs exactly once where it
    says (a refactor of impl/ that moves the code must move the mutant with it, or the kill rate
    of ``python -m kvstate.api_mutants`` would count patches that no longer plant anything)."""
    from kvstate.api_mutants import MUTANTS, ROOT

    stale = []
    for m in MUTANTS:
        src = (ROOT / m.path).read_text()
        if src.count(m.old) != 1 or m.old == m.new:
            stale.append(f"{m.name}: {src.count(m.old)} occurrences in {m.path}")
    assert not stale, stale


def test_equivalent_mutants_are_equivalent_on_small() -> None:
    """The one mutant marked equivalent (``gather_first_page_only``) is so only while every slot
    group of the harness's geometry has one page per block: if that changes, it must be run."""
    from kvstate.api_mutants import MUTANTS
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.spec import small

    assert [m.name for m in MUTANTS if m.equivalent] == ["gather_first_page_only"]
    with HeterogeneousKVCache(small(), executors="manual", writer=DeterministicWriter()) as c:
        groups = c.inspect().tiers.slot_groups
        assert groups and all(g.pages_per_block == 1 for g in groups)


def test_planted_mutants_are_killed() -> None:
    """One of the planted bugs, end to end through the runner (python -m kvstate.api_mutants
    runs all of them: minutes, not in the default run)."""
    from kvstate.api_mutants import run_one, stage

    root = stage()
    for name in ("host_copy_without_indexer",):
        r = run_one(root, name, "ci", 300.0)
        assert r["killed"], r


def test_threads_conform() -> None:
    from kvstate.targets.api.threads import run_threads

    for seed in range(2):
        r = run_threads(TABLE, N, seed=seed)
        assert not r.problems, (seed, r.problems)
        assert r.counts["sections checked"] > 20 and r.counts["reads checked"] > 20


def test_threads_check_finds_a_change_outside_the_lock() -> None:
    """Mutation check of the lock-order linearization: a generation bumped behind the lock."""
    from kvstate.targets.api.threads import run_threads

    def tamper(h: ApiHarness) -> None:
        h.hooks.poke("gen", h.rids[0], h.view.meta.gen[h.rids[0]] + 1)

    r = run_threads(TABLE, N, seed=0, tamper=tamper)
    assert any("outside the lock" in p or "not explained" in p for p in r.problems), r.problems


# an admission whose third disk load waits for the I/O cap (io_cap 2), aborted by the
# quiescence before that load starts
HELD_BACK_LOAD = (
    "request(i=0, n=48, life=1); admit(i=0); use(i=0); finish(i=0); tick(t=1); offload(n=1); "
    "drain(); spill(n=1); offload(n=2); drain(); spill(n=2); request(i=1, n=49, life=1); "
    "admit(i=1)"
)


def test_an_aborted_admission_leaves_no_follow_up_of_its_held_back_load() -> None:
    """After a drain nothing may wait on something running (``drained_idle``): the held-back
    load of an aborted admission leaves the I/O queue, and its rebuild and tail check with it
    (they were left behind: found by this check, fixed in ``Recovery.forget_unwanted``)."""
    assert replay(TABLE, N, parse_ops(HELD_BACK_LOAD)) is None


def test_a_follow_up_left_waiting_after_a_drain_is_found() -> None:
    """Mutation check of ``drained_idle``: a rebuild wanted for a block with no load."""
    h = ApiHarness(TABLE, N)
    try:
        h.apply(op("request", i=0, n=N * L + 1, life=1))
        h.hooks.want_rebuild(h.rids[1])  # wanted, yet no load will ever end
        with pytest.raises(AssertionError, match="follow-ups wait on loads"):
            h.apply(op("drain"))
    finally:
        h.close()


def test_an_event_no_action_explains_is_found() -> None:
    """Mutation check of the event comparison: a STORED event of a block nothing stored."""
    from kvstate.impl.events import EventKind

    h = ApiHarness(TABLE, N)
    tick = OPS["tick"]

    def tick_and_tell(h: ApiHarness, o: object) -> int | None:
        got = tick(h, o)  # type: ignore[arg-type]
        h.cache.events.emit(EventKind.STORED, h.chain.keys[2], "device")
        return got

    try:
        h.apply(op("request", i=0, n=N * L + 1, life=1))
        OPS["tick"] = tick_and_tell
        with pytest.raises(AssertionError, match="events"):
            h.apply(op("tick", t=1))
    finally:
        OPS["tick"] = tick
        h.close()


def test_files_kvstate_did_not_write_are_left_alone_and_its_leftovers_reaped() -> None:
    """A restart plants a killed writer's temporary (the scan must delete it) and three files
    of another program under kvstate-like names (left alone, never read as entries; one carries
    kvstate's magic under a name of an odd number of hex digits, which no entry has)."""
    from kvstate.impl import disk

    h = ApiHarness(TABLE, N)
    try:
        h.apply(op("restart"))
        assert len(h.foreign_files) == 3
        assert any(len(n[: -len(".kvb")]) % 2 for n in h.foreign_files if n.endswith(".kvb"))
        names = sorted(p.name for p in __import__("pathlib").Path(h.dir).iterdir())
        assert all(n in names for n in h.foreign_files)
        assert not [n for n in names if n.endswith(".tmp") and n not in h.foreign_files]
        # mutation checks: the scan deletes a foreign file / keeps the killed temporary
        victim = next(n for n in h.foreign_files if n.endswith(".kvb"))
        (disk.Path(h.dir) / victim).unlink()
        with pytest.raises(AssertionError, match="did not write is gone"):
            h.apply(op("tick", t=1))
    finally:
        h.close()


def test_a_full_disk_fails_the_write_itself() -> None:
    """``disk_full`` fails the temporary's writes (not the whole ``prepare``), so the
    library's own cleanup runs: a temporary left behind is found by the accounting."""
    from kvstate.impl import disk as disk_mod

    h = ApiHarness(TABLE, N)
    try:
        for o in witnesses(N, L, TABLE.consts.lease_max)["full disk"][:-1]:
            h.apply(o)  # blocks on the host; the disk full
        real = disk_mod.DiskTier.remove

        def keep(self: object, path: object) -> bool:  # the cleanup, undone
            return True if str(path).endswith(".tmp") else real(self, path)  # type: ignore[arg-type]

        disk_mod.DiskTier.remove = keep  # type: ignore[method-assign]
        try:
            with pytest.raises(AssertionError, match="temporary files left behind"):
                h.apply(op("spill", n=1))
        finally:
            disk_mod.DiskTier.remove = real  # type: ignore[method-assign]
    finally:
        h.close()


class _Refusing:
    """The cache, its ``admit`` refused (a compiled class's method cannot be patched)."""

    def __init__(self, cache: object, exc: Exception) -> None:
        self._cache, self._exc = cache, exc

    def admit(self, *a: object, **k: object) -> object:
        raise self._exc

    def __getattr__(self, name: str) -> object:
        return getattr(self._cache, name)


def test_a_refusal_the_table_does_not_require_is_a_finding() -> None:
    """An ``admit`` refused while the table has an idle request slot (the generated mutant
    ``cache.py`` ``is not`` -> ``is``): the harness asks the model, which admits."""
    from kvstate.harness.finding import Nonconformance
    from kvstate.impl.errors import OutOfCapacity, Refused

    for exc in (Refused("admit", ("idle",), "planted"), OutOfCapacity("admit", (), "planted")):
        h = ApiHarness(TABLE, N)
        try:
            h.apply(op("request", i=0, n=L + 1, life=1))

            h.cache = _Refusing(h.cache, exc)
            with pytest.raises(Nonconformance, match="the table allows 'admit' here: admit"):
                h.apply(op("admit", i=0))
        finally:
            h.close()


def test_a_refusal_outside_the_modelled_part_of_a_call_is_left_alone() -> None:
    """A request of another namespace (``variant``: ``foreign``, ``ROOM*``) refused for want
    of a request slot: its admission is outside the call's patterns, so the table is not asked
    (found by ``kvstate fuzz --target kvstate-api --profile dev --seed 0``)."""
    trace = "request(i=0, n=0, life=1); request(i=1, n=0, life=1); admit(i=0); admit(i=1)"
    assert replay(TABLE, N, parse_ops(f"{trace}; variant(n=16, p=0)")) is None


def test_the_table_refuses_an_admit_only_without_an_idle_request_slot() -> None:
    """``a_way`` finds an admission from the initial state, none once every slot is taken."""
    from kvstate.model.apirefuse import a_way

    m = Machine(TABLE, N)
    ex = Explainer(m)
    s = m.init()
    way = a_way(ex, "admit", s)
    assert way is not None and way[0][0] == "admit"
    for r in range(TABLE.consts.R):
        s = m.step(s, "admit", {"r": r, "t": 1})
    assert a_way(ex, "admit", s) is None
    assert a_way(ex, "evict", s) == []  # ``EVICT*``: doing nothing is a way, never refused


def test_a_run_that_reached_nothing_fails() -> None:
    """Anti-vacuity from the run's own counters: no hit used, no read checked, an operation
    whose every call was refused (one whose table call has no empty way)."""
    from kvstate.targets.api import MAPPING
    from kvstate.targets.api.refusals import vacuous

    ex = Explainer(Machine(TABLE, N))
    empty = {c for c, (nfa, s, a) in ex.nfas.items() if a in nfa.closure([s])}
    assert "admit" not in empty and "read" in empty
    c = Coverage()
    c.add("refused admit:Refused", 97)
    c.add("refused bad_input:InvalidArgument", 3)
    assert vacuous(c.counts, MAPPING, empty) == [
        "every admit was refused (admit:Refused 97)",
        "hits used 0",
        "reads checked 0",
    ]
    c.add("call admit")
    c.add("hits used")
    c.add("reads checked")
    assert vacuous(c.counts, MAPPING, empty) == []


def test_a_request_grown_past_the_chain_is_shown_within_it() -> None:
    """A request grown by appends past the modelled chain's ``N`` blocks and admitted again
    pins a snapshot longer than the model's row: the harness shows the first ``N`` blocks
    (found by ``kvstate fuzz --target kvstate-api --profile dev --seed 0``)."""
    trace = "request(i=1, n=65, life=1); admit(i=1); use(i=1); append(i=1, k=32); finish(i=1)"
    assert replay(TABLE, N, parse_ops(f"{trace}; admit(i=1); use(i=1)")) is None


def test_a_variant_whose_hit_waits_on_a_load_leaves_no_request_behind() -> None:
    """A variant hitting blocks an earlier variant stored, offloaded since: its ``use`` is
    ``NotReady`` under manual pipelines, and the harness gives the request up (found by
    ``kvstate fuzz --target kvstate-api --profile dev --seed 1``)."""
    trace = "variant(n=33, p=1); tick(t=4); offload(n=4); drain(); variant(n=33, p=1)"
    assert replay(TABLE, N, parse_ops(trace)) is None


def test_a_foreign_request_whose_hit_waits_on_disk_loads_leaves_no_job_behind() -> None:
    """Another namespace's request hitting its own blocks, spilled to disk since: its loads
    are driven before its ``use`` (none is on a chain block), so the call leaves neither a
    request nor a load in flight (found by ``kvstate fuzz --target kvstate-api --profile dev
    --seed 2``)."""
    trace = "foreign(n=65, ns=0); tick(t=4); offload(n=4); drain(); spill(n=4); foreign(n=65, ns=0)"
    assert replay(TABLE, N, parse_ops(trace)) is None


def test_a_store_that_runs_out_of_swa_pages_leaves_no_claim_behind() -> None:
    """A store run whose block got its device slot but no SWA pages gave the slot back still
    claimed by the failed record, whose address was elsewhere (``BlockStore.fx_allocate``;
    found by the pool-state check, ``kvstate fuzz --target kvstate-api --remote --profile ci``)."""
    trace = (
        "request(i=0, n=48, life=1); admit(i=0); use(i=0); request(i=1, n=49, life=1); "
        "finish(i=0); admit(i=1); foreign(n=32, ns=0)"
    )
    assert replay(TABLE, N, parse_ops(trace)) is None
