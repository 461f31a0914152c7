"""Planted bugs of the class ``kvstate/targets/api/forms.py`` closes: the build's other form of
the generated guards and search.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_planted.Mutant` takes them.  The mutants run on the pure sources, where no
twin is registered unless an example asks for the shipped ones: without ``forms`` a registry
that answers with another source's twin was never run under the model's eye.
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
)
