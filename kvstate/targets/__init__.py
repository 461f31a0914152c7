"""``TARGETS``: every ``kvstate fuzz --target NAME``, one row each.

A target is a package beside this file (its operations, its projection of the table, its
driver, its configurations) on the toolkit of :mod:`kvstate.harness`; its row names the
function that runs it, ``run(args, table) -> exit code``, imported only when chosen (a
target's dependencies, vLLM say, load with it).  A name with a colon, ``module:factory``, is
a third-party allocator run by the block-level target.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from kvstate.spec.table import Table


@dataclass(frozen=True)
class Entry:
    name: str
    runner: str  # "module:function", the function taking (args, table) and returning an exit code
    about: str
    runs_allocator: bool = False  # runs kvstate's own allocator (``--coverage`` measures impl/)

    def load(self) -> Callable[[argparse.Namespace, Table], int]:
        mod, _, attr = self.runner.partition(":")
        fn: Callable[[argparse.Namespace, Table], int] = getattr(importlib.import_module(mod), attr)
        return fn


TARGETS: dict[str, Entry] = {
    e.name: e
    for e in (
        Entry(
            "kvstate-api",
            "kvstate.targets.api.run:run_api_cli",
            "the public API with bytes and faults",
            runs_allocator=True,
        ),
        Entry(
            "kvstate",
            "kvstate.targets.block.cli:run_block_cli",
            "the built-in allocator, one action at a time",
            runs_allocator=True,
        ),
        Entry(
            "model",
            "kvstate.targets.block.cli:run_block_cli",
            "the reference interpreter (a self-check)",
        ),
        Entry(
            "vllm",
            "kvstate.targets.vllm.engine:run_cli",
            "vLLM's KVCacheManager, on the table's projection",
        ),
        Entry(
            "vllm-scheduler",
            "kvstate.targets.vllm_scheduler.engine:run_cli",
            "vLLM's Scheduler (schedule, update_from_output, a KV connector)",
        ),
        Entry(
            "sglang",
            "kvstate.targets.sglang.engine:run_cli",
            "SGLang's unified radix cache and DeepSeek-V4 pools, on the table's projection",
        ),
    )
}
FACTORY = Entry(
    "module:factory", "kvstate.targets.block.cli:run_block_cli", "any allocator factory(table, N)"
)


def lookup(name: str) -> Entry | None:
    """The row for ``name`` (``module:factory`` names share one), or None."""
    if name in TARGETS:
        return TARGETS[name]
    return FACTORY if ":" in name else None
