"""``kvstate graphs``: each component's phase graph as Graphviz DOT, checked for unreachable
and trap phases."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .common import EXIT_FAIL, EXIT_OK, SPEC_HELP, load_table, spec_names


def run(args: argparse.Namespace) -> int:
    from kvstate.model.graph import check_structure, phase_graph, to_dot
    from kvstate.spec.phases import LIFECYCLES

    table = load_table(args.spec)
    os.makedirs(args.out, exist_ok=True)
    ok = True
    for lc in LIFECYCLES:
        g = phase_graph(table, lc)
        rep = check_structure(g, lc)
        ok &= rep.ok
        path = os.path.join(
            args.out, lc.component.lower().replace(" ", "_").replace("-", "_") + ".dot"
        )
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(to_dot(g, lc))
        print(
            f"{lc.component:<18} {rep.edges:>3} edges  {'ok' if rep.ok else 'PROBLEM'}  -> {path}"
        )
    return EXIT_OK if ok else EXIT_FAIL


def add_parser(sub: Any) -> None:
    gr = sub.add_parser(
        "graphs",
        help="export each component's phase graph as DOT and check it",
        description="Write one Graphviz DOT file per component lifecycle (edges from the "
        "guards, by Z3) and check each: exit 1 when a phase is unreachable or a trap.",
    )
    gr.add_argument("--spec", default="default", help=SPEC_HELP.format(", ".join(spec_names())))
    gr.add_argument(
        "--out", default="graphs", help="folder for the .dot files (created; default ./graphs)"
    )
    gr.set_defaults(func=run)
