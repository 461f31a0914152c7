"""``python -m kvstate.impl_mutants run|report|list|verify|migrate-triage``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kvstate.impl_mutants.mutants import enumerate_mutants, mutated_source, picked
from kvstate.impl_mutants.reach import is_reached, reached_lines
from kvstate.impl_mutants.report import report
from kvstate.impl_mutants.run import run
from kvstate.impl_mutants.store import CONTEXT, ROOT, STORE, load
from kvstate.impl_mutants.triage import migrate_triage
from kvstate.impl_mutants.walks import plan, remote_on
from kvstate.mutant_runner import Target

_KILL = "kvstate.impl_mutants.killer"
IMPL = Target(
    package="kvstate.impl",
    folder=ROOT / "impl",
    killer=f"{_KILL}:api_fuzz",
    prepare=f"{_KILL}:prepare",
    exclude=("_aot.py",),  # generated from the table by kvstate/buildtools/aotgen.py
    context=tuple(ROOT / f for f in CONTEXT),
    remote=f"{_KILL}:remote_fuzz",
    both=f"{_KILL}:both",
)


def verify(args: argparse.Namespace, target: Target) -> int:
    """The real commands, ``kvstate fuzz --target kvstate-api`` (and ``--remote``, for a mutant
    the remote walk reaches), in a fresh interpreter on a staged copy of the package with the
    mutant written into it: the forked runner's verdicts, checked."""
    import os
    import subprocess

    from kvstate.api_mutants import stage

    stored = {m.id: (m, r) for m, r in load(args, target)}
    everything = {m.id: m for m in enumerate_mutants(target)}
    reach = reached_lines(args, target) if remote_on(args, target) else None
    root = stage()
    agree = measured = 0
    for mid in args.ids:
        m = everything.get(mid)
        if m is None:
            print(f"{mid}: no such mutant of the current sources", file=sys.stderr)
            return 2
        text, mutated = mutated_source(target, m)
        dst = root / "kvstate" / "impl" / m.file
        dst.write_text(mutated or text)
        env = {**os.environ, "KVSTATE_PURE_PYTHON": "1", "PYTHONPATH": str(root)}
        cmd = [sys.executable, "-m", "kvstate", "fuzz", "--target", "kvstate-api"]
        cmd += ["--profile", args.profile]
        walks = "api"
        if reach is not None:
            walks = plan(
                target, is_reached(target, m, reach.api), is_reached(target, m, reach.remote)
            ).walks
        t0 = time.monotonic()
        try:
            verdict = "survived"
            for w in walks.split("+"):  # the command starts its own redis-server for --remote
                c = [*cmd, "--remote"] if w == "remote" else cmd
                rc = subprocess.run(
                    c, env=env, cwd=root, capture_output=True, timeout=args.timeout
                ).returncode
                if rc != 0:
                    verdict = "killed"
                    break
        except subprocess.TimeoutExpired:
            verdict = "timeout"
        finally:
            dst.write_text(text)
        before = stored[mid][1]["verdict"] if mid in stored else "unmeasured"
        agree += before == verdict
        measured += before != "unmeasured"
        print(
            f"{mid:<58} command ({walks}): {verdict:<8} ({time.monotonic() - t0:5.1f} s)  "
            f"forked runner: {before}",
            flush=True,
        )
    print(f"{agree}/{measured} verdicts agree with the store's")
    return 0 if agree == measured else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kvstate.impl_mutants",
        description="Generated mutants of impl/, killed (or not) by the API fuzz alone.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report", "list", "verify", "migrate-triage"):
        p = sub.add_parser(name)
        p.add_argument(
            "--profile", default="ci", choices=["ci", "dev"], help="the killing test's profile"
        )
        p.add_argument("--store", type=Path, default=STORE, help="the result store's folder")
        p.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
        p.add_argument("--package", default=None, help=argparse.SUPPRESS)
        p.add_argument("--killer", default=None, help=argparse.SUPPRESS)
        p.add_argument(
            "--files", nargs="+", default=None, metavar="GLOB",
            help="only mutants of these files of impl/ (globs, e.g. 'disk*.py')",
        )  # fmt: skip
        p.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
        p.add_argument("--remote-killer", default=None, help=argparse.SUPPRESS)
        p.add_argument("--both-killer", default=None, help=argparse.SUPPRESS)
        p.add_argument(
            "--no-remote", action="store_true",
            help="leave out the remote tier's walk (kvstate fuzz --target kvstate-api --remote), "
            "which mutants on the lines it runs get besides the API walk",
        )  # fmt: skip
    r = sub.choices["run"]
    r.add_argument("--sample", type=int, default=None, help="a uniform random sample of this many")
    r.add_argument("--seed", type=int, default=0, help="the sample's seed")
    r.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once")
    r.add_argument(
        "--survivors-of",
        default=None,
        choices=["ci", "dev"],
        help="only the mutants that survived this profile's run",
    )
    r.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant (default: 10x the baseline, at least 30)",
    )
    rp = sub.choices["report"]
    rp.add_argument(
        "--triage", default=None, help="JSON {mutant id: triage}; 'equivalent: ...' is not counted"
    )
    rp.add_argument("--json", default=None, help="write the summary here")
    rp.add_argument(
        "--markdown", default=None, help="write the per-file table and the survivors by class here"
    )
    rp.add_argument("--sample", type=int, default=None, help="only the first N of the seeded order")
    rp.add_argument("--seed", type=int, default=0)
    mt = sub.choices["migrate-triage"]
    mt.add_argument("--triage", required=True, help="the triage file, rewritten in place")
    mt.add_argument(
        "--evidence", default=None, help="a report's survivor lines (docs/generated-mutants.md)"
    )
    v = sub.choices["verify"]
    v.add_argument("ids", nargs="+", help="mutant ids (as report and list print them)")
    v.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    target = IMPL
    if a.folder is not None:  # another package (the tool's own tests use a scratch one)
        target = Target(
            a.package, a.folder.resolve(), a.killer, a.prepare or "",
            remote=a.remote_killer or "", both=a.both_killer or "",
        )  # fmt: skip
    if a.cmd == "list":
        for m in enumerate_mutants(target):
            if picked(m, a):
                print(m.id)
        return 0
    if a.cmd == "migrate-triage":
        return migrate_triage(a, target)
    return {"run": run, "report": report, "verify": verify}[a.cmd](a, target)


if __name__ == "__main__":
    sys.exit(main())
