"""The pytest plugin: a table's proof obligations and fuzz targets as test items.

``pytest --kvstate-spec mymod:table`` adds, beside the user's own tests:

* one item per proof obligation of ``kvstate prove`` (``kvstate/prove/<obligation>``, marker
  ``kvstate_prove``): the runner's units (``proofs/obligations.plan``), each run by
  ``proofs/obligations.run_unit``; an ``inductive/*/<action>`` item checks that action against
  every invariant (its hypotheses are built once), and its failure names the invariant;
* per fuzz target (``--kvstate-fuzz``, default the built-in allocator ``kvstate``), two items
  (marker ``kvstate_fuzz``): ``kvstate/fuzz/<target>/coverage``, the deterministic coverage
  pass of ``kvstate fuzz`` (every reachability witness replayed in lockstep, near misses
  refused), and ``kvstate/fuzz/<target>``, Hypothesis' exploration: a Hypothesis test function
  (``hypothesis.stateful.get_state_machine_test``), so ``--hypothesis-show-statistics`` reports
  it and HypoFuzz can fuzz it; a failure shows the replay-minimized trace and a
  ``kvstate fuzz --replay`` command.

So ``-k``, ``-m kvstate_prove``, ``--junitxml``, ``-n`` (pytest-xdist) and the rest of pytest
apply.  Nothing is restated: the items are the runner's units and the fuzzer's entry points.
The fuzz items run under ``--kvstate-profile`` (``ci``, derandomized, by default); with a
non-derandomized profile their examples go to Hypothesis' configured example database under
the key ``kvstate fuzz`` files them by (:mod:`kvstate.examples_db`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MARKERS = {
    "kvstate": "an item the kvstate plugin made from --kvstate-spec",
    "kvstate_prove": "a proof obligation of the --kvstate-spec table (kvstate prove)",
    "kvstate_fuzz": "a fuzz target run against the --kvstate-spec table (kvstate fuzz)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kvstate", "kvstate: a table's proof obligations and fuzz targets")
    g.addoption(
        "--kvstate-spec",
        default=None,
        metavar="SPEC",
        help="the table: a built-in spec (default, small, ...) or module:attr (a Table or a "
        "function returning one); without it the plugin adds nothing",
    )
    g.addoption("--kvstate-geometry", default=None, help="replace the table's geometry by a preset")
    g.addoption(
        "--kvstate-only",
        default=None,
        metavar="NAME",
        help="only the obligations of this invariant, action or kind (kvstate prove --only)",
    )
    g.addoption("--kvstate-depth", type=int, default=None, help="BMC depth (default 4)")
    g.addoption(
        "--kvstate-no-traces",
        action="store_true",
        help="a failed induction step reports its counterexample to induction without "
        "searching a trace from Init (faster)",
    )
    g.addoption(
        "--kvstate-fuzz",
        default="kvstate",
        metavar="TARGETS",
        help="comma-separated fuzz targets (kvstate, model, module:factory), or 'none'",
    )
    g.addoption("--kvstate-pool", type=int, default=None, help="blocks in the fuzzed chain")
    g.addoption(
        "--kvstate-bug",
        action="append",
        default=[],
        metavar="NAME",
        help="plant a seeded bug in the built-in fuzz target (repeatable)",
    )
    g.addoption(
        "--kvstate-profile",
        default="ci",
        choices=("ci", "dev", "nightly"),
        help="the fuzz items' Hypothesis profile (default ci: derandomized)",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")


class KvstateFailure(Exception):
    """A failed kvstate item, with the report to show instead of a traceback."""


class _Spec(pytest.Collector):
    """The items made from one table (a node of its own: their ids read ``kvstate/...``)."""

    def collect(self) -> list[pytest.Item]:
        return list(_items(self, self.config))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name


class ProveItem(pytest.Item):
    """One unit of ``kvstate prove``'s plan."""

    def __init__(self, *, table: Any, unit: Any, cfg: Any, only: str | None, **kw: Any) -> None:
        super().__init__(**kw)
        self.table, self.unit, self.cfg, self.only = table, unit, cfg, only

    def runtest(self) -> None:
        from kvstate.proofs.obligations import run_unit

        results = run_unit(self.table, self.unit, self.cfg, self.only)
        failed = [r for r in results if not r.ok]
        if failed:
            lines = []
            for r in failed:
                lines.append(f"{r.obligation} [{r.status}] ({r.method}; {r.scope})")
                if r.detail:
                    lines.append(f"  {r.detail}")
                if r.trace is not None:
                    lines.append(r.trace.render())
            raise KvstateFailure("\n".join(lines))

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, KvstateFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"kvstate prove {self.unit.name}"


