"""Lockstep steps per second of ``kvstate fuzz`` in the ``ci`` profile, paired across builds.

Runs the two conformance targets the issue tracker measures, each as its own ``kvstate fuzz``
process (Python's start is excluded by the command's own clock):

* ``block``: ``kvstate fuzz --profile ci`` (the table's actions one at a time on a real cache);
  the figure is *lockstep steps/s* (actions performed by model and target, then checked).
* ``model``: ``kvstate fuzz --target model --profile ci`` (the same walk on the reference
  model's own executable table: what the harness costs without the cache).
* ``api``: ``kvstate fuzz --target kvstate-api --profile ci`` (the public API, bytes and faults);
  the figure is *API operations/s*.
* ``vllm``: ``kvstate fuzz --target vllm --profile ci`` (vLLM's ``KVCacheManager``; needs vLLM,
  ``tools/install_vllm.sh``); the figure is *steps/s*.  Its ci run ends in the known vLLM
  0.33.0 finding (exit 1, ``docs/vllm-findings.md``): that exit counts as a completed run.

Two rates per run: the command's own (its count over the seconds of its fuzzing loop, wall
clock) and the count over the process's CPU seconds (user + system, ``getrusage`` of the
child: Python's start and the imports included, other jobs' time excluded), the one to compare
on a loaded machine.

``--python`` adds other interpreters (for instance a baseline worktree's venv), and every round
runs each interpreter once per target, the order rotating, so each round's ratio compares runs
that saw the same machine load.  Each run's counts (steps, refusals, examples; operations) are
printed too: a speed-up that changed them changed what the fuzzer checks, and the bench says so.

    .venv/bin/python bench/fuzz_throughput.py [--rounds 3] [--python ../base/.venv/bin/python]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# ``-P``: the working directory is not put on ``sys.path``.  Run from a checkout, ``python -c``
# would otherwise import that checkout's ``kvstate/`` folder ahead of the interpreter's own
# (editable) install: a baseline venv would run this worktree's ``kvstate/*`` modules.
ISOLATED = ("-P",)

TARGETS = {
    "block": (["fuzz", "--profile", "ci"], r"throughput: ([\d.]+) lockstep steps/s"),
    "model": (
        ["fuzz", "--target", "model", "--profile", "ci"],
        r"throughput: ([\d.]+) lockstep steps/s",
    ),
    "api": (
        ["fuzz", "--target", "kvstate-api", "--profile", "ci"],
        r"\(([\d.]+) operations/s\)",
    ),
    "vllm": (
        ["fuzz", "--target", "vllm", "--profile", "ci"],
        r"steps in [\d.]+ s \(([\d.]+) steps/s\)",
    ),
}
# exit statuses of a completed run: vLLM's ci run ends in a finding on vLLM 0.33.0
COMPLETED = {"block": (0,), "model": (0,), "api": (0,), "vllm": (0, 1)}
COUNTS = {  # the first group is the count the rates are of
    "block": r"ok, (\d+) lockstep steps and (\d+) refused actions checked in (\d+) examples",
    "model": r"ok, (\d+) lockstep steps and (\d+) refused actions checked in (\d+) examples",
    "api": r"(\d+) API operations in (\d+) Hypothesis examples",
    "vllm": r"(\d+) steps in",
}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(
    python: str, target: str, keep: Path | None = None
) -> tuple[float, float, tuple[int, ...]]:
    """One ``kvstate fuzz`` run: its own rate, its count per process CPU second, its counts
    (its whole output written to ``keep`` when given: the verdict and the report)."""
    args, pat = TARGETS[target]
    cli = "import sys; from kvstate.cli import main; sys.exit(main())"
    cpu0 = _children_cpu()
    proc = subprocess.run(
        [python, *ISOLATED, "-c", cli, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    cpu = _children_cpu() - cpu0
    out = proc.stdout + proc.stderr
    if keep is not None:
        keep.write_text(
            f"{python} {' '.join(args)}\nexit {proc.returncode}, CPU {cpu:.1f} s\n{out}"
        )
    rate = re.search(pat, out)
    counts = re.search(COUNTS[target], out)
    if proc.returncode not in COMPLETED[target] or rate is None or counts is None:
        raise SystemExit(f"{python} {' '.join(args)} failed (rc {proc.returncode}):\n{out[-3000:]}")
    got = tuple(int(x) for x in counts.groups())
    return float(rate.group(1)), got[0] / cpu, got


def _mmm(xs: list[float], digits: int = 1) -> str:
    """min / median / max."""
    return "/".join(f"{x:.{digits}f}" for x in (min(xs), statistics.median(xs), max(xs)))


def _compiled(python: str) -> str:
    code = "from kvstate.impl import native_modules; print(' '.join(sorted(native_modules())))"
    got = subprocess.run(
        [python, *ISOLATED, "-c", code], capture_output=True, text=True, check=False
    )
    return got.stdout.strip() or "none (pure Python)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", nargs="+", choices=list(TARGETS), default=list(TARGETS))
    ap.add_argument(
        "--python",
        action="append",
        default=[],
        help="another interpreter to run side by side (repeatable); this one always runs",
    )
    ap.add_argument("--keep", type=Path, default=None, help="write each run's output here")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    pythons = [sys.executable, *a.python]
    print(f"machine load (1/5/15 min): {_load()}, {os.cpu_count()} CPUs")
    for i, py in enumerate(pythons):
        print(f"  [{i}] {py}: compiled request path: {_compiled(py)}")
    for target in a.targets:
        own: dict[int, list[float]] = {i: [] for i in range(len(pythons))}
        per_cpu: dict[int, list[float]] = {i: [] for i in range(len(pythons))}
        counts: dict[int, set[tuple[int, ...]]] = {i: set() for i in range(len(pythons))}
        load0 = _load()
        for rnd in range(a.rounds):
            order = list(range(len(pythons)))
            order = order[rnd % len(order) :] + order[: rnd % len(order)]
            for i in order:
                keep = None
                if a.keep is not None:
                    a.keep.mkdir(parents=True, exist_ok=True)
                    keep = a.keep / f"{target}-{i}-{rnd + 1}.txt"
                rate, cpu_rate, cnt = run_once(pythons[i], target, keep)
                own[i].append(rate)
                per_cpu[i].append(cpu_rate)
                counts[i].add(cnt)
        unit = "operations/s" if target == "api" else "steps/s"
        print(
            f"\n{target} ({' '.join(TARGETS[target][0])}), {unit}, {a.rounds} rounds "
            f"(load {load0} -> {_load()}):"
        )
        for i in own:
            print(
                f"  [{i}] own clock {_mmm(own[i])}; per process CPU s {_mmm(per_cpu[i])}"
                f"   counts {sorted(counts[i])}"
            )
        for i in list(own)[1:]:
            for name, rates in (("own clock", own), ("per CPU s", per_cpu)):
                ratios = [x / y for x, y in zip(rates[0], rates[i], strict=True)]
                print(f"  ratio [0]/[{i}] per round, {name}: {_mmm(ratios, 2)}")
            if counts[0] != counts[i]:
                print(
                    f"  NOTE: the counts differ between [0] and [{i}]: they checked different runs"
                )
    print(f"\nmachine load at the end: {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
