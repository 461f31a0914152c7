"""Machine-readable reports of a ``kvstate fuzz`` run, for CI systems.

* ``--json PATH``: the run and its finding (``schema``: :data:`SCHEMA`), with the minimized
  trace as calls, the commands to rerun and replay, and the spec location.
* ``--junit PATH``: JUnit XML, one test case for the run (a failure carries the trace).
* ``--sarif PATH``: SARIF 2.1.0, one result per finding, located at the line of the spec that
  the finding names: the guard conjunct a target ignored, the invariant a state breaks, or the
  update of the field that diverged (``inspect.getsourcelines`` on the table's own callable).
* ``--github-annotations`` (on by default when ``GITHUB_ACTIONS=true``): the same finding as a
  ``::error file=...,line=...::`` workflow command on stdout, shown on the pull request's diff.
* ``--itf PATH``: the minimized trace in the ITF trace format (Apalache's JSON traces:
  ``vars``, and ``states``, each the model's whole state after one step, with the step in
  ``mbt::actionTaken`` and its parameters in ``mbt::nondetPicks``), replayed on a fresh model.

Only the standard library is used: ``json`` and ``xml.etree`` write all of them (SARIF and ITF
are JSON documents whose few fields are written here; a SARIF library would add a dependency
for a dozen lines).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from xml.etree import ElementTree as ET

from kvstate.spec.table import Table

SCHEMA = "kvstate.fuzz/1"  # bumped when a field changes meaning or goes away
ITF_SPEC = "https://apalache-mc.org/docs/adr/015adr-trace.html"


def add_arguments(fz: argparse.ArgumentParser) -> None:
    """The fuzz subcommand's options for the example database and the reports."""
    fz.add_argument(
        "--example-db",
        default=None,
        metavar="DB",
        help="Hypothesis example database for dev/nightly runs (found failures replayed first): "
        "a directory (default .kvstate/examples, or $KVSTATE_EXAMPLE_DB), 'none', "
        "redis://HOST:PORT/DB or unix:///PATH (shared by a campaign's workers); ci: none",
    )
    fz.add_argument("--json", default=None, metavar="PATH", help="write a JSON report")
    fz.add_argument("--junit", default=None, metavar="PATH", help="write a JUnit XML report")
    fz.add_argument(
        "--sarif", default=None, metavar="PATH", help="write SARIF (the finding at its spec line)"
    )
    fz.add_argument(
        "--itf", default=None, metavar="PATH", help="write the finding's trace (ITF JSON, states)"
    )
    fz.add_argument(
        "--github-annotations",
        action="store_true",
        default=os.environ.get("GITHUB_ACTIONS") == "true",
        help="print a finding as a GitHub ::error annotation (default on under GitHub Actions)",
    )


@dataclass
class Location:
    """A line of the spec: where a callable of the table is written."""

    path: str
    line: int
    what: str  # e.g. "guard conjunct load_done.complete"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "what": self.what}


@dataclass
class Outcome:
    """A fuzz run as the reports see it."""

    target: str
    table: str
    geometry: str
    pool: int
    profile: str
    seed: int | None
    ok: bool
    seconds: float
    steps: int = 0
    examples: int = 0
    kind: str = ""  # a finding's kind ('' when ok; 'crash' for a failure that is not one)
    detail: tuple[str, ...] = ()
    message: str = ""
    origin: str = ""
    trace: list[str] = field(default_factory=list)  # the minimized trace, one call per step
    commands: dict[str, str] = field(default_factory=dict)  # rerun, replay, reproduce
    location: Location | None = None
    states: Callable[[], dict[str, Any]] | None = None  # the ITF trace, built on demand

    @property
    def signature(self) -> str:
        return f"{self.kind}: {', '.join(self.detail)}" if self.kind else ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": SCHEMA,
            "target": self.target,
            "table": self.table,
            "geometry": self.geometry,
            "pool": self.pool,
            "profile": self.profile,
            "seed": self.seed,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "steps": self.steps,
            "examples": self.examples,
            "finding": None,
        }
        if not self.ok:
            d["finding"] = {
                "kind": self.kind,
                "detail": list(self.detail),
                "signature": self.signature,
                "message": self.message,
                "origin": self.origin,
                "trace": list(self.trace),
                "commands": dict(self.commands),
                "location": self.location.to_dict() if self.location else None,
            }
        return d


