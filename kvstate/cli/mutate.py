"""``kvstate mutate``: mutation analysis of a table, gated by a kill rate that counts every
mutant not checked (``unknown``, ``unchecked``) as not killed, resumable through a session
store."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from .common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGTERM,
    EXIT_UNDECIDED,
    SPEC_HELP,
    load_table,
    positive_int,
    pure_build_notice,
    rate,
    seconds,
    spec_names,
    usage_error,
)


def operator(text: str) -> str:
    """A mutation operator's name (the list: ``kvstate mutate --help``)."""
    from kvstate.proofs.mutate import OPERATORS

    if text not in OPERATORS:
        raise argparse.ArgumentTypeError(
            f"unknown mutation operator {text!r}; operators: {', '.join(OPERATORS)}"
        )
    return text


def run(args: argparse.Namespace) -> int:
    from kvstate.proofs.mutate import OPERATORS, mutate
    from kvstate.proofs.mutate_report import render_junit, render_text
    from kvstate.proofs.session import default_path

    from .prove import signals_as_interrupts

    table = load_table(args.spec)
    ops = args.operator or list(OPERATORS)
    progress = None
    if not args.quiet:

        def progress(o):  # type: ignore[no-untyped-def]
            print(f"  {o.mutant}: {o.verdict}", file=sys.stderr, flush=True)

    session = None if args.no_session else (args.session or default_path())
    with signals_as_interrupts() as came:
        rep = mutate(
            table,
            operators=ops,
            only=args.only,
            jobs=args.jobs,
            budget_s=args.budget,
            timeout_ms=args.timeout_ms,
            liveness=args.liveness,
            progress=progress,
            session=session,
        )
    if rep.judged == 0 and args.min_kill_rate > 0:
        return usage_error(
            "no mutant to judge (none matched, or all are equivalent or invalid): "
            "--min-kill-rate cannot be met or failed"
        )
    fuzz_failures: dict[str, str] = {}
    if args.fuzz and rep.stopped is None:
        from kvstate.targets.block.cli import fuzz_spec_mutants

        pure_build_notice()
        fuzz_failures = fuzz_spec_mutants(table, rep, examples=args.fuzz_examples)
    if args.format == "json":
        d = rep.to_dict()
        if args.fuzz:
            d["fuzz"] = fuzz_failures
        out = json.dumps(d, indent=2)
    elif args.format == "junit":
        out = render_junit(rep)
    else:
        out = render_text(rep, verbose=args.verbose)
        if args.fuzz:
            out += "\n\nconformance fuzz (spec mutant vs the unchanged implementation):\n"
            out += "\n".join(f"  {k}: {v}" for k, v in fuzz_failures.items()) or "  (none run)"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(out + "\n")
        print(
            f"kvstate mutate: checked {rep.checked} of {len(rep.outcomes)} mutants, kill rate "
            f"{100 * rep.kill_rate:.1f}%, {len(rep.survivors())} survivors; report written to "
            f"{args.output}"
        )
    else:
        print(out)
    if rep.stopped == "interrupted":
        return EXIT_SIGTERM if came and came[-1] == signal.SIGTERM else EXIT_SIGINT
    if rep.kill_rate < args.min_kill_rate:
        return EXIT_FAIL
    if args.min_kill_rate == 0 and rep.count("unchecked"):
        # no gate, and the budget left mutants unchecked: the report is partial, not a pass
        return EXIT_UNDECIDED
    return EXIT_OK


def _epilog() -> str:
    from kvstate.proofs.mutate import OPERATORS

    from .common import EXIT_CODES

    return "mutation operators: " + ", ".join(OPERATORS) + "\n\n" + EXIT_CODES


def add_parser(sub: Any) -> None:
    mu = sub.add_parser(
        "mutate",
        help="measure a table's properties: mutate the table, see which obligation kills each",
        description="Mutate the table one small defect at a time and put each mutant to the "
        "obligations it can change.  The kill rate is killed / every mutant not equivalent or "
        "invalid: a mutant that timed out or was never checked counts as not killed.",
        epilog_fn=_epilog,
    )
    mu.add_argument("--spec", default="default", help=SPEC_HELP.format(", ".join(spec_names())))
    mu.add_argument(
        "--operator",
        action="append",
        type=operator,
        default=[],
        metavar="OP",
        help="only this mutation operator (repeatable; default: all; listed below)",
    )
    mu.add_argument(
        "--only", action="append", default=[], help="only mutants whose id contains this text"
    )
    mu.add_argument("-j", "--jobs", type=positive_int, default=None, help="worker processes")
    mu.add_argument(
        "--budget",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds: mutants left are 'unchecked' (not killed); the "
        "session store keeps the verdicts so far, and the next run resumes",
    )
    mu.add_argument(
        "--timeout-ms", type=positive_int, default=4000, help="per Z3 query (default 4000)"
    )
    mu.add_argument(
        "--liveness",
        action="store_true",
        help="also the completeness rule (bounded model checking; slower): the default is the "
        "safety obligations alone, fit for CI",
    )
    mu.add_argument(
        "--min-kill-rate",
        type=rate,
        default=0.0,
        help="exit 1 when killed / (every mutant not equivalent or invalid) is below this "
        "(0..1; unknown and unchecked mutants count as not killed)",
    )
    mu.add_argument(
        "--session",
        default=None,
        metavar="PATH",
        help="the session store (SQLite) of verdicts, keyed by the table's content digest, the "
        "mutant and the settings (default: $KVSTATE_CACHE_DIR or ~/.cache/kvstate, "
        "mutate.sqlite)",
    )
    mu.add_argument(
        "--no-session", action="store_true", help="neither reuse nor keep verdicts: check all"
    )
    mu.add_argument(
        "--fuzz",
        action="store_true",
        help="also fuzz each surviving or equivalent spec mutant against the unchanged allocator",
    )
    mu.add_argument(
        "--fuzz-examples",
        type=positive_int,
        default=20,
        help="Hypothesis examples per mutant with --fuzz (default 20)",
    )
    mu.add_argument(
        "--format",
        choices=["text", "json", "junit"],
        default="text",
        help="report format (json carries a schema version; junit: one testcase per mutant)",
    )
    mu.add_argument("-o", "--output", default=None, help="write the report to a file")
    mu.add_argument(
        "-v", "--verbose", action="store_true", help="also list killed and unchecked mutants"
    )
    mu.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    mu.set_defaults(func=run)
