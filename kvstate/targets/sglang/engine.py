"""``kvstate fuzz --target sglang``: a Hypothesis state machine over SGLang's unified radix cache.

Each configuration (layout, tree core, page and window, pool size) gets its share of examples;
each example builds a fresh stack from SGLang's own classes on ``device="cpu"`` and runs
operations the way SGLang's scheduler issues them (``ops.py``), checking the table's projection
after each (``checks.py``, ``driver.py``).  A failure is cut down by the toolkit's delta
debugging, replaying shorter traces on fresh stacks, and printed as a standalone reproducer
that needs only SGLang.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from kvstate.harness.coverage import summary
from kvstate.harness.ddmin import ddmin
from kvstate.harness.profiles import SIZES, pin, seed_only, show

from . import imports as sglang_import
from .configs import ALL, Config
from .driver import NAMES, Driver, Finding, Op, Stats, draw_op
from .ops import SOURCE as OPS_SOURCE

PROFILES = SIZES["sglang"]  # the toolkit's profiles, sized for this target (examples x steps)
CI_SEED = 0x5C1A06  # the derandomized ci walks follow this seed (printed in the report)


@dataclass
class Report:
    ok: bool
    profile: str
    seconds: float
    stats: Stats
    finding: Finding | None = None
    trace: list[Op] = field(default_factory=list)
    config: Config | None = None
    reproducer: str = ""
    original_length: int = 0
    version: str = ""
    findings: list[tuple[Config, Finding, list[Op]]] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def render(self) -> str:
        s = self.stats
        lines = [
            f"kvstate fuzz --target sglang: SGLang {self.version}, profile {self.profile}"
            + (f", seed {show(CI_SEED)} (pinned, derandomized)" if self.profile == "ci" else ""),
            f"  configurations exercised ({len(s.configs)}): "
            + ", ".join(f"{k} x{v}" for k, v in sorted(s.configs.items())),
            *[f"  not buildable here: {k} ({v})" for k, v in self.skipped.items()],
            *summary("  operations that acted", s.calls, NAMES),
            "  operations with nothing to act on: "
            + ", ".join(f"{k} {v}" for k, v in sorted(s.idle.items())),
            "  paths reached: " + ", ".join(f"{k} {v}" for k, v in sorted(s.paths.items())),
            "  checks evaluated: " + ", ".join(f"{k} {v}" for k, v in sorted(s.checks.items())),
            f"  {s.steps} steps in {self.seconds:.1f} s",
        ]
        if self.ok:
            lines.append("  verdict: PASS (no check failed)")
            return "\n".join(lines)
        f = self.finding
        assert f is not None and self.config is not None
        lines += [
            f"  verdict: FAIL ({len(self.findings)} configuration(s) with a finding: "
            + ", ".join(f"{c.label} [{x.kind}]" for c, x, _ in self.findings)
            + ")",
            f"  first finding [{f.kind}] on {self.config.label}",
            f"  minimized {self.original_length} -> {len(self.trace)} operations",
            *[f"    [{v.check}] {v.message}" for v in f.violations],
            "  trace: " + " ; ".join(repr(op) for op in self.trace),
            "",
            "# ---- standalone reproducer (needs only SGLang) ----",
            self.reproducer,
        ]
        return "\n".join(lines)


def replay(config: Config, ops: list[Op], patch: Any = None) -> tuple[Finding | None, Driver]:
    d = Driver(config, patch=patch)
    try:
        for i, op in enumerate(ops):
            try:
                d.run_op(i, op)
            except Finding as f:
                return f, d
        return None, d
    finally:
        d.ns["close"](d.st)


def minimize(config: Config, ops: list[Op], kind: str, patch: Any = None) -> list[Op]:
    """The toolkit's delta debugging over the operations, keeping what fails the same way."""

    def fails(cand: list[Op]) -> tuple[list[Op], None] | None:
        f, _ = replay(config, cand, patch)
        return (cand[: f.step + 1], None) if cand and f is not None and f.kind == kind else None

    return ddmin(ops, fails, None)[0]