# ---- the spec line a finding names -----------------------------------------------------------
def _where(fn: Any, what: str) -> Location | None:
    try:
        path = inspect.getsourcefile(fn)
        _, line = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    if path is None:
        return None
    rel = os.path.relpath(path)
    return Location(rel if not rel.startswith("..") else path, max(1, line), what)


_GUARD = re.compile(r"^(\w+)\[([\w.,]*)\]$")


def spec_location(
    table: Table, kind: str, detail: Sequence[str], last: str = ""
) -> Location | None:
    """The line of ``table``'s source that a finding names (None when it names none).

    ``action[conjuncts]`` (a guard the target ignored, or one the completeness rule needs):
    the first conjunct; an invariant's name: the invariant; a diverged ``observe()`` field or
    byte state: the update of that field by ``last`` (the action of the failing step), else
    that action's first update; ``action:Error`` / ``action``: the action's first update."""
    actions = {a.name: a for a in table.actions}
    invariants = {i.name: i for i in table.invariants}
    for d in detail:
        m = _GUARD.match(d)
        if m and m.group(1) in actions:
            a = actions[m.group(1)]
            names = m.group(2).split(",")
            for c in a.guard:
                if c.name in names:
                    return _where(c.fn, f"guard conjunct {a.name}.{c.name}")
        if d in invariants:
            inv = invariants[d]
            fn = inv.per_block or inv.scalar
            if fn is not None:
                return _where(fn, f"invariant {inv.name}")
    name = last
    if not name and detail:
        name = re.split(r"[:.\[]", detail[0])[0]
    a = actions.get(name)
    if a is None:
        return None
    for d in detail:
        if d in a.updates:
            return _where(a.updates[d], f"update of {d} by {a.name}")
    for var, fn in a.updates.items():
        return _where(fn, f"update of {var} by {a.name}")
    return None


# ---- ITF traces -------------------------------------------------------------------------------
def _itf_value(v: Any) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):  # IntEnum phases too
        return int(v) if abs(v) < 2**53 else {"#bigint": str(int(v))}
    if isinstance(v, (list, tuple)):
        return [_itf_value(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _itf_value(x) for k, x in v.items()}
    return str(v)


def itf(
    states: Sequence[tuple[str, Mapping[str, int], Mapping[str, Any]]],
    *,
    description: str,
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """An ITF trace: ``states`` are (step, its parameters, the model's state after it)."""
    names: list[str] = []
    for _, _, values in states[:1]:
        names = list(values)
    out = []
    for i, (step, params, values) in enumerate(states):
        s: dict[str, Any] = {
            "#meta": {"index": i},
            "mbt::actionTaken": step,
            "mbt::nondetPicks": {k: _itf_value(v) for k, v in params.items()},
        }
        s.update({k: _itf_value(values[k]) for k in names})
        out.append(s)
    return {
        "#meta": {
            "format": "ITF",
            "format-description": ITF_SPEC,
            "source": "kvstate fuzz",
            "description": description,
            **meta,
        },
        "vars": names,
        "states": out,
    }


def block_states(table: Table, n: int, steps: Sequence[Any]) -> list[tuple[str, Any, Any]]:
    """The model's state after each step of a block-target trace (``TraceStep``s), from Init.

    A refused step (the model's guard is false) leaves the state as it was; the target's
    outputs (addresses, formats) are fed to the model as the run fed them."""
    from kvstate.model.concrete import GuardError, Machine

    m = Machine(table, n)
    s = m.init()
    out: list[tuple[str, Any, Any]] = [("init", {}, s.values)]
    for st in steps:
        params = {**st.inputs, **st.outputs}
        if st.refused:
            out.append((f"refused {st.action}", params, s.values))
            continue
        try:
            s = m.step(s, st.action, params)
        except GuardError:
            out.append((f"refused {st.action}", params, s.values))
            continue
        out.append((st.action, params, s.values))
    return out


def api_states(table: Table, n: int, ops: Sequence[Any]) -> list[tuple[str, Any, Any]]:
    """The model's state after each operation of an API-target trace, on a fresh cache (the
    harness's replay), and after the final quiescence; up to the failing operation."""
    from kvstate.harness.finding import Nonconformance
    from kvstate.targets.api.base import Coverage
    from kvstate.targets.api.state import ApiHarness

    h = ApiHarness(table, n, coverage=Coverage())
    out: list[tuple[str, Any, Any]] = [("init", {}, h.model.values)]
    try:
        for o in ops:
            try:
                h.apply(o)
            finally:
                out.append((o.name, dict(o.inputs), h.model.values))
        h.quiesce()
        out.append(("quiesce", {}, h.model.values))
    except Nonconformance:
        pass
    finally:
        h.close()
    return out


# ---- writers --------------------------------------------------------------------------------
def junit(o: Outcome) -> str:
    suite = ET.Element(
        "testsuite",
        name=f"kvstate.fuzz[{o.target}]",
        tests="1",
        failures=str(int(not o.ok)),
        time=f"{o.seconds:.3f}",
    )
    case = ET.SubElement(
        suite,
        "testcase",
        classname=f"kvstate.fuzz.{o.target}",
        name=f"{o.table} pool={o.pool} profile={o.profile}",
        time=f"{o.seconds:.3f}",
    )
    ET.SubElement(case, "system-out").text = f"{o.steps} steps in {o.examples} examples; seed " + (
        "derandomized" if o.seed is None else str(o.seed)
    )
    if not o.ok:
        f = ET.SubElement(case, "failure", message=o.signature, type=o.kind)
        f.text = "\n".join(
            [o.message, f"found by: {o.origin}", "trace:", *(f"  {t}" for t in o.trace)]
            + [f"{k}: {v}" for k, v in o.commands.items()]
        )
    return ET.tostring(suite, encoding="unicode")


def sarif(o: Outcome) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        tool_version = version("kvstate")
    except PackageNotFoundError:
        tool_version = "0"
    results = []
    if not o.ok:
        r: dict[str, Any] = {
            "ruleId": o.kind,
            "level": "error",
            "message": {"text": f"{o.signature}\n{o.message}"},
            "properties": {"trace": o.trace, "origin": o.origin, **o.commands},
        }
        if o.location is not None:
            r["locations"] = [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": o.location.path.replace(os.sep, "/")},
                        "region": {"startLine": o.location.line},
                    },
                    "message": {"text": o.location.what},
                }
            ]
        results.append(r)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "kvstate fuzz",
                        "version": tool_version,
                        "informationUri": "https://pypi.org/project/kvstate/",
                        "rules": [{"id": o.kind}] if not o.ok else [],
                    }
                },
                "results": results,
            }
        ],
    }


