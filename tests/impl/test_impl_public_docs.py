"""The public surface documents itself, in the compiled and in the pure build alike.

``help()`` and ``inspect.signature`` must show each public class's and method's real parameters
(the names of its source, the declared types rather than ``Any``, defaults that read as what they
mean rather than ``<object object at 0x...>``) and a docstring.  The compiled build lost all of it
(mypyc keeps no docstring, and no class signature when a default is not a literal): see
``kvstate/buildtools/mypyc_docs.py`` and ``impl/signatures.py``.  The surface is read off
``kvstate.impl.__all__`` and each class's source, never listed here, so a method added to the
public classes is checked as soon as it exists.  CI runs this file in both builds.
"""

from __future__ import annotations

import ast
import inspect
import pydoc
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvstate.impl as impl
from kvstate.impl import HeterogeneousKVCache

PUBLIC = [getattr(impl, name) for name in impl.__all__]
CLASSES = [c for c in PUBLIC if isinstance(c, type)]


def _source(cls: type) -> ast.ClassDef:
    # the package's folder: a compiled module's ``__file__`` names mypyc's staging tree
    path = Path(impl.__file__ or "").with_name(cls.__module__.rpartition(".")[2] + ".py")
    tree = ast.parse(path.read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__)


def _own(cls: type) -> Iterator[type]:
    """``cls`` and its bases defined in ``kvstate.impl`` (not ``Exception``'s or ``Enum``'s)."""
    return (c for c in cls.__mro__ if c.__module__.startswith("kvstate.impl."))


def _defs(cls: type) -> Iterator[tuple[type, ast.FunctionDef]]:
    for c in _own(cls):
        for node in _source(c).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                yield c, node


def _is_property(node: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) == "property" for d in node.decorator_list)


def _routines() -> Iterator[tuple[str, object, ast.FunctionDef | None]]:
    """Every public method of every public class, as Python finds it on the class (a
    function, or a compiled method descriptor), with its source."""
    seen = set()
    for cls in CLASSES:
        defs = {n.name: n for _, n in _defs(cls)}
        for c in _own(cls):
            for name, raw in vars(c).items():
                if name.startswith("_") or (cls, name) in seen:
                    continue
                seen.add((cls, name))
                if isinstance(raw, staticmethod | classmethod) or inspect.isroutine(raw):
                    yield f"{cls.__name__}.{name}", getattr(cls, name), defs.get(name)


ROUTINES = list(_routines())


def _params(node: ast.FunctionDef) -> list[str]:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return names


def _check(where: str, sig: inspect.Signature, declared: list[str] | None) -> None:
    if declared is not None:
        names = [n for n in sig.parameters if n not in ("self", "cls")]
        want = [n for n in declared if n not in ("self", "cls")]
        assert sorted(names) == sorted(want), f"{where}{sig}: the source declares {declared}"
    for p in sig.parameters.values():
        if p.name.startswith("_"):
            continue  # a private parameter (the dataclasses' internal state)
        assert "object at 0x" not in repr(p.default), f"{where}{sig}: default of {p.name}"
        ann = inspect.formatannotation(p.annotation)
        assert "Any" not in ann, f"{where}{sig}: {p.name} is annotated {ann}"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_public_class_has_a_docstring_and_a_signature(cls: type) -> None:
    assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no docstring"
    init = next((n for _, n in _init_defs(cls)), None)
    try:
        sig = inspect.signature(cls)
    except ValueError:
        # an exception class taking Exception's own arguments: CPython has no signature for it
        assert issubclass(cls, BaseException) and init is None, f"{cls.__name__}: no signature"
        return
    _check(cls.__name__, sig, _params(init) if init is not None else None)


def _init_defs(cls: type) -> Iterator[tuple[type, ast.FunctionDef]]:
    for c in _own(cls):
        for node in _source(c).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                yield c, node
                return


@pytest.mark.parametrize("name,fn,node", ROUTINES, ids=[r[0] for r in ROUTINES])
def test_every_public_method_has_a_docstring_and_its_real_signature(
    name: str, fn: object, node: ast.FunctionDef | None
) -> None:
    assert (getattr(fn, "__doc__", None) or "").strip(), f"{name} has no docstring"
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    _check(name, sig, _params(node) if node is not None else None)
    if inspect.isfunction(fn) and node is not None:
        # interpreted (the pure build): the declared types are there, not just the names
        missing = [
            p.name
            for p in sig.parameters.values()
            if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty
        ]
        assert not missing, f"{name}{sig}: no type for {missing}"


@pytest.mark.parametrize(
    "cls,prop",
    [(c, n.name) for c in CLASSES for _, n in _defs(c) if _is_property(n)],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_every_public_property_has_a_docstring(cls: type, prop: str) -> None:
    raw = inspect.getattr_static(cls, prop)
    assert (raw.__doc__ or "").strip(), f"{cls.__name__}.{prop} has no docstring"


def test_the_cache_reads_as_declared_in_help() -> None:
    """The headline: the constructor's declared types and readable defaults, and the methods'
    docstrings, in what ``help(HeterogeneousKVCache)`` prints."""
    sig = inspect.signature(HeterogeneousKVCache)
    assert list(sig.parameters)[:3] == ["geometry", "table", "cache_dir"]
    assert inspect.formatannotation(sig.parameters["max_requests"].annotation) == "int | None"
    assert repr(sig.parameters["writer"].default) == "<a new HandedRows>"
    text = pydoc.render_doc(HeterogeneousKVCache, renderer=pydoc.plaintext)
    assert "HeterogeneousKVCache(geometry: " in text
    assert "*args, **kwargs" not in text.split("Methods defined here")[0]
    assert "Longest valid hit" in text  # admit's docstring
    assert "request(self, /, tokens, *, namespace=''" in text or "request(self, tokens:" in text


def test_a_subclass_gets_its_own_signature() -> None:
    """The signature given to a public class is its own: a subclass with another
    ``__init__`` (a user's error type, say) is not described by its base's."""

    class Mine(impl.Refused):
        def __init__(self, why: str) -> None:
            super().__init__("mine", (), why)

    assert list(inspect.signature(Mine).parameters) == ["why"]
