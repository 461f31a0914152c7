"""Generated mutants of ``impl/``, killed (or not) by the API fuzz alone.

``python -m kvstate.impl_mutants run`` enumerates cosmic-ray's mutations of every module of
``impl/`` (``impl/_aot.py`` is generated and left out), takes a uniform random sample of them
(``--sample N``; all of them without it), and runs the API fuzz (``kvstate fuzz --target
kvstate-api --profile ci``; ``--profile dev`` for the longer walk) against each one, on the pure
sources, in a forked child (:mod:`kvstate.mutant_runner`).  ``report`` prints the kill rate, the
median time to catch and every survivor with its diff.  Needs the ``mutants`` extra
(``pip install -e ".[mutants]"``); docs/generated-mutants.md has the figures and the triage.

The result store is cosmic-ray's own (a ``WorkDB``: ``cr-report`` and ``cr-html`` read it), in
``.kvstate-mutants/`` by default.  A mutant's id names its file, line, operator and occurrence,
and its job id adds the digest of the file it mutates; its result records the digest of what the
verdict depends on (``impl/``, ``kvstate/``, ``spec/``, ``model/``, ``kernels/``).  A result is
reused only while both digests still hold, so an interrupted run resumes where it stopped and an
edit anywhere the verdict depends on runs the mutants again.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import hashlib
import json
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvstate.mutant_runner import Outcome, Runner, Target

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / ".kvstate-mutants"

# One behavioural change per site, the kinds a single-line bug makes (an off-by-one, a flipped
# or dropped condition, a swapped sign, a skipped loop, a handler that no longer catches, a
# decorator dropped), not cosmic-ray's every pairwise replacement: ``a + b`` -> ``a @ b`` and
# the like mostly raise a TypeError at once and would inflate the kill rate.
OPERATORS = (
    "core/NumberReplacer",
    "core/AddNot",
    "core/ReplaceUnaryOperator_Delete_Not",
    "core/ReplaceUnaryOperator_USub_UAdd",
    "core/ReplaceUnaryOperator_USub_Invert",
    "core/ReplaceTrueWithFalse",
    "core/ReplaceFalseWithTrue",
    "core/ReplaceAndWithOr",
    "core/ReplaceOrWithAnd",
    "core/ReplaceBreakWithContinue",
    "core/ReplaceContinueWithBreak",
    "core/ExceptionReplacer",
    "core/ZeroIterationForLoop",
    "core/RemoveDecorator",
    "core/ReplaceBinaryOperator_Add_Sub",
    "core/ReplaceBinaryOperator_Sub_Add",
    "core/ReplaceBinaryOperator_Mul_Add",
    "core/ReplaceComparisonOperator_Lt_LtE",
    "core/ReplaceComparisonOperator_LtE_Lt",
    "core/ReplaceComparisonOperator_Gt_GtE",
    "core/ReplaceComparisonOperator_GtE_Gt",
    "core/ReplaceComparisonOperator_Eq_NotEq",
    "core/ReplaceComparisonOperator_NotEq_Eq",
    "core/ReplaceComparisonOperator_Is_IsNot",
    "core/ReplaceComparisonOperator_IsNot_Is",
)
# where the verdict's code lives: a result is reused only while all of it is unchanged
CONTEXT = ("impl", "kvstate", "spec", "model", "kernels")
TOOL_PATHS = (ROOT / "kvstate" / "impl_mutants.py", ROOT / "kvstate" / "mutant_runner.py")

IMPL = Target(
    package="kvstate.impl",
    folder=ROOT / "impl",
    killer="kvstate.impl_mutants:api_fuzz",
    prepare="kvstate.impl_mutants:prepare",
    exclude=("_aot.py",),  # generated from the table by kvstate/buildtools/aotgen.py
    context=tuple(ROOT / f for f in CONTEXT),
)


def prepare() -> None:
    """The parent's imports and process settings, those of ``kvstate fuzz`` (kvstate/cli.py)."""
    import hypothesis.stateful  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import z3  # noqa: F401

    import kvstate.model.apimap  # noqa: F401
    import kvstate.targets.block  # noqa: F401
    from kvstate.spec import default_table
    from kvstate.testing.scratch import ram_scratch
    from kvstate.testing.threads import single_intraop_thread

    single_intraop_thread()
    ram_scratch()
    default_table()


