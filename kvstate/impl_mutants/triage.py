"""The triage file (``{mutant key: "class: why"}``): read, and rekeyed from old mutant ids."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

from kvstate.impl_mutants.mutants import Mutant, enumerate_mutants, mutated_source
from kvstate.mutant_runner import Target

_OLD_ID = re.compile(r"^[\w./-]+\.py:\d+:\w+#\d+$")
# a survivor's line in docs/generated-mutants.md: - `ID` (where) `- old line` / `+ new line`: ...
_EVIDENCE = re.compile(r"^- `(?P<id>[^`]+)` \([^)]*\) `- (?P<old>.*?)` / `\+ (?P<new>.*?)`:")


def load_triage(path: Path) -> dict[str, str]:
    """The triage file (``{mutant key: "class: why"}``, :attr:`Mutant.key`).  Entries still
    keyed by an old mutant id are not used (the id may name another mutant now): they are
    counted on stderr, and ``migrate-triage`` rewrites them."""
    raw: dict[str, str] = json.loads(path.read_text())
    old = [k for k in raw if _OLD_ID.match(k)]
    if old:
        print(
            f"{path}: {len(old)} entries keyed by old mutant ids are not used "
            "(python -m kvstate.impl_mutants migrate-triage)",
            file=sys.stderr,
        )
    return {k: v for k, v in raw.items() if not _OLD_ID.match(k)}


def migrate(
    triage: dict[str, str],
    mutants: Sequence[Mutant],
    evidence: str = "",
    mutated_line: Callable[[Mutant], str] | None = None,
) -> tuple[dict[str, str], list[str], list[str]]:
    """Old-id entries rekeyed by :attr:`Mutant.key`: (the new triage, ids migrated, ids
    dropped).  Where ``evidence`` (a report's survivor lines, ``- `ID` (...) `- old` / `+ new`:``)
    recorded the id's diff, the entry goes to the mutant of the current sources that makes that
    very diff (same file and operator, the line's text ``old`` mutated to ``new``: by
    ``mutated_line``), wherever the line is now; an id recorded with different diffs (reports
    of different sources) names no one mutant and is dropped.  Without evidence, an old id is
    kept only while a current mutant has that id.  Otherwise the argument is dropped: the line
    it was about changed or is gone.  Entries already keyed stay as they are."""
    by_id = {m.id: m for m in mutants}
    by_text: dict[tuple[str, str, str], list[Mutant]] = defaultdict(list)
    for m in mutants:
        by_text[(m.file, m.operator.removeprefix("core/"), m.text)].append(m)
    diffs: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for ln in evidence.splitlines():
        e = _EVIDENCE.match(ln)
        if e:
            diffs[e["id"]].add((" ".join(e["old"].split()), " ".join(e["new"].split())))
    out: dict[str, str] = {}
    moved: list[str] = []
    dropped: list[str] = []
    for k, note in triage.items():
        if not _OLD_ID.match(k):
            out[k] = note
            continue
        found: Mutant | None = None
        if k in diffs:
            if len(diffs[k]) == 1 and mutated_line is not None:
                ((old, new),) = diffs[k]
                file, _, rest = k.split(":", 2)
                op = rest.split("#")[0]
                hits = {
                    m.key: m
                    for m in by_text.get((file, op, old), [])
                    if " ".join(mutated_line(m).split()) == new
                }
                if len(hits) == 1:
                    (found,) = hits.values()
        else:
            found = by_id.get(k)
        if found is None:
            dropped.append(k)
            continue
        out.setdefault(found.key, note)
        moved.append(k)
    return dict(sorted(out.items())), moved, dropped


def migrate_triage(args: argparse.Namespace, target: Target) -> int:
    path = Path(args.triage)
    evidence = Path(args.evidence).read_text() if args.evidence else ""

    def mutated_line(m: Mutant) -> str:
        _, mutated = mutated_source(target, m)
        lines = (mutated or "").splitlines()
        return lines[m.line - 1] if 0 < m.line <= len(lines) else ""

    new, moved, dropped = migrate(
        json.loads(path.read_text()), enumerate_mutants(target), evidence, mutated_line
    )
    path.write_text(json.dumps(new, indent=1, ensure_ascii=False) + "\n")
    print(f"{path}: {len(moved)} entries rekeyed, {len(dropped)} dropped (no longer match)")
    for k in dropped:
        print(f"  dropped {k}")
    return 0
