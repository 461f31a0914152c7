"""``kvstate fuzz --target sglang``: a Hypothesis state machine over SGLang's unified radix cache.

Each configuration (layout, tree core, page and window, pool size) gets its share of examples;
each example builds a fresh stack from SGLang's own classes on ``device="cpu"`` and runs
operations the way SGLang's scheduler issues them (``ops.py``), checking the table's projection
after each (``checks.py``, ``driver.py``).  The run loop, the minimizer and the report are the
toolkit's (:mod:`kvstate.harness.walk`); a finding prints as a standalone reproducer that needs
only SGLang.
"""

from __future__ import annotations

import random
from typing import Any

from kvstate.harness import walk
from kvstate.harness.coverage import summary
from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep
from kvstate.targets.engine import run as engine_run
from kvstate.targets.engine import run_cli as engine_cli

from . import imports as sglang_import
from .configs import ALL, Config
from .driver import NAMES, Driver, Stats, draw_op, draw_tier_walk
from .ops import SOURCE as OPS_SOURCE

CI_SEED = 0x5C1A06  # the derandomized ci walks follow this seed (printed in the report)

Report = walk.Report


def _load() -> str:
    sglang_import.load()
    import logging

    logging.getLogger("sglang").setLevel(logging.ERROR)
    return sglang_import.version()


def _draw(rng: random.Random, d: Any) -> TraceStep:
    c = d.config
    tier = draw_tier_walk(rng.random, d)
    return tier or draw_op(rng.random, rng.randrange, c.page, c.max_len, c.hicache)


def _close(d: Any) -> None:
    """A stack's HiCache threads and files are closed after every driver (ops.py's ``close``)."""
    d.ns["close"](d.st)


def _lines(report: walk.Report) -> list[str]:
    s = report.stats
    return [
        *summary("  operations that acted", s.calls, NAMES),
        "  operations with nothing to act on: "
        + ", ".join(f"{k} {v}" for k, v in sorted(s.idle.items())),
        "  paths reached: " + ", ".join(f"{k} {v}" for k, v in sorted(s.paths.items())),
        "  checks evaluated: " + ", ".join(f"{k} {v}" for k, v in sorted(s.checks.items())),
    ]


def _reproducer(config: Config, d: Any, f: Nonconformance | None) -> str:
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
        tail = ["", "# The last call breaks:"] + [f"#   {line}" for line in str(f).splitlines()]
    return "\n".join(head + d.code + tail)


def _parse(text: str) -> list[TraceStep]:
    from kvstate.calls import parse_calls

    from .driver import OPS

    out = []
    for name, args in parse_calls(text):
        p = dict(args)
        if name not in OPS or set(p) != set(OPS[name]):
            raise ValueError(f"{name}: takes {', '.join(OPS.get(name, ()))}; given {p}")
        out.append(TraceStep(name, {k: p[k] for k in OPS[name]}))
    return out


ENGINE = walk.Engine(
    name="sglang",
    product="SGLang",
    ci_seed=CI_SEED,
    configs=ALL,
    load=_load,
    unavailable=sglang_import.SGLangUnavailable,
    install="tools/install_sglang.sh",
    driver=lambda config, stats, patch: Driver(config, stats, patch),
    stats=Stats,
    draw=_draw,
    close=_close,
    lines=_lines,
    reproducer=_reproducer,
    fresh="a fresh stack",
    parse=_parse,
)


def run(profile: str = "ci", *, patch: Any = None, **options: Any) -> walk.Report:
    """Fuzz SGLang's cache (``options``: :func:`kvstate.harness.walk.run`'s); ``patch(driver)``
    may break a method of the built stack (tests).  Raises ``InvalidArgument`` for an unknown
    profile, ``SGLangUnavailable`` (an ``ImportError``) without SGLang."""
    return engine_run(ENGINE, profile, hook=patch, **options)


def run_cli(args: Any, table: Any = None) -> int:
    """``kvstate fuzz --target sglang``: exit 0 pass, 1 a finding, 2 SGLang missing."""
    return engine_cli(ENGINE, args, table)