def _escape(text: str, *, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def annotation(o: Outcome) -> str:
    """The finding as a GitHub Actions ``::error`` workflow command ('' when ok)."""
    if o.ok:
        return ""
    props = [f"title={_escape('kvstate fuzz: ' + o.signature, prop=True)}"]
    if o.location is not None:
        props = [
            f"file={_escape(o.location.path, prop=True)}",
            f"line={o.location.line}",
            *props,
        ]
    body = f"{o.message}\nfound by: {o.origin}\ntrace: {'; '.join(o.trace)}"
    if "replay" in o.commands:
        body += f"\nreplay: {o.commands['replay']}"
    return f"::error {','.join(props)}::{_escape(body)}"


def emit(args: Any, o: Outcome) -> None:
    """Write the reports ``args`` asks for (``--json``, ``--junit``, ``--sarif``, ``--itf``,
    ``--github-annotations``)."""

    def write(path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")

    if getattr(args, "json", None):
        write(args.json, json.dumps(o.to_dict(), indent=2))
    if getattr(args, "junit", None):
        write(args.junit, junit(o))
    if getattr(args, "sarif", None):
        write(args.sarif, json.dumps(sarif(o), indent=2))
    if getattr(args, "itf", None) and not o.ok and o.states is not None:
        write(args.itf, json.dumps(o.states(), indent=1))
    if getattr(args, "github_annotations", False) and not o.ok:
        print(annotation(o), flush=True)


def api_outcome(args: Any, table: Table, n: int, res: Any, commands: Mapping[str, str]) -> Outcome:
    """The reports' view of a ``--target kvstate-api`` run (``res``: its ``RunResult``)."""
    o = Outcome(
        target="kvstate-api",
        table=table.name,
        geometry=table.geometry.name,
        pool=n,
        profile=args.profile,
        seed=res.seed,
        ok=res.finding is None,
        seconds=res.seconds,
        steps=res.steps,
        examples=res.stats["(examples)"],
    )
    f = res.finding
    if f is None:
        return o
    ops = list(res.minimized or f.trace)
    o.kind, o.detail, o.message, o.origin = f.kind, tuple(f.detail), str(f), res.origin
    o.trace, o.commands = [op.render() for op in ops], dict(commands)
    o.location = spec_location(table, f.kind, f.detail)
    o.states = lambda: itf(
        api_states(table, n, ops), description=f"{o.signature} (kvstate-api)", meta=o.to_dict()
    )
    return o
