"""``kvstate fuzz``: its options (validated while parsing) and the collector's tuning for a run;
the run itself is :mod:`kvstate.fuzz_cli`."""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Iterator
from typing import Any

from kvstate.targets import TARGETS

from .common import (
    EXIT_CODES,
    EXIT_USAGE,
    SPEC_HELP,
    load_table,
    positive_int,
    pure_build_notice,
    spec_names,
)

RUNS_THE_ALLOCATOR = tuple(k for k, e in TARGETS.items() if e.runs_allocator)


def target(text: str) -> str:
    """A target name, or ``module:factory``."""
    mod, colon, attr = text.partition(":")
    if text in TARGETS or (colon and mod and attr):
        return text
    raise argparse.ArgumentTypeError(
        f"unknown target {text!r}; targets: {', '.join(TARGETS)}, or module:factory"
    )


def bug(text: str) -> str:
    """A seeded bug's name (the list: ``kvstate fuzz --help``)."""
    from kvstate.testing.seeded import BUGS

    if text not in BUGS:
        raise argparse.ArgumentTypeError(
            f"unknown seeded bug {text!r}; known: {', '.join(sorted(BUGS))}"
        )
    return text


def blob(text: str) -> str:
    """A Hypothesis ``@reproduce_failure`` blob (the base64 text between ``b'`` and ``'``)."""
    from hypothesis.core import decode_failure

    try:
        decode_failure(text.encode())
    except Exception as exc:  # noqa: BLE001 - Hypothesis' InvalidArgument, binascii, zlib
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Hypothesis @reproduce_failure blob ({exc})"
        ) from None
    return text


@contextlib.contextmanager
def long_lived_imports() -> Iterator[None]:
    """The collector tuned for a fuzz run, and put back as it was afterwards.

    What is alive on entry (the imported modules: torch, z3, Hypothesis, the table) lives as
    long as the run: ``gc.freeze()`` moves it out of the collector's generations, so no full
    collection walks it again.  Hypothesis runs one at its first example (``register_random``),
    and Python others as the examples allocate: each walked the whole import graph.  The young
    generation is collected after 50,000 allocations instead of 700 (a ci run made about 600
    young collections; Hypothesis allocates much and keeps little).  Only walks are saved: any
    garbage made during the run is collected as before, and on exit the threshold and the
    generations are restored (``gc.unfreeze``), so a caller's process (a test session) goes on
    as it was.  Measured on the ci runs: time in the collector 0.53 -> 0.12 s (block target),
    0.29 -> 0.11 s (API target).
    """
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def run(args: argparse.Namespace) -> int:
    measure = None
    if args.code_coverage and args.target not in ("vllm", "vllm-scheduler"):  # before impl
        from kvstate.codecov import CoverageUnavailable, Measure

        try:
            measure = Measure(args.target)
        except CoverageUnavailable as exc:
            print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    from kvstate.fuzz_cli import run_fuzz_cli
    from kvstate.testing.scratch import ram_scratch
    from kvstate.testing.threads import single_intraop_thread

    table = load_table(args.spec)
    if args.target in RUNS_THE_ALLOCATOR:
        pure_build_notice()
    single_intraop_thread()
    ram_scratch()  # per-example disk tiers on tmpfs: see kvstate/testing/scratch.py
    try:
        with long_lived_imports():
            return run_fuzz_cli(args, table)
    finally:
        if measure is not None:
            got = measure.stop()
            print("\n".join(got.lines()), flush=True)
            if args.coverage_json:
                import json

                with open(args.coverage_json, "w", encoding="utf-8") as fh:
                    json.dump(got.raw, fh, indent=1)


def _epilog() -> str:
    from kvstate.testing.seeded import BUGS

    targets = "\n".join(f"  {k:<12} {e.about}" for k, e in TARGETS.items())
    bugs = "\n".join(f"  {k:<28} {v}" for k, v in sorted(BUGS.items()))
    return (
        f"targets:\n{targets}\n  module:factory  factory(table, N) -> an object with one method "
        f"per action and observe()\n\nseeded bugs (--bug, --target kvstate):\n{bugs}\n\n"
        + EXIT_CODES
    )