def api_fuzz(profile: str) -> dict[str, Any]:
    """The killing test: ``kvstate fuzz --target kvstate-api --profile PROFILE`` (the dev walk
    with seed 0, so that a verdict can be repeated), without minimizing what it finds; where
    that command also runs the threaded mode's schedules after the walk, they run here too."""
    from kvstate.spec import default_table
    from kvstate.targets.api.run import run_api

    try:  # where the command's helpers live differs between versions of kvstate/cli
        from kvstate.cli.fuzz import long_lived_imports  # type: ignore[import-not-found]
    except ImportError:
        from kvstate.cli import long_lived_imports
    seed = None if profile == "ci" else 0
    with long_lived_imports():
        res = run_api(default_table(), 4, profile=profile, seed=seed, minimize=False)
        f = res.finding
        if f is None:
            try:
                from kvstate.targets.api.schedule import run_profile  # type: ignore[import-not-found]
            except ImportError:
                run_profile = None
            if run_profile is not None:
                failed, lines = run_profile(default_table(), 4, profile, seed)
                if failed:
                    return {
                        "killed": True,
                        "kind": "threads",
                        "detail": "\n".join(lines)[:300],
                        "origin": "threaded schedules",
                        "seconds": round(res.seconds, 3),
                    }
    return {
        "killed": f is not None,
        "kind": f.signature if f is not None else "",
        "detail": str(f)[:300] if f is not None else "",
        "origin": res.origin,
        "seconds": round(res.seconds, 3),
        "found_len": res.found_len,
    }


@dataclass(frozen=True)
class Mutant:
    file: str  # relative to the target's folder
    operator: str
    occurrence: int
    line: int
    col: int
    definition: str
    digest: str  # of the file it mutates
    text: str = ""  # the mutated line's source, blanks collapsed
    in_line: int = 0  # this operator's occurrence within that line
    twin: int = 0  # earlier lines of the file with the same text (and operator)

    @property
    def id(self) -> str:
        """File, line number, operator and occurrence in the file: what ``run`` prints and
        ``verify`` takes, renumbered by any edit of the file above the mutant."""
        return f"{self.file}:{self.line}:{self.operator.removeprefix('core/')}#{self.occurrence}"

    @property
    def key(self) -> str:
        """The triage's key: file, operator with its occurrence within the line, and the
        line's source text.  An edit elsewhere in the file leaves it as it is, so an
        equivalence argued once stays attached to its mutant; an edit of the line itself drops
        the argument (it may no longer hold).  ``@N`` tells apart the N-th repeat of an
        identical line in the same file."""
        op = self.operator.removeprefix("core/")
        twin = f"@{self.twin}" if self.twin else ""
        return f"{self.file}::{op}#{self.in_line}{twin}::{self.text}"

    @property
    def job_id(self) -> str:
        return f"{self.id}@{self.digest[:12]}"


