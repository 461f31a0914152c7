"""The ``kvstate`` command line: ``prove``, ``fuzz``, ``graphs``, ``mutate``.

Exit codes are part of the interface, so CI can gate on them (:data:`common.EXIT_CODES`):
0 all good, 1 a property fails (with a readable trace), 2 bad usage or malformed input (one
line on stderr), 3 undecided (an obligation ``unknown``: timed out, or the budget ran out),
130/143 interrupted (after the partial report).  One module per command; arguments are
validated while parsing (:mod:`.common`'s types).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvstate.spec.errors import SpecError

from . import fuzz, graphs, mutate, prove
from .common import (
    EXIT_CODES,
    EXIT_FAIL,
    EXIT_OK,
    EXIT_UNDECIDED,
    EXIT_USAGE,
    EXTRAS,
    Parser,
    load_table,
    version_text,
)
from .fuzz import long_lived_imports

_load_table = load_table  # the name scripts and docs/performance.md use


class _Version(argparse.Action):
    """``--version``: computed when asked (it looks at the request path's build)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kw: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="kvstate",
        description="Provable prefix-cache hits for hybrid-attention KV caches.",
        epilog=EXIT_CODES,
    )
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser, metavar="COMMAND")
    prove.add_parser(sub)
    graphs.add_parser(sub)
    mutate.add_parser(sub)
    fuzz.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (2, one line on stderr), --help or --version (0)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        return int(args.func(args))
    except SpecError as exc:
        print(f"kvstate: spec error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"kvstate: {args.cmd} needs {exc.name!r}: pip install 'kvstate[{extra}]'",
            file=sys.stderr,
        )
        return EXIT_USAGE


__all__ = [
    "EXIT_FAIL",
    "EXIT_OK",
    "EXIT_UNDECIDED",
    "EXIT_USAGE",
    "build_parser",
    "long_lived_imports",
    "main",
]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
