"""Render a proof report as readable text, JSON, or JUnit XML (for CI dashboards).

Text shows what a reader acts on: the obligations that do not hold (with their traces), the
summary and the verdict; ``verbose=1`` adds the table of every obligation, ``verbose=2`` every
witness trace too.  JSON carries ``schema`` (``kvstate.prove/N``: N bumped when a field changes meaning).
"""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from .runner import Report, summary_counts

RESULT_LINE = {
    "hold": "all obligations hold",
    "fail": "some obligations FAIL",
    "undecided": "UNDECIDED: no obligation fails, but not all were decided (unknown is not a pass)",
}


def _stopped(report: Report) -> str:
    if report.stopped == "budget":
        return f"partial report: the --budget of {report.budget_s:g} s ran out"
    if report.stopped == "interrupted":
        return "partial report: interrupted"
    return ""


def render_text(report: Report, *, verbose: int | bool = 0) -> str:
    verbose = int(verbose)
    lines = [
        f"kvstate prove: table {report.table} (geometry {report.geometry}), "
        f"{len(report.results)} obligations, {report.jobs} job(s), {report.seconds:.1f} s",
        "",
    ]
    if verbose >= 1:
        lines += _table(report)
    if _stopped(report):
        lines += [_stopped(report), ""]
    return "\n".join(lines + _tail(report, verbose))


def _table(report: Report) -> list[str]:
    lines: list[str] = []
    w_ob = min(62, max(len(r.obligation) for r in report.results) if report.results else 10)
    w_m = 40
    header = f"{'obligation':<{w_ob}}  {'method':<{w_m}}  {'bound':<9}  {'result':<13}  {'s':>6}"
    lines.append(header)
    lines.append("-" * len(header))
    for r in report.results:
        bound = "unbounded" if r.unbounded else "bounded"
        lines.append(
            f"{r.obligation[:w_ob]:<{w_ob}}  {r.method[:w_m]:<{w_m}}  {bound:<9}  {r.status:<13}  {r.seconds:>6.2f}"
        )
    lines.append("")
    return lines


def _tail(report: Report, verbose: int) -> list[str]:
    lines = ["scope of each kind of claim:"]
    seen: dict[str, str] = {}
    for r in report.results:
        seen.setdefault(r.kind, r.scope)
    for kind, scope in seen.items():
        lines.append(f"  {kind:<13} {scope}")
    counts = summary_counts(report)
    lines.append("")
    lines.append(
        "summary: "
        + ", ".join(
            f"{k} {v['ok']}/{v['total']}"
            + (f" ({v['undecided']} undecided)" if v["undecided"] else "")
            for k, v in counts.items()
        )
        + f"; unbounded claims {sum(v['unbounded'] for v in counts.values())}, "
        f"bounded {sum(v['total'] - v['unbounded'] for v in counts.values())}"
    )
    fails = report.failures
    if fails:
        lines.append("")
        n_ref, n_und = len(report.refuted), len(report.undecided)
        lines.append(
            f"FAILED: {n_ref} obligation(s)" + (f"; {n_und} undecided" if n_und else "")
            if n_ref
            else f"UNDECIDED: {n_und} obligation(s) without a verdict (unknown or not run)"
        )
        not_run = [r for r in fails if r.status == "not-run"]
        shown = fails if verbose >= 1 else [r for r in fails if r.status != "not-run"]
        for r in shown:
            lines.append("")
            who = ", ".join(
                x
                for x in (
                    f"invariant {r.invariant}" if r.invariant else "",
                    f"action {r.action}" if r.action else "",
                )
                if x
            )
            lines.append(f"* {r.obligation} [{r.status}]" + (f" ({who})" if who else ""))
            if r.detail:
                lines.append(f"  {r.detail}")
            if r.trace is not None:
                lines.append(r.trace.render())
        if not_run and verbose < 1:
            lines.append("")
            lines.append(
                f"* {len(not_run)} obligation(s) not started: {not_run[0].detail.split(': ', 1)[-1]}"
                " (-v lists them)"
            )
    elif verbose >= 2:
        for r in report.results:
            if r.trace is not None:
                lines.append("")
                lines.append(f"witness for {r.obligation}:")
                lines.append(r.trace.render())
    lines.append("")
    lines.append("RESULT: " + RESULT_LINE[report.verdict])
    return lines


SCHEMA = "kvstate.prove/1"  # the JSON report's version: bumped when a field changes meaning


def render_json(report: Report) -> str:
    return json.dumps(
        {
            "schema": SCHEMA,
            "table": report.table,
            "geometry": report.geometry,
            "ok": report.ok,
            "verdict": report.verdict,
            "stopped": report.stopped,
            "budget_s": report.budget_s,
            "timeout_s": report.timeout_s,
            "seconds": report.seconds,
            "jobs": report.jobs,
            "summary": summary_counts(report),
            "results": [r.to_dict() for r in report.results],
        },
        indent=2,
        default=str,
    )


def render_junit(report: Report) -> str:
    suite = ET.Element(
        "testsuite",
        name=f"kvstate.prove[{report.table}]",
        tests=str(len(report.results)),
        failures=str(len(report.refuted)),
        errors=str(sum(1 for r in report.undecided if r.status == "unknown")),
        skipped=str(sum(1 for r in report.undecided if r.status == "not-run")),
        time=f"{report.seconds:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for k, v in (("verdict", report.verdict), ("stopped", report.stopped or "")):
        ET.SubElement(props, "property", name=k, value=v)
    for r in report.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"kvstate.{r.kind}",
            name=r.obligation,
            time=f"{r.seconds:.3f}",
        )
        ET.SubElement(case, "system-out").text = f"{r.method}; {r.scope}; {r.status}"
        if r.ok:
            continue
        if r.status == "not-run":  # never started (budget, interruption): not a pass either
            ET.SubElement(case, "skipped", message=r.detail)
        elif r.status == "unknown":  # no verdict: an error, not a pass and not a refutation
            ET.SubElement(case, "error", message=f"unknown: {r.detail}").text = r.detail
        else:
            f = ET.SubElement(case, "failure", message=f"{r.status}: {r.detail}")
            f.text = r.trace.render() if r.trace else r.detail
    return ET.tostring(suite, encoding="unicode")
