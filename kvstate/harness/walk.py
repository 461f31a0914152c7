"""The one run loop of an engine target: explore per configuration, minimize, report.

An engine target (vLLM's ``KVCacheManager``, vLLM's ``Scheduler``, SGLang's cache) supplies an
:class:`Engine`: its configurations, a driver that runs one :class:`TraceStep` at a time on a
fresh system and raises :class:`Nonconformance` when a check fails, how a step is drawn, and
what its report and reproducer add.  This module does the rest the same way for each: one
Hypothesis state machine per configuration (its share of the profile's examples, the pinned
ci seed), the first finding cut down by the toolkit's minimizer
(:func:`~kvstate.harness.ddmin.shrink`) on fresh drivers, its reproducer written, the report
printed (``kvstate fuzz``'s command line around it: :mod:`kvstate.targets.engine`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from .ddmin import shrink
from .finding import Nonconformance, find_in
from .profiles import SIZES, for_target, pin, seed_only, show
from .report import field_lines, finding_lines
from .trace import TraceStep


class Driver(Protocol):
    """One fresh system of one configuration and what it did."""

    config: Any
    trace: list[TraceStep]  # the steps run so far, as run (resolved), the failing one included
    code: list[str]  # the same steps as lines of the standalone reproducer

    def run_op(self, i: int, op: TraceStep) -> None: ...


@dataclass(frozen=True)
class Engine:
    """What one engine target supplies to the loop."""

    name: str  # its ``--target`` name and its row of ``profiles.SIZES``
    product: str  # the engine's name in the report's first line ("vLLM")
    ci_seed: int  # the seed the derandomized ci walks follow (printed)
    configs: tuple[Any, ...]  # each with a ``label``
    load: Callable[[], str]  # imports the engine, returns the release that runs; or raises
    unavailable: type[Exception]  # what ``load`` raises without the engine
    install: str  # the command that installs it, for the error line
    driver: Callable[[Any, Any, Any], Driver]  # (config, stats or None, hook) -> a fresh driver
    stats: Callable[[], Any]  # a fresh counter set (``configs``, ``steps`` at least)
    draw: Callable[[random.Random, Driver], TraceStep]  # one step, from the rule's generator
    lines: Callable[[Report], list[str]]  # the report's coverage lines
    reproducer: Callable[[Any, Driver, Nonconformance | None], str]  # from a replay's driver
    salt: Callable[[Any], int] = lambda config: 0  # per configuration, added to each draw's seed
    parse: Callable[[str], list[TraceStep]] | None = None  # ``--replay``'s trace, when it has one
    fresh: str = "a fresh system"  # where a trace starts, in the report
    close: Callable[[Driver], None] | None = None  # run after every driver (threads, files)
    # ``--coverage``: a fresh measurer of the engine's own code, with ``measure(label)`` (a
    # context around one configuration's exploration) and ``lines()`` (the report's lines)
    coverage: Callable[[], Any] | None = None

    def closing(self, d: Driver) -> None:
        """The engine's ``close`` on ``d`` (nothing when it has none)."""
        if self.close is not None:
            self.close(d)

    def replay(
        self, config: Any, ops: list[TraceStep], hook: Any = None
    ) -> tuple[Nonconformance | None, Driver]:
        """``ops`` on a fresh driver of ``config`` (:func:`replay`)."""
        return replay(self, config, ops, hook)

    def config_named(self, label: str) -> Any:
        """The configuration labelled ``label``; ValueError if none is."""
        for c in self.configs:
            if c.label == label:
                return c
        known = ", ".join(c.label for c in self.configs)
        raise ValueError(
            f"--config: {label!r} is not a {self.product} configuration; known: {known}"
        )


