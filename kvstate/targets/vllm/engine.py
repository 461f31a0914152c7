"""``kvstate fuzz --target vllm``: a Hypothesis state machine over vLLM's ``KVCacheManager``.

Each example picks a configuration (group layout, EAGLE on or off, a pool small enough to
evict), builds a fresh manager from vLLM's own classes, and runs rules that call the manager
the way the scheduler does: arrivals sharing prefixes, admission (``get_computed_blocks`` then
``allocate_slots``, with a KV connector's external tokens), chunked prefill, decode and EAGLE
steps, preemption, ``free``, ``cache_blocks``, ``remove_skipped_blocks``, ``evict_blocks``,
``reset_prefix_cache`` and re-sent prompts.  After every call the table's rules, projected onto
what vLLM exposes (``checks``), are checked.  The run loop, the minimizer and the report are the
toolkit's (:mod:`kvstate.harness.walk`); this module supplies what only vLLM's has.
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

from . import imports as vllm_import
from .configs import ALL, Config
from .driver import TOKENS_SRC, Driver, Stats
from .ops import NAMES, draw_op
from .tenants import TENANTS

# The seed of the derandomized ci runs, pinned (printed in the report): the one Hypothesis
# derived from the machine's source before the seed was pinned, so ci draws what it drew.
CI_SEED = int(
    "cff787afdbcb92a52b4f8890079bebea523d833ac51d6aacbc38c3636319c7cc"
    "f0e8503a1a0bccfd462030cc086ea925",
    16,
)

Report = walk.Report


def _load() -> str:
    vllm_import.load("vllm.v1.core.kv_cache_manager")
    import logging

    logging.getLogger("vllm").setLevel(logging.ERROR)
    return vllm_import.loaded()


def _draw(rng: random.Random, d: Any) -> TraceStep:
    op = draw_op(rng.random, rng.randrange, d.geo.L)
    if op.action == "arrive" and d.tenants:
        op.inputs["tenant"] = rng.randrange(TENANTS)  # drawn after: the others unchanged
    return op


def _lines(report: walk.Report) -> list[str]:
    s = report.stats
    return [
        "  calls: " + ", ".join(f"{k} {v}" for k, v in sorted(s.calls.items())),
        "  checks evaluated: " + ", ".join(f"{k} {v}" for k, v in sorted(s.checks.items())),
        *summary("operation counts", s.ops, NAMES),
    ]


def _reproducer(config: Config, d: Any, f: Nonconformance | None) -> str:
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
    return "\n".join(head + d.code + tail)


def _parse(text: str) -> list[TraceStep]:
    from kvstate.calls import parse_calls

    from .ops import parse

    return parse(parse_calls(text))


def _coverage() -> Any:
    """``--coverage``: the lines and branches of vLLM's allocation files, per configuration."""
    from .codecov import VllmCoverage

    return VllmCoverage()


ENGINE = walk.Engine(
    name="vllm",
    product="vLLM",
    ci_seed=CI_SEED,
    configs=ALL,
    load=_load,
    unavailable=vllm_import.VLLMUnavailable,
    install="tools/install_vllm.sh",
    driver=lambda config, stats, manager_cls: Driver(config, manager_cls, stats),
    stats=Stats,
    draw=_draw,
    lines=_lines,
    reproducer=_reproducer,
    fresh="a fresh manager",
    parse=_parse,
    coverage=_coverage,
)


def run(profile: str = "ci", *, manager_cls: Any = None, **options: Any) -> walk.Report:
    """Fuzz vLLM's KV cache manager (``options``: :func:`kvstate.harness.walk.run`'s);
    ``manager_cls`` points it at any (patched) manager class.  Raises ``InvalidArgument`` for an
    unknown profile, ``VLLMUnavailable`` (an ``ImportError``) without vLLM."""
    return engine_run(ENGINE, profile, hook=manager_cls, **options)


def run_cli(args: Any, table: Any = None) -> int:
    """``kvstate fuzz --target vllm``: exit 0 pass, 1 a finding, 2 vLLM missing or bad usage."""
    return engine_cli(ENGINE, args, table)
