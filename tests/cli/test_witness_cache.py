"""``proofs/witnesses.json``: keyed by the table's content, written atomically under a file lock,
so parallel ``--update-witnesses`` runs lose nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kvstate.proofs import witnesses
from kvstate.proofs.digest import table_digest
from kvstate.proofs.results import Step, Trace
from kvstate.spec import table_named


def test_digest_is_content_not_name() -> None:
    a = table_named("default")
    assert table_digest(a) == table_digest(table_named("small"))  # two names, one table
    assert table_digest(a.derive(name="renamed")) == table_digest(a)
    # the same name, other content: a geometry swapped (--geometry keeps the name) ...
    flash = a.with_geometry(table_named("deepseek-v4-flash").geometry)
    assert flash.name == a.name and table_digest(flash) != table_digest(a)
    # ... or a guard conjunct dropped
    assert table_digest(a.derive(name=a.name, drop_guard=[("evict_start", "unpinned")])) != (
        table_digest(a)
    )


def test_digest_is_stable_across_processes() -> None:
    code = (
        "from kvstate.spec import table_named; from kvstate.proofs.digest import table_digest; "
        "print(table_digest(table_named('default')))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": seed},
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert seen == {table_digest(table_named("default"))}


def test_the_shipped_cache_serves_the_default_table() -> None:
    # every reach witness of the default table is found under its content digest
    data = json.loads(witnesses.CACHE_PATH.read_text())
    assert data["schema"] == witnesses.SCHEMA
    own = data["tables"][table_digest(table_named("default"))]["witnesses"]
    actions = {a.name for a in table_named("default").actions}
    assert {f"reach/{a}" for a in actions} <= set(own)


_WRITER = """
import sys
from pathlib import Path
from kvstate.proofs import witnesses
from kvstate.proofs.results import Step, Trace
from kvstate.spec import table_named

witnesses.CACHE_PATH = Path(sys.argv[1])
t = table_named("default")
tr = Trace((Step("admit", {"r": 0, "t": 1}),), 1)
for i in range(int(sys.argv[3])):
    witnesses.store(t, f"test/{sys.argv[2]}/{i}", tr, witnesses.Shape(1, 1, False))
"""


def test_parallel_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "witnesses.json"
    n = 40
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), who, str(n)])
        for who in ("a", "b")
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    data = json.loads(path.read_text())
    kept = data["tables"][table_digest(table_named("default"))]["witnesses"]
    assert len(kept) == 2 * n
    assert not [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_a_name_hint_is_rechecked_and_stored_under_the_content(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(witnesses, "CACHE_PATH", tmp_path / "w.json")
    base = table_named("default")
    other = base.derive(name=base.name, drop_guard=[("evict_start", "unpinned")])
    tr = Trace((Step("admit", {"r": 0, "t": 1}),), 1)
    witnesses.store(other, "reach/admit", tr, witnesses.Shape(1, 1, False))
    # the default table has no entry of its own: the one of its name is a hint, re-checked
    assert witnesses.candidates(base, "reach/admit")
    from kvstate.proofs.engine import fires_goal

    got = witnesses.witness(
        base,
        "reach/admit",
        lambda t: fires_goal("admit"),
        lambda t: t.replayed,
        max_depth=3,
        scale_caps=False,
        timeout_ms=20000,
        update=True,
    )
    assert got is not None and got[2].startswith("cached certificate")
    data = json.loads((tmp_path / "w.json").read_text())
    assert "reach/admit" in data["tables"][table_digest(base)]["witnesses"]
