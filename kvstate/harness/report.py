"""The one report of a finding every target prints: who found it, the failure, the trace.

A target adds what only it has (the seed line, Hypothesis' blob, the commands to rerun and
replay, a standalone reproducer) after these lines; the machine-readable reports (``--json``,
``--junit``, ``--sarif``) are :mod:`kvstate.fuzz_report`'s ``Outcome``, the same for all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .finding import Nonconformance
from .profiles import show
from .trace import TraceStep


def finding_lines(
    failure: Nonconformance,
    how: str,
    steps: Sequence[TraceStep],
    *,
    start: str = "Init",
    unit: str = "action",
    replayable: bool = True,
    empty: str = "",
) -> list[str]:
    """``found by`` (the finding's origin and ``how`` it was minimized), the failure's
    signature and message, and the trace from ``start``, one ``unit`` per numbered line, in the
    call syntax ``--replay`` reads (``empty``: what an empty trace means, when not that
    ``start`` itself fails)."""
    out = [
        f"  found by:  {failure.origin}; {how}",
        f"  failure:   {failure.signature}",
        "             " + str(failure).replace("\n", "\n             "),
        f"  trace (from {start}, one {unit} per line"
        + ("; replayable with --replay):" if replayable else "):"),
    ]
    if not steps:
        out.append(f"      (none: {empty or f'{start} itself fails'})")
    out += [f"    {i:>3}. {s.render()}" for i, s in enumerate(steps, 1)]
    return out


def seed_text(seed: int | None, ci_seed: int, profile: str) -> str:
    """The seed a run's walks followed: the given one, or ``ci_seed`` pinned (derandomized)."""
    if seed is None:
        return f"{show(ci_seed)} (pinned; profile {profile}: the same examples every run)"
    return str(seed)


def field_lines(fields: Mapping[str, str]) -> list[str]:
    """The report's lines after the trace, one ``name: value`` each, aligned: the seed,
    Hypothesis' blob, and the commands that rerun the run, reproduce Hypothesis' example and
    replay the trace (``rerun``, ``reproduce``, ``replay``)."""
    return [f"  {k + ':':<10} {v}" for k, v in fields.items()]
