"""Render a proof report as a readable table, JSON, or JUnit XML (for CI dashboards)."""

from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from .runner import Report, summary_counts


def render_text(report: Report, *, verbose: bool = False) -> str:
    lines = [
        f"kvstate prove: table {report.table} (geometry {report.geometry}), "
        f"{len(report.results)} obligations, {report.jobs} job(s), {report.seconds:.1f} s",
        "",
    ]
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
    lines.append("scope of each kind of claim:")
    seen: dict[str, str] = {}
    for r in report.results:
        seen.setdefault(r.kind, r.scope)
    for kind, scope in seen.items():
        lines.append(f"  {kind:<13} {scope}")
    counts = summary_counts(report)
    lines.append("")
    lines.append(
        "summary: "
        + ", ".join(f"{k} {v['ok']}/{v['total']}" for k, v in counts.items())
        + f"; unbounded claims {sum(v['unbounded'] for v in counts.values())}, "
        f"bounded {sum(v['total'] - v['unbounded'] for v in counts.values())}"
    )
    fails = report.failures
    if fails:
        lines.append("")
        lines.append(f"FAILED: {len(fails)} obligation(s)")
        for r in fails:
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
    elif verbose:
        for r in report.results:
            if r.trace is not None:
                lines.append("")
                lines.append(f"witness for {r.obligation}:")
                lines.append(r.trace.render())
    lines.append("")
    lines.append("RESULT: " + ("all obligations hold" if report.ok else "some obligations FAIL"))
    return "\n".join(lines)


SCHEMA = "kvstate.prove/1"  # the JSON report's version: bumped when a field changes meaning


def render_json(report: Report) -> str:
    return json.dumps(
        {
            "schema": SCHEMA,
            "table": report.table,
            "geometry": report.geometry,
            "ok": report.ok,
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
        failures=str(len(report.failures)),
        time=f"{report.seconds:.3f}",
    )
    for r in report.results:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"kvstate.{r.kind}",
            name=r.obligation,
            time=f"{r.seconds:.3f}",
        )
        ET.SubElement(case, "system-out").text = f"{r.method}; {r.scope}; {r.status}"
        if not r.ok:
            f = ET.SubElement(case, "failure", message=f"{r.status}: {r.detail}")
            f.text = r.trace.render() if r.trace else r.detail
    return ET.tostring(suite, encoding="unicode")