@dataclass
class Report:
    """One run: what ran, the findings (one per configuration at most), the first minimized."""

    engine: Engine
    profile: str
    stats: Any
    version: str = ""  # the engine's release whose code ran
    ok: bool = True
    seconds: float = 0.0
    findings: list[tuple[Any, Nonconformance]] = field(default_factory=list)
    finding: Nonconformance | None = None  # the first finding, as its minimized trace fails
    trace: list[TraceStep] = field(default_factory=list)  # its minimized trace
    config: Any = None
    reproducer: str = ""
    original_length: int = 0
    skipped: dict[str, str] = field(default_factory=dict)  # configuration -> why not built
    seed: int | None = None  # None: the pinned ci seed (derandomized)
    sizes: tuple[int, int] = (0, 0)  # examples, steps per example
    replays: int = 0  # fresh replays the minimizer ran
    minimize_seconds: float = 0.0
    code: Any = None  # the engine's coverage measurer when the run measured its code

    @property
    def steps_per_second(self) -> float:
        return self.stats.steps / self.seconds if self.seconds else 0.0

    def seed_text(self) -> str:
        if self.seed is None:
            return f"{show(self.engine.ci_seed)} (pinned, derandomized)"
        return str(self.seed)

    def render(self, commands: dict[str, str] | None = None) -> str:
        e, s = self.engine, self.stats
        lines = [
            f"kvstate fuzz --target {e.name}: {e.product} {self.version}, profile {self.profile} "
            f"({self.sizes[0]} examples x {self.sizes[1]} steps), seed {self.seed_text()}",
            f"  configurations exercised ({len(s.configs)}): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(s.configs.items())),
            *[f"  not buildable on this release: {k} ({v})" for k, v in self.skipped.items()],
            *e.lines(self),
            f"  {s.steps} steps in {self.seconds:.1f} s ({self.steps_per_second:.0f} steps/s)",
            *(self.code.lines() if self.code is not None else ()),
        ]
        if self.ok:
            lines.append("  verdict: PASS (no check failed)")
            return "\n".join(lines)
        f = self.finding
        assert f is not None and self.config is not None
        how = (
            f"minimized {self.original_length} -> {len(self.trace)} steps"
            f" ({self.replays} fresh replays, {self.minimize_seconds:.1f} s)"
        )
        lines += [
            f"  verdict: FAIL ({len(self.findings)} configuration(s) with a finding: "
            + ", ".join(f"{c.label} [{x.kind}]" for c, x in self.findings)
            + ")",
            *finding_lines(
                f, how, self.trace, start=e.fresh, unit="operation", replayable=e.parse is not None
            ),
            f"  seed:      {self.seed_text()}",
            *field_lines(commands or {}),
            "",
            f"# ---- standalone reproducer (needs only {e.product}) ----",
            self.reproducer,
        ]
        return "\n".join(lines)


def replay(
    engine: Engine, config: Any, ops: list[TraceStep], hook: Any = None
) -> tuple[Nonconformance | None, Driver]:
    """``ops`` on a fresh driver of ``config``: the finding they raise (or None), the driver
    (closed: the engine's ``close`` has run on it)."""
    d = engine.driver(config, None, hook)
    try:
        for i, op in enumerate(ops):
            try:
                d.run_op(i, op)
            except Nonconformance as f:
                if not f.trace:
                    f.trace = list(d.trace)
                return f, d
        return None, d
    finally:
        engine.closing(d)


def minimize(
    engine: Engine, config: Any, original: Nonconformance, hook: Any = None
) -> tuple[list[TraceStep], int]:
    """Delta debugging over the finding's trace (as run: each step names the request it acted
    on, so deleting an arrival does not redirect later steps), keeping candidates that fail the
    same way (:meth:`Nonconformance.same_as`) on a fresh driver, as that driver ran them (cut
    after the failing step).  Returns the smallest and the number of fresh replays."""
    replays = 0

    def fails(cand: list[TraceStep]) -> tuple[list[TraceStep], None] | None:
        nonlocal replays
        replays += 1
        f, d = replay(engine, config, cand, hook)
        return (list(d.trace), None) if f is not None and f.same_as(original) else None

    return shrink(original.trace, fails, None)[0], replays


def _machine(engine: Engine, config: Any, hook: Any, stats: Any, sink: dict[str, Any]) -> type:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

    salt = engine.salt(config)

    class EngineMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.d: Driver | None = None
            self.ops: list[TraceStep] = []

        @initialize()
        def build(self) -> None:
            self.d = engine.driver(config, stats, hook)
            stats.configs[config.label] += 1

        def teardown(self) -> None:
            if self.d is not None:
                engine.closing(self.d)

        @rule(seed=st.integers(0, 2**32 - 1))
        def act(self, seed: int) -> None:
            """One engine call; the draw's seed picks the operation and its arguments with
            traffic-like weights (the target's ``draw``)."""
            assert self.d is not None
            rng = random.Random(seed * 1_000_003 + len(self.ops) + salt)  # varied even at 0
            op = engine.draw(rng, self.d)
            self.ops.append(op)
            try:
                self.d.run_op(len(self.ops) - 1, op)
            except Nonconformance as f:
                if not f.trace:
                    f.trace = list(self.d.trace)
                f.origin = f"Hypothesis, configuration {config.label}"
                sink["finding"] = f
                raise

    return EngineMachine


