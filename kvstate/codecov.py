"""``kvstate fuzz --coverage``: branch coverage of the fuzzed code, per ``impl/`` module.

The fuzz is only as good as the paths it drives, so a run can say which of kvstate's own
lines and branches it executed (coverage.py's API, statements and branches together, its usual
percentage).  Only kvstate's own targets (``kvstate-api``, ``kvstate``) have their code here;
the generated twins (``impl/_aot.py``, :mod:`kvstate.buildtools.aotgen`) are left out.

Pure build only: mypyc-compiled modules run no Python lines a tracer could see, so the run
imports the sources (``KVSTATE_PURE_PYTHON=1``, set here before ``kvstate.impl`` is imported);
a process that already imported the compiled build is refused.  The run stays in one process
(the forked helpers that share a run's work are not traced).

A line unreachable by design is excluded only with its reason on the same line,
``# pragma: no cover: <why>`` (:data:`EXCLUDE`; ``pyproject.toml`` says the same for
``python -m coverage``); a bare pragma excludes nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGETS = ("kvstate-api", "kvstate")
EXCLUDE = r"#\s*pragma: no cover: \S"  # the reason is required (see the module docstring)


def _impl() -> Path:
    """The folder ``kvstate.impl`` is imported from, found without importing it: ``impl/``
    beside ``kvstate/`` in a checkout (``package-dir``), ``kvstate/impl`` in an installed wheel,
    and, through a link, wherever a folder of symlinks points (coverage.py compares real paths)."""
    spec = importlib.util.find_spec("kvstate.impl")
    if spec is None or not spec.submodule_search_locations:
        raise CoverageUnavailable("kvstate.impl is not importable here")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


class CoverageUnavailable(RuntimeError):
    """``--coverage`` cannot measure this run (the reason is the message)."""


@dataclass(frozen=True)
class ModuleCoverage:
    name: str
    statements: int
    missed: int
    branches: int
    partial: int
    percent: float  # coverage.py's: (statements + branch arcs) executed over all


@dataclass(frozen=True)
class CodeCoverage:
    modules: tuple[ModuleCoverage, ...]
    total: ModuleCoverage
    raw: dict[str, Any]  # coverage.py's JSON report (missing lines and branches per file)

    def lines(self) -> list[str]:
        """The summary lines of a fuzz run."""
        row = ", ".join(f"{m.name} {m.percent:.0f}%" for m in self.modules)
        t = self.total
        return [
            f"  code coverage of impl/ (pure build; statements and branches, impl/_aot.py "
            f"generated and left out): {t.percent:.1f}% ({t.statements - t.missed}/"
            f"{t.statements} statements, {t.branches} branches, {t.partial} partly taken)",
            f"    per module: {row}",
        ]


class Measure:
    """Started before ``kvstate.impl`` is imported; :meth:`stop` gives the figures."""

    def __init__(self, target: str) -> None:
        if target not in TARGETS:
            raise CoverageUnavailable(
                f"--coverage measures kvstate's own targets ({', '.join(TARGETS)}), not {target!r}"
            )
        try:
            import coverage
        except ModuleNotFoundError as exc:
            raise CoverageUnavailable(
                "--coverage needs coverage.py: pip install 'kvstate[dev]'"
            ) from exc
        if "kvstate.impl" in sys.modules:
            from kvstate.impl.native import native_modules

            if native_modules():
                raise CoverageUnavailable(
                    "--coverage measures the pure build only, and this process already runs "
                    f"the compiled one ({', '.join(native_modules())}): run it in a fresh "
                    "process, or with KVSTATE_PURE_PYTHON=1"
                )
        else:
            os.environ["KVSTATE_PURE_PYTHON"] = "1"
        self.cov = coverage.Coverage(
            branch=True,
            data_file=None,
            config_file=False,
            include=[str(_impl() / "*")],
            omit=[str(_impl() / "_aot.py")],
        )
        self.cov.exclude(EXCLUDE)
        self.cov.start()

    def stop(self) -> CodeCoverage:
        self.cov.stop()
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "coverage.json")
            self.cov.json_report(outfile=out)
            with open(out, encoding="utf-8") as fh:
                raw = json.load(fh)
        mods = []
        for path, f in sorted(raw["files"].items()):
            s = f["summary"]
            mods.append(
                ModuleCoverage(
                    Path(path).stem,
                    s["num_statements"],
                    s["missing_lines"],
                    s["num_branches"],
                    s["num_partial_branches"],
                    s["percent_covered"],
                )
            )
        t = raw["totals"]
        total = ModuleCoverage(
            "TOTAL",
            t["num_statements"],
            t["missing_lines"],
            t["num_branches"],
            t["num_partial_branches"],
            t["percent_covered"],
        )
        return CodeCoverage(tuple(mods), total, raw)
