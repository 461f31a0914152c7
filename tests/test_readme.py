"""The examples of README.md and docs/*.md are checked against the code, so they cannot drift.

Every fenced block is checked unless the line before it is an HTML comment saying why not,
``<!-- not-run: REASON -->`` (a reason is required, and such a block is listed in the test ids):

* a ``python`` block runs in a fresh interpreter in a temporary directory; one whose first line
  names a file (``# my_alloc.py -- ...``) is written there as that module, and the ``kvstate``
  command quoted on that line runs against it, as written;
* every command line (in a ``bash`` block, after a ``$ `` prompt, or a synopsis block starting
  with ``kvstate``): a ``kvstate`` command names a subcommand and options of the CLI's own parser
  (``kvstate.cli.build_parser``) and a concrete one parses; a synopsis's alternatives
  (``--format text|json``) are the option's choices, or the names its help quotes; ``python -m
  M`` and ``python FILE`` name a module or file that exists; ``pip install ".[x]"`` names
  extras that ``pyproject.toml`` declares;
* a sample (a ``$ kvstate ...`` line and its output) preceded by ``<!-- output-checked -->`` is
  run and its output compared, durations and Hypothesis' blob aside.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import pytest

from kvstate.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not-run:(.*?)-->")
OUTPUT_CHECKED = "<!-- output-checked -->"
TIMEOUT = 600


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str  # the HTML comment before the fence, or ""

    @property
    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = before.strip() if before.strip().startswith("<!--") else ""
        out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1 : end]), marker))
        i = end + 1
    return out


ALL = [b for p in DOCS for b in blocks(p)]


def test_markers_give_reasons_and_every_block_is_read() -> None:
    """A not-run marker names its reason; fences pair up (an odd fence would hide blocks)."""
    assert len(ALL) > 10, "the README's blocks were not found"
    for b in ALL:
        m = NOT_RUN.fullmatch(b.marker)
        if b.marker and m is None:
            assert b.marker == OUTPUT_CHECKED, f"{b.id}: unknown marker {b.marker!r}"
        if m is not None:
            assert m.group(1).strip(), f"{b.id}: a not-run marker needs a reason"
    for p in DOCS:
        fences = [ln for ln in p.read_text().splitlines() if ln.startswith("```")]
        assert len(fences) % 2 == 0, f"{p.name}: unpaired fence"


# ---- python blocks -----------------------------------------------------------------------------

PYTHON = [b for b in ALL if b.lang == "python"]
MODULE = re.compile(r"^# (\w+)\.py\b.*?`(kvstate [^`]*)`")


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), env.get("PYTHONPATH", "")])
    env.setdefault("KVSTATE_KERNEL_BACKEND", "torch")
    return env


def _kvstate() -> list[str]:
    return [sys.executable, "-m", "kvstate"]


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    if NOT_RUN.fullmatch(block.marker):
        pytest.skip(f"marked not-run: {NOT_RUN.fullmatch(block.marker).group(1).strip()}")  # type: ignore[union-attr]
    m = MODULE.match(block.text)
    if m is None:
        cmd = [sys.executable, "-c", block.text]
    else:  # a module the block's first line says to fuzz: write it, run that command on it
        (tmp_path / f"{m.group(1)}.py").write_text(block.text)
        argv = shlex.split(m.group(2))[1:]
        _parse(argv, block)
        cmd = [*_kvstate(), *argv]
    done = subprocess.run(
        cmd, cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


# ---- commands ----------------------------------------------------------------------------------


def _commands(block: Block) -> list[str]:
    """The command lines of a block (continuations joined; comments and output dropped)."""
    text = re.sub(r"\\\n\s*", " ", block.text)
    lines = text.splitlines()
    if block.lang in ("bash", "sh", "shell"):
        return [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    prompts = [ln[2:] for ln in lines if ln.startswith("$ ")]
    if prompts:
        return prompts
    if lines and re.match(r"^kvstate \w+ .*\[", lines[0]):  # a synopsis, maybe on several lines
        return [" ".join(ln.strip() for ln in lines)]
    return []


COMMANDS = [(b, c) for b in ALL for c in _commands(b)]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _parse(argv: list[str], block: Block) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"{block.id}: `kvstate {shlex.join(argv)}` does not parse") from exc


def _check_synopsis(words: list[str], block: Block) -> None:
    """``kvstate CMD [--opt A|B] [--flag] ...``: each option is the subcommand's, and its
    alternatives are the ones the parser accepts or names."""
    cmd, rest = words[0], " ".join(words[1:])
    parsers = _subparsers()
    assert cmd in parsers, f"{block.id}: no subcommand {cmd!r}"
    actions = parsers[cmd]._option_string_actions
    for m in re.finditer(r"(?<![\w-])(--?[a-zA-Z][\w-]*)(?:[ =]([^\s\[\]]+))?", rest):
        opt, value = m.group(1), m.group(2)
        if re.fullmatch(r"-([a-z])\1+", opt) and isinstance(
            actions.get(opt[:2]), argparse._CountAction
        ):
            opt = opt[:2]  # -vv: a counted flag given twice
        assert opt in actions, f"{block.id}: `kvstate {cmd}` has no option {opt}"
        action = actions[opt]
        if value is None or "|" not in value or action.nargs == 0:
            continue
        shown = {v.strip("'\"") for v in value.split("|") if ":" not in v and "=" not in v}
        if action.choices is not None:
            known = set(map(str, action.choices))
        else:  # free text: the names its help quotes are the ones to list
            known = set(re.findall(r"'([\w-]+)'", action.help or ""))
            if not known:
                continue
        assert shown == known, f"{block.id}: {opt} lists {sorted(shown)}, the CLI {sorted(known)}"


def _extras() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(meta["project"]["optional-dependencies"])


def _segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at ``&&``, ``;``, ``|``; comments dropped)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    for tok in lex:
        if tok in ("&&", "||", ";", "|", "&"):
            out.append([])
        else:
            out[-1].append(tok)
    # leading VAR=value assignments are the environment, not the command
    return [
        words[next((i for i, w in enumerate(words) if "=" not in w), len(words)) :]
        for words in out
        if words
    ]


@pytest.mark.parametrize("block,line", COMMANDS, ids=[f"{b.id}:{c[:40]}" for b, c in COMMANDS])
def test_command_names_what_exists(block: Block, line: str) -> None:
    if re.match(r"^kvstate \w+ .*\[", line):  # a synopsis: ``[--opt A|B]``, not shell syntax
        _check_synopsis(line.split()[1:], block)
        return
    for words in _segments(line):
        head = words[0] if words else ""
        if head == "kvstate":
            _parse(words[1:], block)
        elif head in ("python", "python3") and words[1:2] == ["-m"]:
            mod = words[2]
            if mod not in ("venv", "pytest", "pip"):
                assert find_spec(mod) is not None, f"{block.id}: no module {mod}"
        elif head in ("python", "python3", ".venv/bin/python") and len(words) > 1:
            assert (ROOT / words[1]).exists(), f"{block.id}: no file {words[1]}"
        elif head == "pip" and "install" in words:
            for w in words:
                m = re.search(r"\.\[([\w,-]+)\]", w)
                for extra in m.group(1).split(",") if m else ():
                    assert extra in _extras(), f"{block.id}: no extra [{extra}] in pyproject.toml"
        elif "/" in head and not head.startswith("/"):
            assert (ROOT / head).exists(), f"{block.id}: no file {head}"


# ---- samples -----------------------------------------------------------------------------------

SAMPLES = [b for b in ALL if b.marker == OUTPUT_CHECKED]


def normalized(text: str) -> list[str]:
    """Output lines with what varies from run to run (durations, Hypothesis' version and
    blob) blanked."""
    text = re.sub(r"\d+(\.\d+)? s\b", "T s", text)
    text = re.sub(r"@reproduce_failure\([^)]*\)", "@reproduce_failure(BLOB)", text)
    text = re.sub(r"--reproduce \S+", "--reproduce BLOB", text)
    return [ln.rstrip() for ln in text.strip().splitlines() if ln.strip()]


@pytest.mark.parametrize("block", SAMPLES, ids=[b.id for b in SAMPLES])
def test_sample_output_is_what_the_command_prints(block: Block, tmp_path: Path) -> None:
    first, *shown = block.text.splitlines()
    assert first.startswith("$ kvstate "), f"{block.id}: a checked sample starts with its command"
    argv = shlex.split(first[2:])[1:]
    done = subprocess.run(
        [*_kvstate(), *argv],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert normalized(done.stdout) == normalized("\n".join(shown)), (
        f"{block.id}: the sample is stale; the command now prints:\n{done.stdout}"
    )


# ---- links -------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_relative_links_reach_a_file_and_heading(path: Path) -> None:
    """README links to one page per command: a page moved or a heading renamed breaks no link."""
    for target in LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{path.name}: link to {target}: no file {dest}"
        if anchor:
            heads = [ln for ln in dest.read_text().splitlines() if re.match(r"^#{1,6} ", ln)]
            assert anchor in {_anchor(h) for h in heads}, f"{path.name}: no heading #{anchor}"


def test_readme_links_one_page_per_command() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in ("docs/prove.md", "docs/mutate.md", "docs/fuzz.md", "docs/library.md"):
        assert f"]({page})" in readme, f"README.md does not link {page}"
