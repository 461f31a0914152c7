"""The mutants: cosmic-ray's operators over the sources of a :class:`Target`, each named by a
stable key, and the seeded uniform sample a run measures."""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import hashlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvstate.mutant_runner import Target

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


def picked(m: Mutant, args: argparse.Namespace) -> bool:
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