def _annotations(text: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Spans of annotations, where a mutant changes nothing under ``from __future__ import
    annotations`` (they are never evaluated): left out as equivalent by construction."""
    tree = ast.parse(text)
    if not any(
        isinstance(n, ast.ImportFrom)
        and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names)
        for n in tree.body
    ):
        return []
    spans = []
    for n in ast.walk(tree):
        anns: list[ast.expr | None] = []
        if isinstance(n, ast.arg):
            anns = [n.annotation]
        elif isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            anns = [n.returns]
        elif isinstance(n, ast.AnnAssign):
            anns = [n.annotation]
        for a in anns:
            if a is not None and a.end_lineno is not None and a.end_col_offset is not None:
                spans.append(((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)))
    return spans


def enumerate_mutants(target: Target, operators: Sequence[str] = OPERATORS) -> list[Mutant]:
    import cosmic_ray.plugins
    from cosmic_ray.ast import ast_nodes, get_ast
    from cosmic_ray.ast.ast_query import ASTQuery

    out = []
    for path in sorted(target.folder.rglob("*.py")):
        rel = path.relative_to(target.folder).as_posix()
        if rel in target.exclude or "__pycache__" in rel:
            continue
        text = path.read_text()
        digest = hashlib.sha256(text.encode()).hexdigest()
        nodes = list(ast_nodes(get_ast(text)))
        skip = _annotations(text)
        src = [" ".join(ln.split()) for ln in text.splitlines()]
        for name in operators:
            op = cosmic_ray.plugins.get_operator(name)()
            occ = 0
            per_line: Counter[int] = Counter()  # this operator's positions on each line so far
            here: list[Mutant] = []
            for node in nodes:
                for start, end in op.mutation_positions(node):
                    line = start[0]
                    k = per_line[line]
                    per_line[line] += 1
                    if not any(a <= start and end <= b for a, b in skip):
                        defn = ASTQuery(node).get_definition_name() or ""
                        t = src[line - 1] if 0 < line <= len(src) else ""
                        here.append(Mutant(rel, name, occ, line, start[1], defn, digest, t, k))
                    occ += 1
            out += _twins(here)
    return out


def _twins(mutants: list[Mutant]) -> list[Mutant]:
    """Number the repeats of one (text, occurrence in the line) key by line, in file order."""
    lines: dict[tuple[str, int], list[int]] = defaultdict(list)
    for m in mutants:
        lines[(m.text, m.in_line)].append(m.line)
    return [replace(m, twin=sorted(set(lines[(m.text, m.in_line)])).index(m.line)) for m in mutants]


def _picked(m: Mutant, args: argparse.Namespace) -> bool:
    """``--files``: only mutants of files matching one of these globs (``disk*.py``), so that a
    run can measure the modules a change touched; the sample is drawn first, so a filtered run
    measures the same mutants an unfiltered one would in those files."""
    globs = getattr(args, "files", None)
    return not globs or any(fnmatch.fnmatch(m.file, g) for g in globs)


def sample(mutants: Sequence[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """A uniform random sample, ranked by a hash of (seed, id): a larger ``n`` keeps the
    smaller sample's mutants, so a run can be extended."""
    ranked = sorted(mutants, key=lambda m: hashlib.sha256(f"{seed}:{m.id}".encode()).digest())
    return ranked if n is None else ranked[:n]


def context_digest(target: Target) -> str:
    """What a verdict depends on: the target's sources and its context's (this tool left out)."""
    h = hashlib.sha256()
    for folder in sorted({target.folder, *target.context}):
        for p in sorted(folder.rglob("*.py")):
            if "__pycache__" not in p.parts and p not in TOOL_PATHS:
                h.update(
                    str(p.relative_to(folder.parent)).encode() + b"\0" + p.read_bytes() + b"\0"
                )
    return h.hexdigest()


def mutated_source(target: Target, m: Mutant) -> tuple[str, str | None]:
    import cosmic_ray.plugins
    from cosmic_ray.mutating import mutate_code

    text = (target.folder / m.file).read_text()
    return text, mutate_code(text, cosmic_ray.plugins.get_operator(m.operator)(), m.occurrence)


def diff(original: str, mutated: str, name: str) -> str:
    lines = difflib.unified_diff(
        original.splitlines(), mutated.splitlines(), f"a/{name}", f"b/{name}", n=0, lineterm=""
    )
    return "\n".join(lines)


def _store(store: Path, profile: str) -> Path:
    store.mkdir(parents=True, exist_ok=True)
    return store / f"results-{profile}.sqlite"


def _reached_file(store: Path, profile: str) -> Path:
    return store / f"reached-{profile}.json"


def _results(db: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for job_id, r in db.results:
        try:
            out[job_id] = {**json.loads(r.output or "{}"), "diff": r.diff or ""}
        except ValueError:
            continue
    return out


def run(args: argparse.Namespace, target: Target) -> int:
    from cosmic_ray.work_db import use_db
    from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkItem, WorkResult

    chosen = [
        m for m in sample(enumerate_mutants(target), args.sample, args.seed) if _picked(m, args)
    ]
    if args.survivors_of:  # e.g. the dev walk over what the ci run let through
        a = argparse.Namespace(store=args.store, profile=args.survivors_of)
        alive = {m.id for m, r in _load(a, target) if r["verdict"] == "survived"}
        chosen = [m for m in chosen if m.id in alive]
    ctx = context_digest(target)
    with use_db(str(_store(args.store, args.profile))) as db:
        known = {w.job_id for w in db.work_items}
        db.add_work_items(
            WorkItem.single(
                m.job_id,
                MutationSpec(
                    str(target.folder / m.file), m.operator, m.occurrence,
                    (m.line, m.col), (m.line, m.col + 1), definition_name=m.definition,
                ),
            )
            for m in chosen
            if m.job_id not in known
        )  # fmt: skip
        prior = _results(db)
        todo = [m for m in chosen if prior.get(m.job_id, {}).get("context") != ctx]
        print(
            f"{len(chosen)} mutants chosen, {len(chosen) - len(todo)} already measured on these "
            f"sources, {len(todo)} to run (profile {args.profile}, -j {args.jobs})",
            flush=True,
        )
        if not todo:
            return 0
        # the baseline gets a generous limit whatever ``--timeout`` says: it is the unmutated
        # sources, and a loaded machine must not turn it into a false "the test fails"
        runner = Runner(target, args.profile, max(args.timeout or 0.0, 120.0), args.jobs)
        try:
            # the unmutated baseline, traced: the killing test must pass on it; it sets the
            # timeout, and the lines it runs tell a survivor the test never reached
            base, lines = runner.reached()
            if base.verdict != "survived":
                print(f"the killing test fails on the unmutated sources: {base}", file=sys.stderr)
                return 2
            _reached_file(args.store, args.profile).write_text(
                json.dumps({"context": ctx, "lines": lines})
            )
            runner.timeout = args.timeout or max(30.0, 4 * base.wall)
            print(
                f"baseline (traced): passes in {base.wall:.1f} s; timeout per mutant "
                f"{runner.timeout:g} s",
                flush=True,
            )
            by_job = {m.job_id: m for m in todo}
            originals: dict[str, str] = {}
            t0, count = time.monotonic(), Counter[str]()

            def work() -> Iterable[tuple[str, str, str]]:
                for m in todo:
                    text, mutated = mutated_source(target, m)
                    if mutated is None:
                        db.set_result(m.job_id, WorkResult(worker_outcome=WorkerOutcome.NO_TEST))
                        continue
                    try:
                        compile(mutated, m.file, "exec")
                    except SyntaxError as exc:
                        rec = {"verdict": "incompetent", "context": ctx, "detail": str(exc)}
                        db.set_result(
                            m.job_id,
                            WorkResult(
                                WorkerOutcome.NORMAL,
                                json.dumps(rec),
                                TestOutcome.INCOMPETENT,
                                diff(text, mutated, m.file),
                            ),
                        )
                        continue
                    originals[m.job_id] = diff(text, mutated, m.file)
                    yield m.job_id, m.file, mutated

            def done(job: str, o: Outcome) -> None:
                m = by_job[job]
                rec = {"verdict": o.verdict, "seconds": o.seconds, "wall": o.wall, "kind": o.kind,
                       "detail": o.detail, "context": ctx, "profile": args.profile, **o.extra}  # fmt: skip
                outcome = TestOutcome.SURVIVED if o.verdict == "survived" else TestOutcome.KILLED
                db.set_result(
                    job,
                    WorkResult(
                        WorkerOutcome.NORMAL,
                        json.dumps(rec, default=str),
                        outcome,
                        originals.pop(job, ""),
                    ),
                )
                count[o.verdict] += 1
                n = sum(count.values())
                print(
                    f"[{n}/{len(todo)} {time.monotonic() - t0:6.0f} s] {o.verdict:<8} {m.id:<58} "
                    f"{o.wall:5.1f} s  {o.kind[:60]}",
                    flush=True,
                )

            runner.run(work(), done)
        finally:
            runner.close()
    return 0


def _load(args: argparse.Namespace, target: Target) -> list[tuple[Mutant, dict[str, Any]]]:
    from cosmic_ray.work_db import WorkDB, use_db

    path = _store(args.store, args.profile)
    if not path.exists():
        return []
    ctx = context_digest(target)
    current = {m.job_id: m for m in enumerate_mutants(target)}
    with use_db(str(path), WorkDB.Mode.open) as db:
        res = _results(db)
    return [(current[j], r) for j, r in res.items() if j in current and r.get("context") == ctx]


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


def _stmt_start(text: str, line: int) -> int:
    """The first line of the innermost statement holding ``line`` (what a line tracer reports
    for a statement that spans lines)."""
    best = line
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, ast.stmt) and n.lineno <= line <= (n.end_lineno or n.lineno):
            best = n.lineno if best == line or n.lineno > best else best
    return best


def reached_lines(args: argparse.Namespace, target: Target) -> dict[str, set[int]]:
    """The lines the killing test runs on the unmutated sources (kept in the store, measured
    again when the sources changed)."""
    path = _reached_file(args.store, args.profile)
    ctx = context_digest(target)
    saved = json.loads(path.read_text()) if path.exists() else {}
    if saved.get("context") != ctx:
        runner = Runner(target, args.profile, 600.0)
        try:
            base, lines = runner.reached()
        finally:
            runner.close()
        if base.verdict != "survived":
            raise SystemExit(f"the killing test fails on the unmutated sources: {base}")
        saved = {"context": ctx, "lines": lines}
        path.write_text(json.dumps(saved))
    return {f: set(v) for f, v in saved["lines"].items()}


def is_reached(target: Target, m: Mutant, lines: dict[str, set[int]]) -> bool:
    ran = lines.get(m.file, set())
    if m.line in ran:
        return True
    return _stmt_start((target.folder / m.file).read_text(), m.line) in ran


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
    rows = [(m, r) for m, r in _load(args, target) if _picked(m, args)]
    if args.sample is not None:  # the first N of the seeded order (what `run --sample N` ran)
        chosen = {m.job_id for m in sample(enumerate_mutants(target), args.sample, args.seed)}
        rows = [(m, r) for m, r in rows if m.job_id in chosen]
    lines = reached_lines(args, target)
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


def verify(args: argparse.Namespace, target: Target) -> int:
    """The real command, ``kvstate fuzz --target kvstate-api``, in a fresh interpreter on a staged
    copy of the package with the mutant written into it: the forked runner's verdicts, checked."""
    import os
    import subprocess

    from kvstate.api_mutants import stage

    stored = {m.id: (m, r) for m, r in _load(args, target)}
    everything = {m.id: m for m in enumerate_mutants(target)}
    root = stage()
    agree = measured = 0
    for mid in args.ids:
        m = everything.get(mid)
        if m is None:
            print(f"{mid}: no such mutant of the current sources", file=sys.stderr)
            return 2
        text, mutated = mutated_source(target, m)
        dst = root / "kvstate" / "impl" / m.file
        dst.write_text(mutated or text)
        env = {**os.environ, "KVSTATE_PURE_PYTHON": "1", "PYTHONPATH": str(root)}
        cmd = [
            sys.executable,
            "-m",
            "kvstate",
            "fuzz",
            "--target",
            "kvstate-api",
            "--profile",
            args.profile,
        ]
        t0 = time.monotonic()
        try:
            rc = subprocess.run(
                cmd, env=env, cwd=root, capture_output=True, timeout=args.timeout
            ).returncode
            verdict = "survived" if rc == 0 else "killed"
        except subprocess.TimeoutExpired:
            verdict = "timeout"
        finally:
            dst.write_text(text)
        before = stored[mid][1]["verdict"] if mid in stored else "unmeasured"
        agree += before == verdict
        measured += before != "unmeasured"
        print(
            f"{mid:<58} command: {verdict:<8} ({time.monotonic() - t0:5.1f} s)  forked runner: {before}",
            flush=True,
        )
    print(f"{agree}/{measured} verdicts agree with the store's")
    return 0 if agree == measured else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kvstate.impl_mutants", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "report", "list", "verify", "migrate-triage"):
        p = sub.add_parser(name)
        p.add_argument(
            "--profile", default="ci", choices=["ci", "dev"], help="the killing test's profile"
        )
        p.add_argument("--store", type=Path, default=STORE, help="the result store's folder")
        p.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
        p.add_argument("--package", default=None, help=argparse.SUPPRESS)
        p.add_argument("--killer", default=None, help=argparse.SUPPRESS)
        p.add_argument(
            "--files", nargs="+", default=None, metavar="GLOB",
            help="only mutants of these files of impl/ (globs, e.g. 'disk*.py')",
        )  # fmt: skip
        p.add_argument("--prepare", default=None, help=argparse.SUPPRESS)
    r = sub.choices["run"]
    r.add_argument("--sample", type=int, default=None, help="a uniform random sample of this many")
    r.add_argument("--seed", type=int, default=0, help="the sample's seed")
    r.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once")
    r.add_argument(
        "--survivors-of",
        default=None,
        choices=["ci", "dev"],
        help="only the mutants that survived this profile's run",
    )
    r.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant (default: 10x the baseline, at least 30)",
    )
    rp = sub.choices["report"]
    rp.add_argument(
        "--triage", default=None, help="JSON {mutant id: triage}; 'equivalent: ...' is not counted"
    )
    rp.add_argument("--json", default=None, help="write the summary here")
    rp.add_argument(
        "--markdown", default=None, help="write the per-file table and the survivors by class here"
    )
    rp.add_argument("--sample", type=int, default=None, help="only the first N of the seeded order")
    rp.add_argument("--seed", type=int, default=0)
    mt = sub.choices["migrate-triage"]
    mt.add_argument("--triage", required=True, help="the triage file, rewritten in place")
    mt.add_argument(
        "--evidence", default=None, help="a report's survivor lines (docs/generated-mutants.md)"
    )
    v = sub.choices["verify"]
    v.add_argument("ids", nargs="+", help="mutant ids (as report and list print them)")
    v.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args(argv)
    target = IMPL
    if a.folder is not None:  # another package (the tool's own tests use a scratch one)
        target = Target(a.package, a.folder.resolve(), a.killer, a.prepare or "")
    if a.cmd == "list":
        for m in enumerate_mutants(target):
            if _picked(m, a):
                print(m.id)
        return 0
    if a.cmd == "migrate-triage":
        return migrate_triage(a, target)
    return {"run": run, "report": report, "verify": verify}[a.cmd](a, target)


if __name__ == "__main__":
    sys.exit(main())
