"""``kvstate mutate``'s session store: each mutant's verdict, kept as soon as it is known, so a run
that was interrupted or ran out of ``--budget`` resumes where it stopped.

A verdict is kept under the table's content digest (:mod:`.digest`), the mutant's id and the
settings that decide it (the per-query timeout, ``liveness``, and a digest of the checker's own
sources in ``proofs/``): a changed table, setting or checker never reuses a verdict.  SQLite
(the standard library's), one row per verdict committed at once: several runs may share one
file (SQLite's lock), and a killed run loses only the mutants it was checking.  ``unchecked``
is never kept.  The default file is ``$KVSTATE_CACHE_DIR`` or ``$XDG_CACHE_HOME/kvstate`` (else
``~/.cache/kvstate``) ``/mutate.sqlite``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    table_digest TEXT NOT NULL,
    settings TEXT NOT NULL,
    mutant TEXT NOT NULL,
    outcome TEXT NOT NULL,
    PRIMARY KEY (table_digest, settings, mutant)
)
"""
# the sources whose behaviour a verdict depends on
_CHECKER = ("mutate.py", "obligations.py", "units.py", "engine.py")


def default_path() -> Path:
    base = os.environ.get("KVSTATE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "kvstate",
    )
    return Path(base) / "mutate.sqlite"


def checker_digest() -> str:
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in _CHECKER:
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    return h.hexdigest()[:16]


def settings_key(*, timeout_ms: int, liveness: bool) -> str:
    return json.dumps(
        {"timeout_ms": timeout_ms, "liveness": liveness, "checker": checker_digest()},
        sort_keys=True,
    )


class Session:
    """The verdicts of one table under one setting, in a SQLite file."""

    def __init__(self, path: Path | str, table_digest: str, settings: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=30.0)
        self.db.execute(_SCHEMA)
        self.db.commit()
        self.key = (table_digest, settings)

    def load(self) -> dict[str, dict[str, Any]]:
        rows = self.db.execute(
            "SELECT mutant, outcome FROM verdicts WHERE table_digest = ? AND settings = ?",
            self.key,
        )
        out = {}
        for mutant, text in rows:
            try:
                out[mutant] = json.loads(text)
            except ValueError:
                continue
        return out

    def save(self, mutant: str, outcome: dict[str, Any]) -> None:
        if outcome.get("verdict") == "unchecked":
            return
        self.db.execute(
            "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?)",
            (*self.key, mutant, json.dumps(outcome, sort_keys=True)),
        )
        self.db.commit()

    def close(self) -> None:
        self.db.close()
