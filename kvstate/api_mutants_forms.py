"""Planted bugs of the classes ``kvstate/targets/api/forms.py``, ``signatures.py`` and
``lrureads.py`` close: the build's other form of the generated guards and search, the published
signatures, and the recency lists the inspection view shows.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_planted.Mutant` takes them.  The mutants run on the pure sources, where no
twin is registered unless an example asks for the shipped ones: without ``forms`` a registry
that answers with another source's twin was never run under the model's eye; no call of the
walk reads what ``inspect.signature`` shows a user; a recency list read back to front shows only
if a later pick of that tier goes wrong.
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
    (
        "disk_lru_read_newest_first",
        "an observable order: a recency list shown most recently used first",
        "impl/inspection.py",
        "        return tuple(self._core.recovery.disk_lru)",
        "        return tuple(reversed(self._core.recovery.disk_lru))",
    ),
    (
        "pin_keeps_recency",
        "an observable order: a pin that does not make its blocks the most recently used",
        "impl/requests.py",
        "            ref[rid] += 1\n            if rid in lru:\n                lru.move_to_end(rid)\n        s.rids = held",
        "            ref[rid] += 1\n        s.rids = held",
    ),
)
