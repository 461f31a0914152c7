"""kvstate.proofs: proof obligations of a table, their runner and reports.

``prove(table, depth=...)`` returns a :class:`Report` with ``.ok`` and per-obligation results
with replayed traces.  These names are a stable API that other tools build on.
"""

from .config import Config
from .report import render_json, render_junit, render_text
from .results import Result, Step, Trace
from .runner import Report, prove

__all__ = [
    "Config",
    "Report",
    "Result",
    "Step",
    "Trace",
    "prove",
    "render_json",
    "render_junit",
    "render_text",
]
