"""The one report of a finding every target prints: who found it, the failure, the trace.

A target adds what only it has (the seed line, Hypothesis' blob, the commands to rerun and
replay, a standalone reproducer) after these lines; the machine-readable reports (``--json``,
``--junit``, ``--sarif``) are :mod:`kvstate.fuzz_report`'s ``Outcome``, the same for all.
"""

from __future__ import annotations

from collections.abc import Sequence

from .finding import Nonconformance
from .trace import TraceStep


def finding_lines(
    failure: Nonconformance,
    how: str,
    steps: Sequence[TraceStep],
    *,
    start: str = "Init",
    unit: str = "action",
    replayable: bool = True,
) -> list[str]:
    """``found by`` (the finding's origin and ``how`` it was minimized), the failure's
    signature and message, and the trace from ``start``, one ``unit`` per numbered line, in the
    call syntax ``--replay`` reads."""
    out = [
        f"  found by:  {failure.origin}; {how}",
        f"  failure:   {failure.signature}",
        "             " + str(failure).replace("\n", "\n             "),
        f"  trace (from {start}, one {unit} per line"
        + ("; replayable with --replay):" if replayable else "):"),
    ]
    if not steps:
        out.append(f"      (none: {start} itself fails)")
    out += [f"    {i:>3}. {s.render()}" for i, s in enumerate(steps, 1)]
    return out
