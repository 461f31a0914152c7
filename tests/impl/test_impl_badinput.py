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

import errno
import importlib.util
import inspect
import math
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from fs_faults import creating, faulty_fs

from kvstate import impl
from kvstate.impl import HeterogeneousKVCache, InvalidArgument, KVStateError
from kvstate.impl.events import EventKind
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
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


_VIEWS: dict[int, Any] = {}  # each cache's view, taken while it is open (it reads on after close)


def snapshot(c: HeterogeneousKVCache) -> Any:
    core = _VIEWS.get(id(c))
    if core is None or core.table is not c.table:
        core = _VIEWS[id(c)] = c.inspect()
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
        self.c = c = HeterogeneousKVCache(
            table=TABLE, executors="manual", writer=DeterministicWriter()
        )
        snapshot(c)  # its view, for the snapshots after close
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
    # each action as the part that performs it takes it (impl/actions.py), driven by name
    from kvstate.impl.actions import ACTIONS as PERFORMERS

    classes = {
        "store": ("blocks", "BlockStore"),
        "recovery": ("recovery", "Recovery"),
        "requests": ("requests", "RequestTable"),
        "gate": ("gate", "GuardGate"),
    }
    for name, (part, meth) in PERFORMERS.items():
        if name in ACTIONS:
            mod, cls = classes[part]
            fn = getattr(getattr(source_module(mod), cls), meth)
            out.append(("core", name, inspect.signature(fn)))
    for name in ("can", "check_tail"):
        out.append(("core", name, inspect.signature(getattr(core_src.CacheCore, name))))
    return out


class Actions:
    """The table's actions by name on a cache (``TestHooks.act``), and ``can`` / ``check_tail``."""

    def __init__(self, c: HeterogeneousKVCache) -> None:
        self.c = c  # the view and the hooks asked for at each call (a closed cache refuses)

    def __getattr__(self, name: str) -> Any:
        if name == "can":
            return lambda *a: self.c.inspect().can(*a)
        if name == "check_tail":
            return lambda *a: self.c.test_hooks().check_tail(*a)
        return lambda *a: self.c.test_hooks().act(name, *a)


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
    target = {"cache": w.c, "run": w.run, "admission": w.adm, "core": Actions(w.c)}[owner]
    return getattr(target, method)(*args, **kwargs)


def test_every_public_parameter_refuses_bad_values(
    tmp_path: Any, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)  # a cache_dir name that is accepted lands here
    other = HeterogeneousKVCache(table=TABLE, executors="manual", writer=DeterministicWriter())
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
            target = {"cache": w.c, "run": w.run, "admission": w.adm, "core": Actions(w.c)}[owner]
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


# ---- the constructor on a failing file system ----------------------------------------------
# every call the disk tier makes at open, each failing with each errno a file system gives
FS_CALLS = ("mkdir", "open", "create", "write", "fdopen", "fsync", "link", "unlink", "listdir",
            "fstat", "pread", "preadv")  # fmt: skip
FS_ERRNOS = {"ENOSPC": errno.ENOSPC, "EROFS": errno.EROFS, "EACCES": errno.EACCES,
             "EPERM": errno.EPERM, "EIO": errno.EIO}  # fmt: skip


def _directory(tmp: Any, state: str) -> Any:
    """A cache directory as an opener finds it: absent, holding a key only, or holding
    entries, a stale temporary and a key temporary (what a crash leaves)."""
    d = tmp / state
    if state == "fresh":
        return d
    c = HeterogeneousKVCache(
        table=TABLE, cache_dir=d, executors="manual", writer=DeterministicWriter()
    )
    if state == "used":
        with c.use(c.admit(c.request(harness_tokens(2 * L + 1)))):
            pass
        c.tick(10)
        c.offload(100)
        c.pipelines.drain()
        c.spill(100)
        (d / f".{'ab' * 24}.kvb.x1.tmp").write_bytes(b"KVSTA")
        (d / ".kvstate-key.x2.new").write_bytes(b"k" * 8)
    c.close()
    return d


