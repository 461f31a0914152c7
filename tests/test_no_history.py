"""Project files describe the present: none speaks of working sessions, git branches or "today".

History lives in git (``git log -p FILE``).  A page organised by "the ninth session" or "branch
`reqpath2`" goes stale the day it is written and hides the current figure among old ones.

The patterns name the phrasings of that kind and nothing else, so the other senses of the words
stay allowed: branch coverage, a code branch ("the CUDA-tensor branch of build_into"), the SWA
branch of an attention layer, a pytest session, ``kvstate mutate``'s session store
(``--session``).  Generated files (``impl/_aot.py``, the witness cache) and everything git or a
build keeps (``.git``, virtual environments, ``build/``, caches) are not read.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_DIRS = {
    ".git",
    "build",
    "dist",
    "graphs",
    "node_modules",
    "__pycache__",
    ".hypothesis",
    ".kvstate",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}
GENERATED = {"impl/_aot.py", "proofs/witnesses.json"}
TEXT = {".py", ".md", ".toml", ".txt", ".sh", ".json", ".cfg", ".ini", ".yml", ".yaml", ""}
ORDINAL = (
    r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"last|previous|next|this|that|earlier|later|another|same|whole|current"
)
FORBIDDEN = [
    # a working session: "the ninth session", "this session's head", "Ninth session:"
    re.compile(rf"\b(?:{ORDINAL}) sessions?\b", re.IGNORECASE),
    re.compile(r"\bsession(?:'s)? (?:head|helpers?)\b", re.IGNORECASE),
    # a git branch: "branch `reqpath2`", "on branch gaps", "merging the branch", "this branch's head"
    re.compile(r"\bbranch(?:es)? `[\w./-]+`", re.IGNORECASE),
    re.compile(r"\b(?:on|from|of) branch [\w./-]+", re.IGNORECASE),
    re.compile(r"\bmerg(?:e|ed|ing)(?: the)? branch(?:es)?\b", re.IGNORECASE),
    re.compile(
        r"\b(?:this|that|each|the helper's|a helper's|whose|the) branch(?:'s)? head\b", re.I
    ),
    # the day it was written
    re.compile(r"\btoday\b|\btoday's\b|\byesterday\b|\bthis week\b", re.IGNORECASE),
]


def findings(text: str) -> list[str]:
    """The forbidden phrasings in ``text``, each with its line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for pat in FORBIDDEN:
            m = pat.search(line)
            if m is not None:
                out.append(f"{n}: {m.group(0)!r} in {line.strip()[:120]!r}")
    return out


def project_files() -> list[Path]:
    """Every text file of the project a person writes: what git tracks or would track (ignored
    build outputs, venvs and caches left out); without git, a walk that skips them by name."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        paths = [ROOT / p for p in listed.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [
            p
            for p in ROOT.rglob("*")
            if not any(
                d in SKIP_DIRS or d.startswith((".venv", "venv")) or d.endswith(".egg-info")
                for d in p.relative_to(ROOT).parts[:-1]
            )
        ]
    me = Path(__file__).resolve()
    return sorted(
        p
        for p in paths
        if p.is_file()
        and p.suffix in TEXT
        and p.relative_to(ROOT).as_posix() not in GENERATED
        and p.resolve() != me  # this file names the patterns
    )


@pytest.mark.parametrize(
    "line",
    [
        "## Ninth session (the request path's reference cycle)",
        "Base: main at 4a0b3a4 (the seventh session's head)",
        "## Branch `reqpath2`: the request path's twins",
        "# planted by hand on branch gaps, where the 26 above do not reach",
        "after merging the branches, the figures were taken again",
        "the figures were taken on this branch's head",
        "every seeded edit applies to today's sources",
    ],
)
def test_the_history_phrasings_are_flagged(line: str) -> None:
    assert findings(line), line


@pytest.mark.parametrize(
    "line",
    [
        "`--coverage` adds the branch coverage of `impl/` the run reached",
        "the CUDA-tensor branch of build_into; the ci walk runs on CPU",
        "* SWA branch (every layer): the last ``n_win`` kv rows",
        "uncompressed tail, a sliding-window branch, a sparse-routing indexer",
        "Each verdict is kept at once in a session store (SQLite, `--session`)",
        "[--session PATH | --no-session]",
        "so a caller's process (this test's pytest session) goes on",
        '@pytest.fixture(autouse=True, scope="session")',
        "misuse fails loudly rather than silently picking one branch.",
        "a store run that starts at its first block never reaches this branch in the ci walk",
    ],
)
def test_the_other_senses_are_allowed(line: str) -> None:
    assert not findings(line), findings(line)


def test_no_project_file_speaks_of_sessions_or_branches() -> None:
    files = project_files()
    assert any(p.name == "README.md" for p in files), "the walk found no README.md"
    bad = {p.relative_to(ROOT).as_posix(): f for p in files if (f := findings(p.read_text()))}
    assert not bad, "history belongs in git; describe the present:\n" + "\n".join(
        f"{path}:{hit}" for path, hits in sorted(bad.items()) for hit in hits
    )
