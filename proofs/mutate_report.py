"""Render a mutation report: text for a reader, JUnit XML for CI dashboards (one testcase per
mutant; JSON is :meth:`MutationReport.to_dict`)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from xml.etree import ElementTree as ET

if TYPE_CHECKING:
    from .mutate import MutationReport


def render_text(rep: MutationReport, *, verbose: bool = False) -> str:
    what = "safety + liveness (completeness)" if rep.liveness else "safety obligations only"
    lines = [
        f"kvstate mutate: {rep.table} ({len(rep.outcomes)} mutants, {rep.jobs} jobs, {what})",
        "",
    ]
    for o in rep.outcomes:
        if o.verdict in ("killed", "unchecked") and not verbose:
            continue
        line = f"{o.verdict.upper():<10} {o.mutant}"
        if o.verdict == "killed":
            line += f"  <- {o.killed_by[0]}"
        elif o.reason:
            line += f"  ({o.reason})"
        lines.append(line)
    lines.append("")
    lines.append("by operator:")
    for op, d in sorted(rep.by_operator().items()):
        lines.append(f"  {op:<20} " + ", ".join(f"{k} {v}" for k, v in sorted(d.items())))
    lines.append("")
    if rep.stopped:
        why = "the --budget ran out" if rep.stopped == "budget" else "interrupted"
        lines.append(
            f"partial run: {why}; {rep.count('unchecked')} mutants unchecked (they count as "
            "not killed" + ("; run again to resume)" if rep.session else ")")
        )
    if rep.session:
        lines.append(
            f"session store: {rep.session} ({rep.resumed} verdicts resumed, "
            f"{rep.checked - rep.resumed} checked in this run)"
        )
    lines.append(
        f"checked {rep.checked} of {len(rep.outcomes)} mutants: killed {rep.count('killed')}, "
        f"survived {rep.count('survived')}, equivalent {rep.count('equivalent')}, unknown "
        f"(timed out) {rep.count('unknown')}, invalid {rep.count('invalid')}; unchecked "
        f"{rep.count('unchecked')}"
    )
    lines.append(
        f"kill rate {100 * rep.kill_rate:.1f}% (killed / every mutant not equivalent or invalid: "
        f"unknown and unchecked count as not killed); {100 * rep.kill_rate_checked:.1f}% of "
        f"those checked; {rep.seconds:.1f} s"
    )
    return "\n".join(lines)


def render_junit(rep: MutationReport) -> str:
    """A testcase per mutant: killed passes; survived is a failure; unknown an error (no
    verdict: not a pass); equivalent, invalid and unchecked are skipped with the reason."""
    suite = ET.Element(
        "testsuite",
        name=f"kvstate.mutate[{rep.table}]",
        tests=str(len(rep.outcomes)),
        failures=str(rep.count("survived")),
        errors=str(rep.count("unknown")),
        skipped=str(rep.count("equivalent") + rep.count("invalid") + rep.count("unchecked")),
        time=f"{rep.seconds:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (
        ("kill_rate", f"{rep.kill_rate:.4f}"),
        ("checked", str(rep.checked)),
        ("stopped", rep.stopped or ""),
    ):
        ET.SubElement(props, "property", name=k, value=v)
    for o in rep.outcomes:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"kvstate.mutate.{o.operator}",
            name=o.mutant,
            time=f"{o.seconds:.3f}",
        )
        if o.verdict == "killed":
            ET.SubElement(case, "system-out").text = "killed by " + "; ".join(o.killed_by)
        elif o.verdict == "survived":
            ET.SubElement(
                case, "failure", message=f"survived: no obligation noticed {o.detail}"
            ).text = o.detail
        elif o.verdict == "unknown":
            ET.SubElement(case, "error", message=f"unknown: {o.reason}").text = o.reason
        else:
            reason = o.reason or (
                "not checked: the run stopped first" if o.verdict == "unchecked" else ""
            )
            ET.SubElement(case, "skipped", message=f"{o.verdict}: {reason}")
    return ET.tostring(suite, encoding="unicode")
