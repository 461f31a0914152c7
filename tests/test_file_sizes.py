"""No hand-written file of the project is over 700 lines (the style rule: split, do not grow).

A file past that size holds several jobs, and a reader of one job reads them all.  Generated
files are exempt (their generator is the source).  ``OVER`` lists the files still over the
limit, each with its reason."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 700
SUFFIXES = (".py", ".sh", ".toml", ".cfg", ".ini", ".yml", ".yaml")
GENERATED = {
    "impl/_aot.py": "written by python -m kvstate.buildtools.aotgen",
}
# files over the limit, and why they still are
OVER: dict[str, str] = {}


def tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [p for p in out.splitlines() if p.endswith(SUFFIXES) and (ROOT / p).is_file()]


def long_files(paths: list[str], root: Path = ROOT) -> dict[str, int]:
    sizes = {p: len((root / p).read_text(errors="replace").splitlines()) for p in paths}
    return {p: n for p, n in sizes.items() if n > LIMIT and p not in GENERATED}


def test_no_hand_written_file_is_over_the_limit() -> None:
    bad = {p: n for p, n in long_files(tracked()).items() if p not in OVER}
    assert not bad, f"files over {LIMIT} lines (split them): {bad}"


def test_the_check_sees_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * LIMIT)
    assert long_files(["long.py", "short.py"], tmp_path) == {"long.py": LIMIT + 1}
