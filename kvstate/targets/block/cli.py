"""``kvstate fuzz`` for the block-level target: an allocator against the model, action by action.

Targets: ``kvstate`` (the built-in allocator, one action at a time,
``kvstate.testing.adapter:make_target``), ``model``
(the reference interpreter, a self-check), or ``module:factory`` -- any callable
``factory(table, N)`` returning an object with one method per spec action plus ``observe()``.

A run replays the proofs' reachability witnesses in lockstep with a near-miss refusal sweep (a
deterministic coverage pass; ``--no-coverage`` skips it) and lets Hypothesis explore; with a
second CPU the pass runs in a forked process beside the exploration (the two share nothing but
answers kept per pure input), otherwise first, and its finding is reported first either way.
A finding is shrunk to a short trace that fails the same way: by Hypothesis' own shrinker when
Hypothesis found it, then (either way) by delta debugging over fresh replays
(:func:`kvstate.targets.block.replay.minimize`).  The report gives who found it and the
lengths before and after, the failure, the minimized trace (one action per line), the seed, Hypothesis'
``@reproduce_failure`` blob when it applies, and one-line commands to rerun the run, replay the
trace (``--replay``) and reproduce Hypothesis' example (``--reproduce``); exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import random
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import hypothesis
from hypothesis import Phase, settings
from hypothesis.errors import DidNotReproduce

from kvstate.calls import parse_calls
from kvstate.examples_db import (
    database_key,
    database_spec,
    open_database,
    run_machine,
    saved,
    with_database,
)
from kvstate.fuzz_report import Outcome, block_states, emit, itf, spec_location
from kvstate.harness.coverage import summary
from kvstate.harness.finding import Nonconformance, find_in
from kvstate.harness.profiles import pin, seed_only, show
from kvstate.harness.report import field_lines, finding_lines, seed_text
from kvstate.harness.trace import Step
from kvstate.model.concrete import Machine
from kvstate.proofs.witnesses import reach_traces
from kvstate.spec.errors import SpecError
from kvstate.spec.table import Table
from kvstate.targets.block.machine import CI_SEED, build_state_machine
from kvstate.targets.block.replay import Minimized, minimize, replay_seeds, replay_trace
from kvstate.targets.block.target import OUTPUT_KINDS

MINIMIZE_SECONDS = 60.0  # budget of the replay minimizer (it stops earlier at a fixpoint)
_BLOB = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


def resolve_target(spec: str, bugs: list[str]) -> Any:
    if spec == "kvstate":
        from kvstate.testing.adapter import make_target
        from kvstate.testing.seeded import check_names

        planted = check_names(bugs)
        return lambda table, n: make_target(table, n, bugs=planted)
    if bugs:
        raise SpecError("--bug plants seeded bugs in the built-in target only (--target kvstate)")
    if spec == "model":
        from kvstate.targets.block.target import ModelTarget

        return lambda table, n: ModelTarget(table, n)
    if ":" not in spec:
        raise SpecError(
            f"unknown target {spec!r}; targets: kvstate-api, kvstate, model, vllm, or module:factory"
        )
    mod, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"cannot load target {spec!r}: {exc}") from exc
    if not callable(factory):
        raise SpecError(f"target {spec!r} is not callable")
    return factory


def parse_trace(text: str, table: Table, n: int) -> list[Step]:
    """``'allocate(b=0); commit(b=0)'`` (or one step per line, as the report prints them).

    ``# comments`` and leading step numbers are ignored, and so are output parameters (the
    target chooses them).  Unknown actions or parameters and out-of-range values raise
    :class:`SpecError`.
    """
    machine = Machine(table, n)
    names = {a.name for a in table.actions}
    steps: list[Step] = []
    try:
        calls = parse_calls(text)
    except ValueError as exc:
        raise SpecError(f"--replay: {exc}") from None
    for name, args in calls:
        line = f"{name}({', '.join(f'{k}={v}' for k, v in args)})"
        if name not in names:
            raise SpecError(f"--replay: unknown action {name!r} in {line!r}")
        action = table.action(name)
        kinds = {q.name: q.kind for q in action.params}
        params: dict[str, int] = {}
        for key, value in args:
            if key not in kinds:
                raise SpecError(f"--replay: bad parameter {key!r} in {line!r}")
            if kinds[key] in OUTPUT_KINDS:
                continue
            if value not in machine.domain(kinds[key]):
                raise SpecError(f"--replay: {key}={value} out of range for pool N={n} in {line!r}")
            params[key] = value
        missing = [q for q, k in kinds.items() if k not in OUTPUT_KINDS and q not in params]
        if missing:
            raise SpecError(f"--replay: {line!r} lacks parameter(s) {', '.join(missing)}")
        steps.append((action.name, params))
    return steps


def _flags(args: argparse.Namespace, *, run: bool) -> list[str]:
    out = ["kvstate", "fuzz"]
    if args.spec != "default":
        out += ["--spec", args.spec]
    out += ["--target", args.target]
    for b in args.bug:
        out += ["--bug", b]
    if args.pool:
        out += ["--pool", str(args.pool)]
    if run:
        out += ["--profile", args.profile]
        for flag in ("seed", "examples", "steps"):
            if getattr(args, flag) is not None:
                out += [f"--{flag}", str(getattr(args, flag))]
        if getattr(args, "example_db", None) is not None:
            out += ["--example-db", args.example_db]
        for flag in ("no_coverage", "no_warmup", "hypothesis_shrink"):
            if getattr(args, flag):
                out.append("--" + flag.replace("_", "-"))
    return out


def _command(args: argparse.Namespace, *, run: bool, extra: Sequence[str] = ()) -> str:
    return " ".join(shlex.quote(x) for x in [*_flags(args, run=run), *extra])


def _nonconformance(exc: BaseException) -> Nonconformance | None:
    return find_in(exc)


def _report(
    args: argparse.Namespace,
    cls: Any,
    exc: BaseException,
    *,
    seed: int | None,
    started: float,
    counts: Counter[str],
    hypothesis_found: bool,
) -> int:
    """Print the failure report (who found it, failure, minimized trace, seed, blob, commands)."""
    notes = "\n".join(getattr(exc, "__notes__", []) or [])
    blob = _BLOB.search(notes)
    finding = _nonconformance(exc)
    print("", flush=True)
    print(f"kvstate fuzz: FAILED after {time.monotonic() - started:.1f} s")
    outcome = _outcome(args, cls.table, seed, started, counts, ok=False)
    if finding is None:  # not a conformance finding: a crash of the target or of the harness
        print(f"  failure:   {type(exc).__name__}: {exc}")
        if notes:
            print("  " + notes.replace("\n", "\n  "))
        print(f"  rerun:     {_command(args, run=True)}")
        outcome.kind, outcome.detail = "crash", (type(exc).__name__,)
        outcome.message = f"{type(exc).__name__}: {exc}"
        outcome.commands = {"rerun": _command(args, run=True)}
        emit(args, outcome)
        return 1
    if hypothesis_found:
        finding.origin = "Hypothesis" + (
            f", example {counts['(first failure)']} (first failing example: "
            f"{counts['(first failure steps)']} steps)"
            if "(first failure)" in counts
            else ""
        )
        if 0 < counts["(first failure)"] <= counts["(saved examples)"]:
            finding.origin += ", a saved example of the example database"
    print(
        f"  minimizing the {len(finding.trace)}-step failing trace (fresh replays)...", flush=True
    )
    mini: Minimized = minimize(cls, finding, max_seconds=MINIMIZE_SECONDS)
    if not mini.reproduced:
        how = "NOT minimized: the trace did not fail the same way on a fresh replay"
    elif hypothesis_found:
        how = (
            f"Hypothesis shrank it to {mini.before} steps; replay-minimized to {mini.after}"
            if args.hypothesis_shrink
            else f"replay-minimized {mini.before} -> {mini.after} steps"
        ) + f" ({mini.replays} fresh replays, {mini.seconds:.1f} s)"
    else:
        how = (
            f"minimized {mini.before} -> {mini.after} steps"
            f" ({mini.replays} fresh replays, {mini.seconds:.1f} s)"
        )
    if mini.reproduced and not mini.complete:
        how += "; budget spent before a fixpoint"
    failure = mini.failure
    fields = {"seed": seed_text(seed, CI_SEED, args.profile)}
    if args.reproduce is not None:
        fields["blob"] = f"{args.reproduce} (given: the one example it encodes, rerun)"
    elif blob is not None:
        fields["blob"] = f"@reproduce_failure({blob.group(1)!r}, b{blob.group(2)!r})"
    elif hypothesis_found:
        fields["blob"] = "(Hypothesis printed none)"
    elif args.replay is None:
        fields["blob"] = "none (the deterministic coverage pass found it; every run repeats it)"
    trace = "; ".join(s.call() for s in mini.steps)
    commands: dict[str, str] = {}
    if args.replay is None:
        commands["rerun"] = _command(args, run=True)
    if blob is not None and args.reproduce is None:
        commands["reproduce"] = _command(args, run=True, extra=["--reproduce", blob.group(2)])
    commands["replay"] = _command(args, run=False, extra=["--replay", trace])
    print("\n".join(finding_lines(failure, how, mini.steps) + field_lines(fields | commands)))
    table, n = cls.table, args.pool or cls.table.geometry.model_blocks
    outcome.kind, outcome.detail = failure.kind, failure.detail
    outcome.message, outcome.origin = str(failure), failure.origin
    outcome.trace = [s.call() for s in mini.steps]
    outcome.commands = commands
    last = next((s.action for s in reversed(mini.steps) if not s.refused), "")
    outcome.location = spec_location(table, failure.kind, failure.detail, last)
    outcome.states = lambda: itf(
        block_states(table, n, mini.steps),
        description=f"{failure.signature} ({args.target})",
        meta=outcome.to_dict(),
    )
    emit(args, outcome)
    return 1


def _outcome(
    args: argparse.Namespace,
    table: Table,
    seed: int | None,
    started: float,
    counts: Counter[str],
    *,
    ok: bool,
) -> Outcome:
    return Outcome(
        target=args.target,
        table=table.name,
        geometry=table.geometry.name,
        pool=args.pool or table.geometry.model_blocks,
        profile=args.profile,
        seed=seed,
        ok=ok,
        seconds=time.monotonic() - started,
        steps=sum(v for k, v in counts.items() if not k.startswith("(")),
        examples=counts["(examples)"],
    )


class _CoverageBeside:
    """The coverage pass run in a forked process while Hypothesis explores in this one.

    The two are independent: every witness trace starts from Init on a fresh target and model,
    every Hypothesis example too, and what they share is kept per pure input (the model's
    answers per state value, the test rows per exact input), so neither changes what the other
    does or checks.  On a machine with a second CPU the pass then costs no wall-clock time.
    The child sends back its counts (steps, refusals) or that it failed; a failure is not
    reported from there: the parent replays the pass itself (it is deterministic) and reports
    that finding exactly as a pass run in place would, before any Hypothesis finding.  Used
    only where ``os.fork`` exists and this process may run on more than one CPU.  The guards
    are compiled before the fork (one target built and closed), so the two processes do not
    both compile them; the exploration then finds the model's answers about the witnesses'
    states not yet kept and computes them itself.  Measured on the ci run at load 5.5-7: the
    two processes together used 2.95-3.18 CPU s against 3.31-3.43 for the same build in place.
    """

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd
        self.why = ""

    @classmethod
    def start(
        cls,
        machine_cls: Any,
        table: Table,
        seeds: Sequence[Sequence[tuple[str, Any]]],
        counts: Counter[str],
    ) -> _CoverageBeside | None:
        """The pass started in a child process (``counts``: the run's, which its machines
        count into), or None where it cannot run beside (the caller runs it in place)."""
        import os

        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        if not hasattr(os, "fork") or cpus < 2:
            return None
        # One target built (and closed) first: the guards it compiles from the table are then
        # compiled once, for both processes, not once in each.
        close = getattr(machine_cls().target, "close", None)
        if callable(close):
            close()
        sys.stdout.flush()
        sys.stderr.flush()
        r, w = os.pipe()
        pid = os.fork()
        if pid:
            os.close(w)
            return cls(pid, r)
        # the child: run the pass, send the counts it added (or why it failed), and leave
        # without running the parent's exit handlers (its scratch folder, its open files)
        code = 1
        try:
            os.close(r)
            import pickle

            # GNU OpenMP (torch's CPU thread pool) is not fork-safe: a child whose parent ran a
            # parallel region hangs at its own first one (a target allocating large tiers, say).
            # One thread in the child runs torch's ops without entering OpenMP at all.
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)

            before = Counter(counts)
            try:
                replay_seeds(machine_cls, table, seeds)
            except BaseException as exc:  # noqa: BLE001 - the parent replays it for the report
                msg: Any = ("failed", f"{type(exc).__name__}: {exc}"[:2000])
            else:
                msg = ("ok", {k: v - before[k] for k, v in counts.items() if v != before[k]})
                code = 0
            data = pickle.dumps(msg)
            with os.fdopen(w, "wb") as fh:
                fh.write(data)
        finally:
            os._exit(code)

    def join(self) -> dict[str, int] | None:
        """The counts the pass added, or None when it failed (``why`` says how)."""
        import os
        import pickle

        chunks = []
        with os.fdopen(self.fd, "rb") as fh:
            while True:
                chunk = fh.read(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        _, status = os.waitpid(self.pid, 0)
        try:
            kind, body = pickle.loads(b"".join(chunks))
        except Exception:  # noqa: BLE001 - a crashed child sends nothing
            kind, body = "failed", f"the process ended with status {status} and sent nothing"
        if kind == "ok" and status == 0:
            return dict(body)
        self.why = str(body)
        return None


def run_block_cli(args: argparse.Namespace, table: Table) -> int:
    """``kvstate fuzz --target kvstate|model|module:factory``: the block-level target's run."""
    try:
        factory = resolve_target(args.target, args.bug)
    except Exception as exc:  # noqa: BLE001 - bad target/bug names are usage errors
        print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
        return 2
    if args.examples is not None and args.examples < 1 or args.steps is not None and args.steps < 1:
        print("kvstate fuzz: error: --examples and --steps must be >= 1", file=sys.stderr)
        return 2
    n = args.pool or table.geometry.model_blocks
    replay_steps: list[Step] | None = None
    if args.replay is not None:
        text = args.replay
        try:
            if text.startswith("@"):
                with open(text[1:], encoding="utf-8") as fh:
                    text = fh.read()
            replay_steps = parse_trace(text, table, n)
        except (OSError, SpecError) as exc:
            print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
            return 2
    base = settings.get_profile(args.profile)
    try:
        db = open_database(database_spec(args.example_db))
    except SpecError as exc:
        print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {}
    if args.examples is not None:
        overrides["max_examples"] = args.examples
    if args.steps is not None:
        overrides["stateful_step_count"] = args.steps
    if not args.hypothesis_shrink:
        # The replay minimizer shrinks what Hypothesis finds (0.5 s where Hypothesis' shrinker,
        # each example a fresh allocator, spent its 5-minute cap and stopped at 19 steps).
        overrides["phases"] = tuple(p for p in base.phases if p is not Phase.shrink)
    if args.reproduce is not None:
        # Hypothesis prints a reproduced example's raw draws itself; the report below says
        # the same readably (the minimized trace, one action per line)
        overrides["verbosity"] = hypothesis.Verbosity.quiet
    seed = args.seed
    if seed is not None or args.profile != "ci":
        seed = seed if seed is not None else random.randrange(2**32)
        overrides["derandomize"] = False
    # dev/nightly: found failures kept and replayed first, under this run's own key
    # (kvstate/examples_db.py); ci (derandomized) runs without a database
    prof = with_database(settings(base, **overrides), db)
    key = database_key(
        args.target,
        table.name,
        table.geometry.name,
        n,
        args.bug if args.target == "kvstate" else (),
    )
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

    seeds = reach_traces(table.name)
    cls: Any = build_state_machine(
        table,
        n,
        factory,
        stats=counts,
        seed_traces=() if args.no_warmup else seeds,
        on_example_end=progress,
    )
    if seed is not None:
        pin(cls, seed)
    elif prof.derandomize:
        pin(cls, CI_SEED)  # the ci walks follow the pinned seed, not the machine's source
    what = f"target {args.target}" + (
        f" with planted bug(s) {', '.join(args.bug)}" if args.bug else ""
    )
    if replay_steps is not None:
        print(
            f"kvstate fuzz: {what} vs table {table.name}, pool N={n}: replaying {len(replay_steps)} steps"
        )
        found, _, taken = replay_trace(cls, replay_steps)
        if found is not None:
            found.origin = "replay of the given trace"
            return _report(
                args, cls, found, seed=seed, started=started, counts=counts, hypothesis_found=False
            )
        print(f"kvstate fuzz: ok, the trace conforms ({len(taken)} steps checked in lockstep)")
        return 0
    if args.reproduce is not None:
        cls._hypothesis_internal_use_reproduce_failure = (
            hypothesis.__version__,
            args.reproduce.encode(),
        )
    print(
        f"kvstate fuzz: {what} vs table {table.name}, pool N={n}, profile {args.profile} "
        f"({prof.max_examples} examples x {prof.stateful_step_count} steps), "
        f"seed {f'{show(CI_SEED)} (pinned, derandomized)' if seed is None else seed}",
        flush=True,
    )
    replayed = counts["(saved examples)"] = saved(prof, key)
    if replayed:
        print(f"  example database: {replayed} saved example(s), run before new ones", flush=True)
    coverage = not args.no_coverage and args.reproduce is None
    # (--coverage traces this process only: the pass then runs here)
    here = getattr(args, "code_coverage", False)
    beside = _CoverageBeside.start(cls, table, seeds, counts) if coverage and not here else None

    def covered() -> int | None:
        """The coverage pass done (here, or joined from beside): None, or the exit code of
        its report."""
        if beside is not None:
            done = beside.join()
            if done is not None:
                counts.update(done)
                return None
            # it failed there: run it here (deterministic: the same finding) for the report
        try:
            replay_seeds(cls, table, seeds)
        except Exception as exc:  # noqa: BLE001 - a finding, or a target crash, is reported
            return _report(
                args, cls, exc, seed=seed, started=started, counts=counts, hypothesis_found=False
            )
        if beside is not None:  # passed here, failed there: say so, never pass silently
            print(f"kvstate fuzz: error: the coverage pass failed in its process: {beside.why}")
            return 1
        return None

    if coverage and beside is None:
        failed = covered()
        if failed is not None:
            return failed
        print(
            f"  coverage pass: {len(seeds)} witness traces replayed in lockstep"
            " (near misses refused at every step)",
            flush=True,
        )
    try:
        run_machine(cls, prof, key)
    except DidNotReproduce as exc:
        if beside is not None:
            beside.join()
        print(f"kvstate fuzz: error: --reproduce: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a finding, or a target crash, is reported
        # a coverage-pass finding comes first, as when the pass ran before the exploration
        failed = covered() if beside is not None else None
        if failed is not None:
            return failed
        return _report(
            args, cls, exc, seed=seed, started=started, counts=counts, hypothesis_found=True
        )
    if beside is not None:
        failed = covered()
        if failed is not None:
            return failed
        print(
            f"  coverage pass: {len(seeds)} witness traces replayed in lockstep"
            " (near misses refused at every step; in its own process, beside the exploration)",
            flush=True,
        )
    steps = sum(v for k, v in counts.items() if not k.startswith("("))
    took = time.monotonic() - started
    refused = counts["(refused)"]
    print(
        f"kvstate fuzz: ok, {steps} lockstep steps and {refused} refused actions checked "
        f"in {counts['(examples)']} examples, {took:.1f} s"
    )
    # A lockstep step: an action performed by the model and the target, then checked (observe()
    # compared, every invariant on both states, completeness, the bytes).  Refusal checks (a
    # disabled action refused with nothing changed) are counted apart.  Seconds: the coverage
    # pass and Hypothesis' exploration, Python's start and imports excluded.
    print(
        f"throughput: {steps / took:.0f} lockstep steps/s "
        f"({(steps + refused) / took:.0f}/s counting the refusal checks)"
    )
    if table.completeness is not None:
        print(
            f"completeness: checked on the model after every step; "
            f"{counts['(completeness probes)']} read-path probes performed on the target"
        )
    print("\n".join(summary("action counts", counts, [a.name for a in table.actions])))
    emit(args, _outcome(args, table, seed, started, counts, ok=True))
    return 0


def fuzz_spec_mutants(table: Table, report: Any, *, examples: int = 20) -> dict[str, str]:
    """``kvstate mutate --fuzz``: each surviving or equivalent spec mutant as the model, against
    the built-in allocator compiled from the unchanged ``table``.  A mutant the allocator
    disagrees with is one the conformance fuzz would catch (the implementation is the second
    witness); one it agrees with behaves like the table on the paths the fuzz reached."""
    from hypothesis.stateful import run_state_machine_as_test

    from kvstate.proofs.mutate import mutants
    from kvstate.testing.adapter import make_target

    by_id = {m.id: m for m in mutants(table)}
    out: dict[str, str] = {}
    n = table.geometry.model_blocks
    prof = settings(
        settings.get_profile("ci"),
        max_examples=examples,
        database=None,
        phases=tuple(p for p in Phase if p is not Phase.shrink),
    )
    for o in report.outcomes:
        if o.verdict not in ("survived", "equivalent") or o.mutant not in by_id:
            continue
        try:
            mt = by_id[o.mutant].make(table)
        except Exception as exc:  # noqa: BLE001
            out[o.mutant] = f"not built: {exc}"
            continue
        cls: Any = build_state_machine(
            mt, n, lambda _t, k: make_target(table, k), seed_traces=reach_traces(table.name)
        )
        try:
            replay_seeds(cls, mt, reach_traces(table.name))
            with seed_only():
                run_state_machine_as_test(pin(cls, CI_SEED), settings=prof)
        except Exception as exc:  # noqa: BLE001 - a disagreement is the finding
            nc = _nonconformance(exc)
            out[o.mutant] = "implementation disagrees: " + (
                nc.signature if nc is not None else f"{type(exc).__name__}: {exc}"
            )
        else:
            out[o.mutant] = f"implementation agrees ({examples} examples)"
    return out
