"""Planted bugs the API harness has never seen: single-edit source mutants of ``impl/``.

``python -m kvstate.api_mutants`` applies each mutant below to a staged copy of the package (one
at a time, restored afterwards; the working tree is never edited), runs the API harness in a fresh interpreter on the pure-Python sources
(``KVSTATE_PURE_PYTHON=1``) and reports the kill rate, the median time to the first finding and
the median minimized trace length.  After a lockstep run that finds nothing, the child runs the
threaded mode's schedule exploration too (:mod:`kvstate.targets.api.schedule`; a kill there reports its
preemptions as the trace length).  Each mutant is one edit at the spot a real engine bug of its
class lives (a missing pin, a reference count off by one, a slot freed without reset, a stale
indexer version, a load marked complete early, a checksum never verified, a host copy without the
indexer pages, a window read at the wrong offset, ...), none of them one of the six seeded bugs
of :mod:`kvstate.testing.seeded` (source edits too, loaded in-process for the lockstep tests and
``kvstate fuzz --bug``).

The mutants are the table of :mod:`kvstate.api_planted`.  The harness runs with every operation (``SKIP`` is empty: the defects that once made
``read_released``, ``mutate_tokens``, ``abort_in_use``, ``disk_full`` and ``foreign`` fail on
the unmutated library are fixed, and ``kvstate fuzz --target kvstate-api`` runs them all clean).
A mutant the harness's geometry cannot distinguish from the original says why (``equivalent``);
it is applied but not run, and not counted.  Not part of the default test run (minutes): ``python -m kvstate.api_mutants [-k
NAME] [--profile ci|dev] [--json FILE]``.

Before any mutant, the same child runs on the unmutated copy: where it does not pass (a
dependency the child cannot import, a harness that fails on the library as it is) every mutant
would read as killed, so the run stops there with status 2 (``--no-baseline`` skips it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvstate.api_planted import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parent.parent
SKIP: tuple[str, ...] = ()


PACKAGES = {
    "kvstate": "kvstate",
    "spec": "kvstate/spec",
    "model": "kvstate/model",
    "proofs": "kvstate/proofs",
    "impl": "kvstate/impl",
    "kernels": "kvstate/kernels",
    "numerics": "kvstate/numerics",
}


def stage() -> Path:
    """A copy of the package (the repository's folder -> package map) the mutants are applied
    to: the working tree itself is never edited; the child runs with the copy first on its path."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="kvstate-mutants-"))
    for folder, pkg in sorted(PACKAGES.items(), key=lambda x: x[1].count("/")):
        shutil.copytree(
            ROOT / folder,
            root / pkg,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.so"),
        )
    return root


def _staged(root: Path, m: Mutant) -> Path:
    folder, _, rest = m.path.partition("/")
    return root / PACKAGES[folder] / rest


def apply(root: Path, m: Mutant) -> str:
    path = _staged(root, m)
    src = path.read_text()
    if src.count(m.old) != 1:
        raise SystemExit(
            f"mutant {m.name}: its source text occurs {src.count(m.old)} times in {m.path}"
        )
    path.write_text(src.replace(m.old, m.new))
    return src


def _child_run(root: Path, profile: str, timeout: float, coverage: bool) -> dict[str, object]:
    """The killing test in a fresh interpreter on the staged copy (first on its path, the
    caller's own path after it: a dependency installed there, e.g. with ``pip --target``,
    stays importable)."""
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    try:
        env = {**os.environ, "KVSTATE_PURE_PYTHON": "1", "PYTHONPATH": path}
        proc = subprocess.run(
            [sys.executable, "-m", "kvstate.api_mutants", "--child", profile]
            + ([] if coverage else ["--no-coverage"]),
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        out: dict[str, object] = (
            json.loads(proc.stdout.strip().splitlines()[-1])
            if proc.stdout.strip()
            else {"killed": True, "kind": "crash", "detail": proc.stderr[-300:]}
        )
    except subprocess.TimeoutExpired:
        out = {"killed": False, "kind": "timeout"}
    return out


def run_one(
    root: Path, name: str, profile: str, timeout: float, coverage: bool = True
) -> dict[str, object]:
    m = next(x for x in MUTANTS if x.name == name)
    original = apply(root, m)
    started = time.monotonic()
    try:
        out = _child_run(root, profile, timeout, coverage)
    finally:
        _staged(root, m).write_text(original)
    out.update(name=m.name, bug_class=m.bug_class, wall=round(time.monotonic() - started, 1))
    return out


def baseline(root: Path, profile: str, timeout: float, coverage: bool = True) -> str | None:
    """Why the killing test fails on the unmutated staged copy, or None when it passes: a
    test that fails (or cannot start: a missing dependency in the child) on every source
    would count every mutant killed."""
    out = _child_run(root, profile, timeout, coverage)
    if out.get("killed") or out.get("kind") == "timeout":
        return f"{out.get('kind')}: {str(out.get('detail', ''))[:300]}"
    return None


def child(profile: str, coverage: bool = True) -> None:
    """In the mutated interpreter: one harness run, the outcome as one JSON line."""
    from kvstate.spec import default_table
    from kvstate.targets.api.registry import DEFAULT_OPS
    from kvstate.targets.api.run import run_api
    from kvstate.testing.scratch import ram_scratch
    from kvstate.testing.threads import single_intraop_thread

    single_intraop_thread()
    ram_scratch()  # per-example disk tiers on tmpfs: see kvstate/testing/scratch.py
    t0 = time.monotonic()
    try:
        res = run_api(
            default_table(),
            4,
            profile=profile,
            ops=DEFAULT_OPS - set(SKIP),
            coverage_pass=coverage,
            minimize_seconds=20.0,
        )
    except Exception as exc:  # noqa: BLE001 - the mutant broke the import or the harness
        print(
            json.dumps(
                {
                    "killed": True,
                    "kind": f"crash:{type(exc).__name__}",
                    "detail": str(exc)[:200],
                    "seconds": time.monotonic() - t0,
                }
            )
        )
        return
    f = res.finding
    if f is None:  # the threaded mode's schedules, as ``kvstate fuzz`` runs them after
        from kvstate.targets.api.schedule import PROFILE_SCHEDULES, explore

        x = explore(default_table(), 4, schedules=PROFILE_SCHEDULES[profile])
        if x.failing is not None:
            print(
                json.dumps(
                    {
                        "killed": True,
                        "kind": x.problems[0][:120],
                        "origin": "schedules",
                        "seconds": round(res.seconds + (x.to_first or 0.0), 2),
                        "found_len": len(x.failing[0]) // 2,  # preemptions
                        "trace_len": 0,
                        "trace": ",".join(map(str, x.failing[0])),
                    }
                )
            )
            return
        from kvstate.targets.api.workers import run_workers  # the cache's own worker threads

        w = run_workers(default_table(), 4)
        if w.problems:
            found = {"killed": True, "kind": w.problems[0][:120], "origin": "workers"}
            print(json.dumps(found | {"seconds": round(time.monotonic() - t0, 2)}))
            return
    print(
        json.dumps(
            {
                "killed": f is not None,
                "kind": f.signature if f is not None else "",
                "origin": res.origin,
                "seconds": round(res.seconds, 2),  # to the first finding (before minimizing)
                "found_len": res.found_len,
                "trace_len": len(res.minimized or []) if f is not None else 0,
                "trace": "; ".join(o.render() for o in (res.minimized or [])),
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvstate.api_mutants", description=__doc__)
    ap.add_argument("-k", action="append", default=[], help="run only mutants whose name has this")
    ap.add_argument("--profile", default="ci", choices=["ci", "dev", "nightly"])
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--list", action="store_true")
    ap.add_argument(
        "--no-coverage",
        action="store_true",
        help="Hypothesis only: skip the scripted witnesses (examples may still start from one)",
    )
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the unmutated run that checks the killing test passes first (exit 2 if not)",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a.child, not a.no_coverage)
        return 0
    chosen = [m for m in MUTANTS if not a.k or any(k in m.name for k in a.k)]
    if a.list:
        for m in chosen:
            print(f"{m.name:<36} {m.bug_class:<40} {m.path}")
        return 0
    root = stage()
    for m in chosen:  # every patch applies (and is undone) before anything runs
        _staged(root, m).write_text(apply(root, m))
    if not a.no_baseline and any(not m.equivalent for m in chosen):
        why = baseline(root, a.profile, a.timeout, not a.no_coverage)
        if why is not None:
            print(f"the killing test fails on the unmutated sources: {why}", file=sys.stderr)
            return 2
    results = []
    for m in chosen:
        if m.equivalent:
            print(f"EQUIVAL  {m.name:<36} not run: {m.equivalent}", flush=True)
            continue
        r = run_one(root, m.name, a.profile, a.timeout, not a.no_coverage)
        results.append(r)
        print(
            f"{'KILLED ' if r['killed'] else 'SURVIVED'} {m.name:<36} {r.get('seconds', '-')!s:>6} s "
            f"{r.get('found_len', '-')!s:>3} -> {r.get('trace_len', '-')!s:>2} ops  {r.get('kind', '')}  [{r.get('origin', '')}]",
            flush=True,
        )
    killed = [r for r in results if r["killed"]]
    print(
        f"\n{len(killed)}/{len(results)} mutants killed ({100 * len(killed) / max(1, len(results)):.0f}%)"
        f", {len(chosen) - len(results)} equivalent on the harness's geometry (not counted)"
    )
    if killed:
        print(
            f"median time to the first finding: {statistics.median([float(str(r['seconds'])) for r in killed if 'seconds' in r] or [0.0]):.1f} s; "
            # (a mutant the fuzz crashed on has no trace: left out of the lengths)
            f"median trace length: {statistics.median([int(r['found_len']) for r in killed if 'found_len' in r] or [0])} operations found, "
            f"{statistics.median([int(r['trace_len']) for r in killed if 'trace_len' in r] or [0])} minimized"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0 if len(killed) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
