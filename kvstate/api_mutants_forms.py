"""Planted bugs of the classes ``kvstate/targets/api/forms.py`` and ``signatures.py`` close: the
build's other form of the generated guards and search, and the published signatures.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_planted.Mutant` takes them.  The mutants run on the pure sources, where no
twin is registered unless an example asks for the shipped ones: without ``forms`` a registry
that answers with another source's twin was never run under the model's eye; no call of the
walk reads what ``inspect.signature`` shows a user.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "twin_looked_up_by_name",
        "caches inside the implementation: a memoized function keyed by its name, not its source",
        "impl/twins.py",
        "    return _TWINS.get(key)",
        "    return next((f for f in _TWINS.values() if f.__name__.startswith(name + '__')), None)",
    ),
    (
        "signature_defaults_shifted",
        "a published contract: a signature's defaults one parameter off",
        "impl/signatures.py",
        "    first_default = len(positional) - len(a.defaults)\n",
        "    first_default = len(positional) - len(a.defaults) + 1\n",
    ),
)
