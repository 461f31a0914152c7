"""The run's driver: ``kvstate fuzz --target kvstate-api`` (:func:`run_api_cli`) parses the
trace or profile, runs the witnesses and Hypothesis (:func:`run_api`, in place or shared with a
forked process), minimizes the first finding and prints the summary lines and the report.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvstate.examples_db import saved, with_database
from kvstate.harness.finding import Nonconformance
from kvstate.harness.profiles import pin, show
from kvstate.harness.report import field_lines, finding_lines, seed_text
from kvstate.harness.trace import TraceStep
from kvstate.spec.table import Table
from kvstate.targets.api.base import Coverage
from kvstate.targets.api.beside import _run_beside, _second_cpu
from kvstate.targets.api.explore import (
    CI_SEED,
    PROFILES,
    _coverage_pass,
    _hypothesis,
    _Recorder,
    _vacuity,
    explore_settings,
    minimize_ops,
    replay,
)
from kvstate.targets.api.machine import build_machine
from kvstate.targets.api.registry import DEFAULT_OPS, OPS, drawn_ops, parse_ops
from kvstate.targets.api.state import ApiHarness
from kvstate.targets.api.witnesses import COVERAGE_ONLY, witnesses

_BLOB = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


@dataclass
class RunResult:
    finding: Nonconformance | None
    coverage: Coverage
    stats: Counter[str]
    seconds: float
    origin: str = ""
    minimized: list[TraceStep] | None = None
    replays: int = 0
    blob: str | None = None
    seed: int | None = None
    found_len: int = 0
    shared: bool = False  # the examples were shared with a forked process (_run_beside)

    @property
    def steps(self) -> int:
        return self.stats["(steps)"]


def run_api(
    table: Table,
    N: int = 4,
    *,
    profile: str = "ci",
    examples: int | None = None,
    steps: int | None = None,
    seed: int | None = None,
    ops: frozenset[str] | None = None,
    coverage_pass: bool = True,
    minimize: bool = True,
    reproduce: str | None = None,
    minimize_seconds: float = 60.0,
    beside: bool = True,
    out: Callable[[str], None] = lambda s: None,
    database: Any = None,
    key: bytes = b"",
) -> RunResult:
    """The scripted witnesses, then Hypothesis; the first finding minimized.

    ``beside``: where the walk is deterministic (derandomized, or a seed) and a second CPU and
    ``os.fork`` exist, the same work is shared by two processes (:func:`_run_beside`): the
    checks, the counts and the report are those of the run in place.  ``database`` (not in
    ``ci``): Hypothesis' example database, examples filed under ``key``
    (:mod:`kvstate.examples_db`); a run with one is not shared (the dry run would judge the
    saved failures passed and delete them)."""
    # What the examples import on first use, imported before the clock starts: the block
    # target's clock, too, starts after Python's start and imports (kvstate/fuzz_cli.py).
    import kvstate.impl.cache
    import kvstate.testing.datacheck  # noqa: F401

    cov, stats = Coverage(), Counter[str]()
    started = time.monotonic()
    allowed = DEFAULT_OPS if ops is None else ops
    wit = {
        name: w
        for name, w in witnesses(N, table.consts.L, table.consts.lease_max).items()
        if all(o.name in allowed for o in w)
    }
    prof = with_database(explore_settings(profile, examples, steps, seed), database)
    stats["(saved examples)"] = saved(prof, key)

    def machine_cls(
        cov: Coverage, stats: Counter[str], harness: Callable[..., Any] | None = None
    ) -> Any:
        cls: Any = build_machine(
            table,
            N,
            ops=allowed,
            coverage=cov,
            stats=stats,
            seeds=[w for name, w in wit.items() if not name.startswith(COVERAGE_ONLY)],
            harness=harness,
        )
        if seed is not None:
            cls = pin(cls, seed)
        elif prof.derandomize:
            cls = pin(cls, CI_SEED)  # the ci walk follows the pinned seed, not the source
        if reproduce is not None:
            import hypothesis

            cls._hypothesis_internal_use_reproduce_failure = (
                hypothesis.__version__,
                reproduce.encode(),
            )
        return cls

    def explore(passed: int = 0) -> tuple[Nonconformance | None, str, str | None]:
        """Hypothesis in this process: its first finding, where it was found, its blob.
        ``passed``: its first examples already ran and passed (beside, with their counts
        added): those are drawn again, not run again (:class:`_Recorder`)."""
        made = 0

        def harness(*a: Any, **k: Any) -> Any:
            nonlocal made
            made += 1
            return _Recorder([]) if made <= passed else ApiHarness(*a, **k)

        found, stdout = _hypothesis(machine_cls(cov, stats, harness if passed else None), prof, key)
        if found is None:
            return None, "", None
        m = _BLOB.search(stdout + "".join(getattr(found, "__notes__", [])))
        at = stats["(examples)"] + 1
        where = ", a saved example of the example database" * (at <= stats["(saved examples)"])
        return found, f"Hypothesis, example {at}{where}", m.group(2) if m else None

    found: Nonconformance | None = None
    origin = ""
    blob = None
    deterministic = reproduce is None and (seed is not None or bool(prof.derandomize))
    shared = beside and coverage_pass and deterministic and prof.database is None
    shared = shared and _second_cpu()
    if shared:
        found, origin, blob = _run_beside(
            table,
            N,
            wit,
            lambda h: machine_cls(Coverage(), Counter(), h),
            prof,
            cov,
            stats,
            explore,
            out,
        )
    else:
        if coverage_pass and reproduce is None:
            found, origin = _coverage_pass(table, N, wit, cov, stats)
            if found is None:
                out(f"  coverage pass: {len(wit)} witnesses replayed in lockstep")
        if found is None:
            found, origin, blob = explore()
    res = RunResult(
        found,
        cov,
        stats,
        time.monotonic() - started,
        origin,
        blob=blob,
        seed=seed,
        found_len=len(found.trace) if found is not None else 0,
        shared=shared,
    )
    if found is None and coverage_pass and reproduce is None:
        res.finding = _vacuity(table, N, cov)
        res.origin = "" if res.finding is None else "the run's own counters, at its end"
    if found is not None and minimize:
        out(f"  minimizing the {len(found.trace)}-operation failing trace (fresh replays)...")
        res.minimized, res.finding, res.replays = minimize_ops(
            table, N, found, max_seconds=minimize_seconds
        )
    return res


def summary_lines(res: RunResult) -> list[str]:
    c = res.coverage.counts
    rate = res.steps / res.seconds if res.seconds else 0.0
    faults = {k[6:]: v for k, v in sorted(c.items()) if k.startswith("fault ")}
    lines = [
        f"  {res.steps} API operations in {res.stats['(examples)']} Hypothesis examples + the "
        f"witnesses, {res.seconds:.1f} s ({rate:.1f} operations/s)",
        f"  paths: disk restores completed {c['disk restores completed']}, host restores "
        f"{c['host restores completed']}, indexer rebuilds {c['indexer rebuilds']}, hits used "
        f"{c['hits used']} (over restored blocks {c['hits used over restored blocks']}), slides "
        f"during a load {c['slides during a load']}, windows slid to make room "
        f"{c['windows slid to make room']}, loads failed {c['loads failed']}",
        f"  bytes: {c['reads checked']} reads checked, {c['bytes compared']} bytes compared, "
        f"{c['reads over restored blocks']} reads over restored blocks; quiescence checks "
        f"{c['quiescence checks']}",
        "  faults injected: " + (", ".join(f"{k} {v}" for k, v in faults.items()) or "none"),
    ]
    remote = {k[8:]: v for k, v in sorted(c.items()) if k.startswith("remote: ")}
    if remote:  # kvstate/targets/api/remote.py (a finding would have ended the run)
        lines.append(
            f"  remote: restores {c['disk restores completed']} (the tier's loads), "
            + ", ".join(f"{k} {v}" for k, v in remote.items())
            + "; wrong bytes 0, "
            f"leaked or stuck blocks 0 ({c['quiescence checks']} quiescence checks)"
        )
    from kvstate.targets.api.twonode import summary_line

    if summary_line(c):  # kvstate/targets/api/twonode.py: node B in its own process
        lines.append(summary_line(c))
    checks = {k[7:]: v for k, v in sorted(c.items()) if k.startswith("check: ")}
    if checks:  # kvstate/targets/api/checks.py
        lines.append("  checked: " + ", ".join(f"{k} {v}" for k, v in checks.items()))
    from kvstate.targets.api.facade import guard_line

    if guard_line(c):
        lines.append(guard_line(c))
    calls = {k[5:]: v for k, v in sorted(c.items()) if k.startswith("call ")}
    lines.append("  calls: " + ", ".join(f"{k} {v}" for k, v in calls.items()))
    refused = {k[8:]: v for k, v in sorted(c.items()) if k.startswith("refused ")}
    if refused:
        lines.append(
            "  refused (documented, nothing changed): "
            + ", ".join(f"{k} {v}" for k, v in refused.items())
        )
    return lines


def run_api_cli(args: Any, table: Table) -> int:
    """``kvstate fuzz --target kvstate-api`` (``--remote [URL]``: over a remote tier, inside
    :func:`kvstate.targets.api.remote.remote_world`)."""
    url = getattr(args, "remote", None)
    if url is None:
        if getattr(args, "nodes", 1) > 1:
            print(
                "kvstate fuzz: error: --nodes 2 needs --remote (node B shares its server)",
                file=sys.stderr,
            )
            return 2
        return _run_api_cli(args, table)
    from kvstate.targets.api.remote import remote_world
    from kvstate.testing.redisserver import ServerMissing

    try:
        world = remote_world(url or None, nodes=getattr(args, "nodes", 1))
        world.__enter__()
    except ServerMissing as exc:
        print(f"kvstate fuzz: error: --remote without a URL: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - the server at URL does not answer
        print(f"kvstate fuzz: error: --remote {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        return _run_api_cli(args, table)
    finally:
        world.__exit__(None, None, None)


def _run_api_cli(args: Any, table: Table) -> int:
    import shlex

    from kvstate.targets.api import remote

    N = args.pool or 4
    drawn = drawn_ops()  # the default operations, or those of a remote run
    ops = drawn
    for name in getattr(args, "skip_op", None) or []:
        if name not in OPS:
            print(
                f"kvstate fuzz: error: unknown API operation {name!r} ({', '.join(OPS)})",
                file=sys.stderr,
            )
            return 2
        ops -= {name}
    if args.bug:
        print(
            "kvstate fuzz: error: --bug plants seeded bugs in --target kvstate only; the API "
            "harness's planted bugs are source mutants (python -m kvstate.api_mutants)",
            file=sys.stderr,
        )
        return 2
    base = ["kvstate", "fuzz", "--target", "kvstate-api", "--pool", str(N)]
    if remote.WORLD is not None:
        base += ["--remote", *([args.remote] if args.remote else [])]
        base += ["--nodes", "2"] if remote.WORLD.nodes > 1 else []
    for name in sorted(drawn - ops):
        base += ["--skip-op", name]
    if args.replay is not None:
        text = args.replay[1:] if args.replay.startswith("@") else None
        try:
            trace = parse_ops(open(text).read() if text else args.replay)
        except (OSError, ValueError) as exc:
            print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
            return 2
        print(
            f"kvstate fuzz: target kvstate-api vs table {table.name}, pool N={N}: replaying "
            f"{len(trace)} operations"
        )
        cov = Coverage()
        found = replay(table, N, trace, coverage=cov)
        if found is None:
            print(f"kvstate fuzz: ok, the trace conforms ({len(trace)} operations + quiescence)")
            return 0
        print(
            f"kvstate fuzz: FAILED\n  failure:   {found.signature}\n             "
            + str(found).replace("\n", "\n             ")
        )
        return 1
    seed = args.seed
    if getattr(args, "threads", False):
        from kvstate.targets.api.threads import run_threads

        runs = {"ci": 3, "dev": 20, "nightly": 200}[args.profile]
        first = seed if seed is not None else 0
        print(
            f"kvstate fuzz: target kvstate-api --threads vs table {table.name}, pool N={N}, "
            f"{runs} threaded runs, seeds {first}..{first + runs - 1}",
            flush=True,
        )
        total: Counter[str] = Counter()
        for sd in range(first, first + runs):
            r = run_threads(table, N, seed=sd)
            total.update(r.counts)
            if r.problems:
                print(f"kvstate fuzz: FAILED (threads, seed {sd}, {r.seconds:.1f} s)")
                for p in r.problems:
                    print(f"  {p}")
                print(f"  rerun:     kvstate fuzz --target kvstate-api --threads --seed {sd}")
                return 1
        print(
            f"kvstate fuzz: ok, {runs} threaded runs: {total['sections checked']} critical "
            f"sections explained in lock order, {total['reads checked']} reads byte-checked, "
            f"{total['fault stall']} stalled disk reads, {total['fault abort_in_use']} aborts "
            "inside use, nothing leaked"
        )
        return 0
    if seed is None and args.profile != "ci":
        import random

        seed = random.randrange(2**32)
    prof = PROFILES[args.profile]
    from kvstate.examples_db import database_key, database_spec, open_database
    from kvstate.fuzz_report import api_outcome, emit

    try:
        db = open_database(database_spec(getattr(args, "example_db", None)))
    except ValueError as exc:  # SpecError: a bad --example-db
        print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
        return 2
    key = database_key("kvstate-api", table.name, table.geometry.name, N, (), drawn - ops)
    print(
        f"kvstate fuzz: target kvstate-api (the public API, bytes, faults) vs table "
        f"{table.name}, pool N={N}, profile {args.profile} "
        f"({args.examples or prof['max_examples']} examples x "
        f"{args.steps or prof['stateful_step_count']} operations), seed "
        f"{f'{show(CI_SEED)} (pinned, derandomized)' if seed is None else seed}",
        flush=True,
    )
    res = run_api(
        table,
        N,
        profile=args.profile,
        examples=args.examples,
        steps=args.steps,
        seed=seed,
        ops=ops,
        coverage_pass=not args.no_coverage,
        reproduce=args.reproduce,
        # --coverage traces this process; a remote run's faults act on the one server
        beside=not getattr(args, "code_coverage", False) and remote.WORLD is None,
        out=lambda s: print(s, flush=True),
        database=db,
        key=key,
    )
    if res.finding is None:
        from kvstate.targets.api.schedule import run_profile  # the threaded mode's schedules

        failed, threads = (False, []) if remote.WORLD else run_profile(table, N, args.profile, seed)
        if failed:
            print("\n".join(threads))
            return 1
        print("kvstate fuzz: ok, no nonconformance")
        print("\n".join(summary_lines(res) + threads))
        emit(args, api_outcome(args, table, N, res, {}))
        return 0
    f = res.finding
    trace = res.minimized or list(f.trace)
    f.origin = res.origin
    print(f"\nkvstate fuzz: FAILED after {res.seconds:.1f} s")
    how = f"minimized {res.found_len} -> {len(trace)} operations ({res.replays} fresh replays)"
    fields = {
        "seed": seed_text(res.seed, CI_SEED, args.profile),
        "blob": res.blob
        or (
            "none (the deterministic coverage pass found it)"
            if "coverage" in res.origin
            else "none"
        ),
    }
    rerun = [*base, "--profile", args.profile] + (
        [] if res.seed is None else ["--seed", str(res.seed)]
    )
    if args.no_coverage:
        rerun.append("--no-coverage")
    if getattr(args, "example_db", None) is not None:
        rerun += ["--example-db", args.example_db]
    commands = {"rerun": shlex.join(rerun)}
    if res.blob:
        commands["reproduce"] = shlex.join([*rerun, "--reproduce", res.blob])
    commands["replay"] = shlex.join([*base, "--replay", "; ".join(o.render() for o in trace)])
    lines = finding_lines(
        f, how, trace, start="a fresh cache", unit="operation", empty="found at the run's end"
    )
    print("\n".join(lines + field_lines(fields | commands)))
    print("\n".join(summary_lines(res)))
    emit(args, api_outcome(args, table, N, res, commands))
    return 1
