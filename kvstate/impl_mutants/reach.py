"""The traced baselines: each killing test on the unmutated sources, which must pass, and the
lines of each file it runs (a survivor on a line no walk runs is "never reached"; a mutant gets
the remote walk only on a line that walk runs).  Kept in the store, measured again when the
sources change."""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import dataclass, field
from typing import Any

from kvstate.impl_mutants.killer import SERVER_ENV
from kvstate.impl_mutants.mutants import Mutant
from kvstate.impl_mutants.store import context, reached_file
from kvstate.impl_mutants.walks import ServerPool, remote_on
from kvstate.mutant_runner import Outcome, Runner, Target


@dataclass
class Reach:
    """The lines each walk runs, by file (relative to the target's folder); ``walls``: each
    traced baseline's wall time (seconds), which sets the timeouts."""

    api: dict[str, set[int]]
    remote: dict[str, set[int]] = field(default_factory=dict)
    walls: dict[str, float] = field(default_factory=dict)

    def union(self) -> dict[str, set[int]]:
        return {
            f: self.api.get(f, set()) | self.remote.get(f, set()) for f in {*self.api, *self.remote}
        }


class BaselineFails(RuntimeError):
    """A killing test fails on the unmutated sources: no verdict of it means anything."""


def _stmt_start(text: str, line: int) -> int:
    """The first line of the innermost statement holding ``line`` (what a line tracer reports
    for a statement that spans lines)."""
    best = line
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, ast.stmt) and n.lineno <= line <= (n.end_lineno or n.lineno):
            best = n.lineno if best == line or n.lineno > best else best
    return best


def is_reached(target: Target, m: Mutant, lines: dict[str, set[int]]) -> bool:
    ran = lines.get(m.file, set())
    if m.line in ran:
        return True
    return _stmt_start((target.folder / m.file).read_text(), m.line) in ran


def baselines(
    runner: Runner, args: argparse.Namespace, target: Target, pool: ServerPool | None
) -> Reach:
    """The API walk traced, and the remote walk traced on a server of ``pool`` (where the
    remote walk is on); saved in the store.  Raises :class:`BaselineFails`."""
    runs: dict[str, tuple[Outcome, dict[str, list[int]]]] = {"api": runner.reached()}
    if pool is not None:
        server = pool.take("baseline")
        try:
            runs["remote"] = runner.reached(target.remote, {SERVER_ENV: server.url})
        finally:
            pool.give("baseline")
    for walk, (base, _) in runs.items():
        if base.verdict != "survived":
            raise BaselineFails(f"the {walk} walk fails on the unmutated sources: {base}")
    saved = {
        "context": context(args, target),
        "lines": runs["api"][1],
        "remote_lines": runs["remote"][1] if "remote" in runs else {},
        "walls": {w: base.wall for w, (base, _) in runs.items()},
    }
    reached_file(args.store, args.profile).write_text(json.dumps(saved))
    return _reach(saved)


def _reach(saved: dict[str, Any]) -> Reach:
    sets = {k: {f: set(v) for f, v in saved.get(k, {}).items()} for k in ("lines", "remote_lines")}
    return Reach(sets["lines"], sets["remote_lines"], dict(saved.get("walls", {})))


def reached_lines(args: argparse.Namespace, target: Target) -> Reach:
    """The lines the killing tests run on the unmutated sources (the store's, or measured now)."""
    path = reached_file(args.store, args.profile)
    saved = json.loads(path.read_text()) if path.exists() else {}
    if saved.get("context") == context(args, target):
        return _reach(saved)
    runner = Runner(target, args.profile, 600.0)
    pool = ServerPool() if remote_on(args, target) else None
    try:
        return baselines(runner, args, target, pool)
    except BaselineFails as exc:
        raise SystemExit(str(exc)) from exc
    finally:
        runner.close()
        if pool is not None:
            pool.close()