def add_parser(sub: Any) -> None:
    fz = sub.add_parser(
        "fuzz",
        help="fuzz an allocator against the model, step by step (Hypothesis)",
        description="Conformance fuzzing: the target and the table's model take the same "
        "steps, and every step is checked.  A finding is minimized and reported with commands "
        "to replay it.",
        epilog_fn=_epilog,
    )
    fz.add_argument("--spec", default="default", help=SPEC_HELP.format(", ".join(spec_names())))
    fz.add_argument(
        "--target",
        type=target,
        default="kvstate",
        help="what to fuzz: " + ", ".join(TARGETS) + ", or module:factory (default kvstate; "
        "listed below)",
    )
    fz.add_argument(
        "--skip-op",
        action="append",
        default=[],
        metavar="OP",
        help="--target kvstate-api: leave this operation (or fault) out of the run",
    )
    fz.add_argument(
        "--remote",
        nargs="?",
        const="",
        default=None,
        metavar="URL",
        help="--target kvstate-api: the caches keep their offloaded blocks in a Redis server "
        "(URL: redis://... or unix://...; without one, a redis-server started on a Unix socket "
        "in a temporary directory), its faults driven through the server, two nodes sharing it",
    )
    fz.add_argument(
        "--nodes",
        type=int,
        choices=[1, 2],
        default=1,
        help="--remote: 2 also draws node B's operations at random (a second cache in its own "
        "process on the same server: cross-node hits, its loads racing changes of the store, "
        "both nodes storing one prefix at once); its scripted walks run in every --remote run",
    )
    fz.add_argument(
        "--threads",
        action="store_true",
        help="--target kvstate-api: several engine threads and the threaded pipelines; "
        "linearizability in lock order, bytes, leaks",
    )
    fz.add_argument(
        "--examples",
        type=positive_int,
        default=None,
        help="Hypothesis examples (default: the profile's)",
    )
    fz.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="steps per example (default: the profile's)",
    )
    fz.add_argument(
        "--seed",
        type=int,
        default=None,
        help="random seed (default: derandomized under --profile ci, random otherwise; the "
        "report prints it)",
    )
    fz.add_argument(
        "--profile",
        choices=["ci", "dev", "nightly"],
        default="ci",
        help="Hypothesis settings profile: ci (derandomized, short), dev, nightly (long)",
    )
    fz.add_argument(
        "--pool",
        type=positive_int,
        default=None,
        help="blocks in the fuzzed prefix chain (default: the geometry's model_blocks)",
    )
    fz.add_argument(
        "--config",
        default=None,
        metavar="LABEL",
        help="--target vllm: run (or --replay on) this configuration only, e.g. "
        "mamba+eagle/pool24 (the labels: a run's header)",
    )
    fz.add_argument(
        "--bug",
        action="append",
        type=bug,
        default=[],
        help="plant a seeded bug (kvstate.testing.seeded) in the built-in target (repeatable; "
        "listed below)",
    )
    fz.add_argument(
        "--no-coverage",
        action="store_true",
        help="skip the deterministic coverage pass (witness replays + refusal sweep)",
    )
    fz.add_argument(
        "--coverage",
        dest="code_coverage",
        action="store_true",
        help="--target kvstate-api or kvstate: report branch coverage of impl/ per module "
        "(coverage.py; pure build only, one process); --target vllm or vllm-scheduler: the "
        "statements and branches of vLLM's allocator and scheduler files run, per configuration",
    )
    fz.add_argument(
        "--coverage-json",
        default=None,
        metavar="FILE",
        help="with --coverage: write coverage.py's JSON report (missing lines and branches)",
    )
    fz.add_argument(
        "--no-warmup",
        action="store_true",
        help="Hypothesis examples do not start from the proofs' witness traces",
    )
    fz.add_argument(
        "--hypothesis-shrink",
        action="store_true",
        help="let Hypothesis shrink a failure first (slow here: up to its 5-minute cap)",
    )
    fz.add_argument(
        "--replay",
        default=None,
        metavar="TRACE",
        help="replay one trace ('allocate(b=0); commit(b=0); ...', or @FILE) and stop",
    )
    fz.add_argument(
        "--reproduce",
        type=blob,
        default=None,
        metavar="BLOB",
        help="rerun the one Hypothesis example of a printed @reproduce_failure blob",
    )
    from kvstate.fuzz_report import add_arguments as add_fuzz_outputs

    add_fuzz_outputs(fz)  # --example-db, --json, --junit, --sarif, --itf, --github-annotations
    fz.set_defaults(func=run)
