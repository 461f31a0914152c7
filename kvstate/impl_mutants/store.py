"""The result store: cosmic-ray's own ``WorkDB`` (``cr-report`` reads it), one per profile, and
what a stored verdict depends on (a result is reused only while that still holds)."""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from kvstate.impl_mutants.mutants import Mutant, enumerate_mutants
from kvstate.mutant_runner import Target

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / ".kvstate-mutants"
# where the verdict's code lives: a result is reused only while all of it is unchanged
CONTEXT = ("impl", "kvstate", "spec", "model", "kernels")
# this tool itself is left out: editing how verdicts are stored does not change them
TOOL_PATHS = (ROOT / "kvstate" / "impl_mutants", ROOT / "kvstate" / "mutant_runner.py")


def context_digest(target: Target) -> str:
    """What a verdict depends on: the target's sources and its context's (this tool left out)."""
    h = hashlib.sha256()
    for folder in sorted({target.folder, *target.context}):
        for p in sorted(folder.rglob("*.py")):
            if "__pycache__" not in p.parts and not any(p.is_relative_to(t) for t in TOOL_PATHS):
                h.update(
                    str(p.relative_to(folder.parent)).encode() + b"\0" + p.read_bytes() + b"\0"
                )
    return h.hexdigest()


def context(args: argparse.Namespace, target: Target) -> str:
    """The digest a run's results carry: :func:`context_digest`, and whether the remote walk
    was among the killing tests (a result measured without it is not reused by a run with it)."""
    from kvstate.impl_mutants.walks import remote_on

    return context_digest(target) + (":remote" if remote_on(args, target) else "")


def results_db(store: Path, profile: str) -> Path:
    store.mkdir(parents=True, exist_ok=True)
    return store / f"results-{profile}.sqlite"


def reached_file(store: Path, profile: str) -> Path:
    return store / f"reached-{profile}.json"


def results(db: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for job_id, r in db.results:
        try:
            out[job_id] = {**json.loads(r.output or "{}"), "diff": r.diff or ""}
        except ValueError:
            continue
    return out


def load(args: argparse.Namespace, target: Target) -> list[tuple[Mutant, dict[str, Any]]]:
    from cosmic_ray.work_db import WorkDB, use_db

    path = results_db(args.store, args.profile)
    if not path.exists():
        return []
    ctx = context(args, target)
    current = {m.job_id: m for m in enumerate_mutants(target)}
    with use_db(str(path), WorkDB.Mode.open) as db:
        res = results(db)
    return [(current[j], r) for j, r in res.items() if j in current and r.get("context") == ctx]
