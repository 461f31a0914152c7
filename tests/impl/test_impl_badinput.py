"""Bad input, generated from the public signatures: every parameter of every public entry point
gets every bad value, and must raise a documented ``KVStateError`` with the state unchanged.

The surface is read with ``inspect``, not listed by hand: the constructor and every public
method of :class:`HeterogeneousKVCache`, every public method of :class:`Run` and
:class:`Admission`, and every :class:`CacheCore` method named after one of the table's actions
(its required parameters: the optional ones are the library's own plumbing, a view or a proof).
One parameter at a time gets a bad value; the others get a valid one (by parameter name) or
their default.  A call that succeeds is *accepted*; it is allowed only where the value is valid
for that parameter: the parameter's own default (None where None is the default, a bool where a
bool is), or a value listed in ``VALID`` (a count of "up to n", a str where a name is asked).
The CI runs this file twice, on the compiled build and on the pure-Python sources, so both builds
give the same documented errors.  The counts are printed (``pytest -s``).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from kvstate import impl
from kvstate.impl import HeterogeneousKVCache, KVStateError
from kvstate.impl.events import EventKind
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import default_table, small

G = small()
L = G.lcm_tokens
TABLE = default_table(G)  # one table: its compiled guards are memoized per table
ACTIONS = frozenset(a.name for a in TABLE.actions)

# (parameter, bad-value kind) pairs that are valid values, not bad ones
VALID = {
    ("n", "huge"),  # evict/offload/spill/drop up to n blocks
    ("tokens", "list"),  # a one-token prompt / one decoded token
    ("namespace", "str"),
    ("cache_dir", "str"),  # a directory name
    ("cache_dir", "surrogate"),  # a file name need not be text
    ("timeout", "float"),
    ("derive_index", "true"),
    ("derive_index", "false"),
    ("writer", "none"),  # the engine writes the pages itself
    ("timeout", "none"),  # wait as long as it takes
}


def bad_values(foreign: Any) -> dict[str, Any]:
    return {
        "none": None,
        "true": True,
        "false": False,
        "negative": -1,
        "huge": 2**64,
        "nan": math.nan,
        "float": 1.5,
        "str": "x",
        "surrogate": "\udc80",
        "bytes": b"x",
        "list": [1],
        "array2d": np.zeros((2, 2), dtype=np.int64),
        "object": object(),
        "foreign": foreign,
        "meta": torch.zeros(4, dtype=torch.int64, device="meta"),
    }


def snapshot(c: HeterogeneousKVCache) -> Any:
    core = c.core
    m = core.meta
    cols = ("ckv", "gen", "ref", "ver", "idx", "iver", "tail", "swa", "lease", "addr", "slot")
    return (
        core.stats(),
        {f: list(getattr(m, f)) for f in cols},
        [
            (s.phase, s.hit, s.pinned, s.deadline, s.rids[:], s.request is not None)
            for s in core.slots
        ],
        len(core.index),
    )


class World:
    """A cache with a stored prefix, an idle request, a request in use (its Run) and a record."""

    def __init__(self) -> None:
        self.c = c = HeterogeneousKVCache(table=TABLE, executors="manual")
        self.toks = toks = harness_tokens(2 * L + 1)
        with c.use(c.admit(c.request(toks))):
            pass
        self.idle = c.request(toks)
        self.busy = c.request(toks)
        self.adm = c.admit(self.busy)
        self.ctx = c.use(self.adm)
        self.run = self.ctx.__enter__()
        self.rid = c.register(c.chain(harness_tokens(L, seed=3)))[0]

    def valid(self, owner: str, method: str, name: str) -> Any:
        c = self.c
        if name == "request":
            return self.idle if method in ("admit", "max_hit") else self.busy
        return {
            "admission": self.adm,
            "tokens": self.toks,
            "namespace": "",
            "lifetime": 4,
            "ticks": 1,
            "n": 1,
            "kind": EventKind.STORED,
            "request_id": self.idle.id,
            "chain": c.chain(self.toks),
            "group": "csa",
            "layer": 0,
            "h": L,
            "rid": self.rid,
            "slot": self.busy.slot.index if self.busy.slot else 0,
            "action": "allocate",
            "boundary": L,
            "timeout": 0.0,
        }[name]

    def close(self) -> None:
        self.c.close()


def source_module(name: str) -> ModuleType:
    """The pure-Python source of an impl module, loaded beside the imported one: a compiled
    (mypyc) class has no signatures to inspect, and both builds must test the same surface."""
    path = Path(impl.__file__).parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"kvstate.impl._signatures_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


def surface() -> list[tuple[str, str, inspect.Signature]]:
    cache_src, core_src = source_module("cache"), source_module("core")
    out = [("HeterogeneousKVCache", "__init__", inspect.signature(cache_src.HeterogeneousKVCache))]
    for owner, cls in (
        ("cache", "HeterogeneousKVCache"),
        ("run", "Run"),
        ("admission", "Admission"),
    ):
        for name, fn in inspect.getmembers(getattr(cache_src, cls), inspect.isroutine):
            if name.startswith("_") or name == "close":
                continue
            out.append((owner, name, inspect.signature(fn)))
    for name, fn in inspect.getmembers(core_src.CacheCore, inspect.isroutine):
        if name in ACTIONS or name == "can":
            out.append(("core", name, inspect.signature(fn)))
    return out


def params(owner: str, sig: inspect.Signature) -> list[inspect.Parameter]:
    ps = [p for p in sig.parameters.values() if p.name != "self"]
    if owner == "core":
        ps = [p for p in ps if p.default is inspect.Parameter.empty]
    return ps


def allowed(p: inspect.Parameter, kind: str, value: Any) -> bool:
    d = p.default
    if d is None and value is None:
        return True
    if isinstance(d, bool) and isinstance(value, bool):
        return True
    return (p.name, kind) in VALID


def call(
    w: World, owner: str, method: str, ps: list[inspect.Parameter], bad: inspect.Parameter, v: Any
) -> Any:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for p in ps:
        if p is bad:
            val = v
        elif p.default is not inspect.Parameter.empty:
            continue
        else:
            val = w.valid(owner, method, p.name)
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[p.name] = val
        else:
            args.append(val)
    if owner == "HeterogeneousKVCache":
        kwargs.setdefault("executors", "manual")
        if bad.name != "table":
            kwargs.setdefault("table", TABLE)
        made = HeterogeneousKVCache(*args, **kwargs)
        made.close()
        return made
    target = {"cache": w.c, "run": w.run, "admission": w.adm, "core": w.c.core}[owner]
    return getattr(target, method)(*args, **kwargs)


def test_every_public_parameter_refuses_bad_values(
    tmp_path: Any, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)  # a cache_dir name that is accepted lands here
    other = HeterogeneousKVCache(table=TABLE, executors="manual")
    foreign = other.request(harness_tokens(L + 1))
    counts: Counter[str] = Counter()
    accepted: list[str] = []
    problems: list[str] = []
    methods = surface()
    try:
        w = World()  # rebuilt after every accepted call (which may change what it holds)
        for owner, method, sig in methods:
            for p in params(owner, sig):
                for kind, v in bad_values(foreign).items():
                    what = f"{owner}.{method}({p.name}={kind})"
                    before = snapshot(w.c)
                    counts["calls"] += 1
                    try:
                        call(w, owner, method, params(owner, sig), p, v)
                    except KVStateError:
                        counts["documented"] += 1
                        if snapshot(w.c) != before:
                            problems.append(f"{what}: refused but changed the state")
                        continue
                    except Exception as exc:  # noqa: BLE001 - what this test looks for
                        problems.append(f"{what}: {type(exc).__name__}: {exc}")
                        continue
                    counts["accepted"] += 1
                    accepted.append(what)
                    if not allowed(p, kind, v):
                        problems.append(f"{what}: accepted")
                    if owner != "HeterogeneousKVCache":
                        w.close()
                        w = World()
    finally:
        w.close()
        other.close()
    with capsys.disabled():
        print(
            f"\nbad input: {len(methods)} entry points, {counts['calls']} calls, "
            f"{counts['documented']} documented errors, {counts['accepted']} accepted "
            f"(valid values), {len(problems)} problems"
        )
    assert not problems, "\n".join(problems)
    assert counts["calls"] > 500 and counts["documented"] > 0.9 * counts["calls"]


def test_every_public_entry_point_after_close_raises_cache_closed() -> None:
    """The error contract: any call after ``close()`` raises :class:`CacheClosed` (the
    constructor and ``close`` itself aside), the queries too, and changes nothing."""
    from kvstate.impl.errors import CacheClosed

    problems: list[str] = []
    methods = [m for m in surface() if m[0] != "HeterogeneousKVCache"]
    for owner, method, sig in methods:
        w = World()
        try:
            ps = params(owner, sig)
            args: list[Any] = []
            kwargs: dict[str, Any] = {}
            for p in ps:
                if p.default is not inspect.Parameter.empty:
                    continue
                val = w.valid(owner, method, p.name)
                if p.kind is inspect.Parameter.KEYWORD_ONLY:
                    kwargs[p.name] = val
                else:
                    args.append(val)
            w.c.close()
            before = snapshot(w.c)
            target = {"cache": w.c, "run": w.run, "admission": w.adm, "core": w.c.core}[owner]
            try:
                got = getattr(target, method)(*args, **kwargs)
            except CacheClosed:
                pass
            except Exception as exc:  # noqa: BLE001 - what this test looks for
                problems.append(f"{owner}.{method}: {type(exc).__name__}: {exc}")
            else:
                problems.append(f"{owner}.{method}: returned {type(got).__name__}")
            if snapshot(w.c) != before:
                problems.append(f"{owner}.{method}: changed the state of a closed cache")
        finally:
            w.close()
    assert len(methods) > 50
    assert not problems, "\n".join(problems)


def test_append_past_max_model_len_is_refused_and_changes_nothing() -> None:
    """A request never grows past ``max_model_len``: an append that would is an
    ``InvalidArgument`` (the tokens fit alone, not after the request's own), by either entry
    point, and changes nothing."""
    from kvstate.impl import InvalidArgument

    w = World()
    try:
        c, req = w.c, w.busy
        room = c.max_model_len - len(req.tokens)
        for append in (lambda t: c.append(req, t), w.run.append):
            before = (snapshot(c), len(req.tokens))
            try:
                append(harness_tokens(room + 1, seed=5))
            except InvalidArgument:
                pass
            else:
                raise AssertionError("an append past max_model_len was accepted")
            assert (snapshot(c), len(req.tokens)) == before
    finally:
        w.close()
