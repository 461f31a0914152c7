"""One killing test per source mutant, each in a forked child of a process that imported once.

The API fuzz's ``ci`` run takes about 0.5-1 s of checking after about 1.7 s of imports (torch, z3,
Hypothesis, the table): a fresh interpreter per mutant would spend two thirds of its time
importing.  So the parent imports what the mutated package does not need (``Target.prepare``),
then forks one child per mutant; the child puts the mutant in place with an import hook and
imports the package (0.1 s for ``kvstate.impl``) and the killing test, which runs as it would
from its own command.  Nothing on disk is edited: the package is imported from a staged copy of its
sources (no compiled extensions, so the pure build runs, and its guard against stale builds finds
nothing to redirect), and the mutated module's text is served from memory.  A child that outlives
its timeout is killed with its process group (a hang is a kill, reported apart).
"""

from __future__ import annotations

import builtins
import compileall
import fcntl
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import linecache
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Target:
    """What is mutated and what tries to kill it."""

    package: str  # the dotted name the folder is imported as (``kvstate.impl``)
    folder: Path  # its sources
    killer: str  # ``module:function(profile) -> dict``, imported in the child after the mutant
    prepare: str = ""  # ``module:function()`` run once in the parent (must not import package)
    exclude: tuple[str, ...] = ()  # file names (relative to folder) never mutated
    context: tuple[Path, ...] = ()  # other folders the verdicts depend on (besides folder)
    remote: str = ""  # a second killing test (the remote tier's walk), where the lines it runs
    both: str = ""  # ``killer``, then ``remote`` where it found nothing


class Job(NamedTuple):
    """One mutant's run: ``source`` is the text of ``rel`` (relative to the folder), imported
    in its place; ``killer`` and ``timeout`` replace the target's and the runner's where set,
    and ``env`` is added to the child's environment."""

    key: str
    rel: str
    source: str
    killer: str = ""
    timeout: float = 0.0
    env: Mapping[str, str] = {}


@dataclass
class Outcome:
    """One run of the killing test: ``verdict`` is killed, timeout or survived."""

    verdict: str
    seconds: float | None = None  # to the first finding, by the killing test's own clock
    wall: float = 0.0  # fork to exit, as the parent saw it
    kind: str = ""  # the finding's signature, ``crash:<Exception>``, or ``timeout``
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _call(spec: str) -> Callable[..., Any]:
    mod, _, fn = spec.partition(":")
    return getattr(importlib.import_module(mod), fn)  # type: ignore[no-any-return]


