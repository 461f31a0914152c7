"""What ``admit`` hands out is a dataclass: its repr and its equality, as declared.

``Admission`` and its ``Explanation`` (``impl/handles.py``) are declared ``@dataclass``: an
engine logs them (``repr``), and compares them (``==``: two admissions of the same hit, state
and explanation are equal, field by field).  Neither is compared with anything by the table,
so a class that lost its declared form (no generated ``__repr__``/``__eq__``: an object's
address printed, identity compared) or that shows its private fields (the validation snapshot,
the pins, the admission's number: ``repr=False``) is seen only here.  After every ``admit`` of
one of the harness's requests, for the admission and its explanation:

* ``repr`` is ``Class(field=value, ...)`` over the public fields, each shown by its own
  ``repr``, in declaration order, and no private field (a name with a leading underscore,
  ``seq``) is shown;
* a copy (``dataclasses.replace``: every field given the original's value) is equal to the original and one whose
  hit (or requested length) differs is not: equality compares the fields, not identity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]
# the public fields each class declares, in declaration order (impl/handles.py), and the field
# a differing copy changes; the private ones (``_snapshot``, ``_pins``, ``seq``) are not shown
_FORMS = {
    "Admission": (
        (
            "request",
            "requested",
            "hit_tokens",
            "state",
            "explanation",
            "recovery",
            "rids",
            "tail_check",
        ),
        "hit_tokens",
    ),
    "Explanation": (
        (
            "requested",
            "immediate",
            "after_recovery",
            "unrecoverable",
            "truncations",
            "rejection",
        ),
        "requested",
    ),
}


def form_problems(obj: Any) -> list[str]:
    """How ``obj`` (an Admission or an Explanation) departs from its declared dataclass form."""
    name = type(obj).__name__
    fields, differs = _FORMS[name]
    out = []
    want = f"{name}({', '.join(f'{f}={getattr(obj, f)!r}' for f in fields)})"
    got = repr(obj)
    if got != want:
        out.append(f"{name}'s repr is {got[:120]!r}, declared {want[:120]!r}")
    # copies by ``dataclasses.replace`` (every field given the original's value, the private
    # ones too: equality compares them), the second with another hit or length
    try:
        twin = dataclasses.replace(obj)
        other = dataclasses.replace(obj, **{differs: getattr(obj, differs) + 1})
    except TypeError as exc:  # not a dataclass instance any more
        return [*out, f"{name} is not a dataclass instance: {exc}"]
    if not twin == obj or twin != obj:
        out.append(f"{name}: a copy of it is not equal to it (equality by identity?)")
    if other == obj:
        out.append(f"{name}: a copy with another {differs} is equal to it")
    return out


class AdmissionForm(CallCheck):
    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name != "admit" or h.threads:
            return
        lv = h.live[o.arg("i")]
        adm = lv.req.admission if lv is not None else None
        if adm is None:
            return
        bad = form_problems(adm) + form_problems(adm.explanation)
        if bad:
            raise h.fail("declared-form", ["admit"], f"{o.render()}: " + "; ".join(bad))
        h.cov.add("check: an admission's repr and equality, as declared")
