"""``kvstate fuzz --target vllm-scheduler``: a Hypothesis state machine over vLLM's ``Scheduler``.

Each configuration (``configs.ALL``) gets its share of the profile's examples.  An example builds
a fresh scheduler and runs operations drawn with traffic-like weights: arrivals sharing prefixes
(some with external tokens a KV connector loads synchronously, asynchronously or failing),
engine steps (``schedule`` + ``update_from_output``), aborts and prefix-cache resets.  After
every operation the check classes of :mod:`.checks` run.  The run loop, the minimizer and the
report are the toolkit's (:mod:`kvstate.harness.walk`); a finding prints as a standalone Python
program that needs only vLLM.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Any

from kvstate.harness import walk
from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep
from kvstate.targets.engine import run as engine_run
from kvstate.targets.engine import run_cli as engine_cli

from . import imports
from .configs import ALL, Config
from .driver import Driver, Stats, draw_op

# The derandomized ci walks follow this seed (printed in the header), not the machine's source.
CI_SEED = 0x5C4ED0_1E_33

Report = walk.Report


def _load() -> str:
    imports.standalone()
    return imports.loaded_version()


def _draw(rng: random.Random, d: Any) -> TraceStep:
    return draw_op(rng, d.block, d.config.connector)


def _lines(report: walk.Report) -> list[str]:
    s = report.stats
    out = ["  operations and paths reached, per configuration:"]
    for label, c in sorted(s.per_config.items()):
        ops = ", ".join(f"{k[3:]} {v}" for k, v in sorted(c.items()) if k.startswith("op:"))
        paths = ", ".join(f"{k[5:]} {v}" for k, v in sorted(c.items()) if k.startswith("path:"))
        out.append(f"    {label} x{s.configs[label]}: {ops}; paths: {paths or '-'}")
    out.append("  checks evaluated: " + ", ".join(f"{k} {v}" for k, v in sorted(s.checks.items())))
    return out


def _reproducer(config: Config, d: Any, f: Nonconformance | None) -> str:
    """A program that needs only vLLM: the standalone module, the layout, the operations."""
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


def _coverage() -> Any:
    """``--coverage``: the lines and branches of vLLM's allocation files, per configuration."""
    from kvstate.targets.vllm.codecov import VllmCoverage

    return VllmCoverage()


ENGINE = walk.Engine(
    name="vllm-scheduler",
    product="vLLM",
    ci_seed=CI_SEED,
    configs=ALL,
    load=_load,
    unavailable=imports.VLLMUnavailable,
    install="tools/install_vllm.sh",
    driver=lambda config, stats, hook: Driver(config, stats),
    stats=Stats,
    draw=_draw,
    lines=_lines,
    reproducer=_reproducer,
    salt=lambda config: zlib.crc32(config.label.encode()) << 20,  # configurations walk apart
    fresh="a fresh scheduler",
    coverage=_coverage,
)


def run(profile: str = "ci", **options: Any) -> walk.Report:
    """Fuzz vLLM's scheduler (``options``: :func:`kvstate.harness.walk.run`'s).  Raises
    ``InvalidArgument`` for an unknown profile, ``VLLMUnavailable`` (an ``ImportError``)
    without vLLM."""
    return engine_run(ENGINE, profile, **options)


def run_cli(args: Any, table: Any = None) -> int:
    """``kvstate fuzz --target vllm-scheduler``: exit 0 pass, 1 a finding, 2 vLLM missing."""
    return engine_cli(ENGINE, args, table)
