"""``kvstate fuzz --target vllm-scheduler``: a Hypothesis state machine over vLLM's ``Scheduler``.

Each configuration (``configs.ALL``) gets its share of the profile's examples.  An example builds
a fresh scheduler and runs operations drawn with traffic-like weights: arrivals sharing prefixes
(some with external tokens a KV connector loads synchronously, asynchronously or failing),
engine steps (``schedule`` + ``update_from_output``), aborts and prefix-cache resets.  After
every operation the check classes of :mod:`.checks` run.  A finding is cut down with the
toolkit's delta debugging and printed as a standalone Python program that needs only vLLM.
"""

from __future__ import annotations

import random
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstate.harness.ddmin import ddmin
from kvstate.harness.finding import Nonconformance, find_in
from kvstate.harness.profiles import SIZES, pin, seed_only, show
from kvstate.targets.vllm.codecov import measured

from . import imports
from .configs import ALL, Config
from .driver import Driver, Op, Stats, draw_op

PROFILES = SIZES["vllm-scheduler"]

# The derandomized ci walks follow this seed (printed in the header), not the machine's source.
CI_SEED = 0x5C4ED0_1E_33


@dataclass
class Report:
    ok: bool
    profile: str
    seconds: float
    stats: Stats
    vllm_version: str
    findings: list[tuple[Config, Nonconformance, list[Op]]] = field(default_factory=list)
    trace: list[Op] = field(default_factory=list)
    original_length: int = 0
    reproducer: str = ""
    code: Any = None  # kvstate.targets.vllm.codecov.VllmCoverage when measured (--coverage)

    def coverage_lines(self) -> list[str]:
        out = []
        for label, c in sorted(self.stats.per_config.items()):
            ops = ", ".join(f"{k[3:]} {v}" for k, v in sorted(c.items()) if k.startswith("op:"))
            paths = ", ".join(f"{k[5:]} {v}" for k, v in sorted(c.items()) if k.startswith("path:"))
            out.append(f"    {label} x{self.stats.configs[label]}: {ops}; paths: {paths or '-'}")
        return out

    def render(self) -> str:
        s = self.stats
        seed = f", seed {show(CI_SEED)} (pinned, derandomized)" if self.profile == "ci" else ""
        lines = [
            f"kvstate fuzz --target vllm-scheduler: vLLM {self.vllm_version} (loaded), "
            f"profile {self.profile}{seed}",
            f"  configurations ({len(s.configs)}), operations and paths reached:",
            *self.coverage_lines(),
            "  checks evaluated: " + ", ".join(f"{k} {v}" for k, v in sorted(s.checks.items())),
            f"  {s.steps} operations in {self.seconds:.1f} s",
            *(self.code.lines() if self.code is not None else ()),
        ]
        if self.ok:
            lines.append("  verdict: PASS (no check failed)")
            return "\n".join(lines)
        cfg, f, _ = self.findings[0]
        lines += [
            f"  verdict: FAIL ({len(self.findings)} configuration(s) with a finding: "
            + ", ".join(f"{c.label} [{x.kind}]" for c, x, _ in self.findings)
            + ")",
            f"  first finding [{f.kind}] on {cfg.label}: {f}",
            f"  minimized {self.original_length} -> {len(self.trace)} operations",
            "  trace: " + " ; ".join(repr(op) for op in self.trace),
            "",
            "# ---- standalone reproducer (needs only vLLM) ----",
            self.reproducer,
        ]
        return "\n".join(lines)


def replay(config: Config, ops: list[Op]) -> tuple[Nonconformance | None, Driver]:
    d = Driver(config)
    for i, op in enumerate(ops):
        try:
            d.run_op(i, op)
        except Nonconformance as f:
            return f, d
    return None, d


def minimize(config: Config, ops: list[Op], original: Nonconformance) -> list[Op]:
    """The toolkit's delta debugging over the resolved trace, keeping what fails the same way."""
    f, d = replay(config, ops)
    if f is not None:
        ops = d.trace

    def fails(cand: list[Op]) -> tuple[list[Op], None] | None:
        got, dd = replay(config, cand)
        if got is None or not got.same_as(original):
            return None
        return dd.trace, None

    return ddmin(ops, fails, None)[0]