def reproducer(config: Config, ops: list[Op], patch: Any = None) -> tuple[str, Finding | None]:
    f, d = replay(config, ops, patch)
    head = [
        f"# SGLang {sglang_import.version()} unified radix cache, configuration {config.label};",
        "# found by kvstate fuzz --target sglang. Runs on a CPU: no model, GPU or scheduler loop.",
        "# Run it from a directory without a kernels/ package (transformers imports that name).",
        "# SGLang's configs import torchvision; without it installed, run this file through",
        '#   python -c "import kvstate.targets.sglang.imports as i; i.load(); '
        "exec(open('repro.py').read())\"",
        config.source.rstrip(),
        OPS_SOURCE.rstrip(),
        "",
    ]
    tail = []
    if f is not None:
        tail = ["", "# The last call breaks:"] + [
            f"#   [{v.check}] {v.message}" for v in f.violations
        ]
    return "\n".join(head + d.code + tail), f


def _machine(config: Config, stats: Stats, sink: dict[str, Any], patch: Any) -> type:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

    class SGLangMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.d: Driver | None = None
            self.ops: list[Op] = []

        @initialize()
        def build(self) -> None:
            self.d = Driver(config, stats, patch)
            stats.configs[config.label] += 1

        def teardown(self) -> None:
            if self.d is not None:
                self.d.ns["close"](self.d.st)

        @rule(seed=st.integers(0, 2**32 - 1))
        def act(self, seed: int) -> None:
            """One scheduler-like call; the draw's seed picks the operation and its arguments."""
            assert self.d is not None
            rng = random.Random(seed * 1_000_003 + len(self.ops))
            op = draw_op(rng.random, rng.randrange, config.page, config.max_len, config.hicache)
            self.ops.append(op)
            try:
                self.d.run_op(len(self.ops) - 1, op)
            except Finding as f:
                sink.update(finding=f, ops=list(self.ops), config=config)
                raise

    return SGLangMachine


def run(
    profile: str = "ci",
    *,
    configs: tuple[Config, ...] | None = None,
    examples: int | None = None,
    steps: int | None = None,
    patch: Any = None,
    minimize_findings: bool = True,
) -> Report:
    """Fuzz SGLang's cache; ``patch(driver)`` may break a method of the built stack (tests).

    Raises ``kvstate.impl.errors.InvalidArgument`` (a ``ValueError``) for an unknown profile
    and ``SGLangUnavailable`` (an ``ImportError``) without SGLang.
    """
    from kvstate.impl.errors import InvalidArgument

    if profile not in PROFILES:
        raise InvalidArgument(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    sglang_import.load()
    import logging

    logging.getLogger("sglang").setLevel(logging.ERROR)
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    n_ex, n_steps = PROFILES[profile]
    configs = configs or ALL
    per = max(1, (examples or n_ex) // len(configs))
    stats = Stats()
    sink: dict[str, Any] = {}
    t0 = time.monotonic()
    report = Report(True, profile, 0.0, stats, version=sglang_import.version())
    for cfg in configs:
        try:
            probe = Driver(cfg)  # a stack this release cannot build is reported, not run
            probe.ns["close"](probe.st)
        except Exception as e:  # noqa: BLE001 - moved or renamed classes
            report.skipped[cfg.label] = f"{type(e).__name__}: {e}"
            continue
        machine = _machine(cfg, stats, sink, patch)
        s = settings(
            max_examples=per,
            stateful_step_count=steps or n_steps,
            derandomize=profile == "ci",
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )
        if s.derandomize:
            pin(machine, CI_SEED)
        try:
            with seed_only():  # the walks follow the seed, not the modules loaded (profiles.py)
                run_state_machine_as_test(machine, settings=s)
        except Exception:  # noqa: BLE001 - a Finding ends this configuration
            if "finding" not in sink:
                raise
            report.findings.append((sink.pop("config"), sink.pop("finding"), sink.pop("ops")))
    report.seconds = time.monotonic() - t0
    if report.findings:
        cfg, f, ops = report.findings[0]
        report.ok = False
        report.original_length = len(ops)
        report.config = cfg
        if minimize_findings:
            ops = minimize(cfg, ops, f.kind, patch)
        report.trace = ops
        report.reproducer, f2 = reproducer(cfg, ops, patch)
        report.finding = f2 or f
    return report


def run_cli(args: Any, table: Any = None) -> int:
    """``kvstate fuzz --target sglang``: exit 0 pass, 1 a finding, 2 SGLang missing."""
    import sys

    try:
        report = run(
            args.profile,
            examples=getattr(args, "examples", None),
            steps=getattr(args, "steps", None),
        )
    except sglang_import.SGLangUnavailable as e:
        print(
            f"kvstate fuzz: error: {e} (install it with tools/install_sglang.sh)", file=sys.stderr
        )
        return 2
    print(report.render())
    return 0 if report.ok else 1
