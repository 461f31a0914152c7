"""Progress of a ``kvstate prove`` run on stderr, so that no run goes silent.

On a terminal: a bar (tqdm, from the ``prove`` extra; lines when it is missing).  Elsewhere (a CI
log, a pipe): one line per kind of obligation when its last unit finishes, and a line every
``HEARTBEAT_S`` seconds while nothing else was printed (how many finished, how many run).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Any, TextIO

from kvstate.proofs.obligations import Unit
from kvstate.proofs.results import Result

HEARTBEAT_S = 60.0


class Lines:
    """One line per finished kind (and a heartbeat): what a log can keep."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = sys.stderr if out is None else out
        self.t0 = time.monotonic()
        self.last = self.t0
        self.left: Counter[str] = Counter()
        self.results: dict[str, Counter[str]] = {}

    def _say(self, text: str) -> None:
        self.last = time.monotonic()
        print(f"  [{self.last - self.t0:6.1f} s] {text}", file=self.out, flush=True)

    def start(self, units: list[Unit]) -> None:
        self.left = Counter(u.kind for u in units)
        kinds = ", ".join(f"{k} {n}" for k, n in self.left.items())
        self._say(f"{len(units)} units of work ({kinds})")

    def unit_done(self, unit: Unit, results: list[Result]) -> None:
        c = self.results.setdefault(unit.kind, Counter())
        for r in results:
            c["ok" if r.ok else r.status] += 1
        self.left[unit.kind] -= 1
        if self.left[unit.kind] == 0:
            n = sum(c.values())
            rest = ", ".join(f"{v} {k}" for k, v in sorted(c.items()) if k != "ok")
            self._say(f"{unit.kind}: {c['ok']}/{n} hold" + (f" ({rest})" if rest else ""))

    def tick(self, running: int, done: int, total: int) -> None:
        if time.monotonic() - self.last >= HEARTBEAT_S:
            self._say(f"... {done}/{total} units finished, {running} running")


class Bar:
    """A tqdm bar over the units, with the count of obligations that do not hold."""

    def __init__(self, tqdm: Any) -> None:
        self.tqdm = tqdm
        self.bar: Any = None
        self.bad = 0

    def start(self, units: list[Unit]) -> None:
        self.bar = self.tqdm(total=len(units), unit="unit", desc="kvstate prove", leave=False)

    def unit_done(self, unit: Unit, results: list[Result]) -> None:
        self.bad += sum(1 for r in results if not r.ok)
        self.bar.set_postfix_str(f"{unit.kind}; not holding: {self.bad}", refresh=False)
        self.bar.update(1)

    def tick(self, running: int, done: int, total: int) -> None:
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def listener(quiet: bool) -> Any:
    """The progress output for this process's stderr (None when ``quiet``)."""
    if quiet:
        return None
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            return Lines()
        return Bar(tqdm)
    return Lines()
