"""Lockstep conformance of the implementation (through its adapter) with the reference model.

The model (``kvstate.model.concrete.Machine``) and ``kvstate.testing.adapter`` run the same action
sequences; after every step the observed state must equal the model's (addresses compared
relationally), and an action must be refused by the implementation exactly when the model's
guard is false.  Walks are built from *macros* (store a block, offload and load it back, take a
hit ...) so that they reach deep states in few steps; scripted traces plant each seeded bug and
show that the lockstep check catches it.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

import pytest

from kvstate.model.concrete import Machine
from kvstate.spec import default_table
from kvstate.spec.errors import ActionRefused
from kvstate.spec.table import ParamKind
from kvstate.testing.adapter import make_target
from kvstate.testing.seeded import BUGS, witness

OUTPUT_KINDS = (ParamKind.ADDR, ParamKind.FMT)
TABLE = default_table()
N = 3
L = TABLE.consts.L


class Divergence(AssertionError):
    pass


def canon(values: dict[str, Any]) -> dict[str, Any]:
    """Addresses compared relationally: renumber them in order of first appearance."""
    seen: dict[int, int] = {}

    def c(x: int) -> int:
        return seen.setdefault(x, len(seen))

    out = dict(values)
    out["addr"] = tuple(c(x) for x in values["addr"])
    out["gaddr"] = tuple(c(x) for x in values["gaddr"])
    out["paddr"] = tuple(tuple(c(x) for x in row) for row in values["paddr"])
    return out


class Lockstep:
    def __init__(self, bugs: tuple[str, ...] = ()) -> None:
        self.m = Machine(TABLE, N)
        self.s = self.m.init()
        self.t = make_target(TABLE, N, bugs=bugs)
        self.trace: list[tuple[str, dict[str, int]]] = []
        self.check_state("init")

    def close(self) -> None:
        self.t.close()

    def check_state(self, where: str) -> None:
        model = {k: v for k, v in self.s.values.items() if not TABLE.var(k).ghost}  # impl: none
        got, want = canon(self.t.observe()), canon(model)
        if got != want:
            diff = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
            raise Divergence(
                f"state differs after {where}: impl vs model {diff}; trace {self.trace}"
            )

    def do(self, name: str, **params: int) -> bool:
        """One action in both; returns whether it happened."""
        a = TABLE.action(name)
        mp = dict(params)
        outs = [q.name for q in a.params if q.kind in OUTPUT_KINDS]
        mp.update({q: 0 for q in outs})  # chosen by the implementation; guards do not read them
        enabled = self.m.is_enabled(self.s, a, mp)
        self.trace.append((name, params))
        try:
            res = getattr(self.t, name)(**params)
            ok = True
        except ActionRefused as exc:
            ok, res = False, exc
        except Exception as exc:
            raise Divergence(
                f"{name}{params} raised {type(exc).__name__}: {exc}; trace {self.trace}"
            ) from exc
        if ok != enabled:
            raise Divergence(
                f"{name}{params}: model {'allows' if enabled else 'refuses'} it, impl "
                f"{'did it' if ok else f'refused: {res}'}; trace {self.trace}"
            )
        if ok:
            if outs:
                assert isinstance(res, dict) and set(res) == set(outs), res
                mp.update(res)
            self.s = self.m.step(self.s, a, mp)
        self.check_state(f"{name}{params}")
        return ok


# ---- macro-guided random walks -----------------------------------------------------------------
def _rand_params(rng: random.Random, name: str) -> dict[str, int]:
    out = {}
    for p in TABLE.action(name).params:
        if p.kind is ParamKind.BLOCK:
            out[p.name] = rng.randrange(N)
        elif p.kind is ParamKind.REQ:
            out[p.name] = rng.randrange(TABLE.consts.R)
        elif p.kind is ParamKind.TOKENS:
            out[p.name] = L * rng.randint(0, N) if rng.random() < 0.85 else rng.randint(0, N * L)
        elif p.kind is ParamKind.TICKS:
            out[p.name] = rng.randint(1, TABLE.consts.lease_max)
    return out


def _macro(rng: random.Random, ls: Lockstep) -> None:
    b, r = rng.randrange(N), rng.randrange(TABLE.consts.R)
    t = rng.randint(1, TABLE.consts.lease_max)
    kind = rng.choice(
        [
            "build",
            "build",
            "offload",
            "spill",
            "load",
            "finish_load",
            "rebuild",
            "evict",
            "slide",
            "drop",
            "hit",
            "hit",
            "hit",
            "recover",
            "end",
            "graph",
            "tick",
            "random",
            "random",
        ]
    )
    do = ls.do
    if kind == "build":
        do("allocate", b=b)
        do("discard", b=b) if rng.random() < 0.1 else do("commit", b=b)
        do("seal", b=b)
        do("index_update", b=b) if rng.random() < 0.8 else None
        do("touch", b=b, t=t)
    elif kind == "offload":
        do("offload", b=b)
        do("tick", t=rng.randint(1, 2)) if rng.random() < 0.5 else None
        do("offload_done", b=b) if rng.random() < 0.75 else do("offload_cancel", b=b)
    elif kind == "spill":
        do("spill", b=b)
    elif kind == "load":
        do("load_start", b=b)
        for _ in range(rng.randint(0, TABLE.consts.load_steps + 1)):
            do("load_progress", b=b)
        if rng.random() < 0.4:
            return  # still in flight: later macros interleave with it (aborts, slides, ...)
        do("load_done", b=b) if rng.random() < 0.8 else do("load_fail", b=b)
    elif kind == "rebuild":
        do("rebuild_start", b=b)
        do("rebuild_done", b=b) if rng.random() < 0.8 else None
    elif kind == "finish_load":
        while do("load_progress", b=b):
            pass
        do("load_done", b=b) if rng.random() < 0.8 else do("load_fail", b=b)
    elif kind == "evict":
        do("evict_start", b=b)
        do("evict_done", b=b)
    elif kind == "slide":
        do("slide", b=b)
    elif kind == "drop":
        do("drop", b=b)
    elif kind == "hit":
        h = L * rng.randint(1, N)
        for bb in range(h // L):
            do("touch", b=bb, t=t)
        do("admit", r=r, t=rng.randint(1, t))
        do("match", r=r, h=h)
        do("pin", r=r)
        if rng.random() < 0.3:
            return  # leave it pinned: later macros interleave with it (loads, evictions, aborts)
        do("validate", r=r) if rng.random() < 0.8 else do("downgrade", r=r)
        do("use", r=r) if rng.random() < 0.7 else None
    elif kind == "recover":  # the library's recovery flow: pin the hit, then load what is offloaded
        h = L * rng.randint(1, N)
        do("admit", r=r, t=t)
        do("match", r=r, h=h)
        do("pin", r=r)
        for bb in range(h // L):
            do("load_start", b=bb)
            if rng.random() < 0.5:
                do("load_progress", b=bb)
        if rng.random() < 0.5:
            do("abort", r=r)
    elif kind == "end":
        do(rng.choice(["release", "release", "abort", "downgrade"]), r=r)
    elif kind == "graph":
        do(rng.choice(["capture", "replay", "recapture"]))
    elif kind == "tick":
        do("tick", t=rng.randint(1, 3))
    else:
        name = rng.choice([a.name for a in TABLE.actions])
        do(name, **_rand_params(rng, name))


def walk(seed: int, macros: int, bugs: tuple[str, ...] = ()) -> Lockstep:
    rng = random.Random(seed)
    ls = Lockstep(bugs)
    try:
        for _ in range(macros):
            _macro(rng, ls)
    finally:
        ls.close()
    return ls


def test_impl_never_imports_model_or_proofs() -> None:
    root = Path(__file__).resolve().parents[2] / "impl"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert not n.startswith(("kvstate.model", "kvstate.proofs", "model", "proofs")), (
                    path.name,
                    n,
                )


def test_initial_state_matches() -> None:
    ls = Lockstep()
    ls.close()


def test_adapter_covers_every_action() -> None:
    t = make_target(TABLE, N)
    try:
        for a in TABLE.actions:
            assert callable(getattr(t, a.name, None)), a.name
    finally:
        t.close()


@pytest.mark.parametrize("seed", range(12))
def test_random_walks_conform(seed: int) -> None:
    ls = walk(seed, 60)
    assert len(ls.trace) > 100


def test_walks_reach_deep_states() -> None:
    """The walks exercise the interesting transitions (so the conformance above means something)."""
    seen: set[str] = set()
    for seed in range(12):
        ls = Lockstep()
        rng = random.Random(seed)
        try:
            for _ in range(60):
                before = len(ls.trace)
                _macro(rng, ls)
                for name, _p in ls.trace[before:]:
                    seen.add(name)
        finally:
            ls.close()
    for name in (
        "validate",
        "use",
        "release",
        "load_done",
        "load_fail",
        "spill",
        "offload_done",
        "rebuild_done",
        "evict_done",
        "recapture",
        "drop",
    ):
        assert name in seen


# ---- seeded bugs: each is caught -------------------------------------------------------------
def replay(ls: Lockstep, steps: list[tuple[str, dict[str, int]]]) -> None:
    for name, params in steps:
        ls.do(name, **params)


def run_witness(ls: Lockstep, bug: str) -> None:
    replay(ls, witness(bug, L))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_scripted_trace_conforms_without_bug(bug: str) -> None:
    ls = Lockstep()
    try:
        run_witness(ls, bug)
    finally:
        ls.close()


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_seeded_bug_is_caught_by_lockstep(bug: str) -> None:
    ls = Lockstep((bug,))
    try:
        with pytest.raises(Divergence):
            run_witness(ls, bug)
    finally:
        ls.close()


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_seeded_bug_is_found_by_random_walks(bug: str) -> None:
    """The macro walker (a small stand-in for the fuzzer) finds every bug within a few seeds."""
    for seed in range(40):
        try:
            walk(seed, 60, (bug,))
        except Divergence:
            return
    pytest.fail(f"{bug} survived 40 random walks")