def stage(target: Target) -> Path:
    """A copy of the package's Python sources (bytecode compiled once, shared by the children)."""
    root = Path(tempfile.mkdtemp(prefix="kvstate-mutant-stage-"))
    dst = root / "pkg"
    shutil.copytree(
        target.folder, dst, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.json")
    )
    compileall.compile_dir(str(dst), quiet=1)
    return dst


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``package`` and its modules from the stage; ``module`` from ``source``."""

    def __init__(self, package: str, staged: Path, module: str, source: str) -> None:
        self.package, self.staged, self.module, self.source = package, staged, module, source

    def _file(self, name: str) -> tuple[Path, bool] | None:
        if name == self.package:
            return self.staged / "__init__.py", True
        if not name.startswith(self.package + "."):
            return None
        rel = self.staged.joinpath(*name[len(self.package) + 1 :].split("."))
        if (rel / "__init__.py").exists():
            return rel / "__init__.py", True
        return (rel.with_suffix(".py"), False) if rel.with_suffix(".py").exists() else None

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        found = self._file(name)
        if found is None:
            return None
        f, pkg = found
        return importlib.util.spec_from_file_location(
            name,
            f,
            loader=self if name == self.module else None,
            submodule_search_locations=[str(f.parent)] if pkg else None,
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        origin = str(module.__spec__.origin) if module.__spec__ else self.module
        linecache.cache[origin] = (len(self.source), None, self.source.splitlines(True), origin)
        exec(compile(self.source, origin, "exec"), module.__dict__)


def _child(
    target: Target,
    staged: Path,
    module: str,
    source: str,
    profile: str,
    wfd: int,
    lines_to: Path | None = None,
    killer: str = "",
) -> None:
    """In the forked child: the mutant in place, the killing test, one JSON line to ``wfd``.
    ``lines_to``: also record which lines of the package ran (coverage.py), as JSON there."""
    from cosmic_ray.exceptions import CosmicRayTestingException

    # what cosmic-ray's exception replacer writes into an ``except`` clause: a name that no code
    # raises, so the handler never catches (a NameError when it is reached would be another bug)
    builtins.CosmicRayTestingException = CosmicRayTestingException  # type: ignore[attr-defined]
    sys.meta_path.insert(0, _Hook(target.package, staged, module, source))
    cov = None
    if lines_to is not None:
        import coverage

        # one CPU: a test that shares its work with a forked helper (the API harness does, on
        # two) keeps it all in this process, where the tracer sees it
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        cov = coverage.Coverage(data_file=None, include=[str(staged / "*")])
        cov.start()
    t0 = time.monotonic()
    try:
        out = dict(_call(killer or target.killer)(profile))
    except BaseException as exc:  # noqa: BLE001 - the mutant broke an import or the harness itself
        out = {
            "killed": True,
            "kind": f"crash:{type(exc).__name__}",
            "detail": str(exc)[:300],
            "seconds": round(time.monotonic() - t0, 3),
        }
    if cov is not None and lines_to is not None:
        cov.stop()
        data = cov.get_data()
        lines_to.write_text(
            json.dumps(
                {
                    Path(f).relative_to(staged).as_posix(): sorted(data.lines(f) or ())
                    for f in data.measured_files()
                }
            )
        )
    os.write(wfd, json.dumps(out, default=str)[:3500].encode())


@dataclass
class _Running:
    key: str
    pid: int
    rfd: int
    log: Path
    started: float
    timeout: float


def _read(rfd: int) -> str:
    chunks = []
    while True:
        try:
            b = os.read(rfd, 65536)
        except BlockingIOError:
            break
        if not b:
            break
        chunks.append(b)
    return b"".join(chunks).decode(errors="replace")


class Runner:
    """Forks the children (``jobs`` at a time) from a parent that has run ``target.prepare``."""

    def __init__(self, target: Target, profile: str, timeout: float, jobs: int = 1) -> None:
        self.target, self.profile, self.timeout, self.jobs = target, profile, timeout, max(1, jobs)
        if target.prepare:
            _call(target.prepare)()
        loaded = [
            m for m in sys.modules if m == target.package or m.startswith(target.package + ".")
        ]
        if loaded:
            raise RuntimeError(
                f"{target.package} is already imported ({', '.join(sorted(loaded)[:3])}): a "
                "forked child would run the imported modules, not the mutants"
            )
        self.staged = stage(target)
        self.logs = Path(tempfile.mkdtemp(prefix="kvstate-mutant-logs-"))

    def close(self) -> None:
        shutil.rmtree(self.staged.parent, ignore_errors=True)
        shutil.rmtree(self.logs, ignore_errors=True)

    def module_name(self, rel: str) -> str:
        """``core.py`` -> ``kvstate.impl.core``; ``__init__.py`` -> the package."""
        parts = list(Path(rel).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join([self.target.package, *parts])

    def _start(self, job: Job, lines_to: Path | None = None) -> _Running:
        rfd, wfd = os.pipe()
        fcntl.fcntl(rfd, fcntl.F_SETFL, os.O_NONBLOCK)
        log = self.logs / f"{len(os.listdir(self.logs))}.log"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                os.setpgid(0, 0)
                os.close(rfd)
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.environ.update(job.env)
                mod = self.module_name(job.rel)
                _child(
                    self.target, self.staged, mod, job.source, self.profile, wfd, lines_to,
                    job.killer,
                )  # fmt: skip
            except BaseException:  # noqa: BLE001
                code = 3
            finally:
                os._exit(code)
        os.close(wfd)
        return _Running(job.key, pid, rfd, log, time.monotonic(), job.timeout or self.timeout)

    def _finish(self, r: _Running, exited: bool) -> Outcome:
        """The child has exited (not yet reaped) or timed out: its group killed, it reaped."""
        wall = round(time.monotonic() - r.started, 3)
        try:
            os.killpg(r.pid, signal.SIGKILL)  # what it left running (a forked helper), or itself
        except (ProcessLookupError, PermissionError):
            pass
        _, status = os.waitpid(r.pid, 0)
        if not exited:
            os.close(r.rfd)
            return Outcome("timeout", None, wall, "timeout", f"no verdict after {r.timeout:g} s")
        text = _read(r.rfd)
        os.close(r.rfd)
        try:
            out = json.loads(text)
        except ValueError:
            tail = r.log.read_text(errors="replace")[-300:] if r.log.exists() else ""
            code = os.waitstatus_to_exitcode(status)
            return Outcome("killed", None, wall, f"crash:exit {code}", tail)
        verdict = "killed" if out.pop("killed") else "survived"
        return Outcome(
            verdict,
            out.pop("seconds", None) if verdict == "killed" else None,
            wall,
            str(out.pop("kind", "")),
            str(out.pop("detail", "")),
            out,
        )

    def reached(
        self, killer: str = "", env: Mapping[str, str] | None = None
    ) -> tuple[Outcome, dict[str, list[int]]]:
        """The unmutated package under the killing test (``killer``: another one), traced: its
        outcome and the lines of each file (relative to the folder) that ran."""
        lines_to = self.logs / "reached.json"
        lines_to.unlink(missing_ok=True)
        init = (self.target.folder / "__init__.py").read_text()
        r = self._start(Job("baseline", "__init__.py", init, killer, 0.0, env or {}), lines_to)
        while os.waitid(os.P_PID, r.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() - r.started > r.timeout:
                return self._finish(r, False), {}
            time.sleep(0.05)
        out = self._finish(r, True)
        return out, json.loads(lines_to.read_text()) if lines_to.exists() else {}

    def run(
        self,
        work: Iterable[Job | tuple[str, str, str]],
        done: Callable[[str, Outcome], None],
    ) -> None:
        """Runs :class:`Job` items (or ``(key, file relative to the folder, mutated source)``);
        ``done`` is called in this process, in completion order, before the next is taken."""
        pending = iter(work)
        running: dict[int, _Running] = {}
        exhausted = False
        try:
            while running or not exhausted:
                while not exhausted and len(running) < self.jobs:
                    nxt = next(pending, None)
                    if nxt is None:
                        exhausted = True
                        break
                    r = self._start(Job(*nxt))
                    running[r.pid] = r
                time.sleep(0.01)
                for pid, r in list(running.items()):
                    # exited, left unreaped so that its process group can still be killed
                    exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    if exited is not None or time.monotonic() - r.started > r.timeout:
                        del running[pid]
                        done(r.key, self._finish(r, exited is not None))
        finally:
            for r in running.values():  # interrupted: nothing is left behind
                try:
                    os.killpg(r.pid, signal.SIGKILL)
                    os.waitpid(r.pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
