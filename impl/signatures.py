"""The public classes' signatures with their real types, for ``help()`` and ``inspect``.

The public methods take a caller's values as ``Any`` and check them in ``impl/args.py``, so the
compiled and the pure build refuse the same values with the same ``InvalidArgument`` (a compiled
``int`` parameter would raise mypyc's ``TypeError`` first).  What a parameter accepts is declared
beside it as ``Annotated[Any, T]``: ``Any`` to mypy and mypyc, ``T`` to readers.  Python's own
signature of such a method says ``Any``; a compiled class keeps no annotations at all, and mypyc
writes no text signature for a class whose ``__init__`` has a default that is not a literal, so
``inspect.signature(HeterogeneousKVCache)`` failed.

:func:`attach` reads each public class's source with :mod:`ast` and gives the class its
``__signature__`` (mypyc's classes take the attribute) and each of its methods that is a Python
function (the pure build) its own, with ``T`` for every ``Annotated[Any, T]``.  A compiled method
descriptor takes no attribute: ``help`` shows its text signature (names, kinds and defaults, which
CPython's format gives without types) and its docstring (``kvstate/buildtools/mypyc_docs.py``).  Nothing on the
request path changes: the methods called are the same objects.  Never compiled.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from collections.abc import Iterable
from pathlib import Path
from types import FunctionType
from typing import Annotated, Any, ForwardRef

_KINDS = inspect.Parameter


class _ClassSignature:
    """``cls.__signature__`` for exactly one class: a subclass (a user's, with its own
    ``__init__``) gets None, and ``inspect`` computes its signature as usual."""

    def __init__(self, owner: type, signature: inspect.Signature) -> None:
        self.owner = owner
        self.signature = signature

    def __get__(self, obj: object, owner: type | None = None) -> inspect.Signature | None:
        return self.signature if obj is None and owner is self.owner else None


@functools.cache
def _classes(module: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of a module's source (the ``.py`` beside a compiled module)."""
    # (beside this file: a compiled module's ``__file__`` names mypyc's staging tree)
    path = Path(__file__).with_name(module.rpartition(".")[2] + ".py")
    tree = ast.parse(path.read_text(), str(path))
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _value(expr: ast.expr, namespace: dict[str, Any]) -> Any:
    """An expression of the source evaluated in its module (its text when that fails)."""
    try:
        return eval(compile(ast.Expression(expr), "<signature>", "eval"), namespace)  # noqa: S307
    except Exception:  # noqa: BLE001 - a name only imported for type checking: show the text
        return ast.unparse(expr)


def _annotation(expr: ast.expr | None, namespace: dict[str, Any]) -> Any:
    """``T`` of ``Annotated[Any, T]``; any other annotation as written."""
    if expr is None:
        return inspect.Parameter.empty
    if (
        isinstance(expr, ast.Subscript)
        and isinstance(expr.slice, ast.Tuple)
        and len(expr.slice.elts) == 2
        and _value(expr.value, namespace) is Annotated  # (imported as ``Checked`` too)
    ):
        expr = expr.slice.elts[1]
    return _value(expr, namespace)


def _resolved(sig: inspect.Signature, namespace: dict[str, Any]) -> inspect.Signature:
    """A signature Python made (a named tuple's, a dataclass's) with its annotations, strings
    under ``from __future__ import annotations``, evaluated in the class's module."""

    def ann(a: Any) -> Any:
        text = a.__forward_arg__ if isinstance(a, ForwardRef) else a
        return (
            _annotation(ast.parse(text, mode="eval").body, namespace)
            if isinstance(text, str)
            else a
        )

    params = [p.replace(annotation=ann(p.annotation)) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=ann(sig.return_annotation))


def signature(fn: ast.FunctionDef, namespace: dict[str, Any]) -> inspect.Signature:
    """The signature a function's source declares, public types in place of ``Any``."""
    a = fn.args
    params: list[inspect.Parameter] = []
    positional: list[tuple[ast.arg, Any]] = [(p, _KINDS.POSITIONAL_ONLY) for p in a.posonlyargs]
    positional += [(p, _KINDS.POSITIONAL_OR_KEYWORD) for p in a.args]
    first_default = len(positional) - len(a.defaults)
    for i, (p, kind) in enumerate(positional):
        default = (
            _value(a.defaults[i - first_default], namespace) if i >= first_default else _KINDS.empty
        )
        ann = _annotation(p.annotation, namespace)
        params.append(inspect.Parameter(p.arg, kind, default=default, annotation=ann))
    if a.vararg is not None:
        ann = _annotation(a.vararg.annotation, namespace)
        params.append(inspect.Parameter(a.vararg.arg, _KINDS.VAR_POSITIONAL, annotation=ann))
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        default = _KINDS.empty if d is None else _value(d, namespace)
        ann = _annotation(p.annotation, namespace)
        params.append(
            inspect.Parameter(p.arg, _KINDS.KEYWORD_ONLY, default=default, annotation=ann)
        )
    if a.kwarg is not None:
        ann = _annotation(a.kwarg.annotation, namespace)
        params.append(inspect.Parameter(a.kwarg.arg, _KINDS.VAR_KEYWORD, annotation=ann))
    returns = _annotation(fn.returns, namespace)
    return inspect.Signature(params, return_annotation=returns)


def attach(objects: Iterable[object]) -> None:
    """Give each class of ``objects`` defined in this package its declared signatures."""
    package = __name__.rpartition(".")[0]
    for cls in objects:
        if not isinstance(cls, type) or not cls.__module__.startswith(package + "."):
            continue
        node = _classes(cls.__module__).get(cls.__name__)
        if node is None:  # pragma: no cover: attach's caller passes top-level classes only
            continue
        namespace = vars(sys.modules[cls.__module__])
        if not any(isinstance(f, ast.FunctionDef) and f.name == "__init__" for f in node.body):
            try:
                made = inspect.signature(cls)  # a named tuple's or a dataclass's fields
            except (ValueError, TypeError):  # an exception with Exception's own __init__
                made = None
            if made is not None:
                cls.__signature__ = _ClassSignature(cls, _resolved(made, namespace))  # type: ignore[attr-defined]
        for fn in node.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            if fn.name != "__init__" and fn.name.startswith("_"):
                continue
            sig = signature(fn, namespace)
            if fn.name == "__init__":
                params = list(sig.parameters.values())[1:]  # without self
                cls.__signature__ = _ClassSignature(cls, sig.replace(parameters=params))  # type: ignore[attr-defined]
            attr = cls.__dict__.get(fn.name)
            if isinstance(attr, staticmethod | classmethod):  # pragma: no cover: none public yet
                attr = attr.__func__
            if isinstance(attr, FunctionType):  # interpreted: it takes its own
                attr.__signature__ = sig  # type: ignore[attr-defined]
    _classes.cache_clear()  # the parsed sources are not needed again
