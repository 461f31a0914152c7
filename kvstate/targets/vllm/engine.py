"""``kvstate fuzz --target vllm``: a Hypothesis state machine over vLLM's ``KVCacheManager``.

Each example picks a configuration (group layout, EAGLE on or off, a pool small enough to
evict), builds a fresh manager from vLLM's own classes, and runs rules that call the manager
the way the scheduler does: arrivals sharing prefixes, admission (``get_computed_blocks`` then
``allocate_slots``, with a KV connector's external tokens), chunked prefill, decode and EAGLE
steps, preemption, ``free``, ``cache_blocks``, ``remove_skipped_blocks``, ``evict_blocks``,
``reset_prefix_cache`` and re-sent prompts.  After every call the table's rules, projected onto
what vLLM exposes (``checks``), are checked.  A failure is cut down by replaying shorter
traces on fresh managers and printed as a standalone Python reproducer.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from kvstate.harness.coverage import summary
from kvstate.harness.ddmin import ddmin
from kvstate.harness.finding import Nonconformance
from kvstate.harness.profiles import SIZES, for_target, pin, seed_only, show
from kvstate.harness.report import finding_lines
from kvstate.harness.trace import TraceStep

from . import imports as vllm_import
from .codecov import measured
from .configs import ALL, Config
from .driver import TOKENS_SRC, Driver, Stats
from .ops import NAMES, draw_op
from .tenants import TENANTS

PROFILES = SIZES["vllm"]  # the toolkit's profiles, sized for this target (examples x steps)

# The seed of the derandomized ci runs, pinned (printed in the report): the one Hypothesis
# derived from ``VLLMMachine``'s source before the seed was pinned, so ci draws what it drew.
CI_SEED = int(
    "cff787afdbcb92a52b4f8890079bebea523d833ac51d6aacbc38c3636319c7cc"
    "f0e8503a1a0bccfd462030cc086ea925",
    16,
)


@dataclass
class Report:
    """One run: what ran, the findings (one per configuration at most), the first minimized."""

    ok: bool
    profile: str
    seconds: float
    stats: Stats
    finding: Nonconformance | None = None  # the first finding, as its minimized trace fails
    trace: list[TraceStep] = field(default_factory=list)  # its minimized trace
    config: Config | None = None
    reproducer: str = ""
    original_length: int = 0
    vllm_version: str = ""  # the release whose code ran (imports.loaded())
    findings: list[tuple[Config, Nonconformance]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # configuration -> why not built
    seed: int | None = None  # None: the pinned ci seed (derandomized)
    sizes: tuple[int, int] = (0, 0)  # examples, steps per example
    replays: int = 0  # fresh replays the minimizer ran
    minimize_seconds: float = 0.0
    code: Any = None  # codecov.VllmCoverage when the run measured vLLM's lines (--coverage)

    @property
    def steps_per_second(self) -> float:
        return self.stats.steps / self.seconds if self.seconds else 0.0

    def seed_text(self) -> str:
        return f"{show(CI_SEED)} (pinned, derandomized)" if self.seed is None else str(self.seed)

    def render(self, commands: dict[str, str] | None = None) -> str:
        s = self.stats
        lines = [
            f"kvstate fuzz --target vllm: vLLM {self.vllm_version}, profile {self.profile} "
            f"({self.sizes[0]} examples x {self.sizes[1]} steps), seed {self.seed_text()}",
            f"  configurations exercised ({len(s.configs)}): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(s.configs.items())),
            *[f"  not buildable on this release: {k} ({v})" for k, v in self.skipped.items()],
            "  calls: " + ", ".join(f"{k} {v}" for k, v in sorted(s.calls.items())),
            "  checks evaluated: " + ", ".join(f"{k} {v}" for k, v in sorted(s.checks.items())),
            f"  {s.steps} steps in {self.seconds:.1f} s ({self.steps_per_second:.0f} steps/s)",
            *summary("operation counts", s.ops, NAMES),
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
            *finding_lines(f, how, self.trace, start="a fresh manager", unit="operation"),
            f"  seed:      {self.seed_text()}",
            *[f"  {k + ':':<10} {v}" for k, v in (commands or {}).items()],
            "",
            "# ---- standalone reproducer (paste into a vLLM issue) ----",
            self.reproducer,
        ]
        return "\n".join(lines)


def replay(
    config: Config, ops: list[TraceStep], manager_cls: Any = None
) -> tuple[Nonconformance | None, Driver]:
    """``ops`` on a fresh manager of ``config``: the finding they raise (or None), the driver."""
    d = Driver(config, manager_cls)
    for i, op in enumerate(ops):
        try:
            d.run_op(i, op)
        except Nonconformance as f:
            return f, d
    return None, d


def minimize(
    config: Config, original: Nonconformance, manager_cls: Any = None
) -> tuple[list[TraceStep], int]:
    """The toolkit's delta debugging over the finding's (resolved) trace, keeping candidates
    that fail the same way (:meth:`Nonconformance.same_as`) on a fresh manager; returns the
    smallest and the number of fresh replays.

    The trace is *resolved* (each step names the request it acted on), so deleting an arrival
    does not redirect later steps to another request.
    """
    replays = 0

    def fails(cand: list[TraceStep]) -> tuple[list[TraceStep], None] | None:
        nonlocal replays
        replays += 1
        f, _ = replay(config, cand, manager_cls)
        ok = cand and f is not None and f.same_as(original)
        return (cand[: len(f.trace)], None) if ok and f is not None else None

    return ddmin(original.trace, fails, None)[0], replays


def reproducer(
    config: Config, ops: list[TraceStep], manager_cls: Any = None
) -> tuple[str, Nonconformance | None]:
    """The standalone Python reproducer of ``ops`` on ``config`` and the finding they raise."""
    f, d = replay(config, ops, manager_cls)
    head = [
        f"# vLLM {vllm_import.loaded()} KVCacheManager, configuration {config.label};",
        "# found by kvstate fuzz --target vllm. Runs on a CPU: no model, GPU or scheduler.",
        config.source.rstrip(),
        TOKENS_SRC.rstrip(),
        "",
    ]
    tail = []
    if f is not None:
        tail = ["", "# The last call breaks:"] + [f"#   {line}" for line in str(f).splitlines()]
    return "\n".join(head + d.code + tail), f


def _machine(
    configs: tuple[Config, ...], manager_cls: Any, stats: Stats, sink: dict[str, Any]
) -> type:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

    class VLLMMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.d: Driver | None = None
            self.ops: list[TraceStep] = []

        @initialize(config=st.sampled_from(configs))
        def build(self, config: Config) -> None:
            self.d = Driver(config, manager_cls, stats)
            stats.configs[config.label] += 1

        def _run(self, op: TraceStep) -> None:
            assert self.d is not None
            self.ops.append(op)
            try:
                self.d.run_op(len(self.ops) - 1, op)
            except Nonconformance as f:
                f.origin = f"Hypothesis, configuration {self.d.config.label}"
                sink.update(finding=f, config=self.d.config)
                raise

        def _L(self) -> int:
            assert self.d is not None
            return self.d.geo.L

        @rule(seed=st.integers(0, 2**32 - 1))
        def act(self, seed: int) -> None:
            """One scheduler-like call; the draw's seed picks the operation and its arguments
            with traffic-like weights (arrivals, admissions and steps dominate)."""
            rng = random.Random(seed * 1_000_003 + len(self.ops))  # varied even at seed 0
            op = draw_op(rng.random, rng.randrange, self._L())
            if op.action == "arrive" and self.d is not None and self.d.tenants:
                op.inputs["tenant"] = rng.randrange(TENANTS)  # drawn after: others unchanged
            self._run(op)

    return VLLMMachine


def run(
    target: str = "vllm",
    profile: str = "ci",
    *,
    manager_cls: Any = None,
    configs: tuple[Config, ...] | None = None,
    examples: int | None = None,
    steps: int | None = None,
    seed: int | None = None,
    minimize_findings: bool = True,
    code_coverage: bool = False,
) -> Report:
    """Fuzz vLLM's KV cache manager; ``manager_cls`` points it at any (patched) manager class.
    ``code_coverage``: measure vLLM's allocation files per configuration (``codecov``).

    ``seed``: the walks' seed (default: the ci profile's pinned ``CI_SEED``, derandomized; a
    random one for dev and nightly).  Raises ``kvstate.impl.errors.InvalidArgument`` (a
    ``KVStateError`` and ``ValueError``) for an unknown target or profile, and
    ``VLLMUnavailable`` (an ``ImportError``) without vLLM.
    """
    from kvstate.impl.errors import InvalidArgument

    if target != "vllm":
        raise InvalidArgument(f"unknown engine target {target!r}")
    if profile not in PROFILES:
        raise InvalidArgument(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    vllm_import.load("vllm.v1.core.kv_cache_manager")
    import logging

    logging.getLogger("vllm").setLevel(logging.ERROR)
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    n_ex, n_steps = PROFILES[profile]
    configs = configs or ALL
    # Every configuration gets its share: one state machine run per configuration.
    per = max(1, (examples or n_ex) // len(configs))
    if seed is None and profile != "ci":
        seed = random.randrange(2**32)
    stats = Stats()
    sink: dict[str, Any] = {}
    t0 = time.monotonic()
    report = Report(True, profile, 0.0, stats, vllm_version=vllm_import.loaded(), seed=seed)
    report.sizes = (examples or n_ex, steps or n_steps)
    if code_coverage:
        from .codecov import VllmCoverage

        report.code = VllmCoverage()
    for cfg in configs:
        try:
            Driver(cfg, manager_cls)  # a layout this release cannot build is reported, not run
        except Exception as e:  # noqa: BLE001 - older releases lack some spec classes
            report.skipped[cfg.label] = f"{type(e).__name__}: {e}"
            continue
        machine = _machine((cfg,), manager_cls, stats, sink)
        s = settings(
            for_target("vllm", profile),
            max_examples=per,
            stateful_step_count=steps or n_steps,
            derandomize=seed is None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        pin(machine, CI_SEED if seed is None else seed)  # the walks follow the seed, not the source
        try:
            with seed_only(), measured(report.code, cfg.label):  # seed_only: profiles.py
                run_state_machine_as_test(machine, settings=s)
        except Exception:  # noqa: BLE001 - a finding (or a crash inside vLLM) ends this config
            if "finding" not in sink:
                raise
            report.findings.append((sink.pop("config"), sink.pop("finding")))
    report.seconds = time.monotonic() - t0
    if report.findings:
        finish(report, *report.findings[0], manager_cls, minimize_findings)
    return report


def finish(
    report: Report, cfg: Config, f: Nonconformance, manager_cls: Any, minimize_findings: bool
) -> None:
    """``report`` failed with ``f`` on ``cfg``: minimized, its reproducer written."""
    report.ok = False
    report.original_length = len(f.trace)
    report.config = cfg
    ops = f.trace
    t0 = time.monotonic()
    if minimize_findings:
        ops, report.replays = minimize(cfg, f, manager_cls)
    report.minimize_seconds = time.monotonic() - t0
    report.trace = ops
    report.reproducer, f2 = reproducer(cfg, ops, manager_cls)
    report.finding = f2 or f
    report.finding.origin = f.origin


def _command(args: Any, *extra: str) -> str:
    import shlex

    out = ["kvstate", "fuzz", "--target", "vllm", "--profile", args.profile]
    for flag in ("seed", "examples", "steps"):
        if getattr(args, flag, None) is not None:
            out += [f"--{flag}", str(getattr(args, flag))]
    return " ".join(shlex.quote(x) for x in [*out, *extra])


def config_named(label: str | None) -> Config:
    """The configuration labelled ``label`` (``mamba+eagle/pool24``); ValueError if none is."""
    for c in ALL:
        if c.label == label:
            return c
    known = ", ".join(c.label for c in ALL)
    raise ValueError(f"--config: {label!r} is not a vLLM configuration; known: {known}")


def _replay_cli(args: Any) -> Report:
    """``--replay TRACE --config LABEL``: the trace on a fresh manager, reported as a run."""
    from kvstate.calls import parse_calls

    from .ops import parse

    text = args.replay
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as fh:
            text = fh.read()
    cfg = config_named(getattr(args, "config", None))
    steps = parse(parse_calls(text))
    vllm_import.load("vllm.v1.core.kv_cache_manager")
    t0 = time.monotonic()
    f, d = replay(cfg, steps)
    report = Report(f is None, args.profile, time.monotonic() - t0, d.stats)
    report.vllm_version, report.seed = vllm_import.loaded(), getattr(args, "seed", None)
    report.sizes = (1, len(steps))
    d.stats.configs[cfg.label] += 1
    if f is not None:
        f.origin = f"replay of the given trace, configuration {cfg.label}"
        report.findings.append((cfg, f))
        finish(report, cfg, f, None, True)
    return report


def run_cli(args: Any, table: Any = None) -> int:
    """``kvstate fuzz --target vllm``: exit 0 pass, 1 a finding, 2 vLLM missing or bad usage.

    ``--config LABEL`` runs one configuration; ``--replay TRACE --config LABEL`` replays a
    printed trace on it.  The run writes the reports every target writes (``--json``,
    ``--junit``, ``--sarif``, ``--github-annotations``)."""
    import sys

    from kvstate.fuzz_report import Outcome, emit

    label = getattr(args, "config", None)
    try:
        if getattr(args, "replay", None) is not None:
            report = _replay_cli(args)
        else:
            report = run(
                "vllm",
                args.profile,
                configs=(config_named(label),) if label else None,
                examples=getattr(args, "examples", None),
                steps=getattr(args, "steps", None),
                seed=getattr(args, "seed", None),
                code_coverage=bool(getattr(args, "code_coverage", False)),
            )
    except vllm_import.VLLMUnavailable as e:
        print(f"kvstate fuzz: error: {e} (install it with tools/install_vllm.sh)", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"kvstate fuzz: error: {e}", file=sys.stderr)
        return 2
    commands: dict[str, str] = {}
    if not report.ok and report.config is not None:
        trace = "; ".join(s.call() for s in report.trace)
        if getattr(args, "replay", None) is None:
            commands["rerun"] = _command(args)
        commands["replay"] = _command(args, "--config", report.config.label, "--replay", trace)
    print(report.render(commands))
    o = Outcome(
        target="vllm",
        table=getattr(table, "name", "default"),
        geometry=report.config.label if report.config else "",
        pool=report.config.num_blocks if report.config else 0,
        profile=args.profile,
        seed=report.seed,
        ok=report.ok,
        seconds=report.seconds,
        steps=report.stats.steps,
        examples=sum(report.stats.configs.values()),
    )
    if report.finding is not None:
        f = report.finding
        o.kind, o.detail, o.message, o.origin = f.kind, f.detail, str(f), f.origin
        o.trace, o.commands = [s.call() for s in report.trace], commands
    emit(args, o)
    return 0 if report.ok else 1