def run(
    engine: Engine,
    profile: str = "ci",
    *,
    configs: tuple[Any, ...] | None = None,
    examples: int | None = None,
    steps: int | None = None,
    seed: int | None = None,
    minimize_findings: bool = True,
    hook: Any = None,
    code_coverage: bool = False,
) -> Report:
    """Fuzz ``engine``: each configuration its share of the profile's examples.

    ``seed``: the walks' seed (default: the ci profile's pinned seed, derandomized; a random one
    for dev and nightly).  ``hook`` goes to every driver (a test's broken engine class).  Raises
    ValueError for an unknown profile (:func:`kvstate.targets.engine.run` raises the
    documented ``InvalidArgument``) and the engine's ``unavailable`` (an ``ImportError``)
    without it.  ``code_coverage``: the engine's ``coverage`` measures each configuration's
    exploration (ValueError for an engine without one).
    """
    sizes = SIZES[engine.name]
    if profile not in sizes:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(sizes)}")
    if code_coverage and engine.coverage is None:
        raise ValueError(f"--coverage: the {engine.name} target does not measure its engine's code")
    version = engine.load()
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.errors import Flaky
    from hypothesis.stateful import run_state_machine_as_test

    n_ex, n_steps = sizes[profile]
    configs = configs or engine.configs
    per = max(1, (examples or n_ex) // len(configs))
    if seed is None and profile != "ci":
        seed = random.randrange(2**32)
    stats = engine.stats()
    report = Report(engine, profile, stats, version=version, seed=seed)
    report.sizes = (examples or n_ex, steps or n_steps)
    if code_coverage and engine.coverage is not None:
        report.code = engine.coverage()
    t0 = time.monotonic()
    for cfg in configs:
        try:
            probe = engine.driver(cfg, None, hook)  # one this release cannot build is skipped
            engine.closing(probe)
        except engine.unavailable:
            raise
        except Exception as e:  # noqa: BLE001 - moved or renamed classes of an older release
            report.skipped[cfg.label] = f"{type(e).__name__}: {e}"
            continue
        sink: dict[str, Any] = {}
        machine = _machine(engine, cfg, hook, stats, sink)
        s = settings(
            for_target(engine.name, profile),
            max_examples=per,
            stateful_step_count=steps or n_steps,
            derandomize=seed is None,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )
        pin(machine, engine.ci_seed if seed is None else seed)  # the walks follow the seed
        try:
            measure = report.code.measure(cfg.label) if report.code is not None else nullcontext()
            with seed_only(), measure:  # seed_only: the walks follow the seed (profiles.py)
                run_state_machine_as_test(machine, settings=s)
        except Exception as exc:  # noqa: BLE001 - a finding ends this configuration
            # Hypothesis replays a failing example once; where the finding rests on what the
            # engine's allocator hands out (a buffer's address: ``addresses``), the replay can
            # fail a step earlier or later and Hypothesis reports its draws as flaky.  The
            # finding the check recorded stands: ``finish`` reproduces and minimizes it itself.
            replayed = isinstance(exc, Flaky)
            if (find_in(exc) is None and not replayed) or "finding" not in sink:
                raise
            report.findings.append((cfg, sink["finding"]))
    report.seconds = time.monotonic() - t0
    if report.findings:
        finish(report, *report.findings[0], hook, minimize_findings)
    return report


def finish(
    report: Report, cfg: Any, f: Nonconformance, hook: Any = None, minimize_findings: bool = True
) -> None:
    """``report`` failed with ``f`` on ``cfg``: minimized, its reproducer written."""
    e = report.engine
    report.ok = False
    report.original_length = len(f.trace)
    report.config = cfg
    ops = f.trace
    t0 = time.monotonic()
    if minimize_findings:
        ops, report.replays = minimize(e, cfg, f, hook)
    report.minimize_seconds = time.monotonic() - t0
    report.trace = ops
    f2, d = replay(e, cfg, ops, hook)
    report.reproducer = e.reproducer(cfg, d, f2)
    report.finding = f2 or f
    report.finding.origin = f.origin