def test_the_constructor_on_a_failing_file_system_raises_only_documented_errors(
    tmp_path: Any, monkeypatch: Any, capsys: Any
) -> None:
    """Generated like the bad values above: each file-system call the disk tier makes when a
    cache opens (``create``: an ``open`` that creates) fails with each errno (a full disk, a
    read-only mount, a refused permission, an I/O error), on a fresh directory, one holding
    its key, and one holding entries and a crash's leftovers, with and without ``disk_key``.
    The constructor either opens (a documented fallback: a file it cannot remove is left) or
    raises a documented error (StorageError, InvalidArgument); never a raw OSError.  After
    either, the directory is not left locked."""
    counts: Counter[str] = Counter()
    problems: list[str] = []
    for state in ("fresh", "keyed", "used"):
        for call in FS_CALLS:
            for code_name, code in FS_ERRNOS.items():
                for disk_key in (None, b"k" * 32):
                    d = _directory(tmp_path / f"{call}-{code_name}-{disk_key is None}", state)
                    what = f"{state} directory, {call} fails {code_name}, disk_key={disk_key!r}"
                    counts["calls"] += 1
                    with faulty_fs(monkeypatch, d.parent) as fs:
                        if call == "create":
                            fs.fail("open", code, when=creating)
                        else:
                            fs.fail(call, code)
                        try:
                            made = HeterogeneousKVCache(
                                table=TABLE,
                                cache_dir=d,
                                executors="manual",
                                disk_key=disk_key,
                                writer=DeterministicWriter(),
                            )
                        except KVStateError:
                            counts["documented"] += 1
                            made = None
                        except Exception as exc:  # noqa: BLE001 - what this test looks for
                            problems.append(f"{what}: {type(exc).__name__}: {exc}")
                            continue
                    if made is not None:
                        counts["opened"] += 1
                        made.close()
                    try:
                        HeterogeneousKVCache(
                            table=TABLE,
                            cache_dir=d,
                            executors="manual",
                            disk_key=disk_key,
                            writer=DeterministicWriter(),
                        ).close()
                    except KVStateError as exc:
                        problems.append(f"{what}: the directory does not open again: {exc}")
    for bad in ("a\x00b", tmp_path / "a\x00b"):
        counts["calls"] += 1
        try:
            HeterogeneousKVCache(
                table=TABLE, cache_dir=bad, executors="manual", writer=DeterministicWriter()
            ).close()
            problems.append(f"cache_dir={bad!r}: accepted")
        except InvalidArgument:
            counts["documented"] += 1
        except Exception as exc:  # noqa: BLE001
            problems.append(f"cache_dir={bad!r}: {type(exc).__name__}: {exc}")
    with capsys.disabled():
        print(
            f"\nstorage failures at open: {counts['calls']} constructions, "
            f"{counts['documented']} documented errors, {counts['opened']} opened (fallbacks), "
            f"{len(problems)} undocumented exceptions"
        )
    assert not problems, "\n".join(problems)
    assert counts["documented"] > 100 and counts["opened"] > 100


# ---- item 4: check_tail, and NumPy integers as int arguments --------------------------------
def test_check_tail_refuses_bad_arguments_and_marks_nothing() -> None:
    """``core.check_tail`` with a wrong type, a bool, a negative, a boundary that is not the
    record's end, or no such record: InvalidArgument, the record not marked corrupt, so the
    prefix still hits whole after an offload (it used to drop from 2 blocks to 1)."""
    w = World()
    try:
        c, core, hooks = w.c, w.c.inspect(), w.c.test_hooks()
        rids = core.resolve(c.chain(w.toks))
        last = rids[-1]
        for boundary in (-1, True, False, 0, L - 1, L, L + 1, 3 * L, 2**64, 1.5, "x", None,
                         np.int64(-1), np.bool_(True)):  # fmt: skip
            with pytest.raises(InvalidArgument):
                hooks.check_tail(last, boundary)
        for rid in (-1, True, 0, 10**9, 1.5, "x", None, np.int64(-1)):
            with pytest.raises(InvalidArgument):
                hooks.check_tail(rid, 2 * L)
        assert not any(core.meta.corrupt[r] for r in rids)
        assert hooks.check_tail(np.int64(last), np.int64(2 * L)) is True
        c.finish(w.busy)
        c.tick(100)
        c.offload(100)
        c.pipelines.drain()
        a = c.admit(c.request(w.toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 2 * L
    finally:
        w.close()


def _outcome(w: World, owner: str, method: str, sig: inspect.Signature, p: Any, v: Any) -> str:
    try:
        got = call(w, owner, method, params(owner, sig), p, v)
    except KVStateError as exc:
        return type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - an undocumented error: reported by the caller
        return f"undocumented {type(exc).__name__}"
    return f"returned {type(got).__name__}"


def test_numpy_integers_are_ints_at_every_entry_point() -> None:
    """One rule for every public entry point (``kvstate.impl.args.integer``): a NumPy integer
    scalar (``np.int64(0)``) is an int, a bool (``np.bool_`` too) is not.  Each parameter whose
    valid value is an int gets the same value as ``np.int64``, ``np.int32`` and ``np.uint16``:
    every entry point answers exactly as it does for the int."""
    checked: list[str] = []
    problems: list[str] = []
    for owner, method, sig in surface():
        if owner == "HeterogeneousKVCache":
            continue
        for p in params(owner, sig):
            w = World()
            try:
                v = w.valid(owner, method, p.name)
            except KeyError:  # (a flag, a timeout: no int to give)
                continue
            finally:
                w.close()
            if type(v) is not int:
                continue
            outcomes = {}
            for kind, value in (("int", v), ("int64", np.int64(v)), ("int32", np.int32(v)),
                                ("uint16", np.uint16(v))):  # fmt: skip
                w = World()
                try:
                    outcomes[kind] = _outcome(w, owner, method, sig, p, value)
                finally:
                    w.close()
            checked.append(f"{owner}.{method}({p.name})")
            if len(set(outcomes.values())) != 1:
                problems.append(f"{owner}.{method}({p.name}): {outcomes}")
    assert len(checked) > 30, checked
    assert not problems, "\n".join(problems)
