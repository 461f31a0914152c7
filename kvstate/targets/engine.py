"""``kvstate fuzz --target NAME`` for an engine target: the toolkit's loop behind the command line.

:mod:`kvstate.harness.walk` runs an engine target (explore, minimize, report); this module is
what the command line adds: the documented ``InvalidArgument`` for a bad profile, ``--config``
and ``--replay``, the exit codes, and the machine-readable reports every target writes.
"""

from __future__ import annotations

import time
from typing import Any

from kvstate.harness import walk
from kvstate.harness.profiles import SIZES
from kvstate.harness.walk import Engine


def run(engine: Engine, profile: str = "ci", **kwargs: Any) -> walk.Report:
    """:func:`kvstate.harness.walk.run`; raises ``kvstate.impl.errors.InvalidArgument`` (a
    ``KVStateError`` and ``ValueError``) for an unknown profile."""
    from kvstate.impl.errors import InvalidArgument

    if profile not in SIZES[engine.name]:
        known = ", ".join(SIZES[engine.name])
        raise InvalidArgument(f"unknown profile {profile!r}; known: {known}")
    return walk.run(engine, profile, **kwargs)


def _command(engine: Engine, args: Any, *extra: str) -> str:
    import shlex

    out = ["kvstate", "fuzz", "--target", engine.name, "--profile", args.profile]
    for flag in ("seed", "examples", "steps"):
        if getattr(args, flag, None) is not None:
            out += [f"--{flag}", str(getattr(args, flag))]
    return " ".join(shlex.quote(x) for x in [*out, *extra])


def _replay_cli(engine: Engine, args: Any) -> walk.Report:
    """``--replay TRACE --config LABEL``: the trace on a fresh system, reported as a run."""
    assert engine.parse is not None
    text = args.replay
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as fh:
            text = fh.read()
    cfg = engine.config_named(getattr(args, "config", None) or "")
    steps = engine.parse(text)
    version = engine.load()
    t0 = time.monotonic()
    f, d = walk.replay(engine, cfg, steps)
    report = walk.Report(engine, args.profile, d.stats, version=version)  # type: ignore[attr-defined]
    report.seconds, report.ok = time.monotonic() - t0, f is None
    report.seed, report.sizes = getattr(args, "seed", None), (1, len(steps))
    report.stats.configs[cfg.label] += 1
    if f is not None:
        f.origin = f"replay of the given trace, configuration {cfg.label}"
        report.findings.append((cfg, f))
        walk.finish(report, cfg, f)
    return report


def run_cli(engine: Engine, args: Any, table: Any = None) -> int:
    """``kvstate fuzz --target NAME`` for an engine: exit 0 pass, 1 a finding, 2 the engine
    missing or bad usage.  ``--config LABEL`` runs one configuration; ``--replay TRACE --config
    LABEL`` replays a printed trace on it (targets that read traces).  Writes the reports every
    target writes (``--json``, ``--junit``, ``--sarif``, ``--github-annotations``)."""
    import sys

    from kvstate.fuzz_report import Outcome, emit

    label = getattr(args, "config", None)
    replaying = getattr(args, "replay", None) is not None
    try:
        if replaying:
            if engine.parse is None:
                raise ValueError(f"--replay: the {engine.name} target does not read traces")
            report = _replay_cli(engine, args)
        else:
            report = run(
                engine,
                args.profile,
                configs=(engine.config_named(label),) if label else None,
                examples=getattr(args, "examples", None),
                steps=getattr(args, "steps", None),
                seed=getattr(args, "seed", None),
                code_coverage=bool(getattr(args, "code_coverage", False))
                and engine.coverage is not None,
            )
    except engine.unavailable as e:
        print(f"kvstate fuzz: error: {e} (install it with {engine.install})", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"kvstate fuzz: error: {e}", file=sys.stderr)
        return 2
    commands: dict[str, str] = {}
    if not report.ok and report.config is not None:
        if not replaying:
            commands["rerun"] = _command(engine, args)
        if engine.parse is not None:
            trace = "; ".join(s.call() for s in report.trace)
            commands["replay"] = _command(
                engine, args, "--config", report.config.label, "--replay", trace
            )
    print(report.render(commands))
    o = Outcome(
        target=engine.name,
        table=getattr(table, "name", "default"),
        geometry=report.config.label if report.config else "",
        pool=getattr(report.config, "num_blocks", 0) if report.config else 0,
        profile=args.profile,
        seed=report.seed,
        ok=report.ok,
        seconds=report.seconds,
        steps=report.stats.steps,
        examples=sum(report.stats.configs.values()),
    )
    if report.finding is not None:
        f = report.finding
        o.kind, o.detail, o.message, o.origin = f.kind, f.detail, str(f), f.origin
        o.trace, o.commands = [s.call() for s in report.trace], commands
    emit(args, o)
    return 0 if report.ok else 1
