"""The signature :mod:`kvstate.impl.signatures` makes from a function's source, for every
parameter form, against the one Python makes from the same source.

:class:`~kvstate.targets.api.signatures.PublishedSignatures` holds each public method's published
signature to the callable; the public classes have no ``*args``, ``**kwargs`` or keyword-only
parameter without a default, and no annotation that does not evaluate, so those branches
of ``signature()`` (a class of a later release, a user's subclass read by ``help``) would only
be read there once a class has them.  :func:`form_differences` compiles a few sources that have
every form (positional-only, defaults, ``*args``, keyword-only with and without a default,
``**kwargs``, ``Annotated[Any, T]``, a plain type, a name that does not evaluate) and compares
``signature(ast, namespace)`` with ``inspect.signature`` of the function Python compiles from
the same text: names, kinds and defaults alike, each annotation the ``T`` of an
``Annotated[Any, T]``, any other evaluated in the namespace, or its text where it does not
evaluate (what ``help`` shows for a name only imported for type checking).
"""

from __future__ import annotations

import ast
import inspect
import typing
from typing import Annotated, Any

# every parameter form; ``Later`` is a name the namespace lacks (imported for type checking only)
SOURCES = (
    "def f(a, /, b: Annotated[Any, int], c: float = 1.5, *args: Annotated[Any, str], d,"
    " e: Later = 2, **kw: Annotated[Any, bytes]) -> Annotated[Any, bool]: ...",
    "def g(p: int = 0, /, *, q: Annotated[Any, list[int]] = (1, 2), r: Later) -> Later: ...",
    "def h(*rows: Later, **named: Any): ...",
    "def k(x, y=None, *, z=-1): ...",
)


def _expected(text: Any, namespace: dict[str, Any]) -> Any:
    """An annotation Python keeps as text (``from __future__ import annotations``), read as
    ``help`` should show it: ``T`` of ``Annotated[Any, T]``, else its value, else the text."""
    if not isinstance(text, str):
        return text  # (inspect.Parameter.empty)
    try:
        value = eval(text, dict(namespace))  # noqa: S307 - this module's own sources
    except NameError:
        return text
    if typing.get_origin(value) is Annotated and typing.get_args(value)[0] is Any:
        return typing.get_args(value)[1]
    return value


def _shape(sig: inspect.Signature) -> list[tuple[Any, ...]]:
    return [(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()] + [
        ("->", sig.return_annotation)
    ]


def form_differences() -> list[str]:
    """Each source whose made signature differs from Python's own, with both."""
    from kvstate.impl.signatures import signature

    bad = []
    flags = annotations.compiler_flag  # (the future import binds its feature to the name)
    for src in SOURCES:
        namespace: dict[str, Any] = {"Annotated": Annotated, "Any": Any}
        exec(compile(src, "<form>", "exec", flags=flags, dont_inherit=True), namespace)  # noqa: S102
        node = ast.parse(src).body[0]
        assert isinstance(node, ast.FunctionDef)
        own = inspect.signature(namespace[node.name])
        want = own.replace(
            parameters=[
                p.replace(annotation=_expected(p.annotation, namespace))
                for p in own.parameters.values()
            ],
            return_annotation=_expected(own.return_annotation, namespace),
        )
        made = signature(node, namespace)
        if _shape(made) != _shape(want):
            bad.append(f"{node.name}: made {made}, Python reads {want}")
    return bad
