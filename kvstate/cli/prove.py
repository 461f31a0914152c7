"""``kvstate prove``: the table's obligations, bounded in time, with progress and a partial
report when stopped early (budget, SIGINT, SIGTERM)."""

from __future__ import annotations

import argparse
import contextlib
import signal
from collections.abc import Iterator
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
    seconds,
    spec_names,
    usage_error,
)

DEFAULT_TIMEOUT_S = 900.0  # per unit of work; the default table's longest takes ~60 s on 2 cores


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[list[int]]:
    """SIGTERM raises ``KeyboardInterrupt`` as SIGINT does, so a CI runner that terminates the
    job still gets the partial report; the list holds the signal that came."""
    came: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        came.append(signum)
        raise KeyboardInterrupt

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in old:
            signal.signal(s, handler)
    except ValueError:  # not the main thread: leave the handlers alone
        old = {}
    try:
        yield came
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run(args: argparse.Namespace) -> int:
    from kvstate.proofs import Config, prove, render_json, render_junit, render_text
    from kvstate.proofs.runner import UsageError

    from .progress import listener

    table = load_table(args.spec)
    if args.geometry:
        from kvstate.spec import preset

        table = table.with_geometry(preset(args.geometry))
    lst = listener(args.quiet)
    try:
        with signals_as_interrupts() as came:
            report = prove(
                table,
                depth=args.depth,
                only=args.only,
                jobs=args.jobs,
                config=Config(update_witnesses=args.update_witnesses),
                budget_s=args.budget,
                timeout_s=args.timeout or None,
                listener=lst,
            )
    except UsageError as exc:
        return usage_error(str(exc))
    finally:
        if hasattr(lst, "close"):
            lst.close()
    out = {
        "text": lambda: render_text(report, verbose=args.verbose),
        "json": lambda: render_json(report),
        "junit": lambda: render_junit(report),
    }[args.format]()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(out + "\n")
        word = {"hold": "ok", "fail": "FAILED", "undecided": "UNDECIDED"}[report.verdict]
        print(
            f"kvstate prove: {word} ({len(report.results)} obligations, {report.seconds:.1f} s"
            f"{'; stopped: ' + report.stopped if report.stopped else ''}); "
            f"report written to {args.output}"
        )
    else:
        print(out)
    if report.stopped == "interrupted":
        return EXIT_SIGTERM if came and came[-1] == signal.SIGTERM else EXIT_SIGINT
    return {"hold": EXIT_OK, "fail": EXIT_FAIL, "undecided": EXIT_UNDECIDED}[report.verdict]


def add_parser(sub: Any) -> None:
    from kvstate.spec.geometry import PRESETS

    pr = sub.add_parser(
        "prove",
        help="prove the safeguards of a transition table with Z3",
        description="Check every proof obligation of a table (Z3).  Prints the obligations "
        "that do not hold and a summary (-v: every obligation; -vv: every witness trace too). "
        "Progress goes to stderr: a bar on a terminal, otherwise one line per finished kind "
        "of obligation.",
    )
    pr.add_argument("--spec", default="default", help=SPEC_HELP.format(", ".join(spec_names())))
    pr.add_argument(
        "--geometry",
        default=None,
        choices=sorted(PRESETS),
        help="replace the spec's geometry by a preset",
    )
    pr.add_argument("--depth", type=positive_int, default=None, help="BMC depth (default 4)")
    pr.add_argument(
        "--only", default=None, help="only obligations of this invariant, action or kind"
    )
    pr.add_argument(
        "--format",
        choices=["text", "json", "junit"],
        default="text",
        help="report format (json carries a schema version; junit: one testcase per obligation)",
    )
    pr.add_argument("-o", "--output", default=None, help="write the report to a file")
    pr.add_argument(
        "-j",
        "--jobs",
        type=positive_int,
        default=None,
        help="worker processes (default: all cores)",
    )
    pr.add_argument(
        "--budget",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds in all: what is left is 'unknown' (exit 3 unless "
        "something failed) and the partial report is printed",
    )
    pr.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="per unit of work (an obligation; an action's induction steps): past it the "
        f"worker is stopped and the verdict is 'unknown' (default {DEFAULT_TIMEOUT_S:g}; 0: none)",
    )
    pr.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="-v: the table of every obligation; -vv: every witness trace too",
    )
    pr.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    pr.add_argument(
        "--update-witnesses",
        action="store_true",
        help="store newly found witness traces in proofs/witnesses.json (keyed by the table's "
        "content; safe for runs in parallel)",
    )
    pr.set_defaults(func=run)
