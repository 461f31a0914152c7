"""``kvstate fuzz``: the target named by ``--target`` looked up in :data:`kvstate.targets.TARGETS`
and run; what a run does is the target's (``kvstate/targets/<name>/``, the API's
``kvstate/targets/api/run.py``)."""

from __future__ import annotations

import argparse
import sys

from kvstate.spec.table import Table
from kvstate.targets import TARGETS, lookup


def run_fuzz_cli(args: argparse.Namespace, table: Table) -> int:
    entry = lookup(args.target)
    if entry is None:
        print(
            f"kvstate fuzz: error: unknown target {args.target!r}; targets: "
            f"{', '.join(TARGETS)}, or module:factory",
            file=sys.stderr,
        )
        return 2
    for name, default in (
        ("no_coverage", False),
        ("no_warmup", False),
        ("replay", None),
        ("reproduce", None),
        ("hypothesis_shrink", False),
        ("example_db", None),
        ("config", None),
    ):
        if not hasattr(args, name):  # callers that build the namespace themselves
            setattr(args, name, default)
    return entry.load()(args, table)
