"""``kvstate fuzz``: conformance fuzzing of an allocator against the model.

Targets: ``kvstate`` (the built-in allocator, ``kvstate.impl.adapter:make_target``), ``model``
(the reference interpreter, a self-check), or ``module:factory`` -- any callable
``factory(table, N)`` returning an object with one method per spec action plus ``observe()``.

A run first replays the proofs' reachability witnesses in lockstep (a deterministic coverage
pass), then lets Hypothesis explore.  On failure it prints the shrunk, replayable trace, the
seed and the reproduce blob, and exits 1.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
import time
from collections import Counter
from typing import Any

from hypothesis import settings
from hypothesis.errors import HypothesisException

from kvstate.model.fuzz import build_state_machine, replay_seeds
from kvstate.proofs.witnesses import reach_traces
from kvstate.spec.errors import SpecError
from kvstate.spec.table import Table


def resolve_target(spec: str, bugs: list[str]) -> Any:
    if spec == "kvstate":
        from kvstate.impl.adapter import make_target
        from kvstate.impl.bugs import check_names

        planted = check_names(bugs)
        return lambda table, n: make_target(table, n, bugs=planted)
    if bugs:
        raise SpecError("--bug plants seeded bugs in the built-in target only (--target kvstate)")
    if spec == "model":
        from kvstate.model.fuzz import ModelTarget

        return lambda table, n: ModelTarget(table, n)
    if ":" not in spec:
        raise SpecError(f"--target must be 'kvstate', 'model' or module:factory, got {spec!r}")
    mod, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"cannot load target {spec!r}: {exc}") from exc
    if not callable(factory):
        raise SpecError(f"target {spec!r} is not callable")
    return factory


def run_fuzz_cli(args: argparse.Namespace, table: Table) -> int:
    try:
        factory = resolve_target(args.target, args.bug)
    except Exception as exc:  # noqa: BLE001 - bad target/bug names are usage errors
        print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
        return 2
    if args.examples is not None and args.examples < 1 or args.steps is not None and args.steps < 1:
        print("kvstate fuzz: error: --examples and --steps must be >= 1", file=sys.stderr)
        return 2
    n = args.pool or table.geometry.model_blocks
    base = settings.get_profile(args.profile)
    overrides: dict[str, Any] = {}
    if args.examples is not None:
        overrides["max_examples"] = args.examples
    if args.steps is not None:
        overrides["stateful_step_count"] = args.steps
    seed = args.seed
    if seed is not None or args.profile != "ci":
        seed = seed if seed is not None else random.randrange(2**32)
        overrides["derandomize"] = False
    prof = settings(base, **overrides)
    counts: Counter[str] = Counter()
    started = time.monotonic()
    last = [started]

    def progress(done: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 5.0:
            last[0] = now
            steps = sum(v for k, v in counts.items() if not k.startswith("("))
            print(
                f"  ... {done} examples, {steps} steps, {now - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    cls = build_state_machine(
        table,
        n,
        factory,
        stats=counts,
        seed_traces=reach_traces(table.name),
        on_example_end=progress,
    )
    if seed is not None:
        cls._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    what = f"target {args.target}" + (
        f" with planted bug(s) {', '.join(args.bug)}" if args.bug else ""
    )
    print(
        f"kvstate fuzz: {what} vs table {table.name}, pool N={n}, profile {args.profile} "
        f"({prof.max_examples} examples x {prof.stateful_step_count} steps), "
        f"seed {'derandomized' if seed is None else seed}",
        flush=True,
    )
    from hypothesis.stateful import run_state_machine_as_test

    try:
        seeds = reach_traces(table.name)
        replay_seeds(cls, table, seeds)
        print(f"  coverage pass: {len(seeds)} witness traces replayed in lockstep", flush=True)
        run_state_machine_as_test(cls, settings=prof)
    except (AssertionError, HypothesisException, Exception) as exc:  # noqa: BLE001
        print("", flush=True)
        print(
            f"kvstate fuzz: FAILED after {time.monotonic() - started:.1f} s: {type(exc).__name__}: {exc}"
        )
        print(
            f"  rerun: kvstate fuzz --target {args.target}"
            + "".join(f" --bug {b}" for b in args.bug)
            + f" --profile {args.profile}"
            + (f" --seed {seed}" if seed is not None else "")
            + (f" --examples {args.examples}" if args.examples else "")
            + (f" --steps {args.steps}" if args.steps else "")
            + (f" --pool {args.pool}" if args.pool else "")
        )
        print(
            "  (the shrunk trace and the @reproduce_failure blob are printed above by Hypothesis)"
        )
        return 1
    steps = sum(v for k, v in counts.items() if not k.startswith("("))
    print(
        f"kvstate fuzz: ok, {steps} lockstep steps and {counts['(refused)']} refused actions checked "
        f"in {time.monotonic() - started:.1f} s"
    )
    print("action counts:")
    for a in table.actions:
        print(f"  {a.name:<16} {counts[a.name]:>7}")
    never = [a.name for a in table.actions if counts[a.name] == 0]
    if never:
        print(f"never fired: {', '.join(never)}")
    return 0
