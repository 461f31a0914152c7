"""``kvstate fuzz --target vllm|vllm-scheduler --coverage``: which of vLLM's own lines ran.

A fuzz run checks only the paths it drives, so each configuration is measured with coverage.py
(statements and branches) over the files that hold vLLM's KV-cache allocation: the manager, the
block pool, the per-type managers, the coordinator and the scheduler.  Per configuration and over
the whole run (the union of the configurations' executed lines and branches) the report gives,
per file, the statements and branches taken, and names the functions of those files that no
configuration entered.  Opt-in: tracing slows a run about threefold, so the ci runs do not
measure unless asked.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import imports as vllm_import

# vllm.<module> -> its short name in the report
FILES = {
    "vllm.v1.core.kv_cache_manager": "kv_cache_manager",
    "vllm.v1.core.block_pool": "block_pool",
    "vllm.v1.core.single_type_kv_cache_manager": "single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_coordinator": "kv_cache_coordinator",
    "vllm.v1.core.sched.scheduler": "scheduler",
}


class CoverageUnavailable(RuntimeError):
    """``--coverage`` cannot measure this run (the reason is the message)."""


@dataclass
class FileCov:
    statements: int
    branches: int
    lines: set[int] = field(default_factory=set)  # executed lines
    arcs: set[tuple[int, int]] = field(default_factory=set)  # executed branch arcs
    functions: dict[str, set[int]] = field(default_factory=dict)  # qualname -> its lines

    def merge(self, other: FileCov) -> None:
        self.lines |= other.lines
        self.arcs |= other.arcs
        for k, v in other.functions.items():
            self.functions.setdefault(k, v)

    def row(self) -> str:
        return (
            f"{len(self.lines)}/{self.statements} stmts, {len(self.arcs)}/{self.branches} branches"
        )

    def never_entered(self) -> list[str]:
        return sorted(k for k, ls in self.functions.items() if ls and not ls & self.lines)


def _paths() -> dict[str, str]:
    out = {}
    for mod, short in FILES.items():
        m = vllm_import.load(mod)[0]
        out[str(Path(m.__file__ or "").resolve())] = short
    return out


def _read(cov: Any, paths: dict[str, str]) -> dict[str, FileCov]:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "coverage.json")
        cov.json_report(outfile=out, include=list(paths))
        with open(out, encoding="utf-8") as fh:
            raw = json.load(fh)
    got: dict[str, FileCov] = {}
    for path, f in raw["files"].items():
        short = paths.get(str(Path(path).resolve()))
        if short is None:
            continue
        s = f["summary"]
        fc = FileCov(
            s["num_statements"],
            s["num_branches"],
            set(f["executed_lines"]),
            {tuple(a) for a in f.get("executed_branches", ())},  # type: ignore[misc]
        )
        for name, fn in f.get("functions", {}).items():
            if name:  # "" is the module's top level
                fc.functions[name] = set(fn["executed_lines"]) | set(fn["missing_lines"])
        got[short] = fc
    return got


@dataclass
class VllmCoverage:
    """Per configuration and over the run: the lines and branches of :data:`FILES` executed."""

    per_config: dict[str, dict[str, FileCov]] = field(default_factory=dict)
    _paths: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            import coverage  # noqa: F401
        except ModuleNotFoundError as exc:
            raise CoverageUnavailable(
                "--coverage needs coverage.py: pip install 'kvstate[dev]'"
            ) from exc
        self._paths = _paths()

    @contextmanager
    def measure(self, label: str) -> Iterator[None]:
        """Trace vLLM's allocation files while one configuration runs."""
        import coverage

        cov = coverage.Coverage(
            branch=True, data_file=None, config_file=False, include=list(self._paths)
        )
        cov.start()
        try:
            yield
        finally:
            cov.stop()
            got = _read(cov, self._paths)
            mine = self.per_config.setdefault(label, {})
            for short, fc in got.items():
                if short in mine:
                    mine[short].merge(fc)
                else:
                    mine[short] = fc

    def union(self) -> dict[str, FileCov]:
        out: dict[str, FileCov] = {}
        for files in self.per_config.values():
            for short, fc in files.items():
                if short not in out:
                    out[short] = FileCov(fc.statements, fc.branches)
                out[short].merge(fc)
        return out

    def lines(self) -> list[str]:
        """The report: per configuration a line (every file), then the union, then the functions
        of those files that no configuration entered."""
        out = ["  code coverage of vLLM (coverage.py, statements and branches executed):"]
        for label, files in sorted(self.per_config.items()):
            row = "; ".join(f"{s} {files[s].row()}" for s in FILES.values() if s in files)
            out.append(f"    {label}: {row}")
        u = self.union()
        out.append("    all configurations: " + "; ".join(f"{s} {u[s].row()}" for s in u))
        for s, fc in u.items():
            never = fc.never_entered()
            if never:
                out.append(f"    never entered in {s} ({len(never)}): {', '.join(never)}")
        return out

    def entered(self, qualname: str) -> bool:
        """Whether any configuration ran a line of ``qualname`` (``Class.method``)."""
        for fc in self.union().values():
            if qualname in fc.functions:
                return bool(fc.functions[qualname] & fc.lines)
        return False


def measured(code: VllmCoverage | None, label: str) -> AbstractContextManager[None]:
    """``code.measure(label)`` when the run measures vLLM's lines, else nothing."""
    return code.measure(label) if code is not None else nullcontext()
