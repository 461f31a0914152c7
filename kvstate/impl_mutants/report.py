"""``report``: the kill rate, the median time to catch, and every survivor with its diff and
its triage line (``--markdown``: by file and by class)."""

from __future__ import annotations

import argparse
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstate.impl_mutants.mutants import Mutant, enumerate_mutants, picked, sample
from kvstate.impl_mutants.reach import is_reached, reached_lines
from kvstate.impl_mutants.store import load
from kvstate.impl_mutants.triage import load_triage
from kvstate.mutant_runner import Target


def summarize(
    rows: Sequence[tuple[Mutant, dict[str, Any]]], equivalent: dict[str, str]
) -> dict[str, Any]:
    verdicts = Counter(r["verdict"] for _, r in rows)
    eq = {m.key for m, r in rows if r["verdict"] == "survived" and m.key in equivalent}
    counted = [
        (m, r)
        for m, r in rows
        if r["verdict"] in ("killed", "timeout", "survived") and m.key not in eq
    ]
    killed = [r for _, r in counted if r["verdict"] == "killed"]
    caught = sorted(float(r["seconds"]) for r in killed if r.get("seconds") is not None)
    per_file: dict[str, Counter[str]] = defaultdict(Counter)
    for m, r in counted:
        per_file[m.file][r["verdict"]] += 1
    return {
        "measured": len(rows),
        "verdicts": dict(verdicts),
        "equivalent": len(eq),
        "counted": len(counted),
        "killed": len(killed),
        "crashes": sum(1 for r in killed if str(r.get("kind", "")).startswith("crash:")),
        "timeouts": verdicts.get("timeout", 0),
        "kill_rate": (len(counted) - sum(1 for _, r in counted if r["verdict"] == "survived")) / max(1, len(counted)),
        "median_catch_s": statistics.median(caught) if caught else None,
        "p90_catch_s": caught[int(0.9 * (len(caught) - 1))] if caught else None,
        "per_file": {f: dict(c) for f, c in sorted(per_file.items())},
        "survivors": [
            {"id": m.id, "key": m.key, "file": m.file, "line": m.line, "operator": m.operator,
             "definition": m.definition, "diff": r.get("diff", ""), "triage": equivalent.get(m.key, "")}
            for m, r in sorted(rows, key=lambda x: (x[0].file, x[0].line, x[0].id))
            if r["verdict"] == "survived"
        ],
    }  # fmt: skip


# the triage's classes (a triage line starts with one of these keys and a colon): the issue's
# path classes first, then what is not a path the harness misses
CLASSES = {
    "order": "order observable but unchecked",
    "prefix": "identity of a prefix",
    "exhaustion": "exhaustion partway",
    "readiness": "readiness ordering in recovery",
    "integrity": "integrity of every stored form",
    "concurrency": "concurrency",
    "graphs": "CUDA-graph rows and events",
    "caches": "caches inside the implementation",
    "refusal": "a refusal the table does not require, accepted",
    "args": "bad input the harness never sends (argument validation)",
    "limits": "defaults and limits beyond the harness's geometry",
    "tooling": "not the library's run-time path",
    "equivalent": "equivalent (not counted)",
}


def _oneline(diff_text: str) -> str:
    body = [ln for ln in diff_text.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    return " / ".join(f"`{ln[0]} {' '.join(ln[1:].split())}`" for ln in body)


def markdown(s: dict[str, Any], triage: dict[str, str]) -> str:
    """The survivors, by file and by class, each with its diff and its triage line."""
    out = [
        "| file | killed | timeout | survived | of which equivalent | kill rate |",
        "|---|---|---|---|---|---|",
    ]
    eq_by_file = Counter(
        sv["file"] for sv in s["survivors"] if triage.get(sv["key"], "").startswith("equivalent")
    )
    for f, c in s["per_file"].items():
        k, t, sv = c.get("killed", 0), c.get("timeout", 0), c.get("survived", 0)
        out.append(
            f"| {f} | {k} | {t} | {sv + eq_by_file[f]} | {eq_by_file[f]} | {100 * (k + t) / max(1, k + t + sv):.0f}% |"
        )
    by_class: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sv in s["survivors"]:
        key = triage.get(sv["key"], "untriaged:").split(":", 1)[0]
        by_class[key].append(sv)
    for key in [*CLASSES, *sorted(set(by_class) - set(CLASSES))]:
        if key not in by_class:
            continue
        out += ["", f"### {CLASSES.get(key, key)} ({len(by_class[key])})", ""]
        for sv in by_class[key]:
            note = triage.get(sv["key"], "untriaged: ").split(":", 1)[1].strip()
            where = "" if sv["reached"] else ", never reached"
            out.append(
                f"- `{sv['id']}` ({sv['definition'] or 'module'}{where}) {_oneline(sv['diff'])}: {note}"
            )
    return "\n".join(out) + "\n"


def report(args: argparse.Namespace, target: Target) -> int:
    rows = [(m, r) for m, r in load(args, target) if picked(m, args)]
    if args.sample is not None:  # the first N of the seeded order (what `run --sample N` ran)
        chosen = {m.job_id for m in sample(enumerate_mutants(target), args.sample, args.seed)}
        rows = [(m, r) for m, r in rows if m.job_id in chosen]
    lines = reached_lines(args, target).union()
    triage = load_triage(Path(args.triage)) if args.triage else {}
    equivalent = {k: v for k, v in triage.items() if v.startswith("equivalent")}
    s = summarize(rows, equivalent)
    for sv, (m, _) in zip(
        s["survivors"],
        [
            x
            for x in sorted(rows, key=lambda x: (x[0].file, x[0].line, x[0].id))
            if x[1]["verdict"] == "survived"
        ],
        strict=True,
    ):
        sv["reached"] = is_reached(target, m, lines)
    s["survivors_unreached"] = sum(1 for sv in s["survivors"] if not sv["reached"])
    if args.json:
        Path(args.json).write_text(json.dumps(s, indent=2))
    if args.markdown:
        Path(args.markdown).write_text(markdown(s, triage))
    v = s["verdicts"]
    print(
        f"{s['measured']} mutants measured (profile {args.profile}): killed {s['killed']} "
        f"(of which the fuzz crashed {s['crashes']}), timeout {s['timeouts']}, survived "
        f"{v.get('survived', 0)} ({s['equivalent']} triaged equivalent), incompetent "
        f"{v.get('incompetent', 0)}"
    )
    print(
        f"kill rate over the {s['counted']} non-equivalent: {100 * s['kill_rate']:.1f}%; time to "
        f"catch: median {s['median_catch_s']} s, 90th percentile {s['p90_catch_s']} s"
    )
    print("\nper file: killed / timeout / survived")
    for f, c in s["per_file"].items():
        print(
            f"  {f:<16} {c.get('killed', 0):>4} {c.get('timeout', 0):>4} {c.get('survived', 0):>4}"
        )
    print(f"\nsurvivors ({s['survivors_unreached']} on lines the killing test never runs):")
    for sv in s["survivors"]:
        body = "\n".join(
            ln for ln in sv["diff"].splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
        )
        where = "reached" if sv["reached"] else "never reached"
        print(
            f"- {sv['id']} in {sv['definition'] or '<module>'} ({where}): {triage.get(sv['key'], 'untriaged')}"
        )
        print("    " + body.replace("\n", "\n    "))
    return 0


# an id of the old form, ``file:line:Operator#occurrence`` (renumbered by any edit of the file)