class CoverageItem(pytest.Item):
    """``kvstate fuzz``'s deterministic coverage pass for one target."""

    def __init__(self, *, machine: Any, table: Any, replay: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.machine, self.table, self.replay = machine, table, replay

    def runtest(self) -> None:
        from kvstate.proofs.witnesses import reach_traces
        from kvstate.targets.block import replay_seeds

        replay_seeds(self.machine, self.table, reach_traces(self.table.name))

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        return _fuzz_failure(self, excinfo) or super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name


class FuzzItem(pytest.Function):
    """Hypothesis' exploration of one target: the item's function is the Hypothesis test."""

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        return _fuzz_failure(self, excinfo) or super().repr_failure(excinfo)


def _fuzz_failure(item: Any, excinfo: Any) -> str | None:
    """A conformance finding, minimized by fresh replays, as ``kvstate fuzz`` prints it."""
    from kvstate.targets.block import minimize
    from kvstate.targets.block.cli import MINIMIZE_SECONDS, _nonconformance

    found = _nonconformance(excinfo.value)
    if found is None:
        return None
    mini = minimize(item.machine, found, max_seconds=MINIMIZE_SECONDS)
    f = mini.failure
    trace = "; ".join(s.call() for s in mini.steps)
    return "\n".join(
        [
            f"failure: {f.signature}",
            "  " + str(f).replace("\n", "\n  "),
            f"found by: {found.origin or 'Hypothesis'}; minimized {mini.before} -> {mini.after}"
            " steps (fresh replays)",
            "trace (from Init):",
            *(f"  {i:>3}. {s.render()}" for i, s in enumerate(mini.steps, 1)),
            f"replay: {item.replay} --replay '{trace}'",
        ]
    )


def _table(config: pytest.Config) -> Any:
    from kvstate.cli import _load_table
    from kvstate.spec.errors import SpecError

    spec = config.getoption("kvstate_spec")
    try:
        table = _load_table(spec)
        geometry = config.getoption("kvstate_geometry")
        if geometry:
            from kvstate.spec import preset

            table = table.with_geometry(preset(geometry))
    except SpecError as exc:
        raise pytest.Collector.CollectError(f"--kvstate-spec {spec}: {exc}") from None
    return table


def _items(root: _Spec, config: pytest.Config) -> Iterator[pytest.Item]:
    from kvstate.proofs.obligations import Config, plan

    table = _table(config)
    spec = config.getoption("kvstate_spec")
    depth, only = config.getoption("kvstate_depth"), config.getoption("kvstate_only")
    cfg = Config(
        **({} if depth is None else {"depth": depth}),
        find_traces=not config.getoption("kvstate_no_traces"),
    )
    try:
        units = plan(table, cfg, only)
    except Exception as exc:  # noqa: BLE001 - a table the planner cannot read is a usage error
        raise pytest.Collector.CollectError(f"--kvstate-spec {spec}: {exc}") from None
    if only and not units:
        raise pytest.Collector.CollectError(f"--kvstate-only {only!r} matches no obligation")
    for u in units:
        item = ProveItem.from_parent(
            root, name=f"prove/{u.name}", table=table, unit=u, cfg=cfg, only=only
        )
        for m in ("kvstate", "kvstate_prove"):
            item.add_marker(m)
        yield item
    targets = [t for t in config.getoption("kvstate_fuzz").split(",") if t.strip()]
    if targets != ["none"]:
        yield from _fuzz_items(root, config, table, spec, [t.strip() for t in targets])


def _fuzz_items(
    root: _Spec, config: pytest.Config, table: Any, spec: str, targets: list[str]
) -> Iterator[pytest.Item]:
    from hypothesis import Phase, settings

    from kvstate.examples_db import database_key, machine_test
    from kvstate.proofs.witnesses import reach_traces
    from kvstate.spec.errors import SpecError
    from kvstate.targets.block import build_state_machine
    from kvstate.targets.block.cli import resolve_target

    bugs = config.getoption("kvstate_bug")
    n = config.getoption("kvstate_pool") or table.geometry.model_blocks
    base = settings.get_profile(config.getoption("kvstate_profile"))
    # as `kvstate fuzz`: findings are minimized by fresh replays, not by Hypothesis' shrinker
    prof = settings(base, phases=tuple(p for p in base.phases if p is not Phase.shrink))
    for target in targets:
        try:
            factory = resolve_target(target, bugs if target == "kvstate" else [])
        except SpecError as exc:
            raise pytest.Collector.CollectError(f"--kvstate-fuzz {target}: {exc}") from None
        cls: Any = build_state_machine(table, n, factory, seed_traces=reach_traces(table.name))
        key = database_key(target, table.name, table.geometry.name, n, bugs)
        replay = " ".join(
            ["kvstate fuzz", "--spec", spec, "--target", target, "--pool", str(n)]
            + [f"--bug {b}" for b in (bugs if target == "kvstate" else [])]
        )
        cov = CoverageItem.from_parent(
            root, name=f"fuzz/{target}/coverage", machine=cls, table=table, replay=replay
        )
        test = machine_test(cls, prof, key)
        hyp = FuzzItem.from_parent(root, name=f"fuzz/{target}", callobj=test)
        hyp.machine, hyp.replay = cls, replay  # type: ignore[attr-defined]
        for item in (cov, hyp):
            for m in ("kvstate", "kvstate_fuzz"):
                item.add_marker(m)
            yield item


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """The table's node joins what the session collects (then ``-k``/``-m`` select as usual)."""
    rep = yield
    if (
        isinstance(collector, pytest.Session)
        and collector.config.getoption("kvstate_spec")
        and rep.passed
    ):
        rep.result.append(_Spec.from_parent(collector, name="kvstate", nodeid="kvstate"))
    return rep
