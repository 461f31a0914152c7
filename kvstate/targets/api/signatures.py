"""The public classes' published signatures against the callables they describe.

``inspect.signature`` and ``help()`` read a signature :mod:`kvstate.impl.signatures` attaches
to each public class and method, made from the source with the declared types in place of
``Any`` (docs/library.md).  A user calls what it shows: a default it misstates (``store=True``
shown where the method stores nothing unless told) or a parameter it drops or reorders is a
wrong contract that no call of the walk can see.  So, once per process (the signatures do not
change while it runs), :class:`PublishedSignatures` compares, for every class of
``kvstate.impl.__all__`` and each of its public methods, the published signature's parameter
names, kinds and defaults with those Python reads off the callable itself: a method's own code
and defaults, a class's through a bare subclass (which the attached signature leaves to
``inspect``).  Compiled callables (no code object) are left to the pure build's run; exception
classes too (Python reads no signature off them).  The parameter forms no public class has
are held to Python's own reading of the same source (``kvstate/targets/api/sigforms.py``).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]
_checked = False


def _shape(sig: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def _own(fn: types.FunctionType) -> inspect.Signature:
    """What Python reads off the function itself (its code and defaults), without the
    attached ``__signature__``."""
    bare = types.FunctionType(
        fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    bare.__kwdefaults__ = fn.__kwdefaults__
    return inspect.signature(bare)


def differences() -> list[str]:
    import kvstate.impl as impl

    bad: list[str] = []
    for name in impl.__all__:
        cls = getattr(impl, name)
        if not isinstance(cls, type) or issubclass(cls, BaseException):
            continue  # (Python reads no signature off an exception class)
        try:
            shown = inspect.signature(cls)
        except (TypeError, ValueError) as exc:
            bad.append(f"inspect.signature({name}) fails: {exc}")
            continue
        probe = None
        if isinstance(getattr(cls, "__init__", None), types.FunctionType):  # not compiled
            try:
                probe = type(f"_{name}Probe", (cls,), {})
            except (TypeError, AttributeError):  # an enum takes no subclass
                pass
        if probe is not None:
            try:
                own = inspect.signature(probe)
            except (TypeError, ValueError):  # an exception class: Exception's own __init__
                own = None
            if own is not None and _shape(own) != _shape(shown):
                bad.append(f"{name}{shown}, the class takes {own}")
        for attr, fn in vars(cls).items():
            if attr.startswith("_") or not isinstance(fn, types.FunctionType):
                continue
            if "__signature__" not in vars(fn):
                bad.append(f"{name}.{attr} publishes no signature")
                continue
            own = _own(inspect.unwrap(fn))  # (a context manager's: the function it wraps)
            if _shape(inspect.signature(fn)) != _shape(own):
                bad.append(f"{name}.{attr}{inspect.signature(fn)}, the method takes {own}")
    return bad


class PublishedSignatures(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        global _checked
        if _checked:
            return
        _checked = True
        from kvstate.targets.api.sigforms import form_differences

        bad = differences() + form_differences()
        if bad:
            raise h.fail("signature", [o.name], "; ".join(bad[:4]))
        h.cov.add("check: published signatures against the callables")