def reproducer(config: Config, ops: list[Op]) -> str:
    """A program that needs only vLLM: the standalone module, the layout, the operations."""
    f, d = replay(config, ops)
    text = Path(imports.standalone().__file__ or "").read_text(encoding="utf-8")
    head = [
        f"# vLLM {imports.loaded_version()} Scheduler, configuration {config.label}; found by",
        "# kvstate fuzz --target vllm-scheduler.  Runs on a CPU: no model, GPU or network.",
        text.rstrip(),
        "",
        "# ---- the layout (kvstate/targets/vllm/configs.py) ----",
        config.layout_source.rstrip(),
        "",
        "# ---- what the fuzzer did ----",
    ]
    tail = ["", "found = violations(engine)", "print(found)", "assert not found, found"]
    if f is not None and f.kind == "crash":
        tail = ["", f"# the last call raises: {f}"]
    return "\n".join(head + d.code + tail) + "\n"


def _machine(config: Config, stats: Stats, sink: dict[str, Any]) -> type:
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

    salt = zlib.crc32(config.label.encode()) << 20  # configurations walk different traffic

    class SchedulerMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.d: Driver | None = None
            self.ops: list[Op] = []

        @initialize()
        def build(self) -> None:
            self.d = Driver(config, stats)
            stats.configs[config.label] += 1

        @rule(seed=st.integers(0, 2**32 - 1))
        def act(self, seed: int) -> None:
            """One engine-core call, drawn from the seed (traffic-like weights)."""
            assert self.d is not None
            rng = random.Random(seed * 1_000_003 + len(self.ops) + salt)
            op = draw_op(rng, self.d.block, config.connector)
            self.ops.append(op)
            try:
                self.d.run_op(len(self.ops) - 1, op)
            except Nonconformance as f:
                sink.update(finding=f, ops=list(self.ops))
                raise

    return SchedulerMachine


def run(
    profile: str = "ci",
    *,
    configs: tuple[Config, ...] | None = None,
    examples: int | None = None,
    steps: int | None = None,
    minimize_findings: bool = True,
    code_coverage: bool = False,
) -> Report:
    """Fuzz vLLM's scheduler (``code_coverage``: measure vLLM's allocation files per
    configuration, :mod:`kvstate.targets.vllm.codecov`).  Raises ``kvstate.impl.errors.InvalidArgument`` (a ``ValueError``)
    for an unknown profile, ``VLLMUnavailable`` (an ``ImportError``) without vLLM."""
    from kvstate.impl.errors import InvalidArgument

    if profile not in PROFILES:
        raise InvalidArgument(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    imports.standalone()
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    n_ex, n_steps = PROFILES[profile]
    configs = configs or ALL
    per = max(1, (examples or n_ex) // len(configs))
    stats = Stats()
    report = Report(True, profile, 0.0, stats, imports.loaded_version())
    if code_coverage:
        from kvstate.targets.vllm.codecov import VllmCoverage

        report.code = VllmCoverage()
    t0 = time.monotonic()
    for cfg in configs:
        sink: dict[str, Any] = {}
        machine = _machine(cfg, stats, sink)
        s = settings(
            settings.get_profile("default"),  # not the loaded profile: the same walks everywhere
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
            with seed_only(), measured(report.code, cfg.label):  # seed_only: profiles.py
                run_state_machine_as_test(machine, settings=s)
        except Exception as exc:  # noqa: BLE001 - a finding ends this configuration
            f = find_in(exc)
            if f is None or "finding" not in sink:
                raise
            report.findings.append((cfg, sink["finding"], sink["ops"]))
    report.seconds = time.monotonic() - t0
    if report.findings:
        cfg, f, ops = report.findings[0]
        report.ok = False
        report.original_length = len(ops)
        report.trace = minimize(cfg, ops, f) if minimize_findings else ops
        report.reproducer = reproducer(cfg, report.trace)
    return report


def coverage(report: Report) -> Counter[str]:
    """Paths reached over the whole run (for tests and docs)."""
    return Counter(report.stats.paths)


def run_cli(args: Any, table: Any = None) -> int:
    """``kvstate fuzz --target vllm-scheduler``: exit 0 pass, 1 a finding, 2 vLLM missing."""
    import sys

    try:
        report = run(
            args.profile,
            examples=getattr(args, "examples", None),
            steps=getattr(args, "steps", None),
            code_coverage=bool(getattr(args, "code_coverage", False)),
        )
    except imports.VLLMUnavailable as e:
        print(f"kvstate fuzz: error: {e} (install it with tools/install_vllm.sh)", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1
