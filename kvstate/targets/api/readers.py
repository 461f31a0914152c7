"""An admission's readers, read after every call on a request: its explanation and its pins.

The harness compares an admission's hit and state with the model; what it hands out beside
them was read for an admission validated at once only (``args.py``).  Here, for every
admission the harness holds (pending, validated, truncated, downgraded):

* **The explanation accounts for the hit**: the hit is the request's longest possible one
  (``requested``) cut by the explanation's cuts (``shortenings``: the search's, after recovery
  if it ran, and a failed recovery's truncations), so it is the least of ``requested`` and
  every cut's end; an admission downgraded to a recompute (hit 0) says why (``rejection``); and
  the readable form (``lines()``, ``str()``) shows every cut and the rejection.  A cut left out
  (a truncation not recorded) or the wrong search's cuts leave a hit the explanation does not
  account for; a ``use`` that truncated its pending hit names that cut first among the
  explanation's truncations (from the pending hit to the one served).
* **A pending admission has a plan to wait for**: its ``recovery`` is truthy.
* **The pins are the device memory validated**: a downgraded admission pins nothing; for every
  pin, ``data_ptrs`` (what an engine hands a kernel: each slot group's address of the block's
  first page, layer 0) is the address of the page the group's device tensor holds at the pin's
  slot, as torch computes it (the implementation's cached base and stride per group are
  compared with the tensors themselves); a run of no hit reads an empty compressor state and
  has no stale pin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


def _fail(h: Any, o: Any, what: str, detail: str) -> Exception:
    return h.fail("readers", [what], f"{o.render()}: {detail}")


class AdmissionReaders(CallCheck):
    def __init__(self) -> None:
        self.pending: tuple[Any, int] | None = None  # (admission, its hit) before a use

    def before(self, h: Any, o: Any) -> None:
        self.pending = None
        lv = h.live[o.arg("i")] if o.name == "use" else None
        adm = lv.req.admission if lv is not None else None
        if adm is not None and adm.state == "pending":
            self.pending = (adm, adm.hit_tokens)

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if "i" not in o.inputs or h.threads:
            return  # (a call on one of the harness's requests: its admission read anew)
        lv = h.live[o.arg("i")]
        adm = lv.req.admission if lv is not None else None
        if adm is None:
            return
        e = adm.explanation
        cuts = e.shortenings
        text = str(e)
        missing = [str(s) for s in cuts if str(s) not in text]
        if e.rejection and f"rejected: {e.rejection}" not in e.lines():
            missing.append(f"rejected: {e.rejection}")
        if missing:
            raise _fail(h, o, "explanation-text", f"the explanation's lines lack {missing[:2]}")
        if adm.state == "pending" and not adm.recovery:
            raise _fail(h, o, "plan", "a pending admission's recovery plan is empty (falsy)")
        if adm.state == "downgraded":
            if adm.hit_tokens != 0 or not e.rejection or adm.pins:
                raise _fail(
                    h,
                    o,
                    "downgraded",
                    f"a downgraded admission shows hit {adm.hit_tokens}, "
                    f"rejection {e.rejection!r}, {len(adm.pins)} pins (a recompute pins nothing, "
                    "and says why)",
                )
            h.cov.add("check: a downgraded admission's readers")
        else:
            floor = min([e.requested, *(s.to_tokens for s in cuts)])
            if floor != adm.hit_tokens:
                raise _fail(
                    h,
                    o,
                    "explanation-hit",
                    f"the {adm.state} admission's hit is "
                    f"{adm.hit_tokens} tokens, yet its explanation cuts {e.requested} requested "
                    f"tokens to {floor}:\n  " + "\n  ".join(e.lines()),
                )
            h.cov.add(f"check: the explanation accounts for the hit ({adm.state})")
            was = self.pending
            if was is not None and was[0] is adm and adm.hit_tokens < was[1]:
                first = e.truncations[0] if e.truncations else None
                if first is None or (first.from_tokens, first.to_tokens) != (was[1], floor):
                    raise _fail(
                        h,
                        o,
                        "truncation",
                        f"use truncated the pending hit of {was[1]} tokens "
                        f"to {adm.hit_tokens}, yet the explanation's first truncation is {first}",
                    )
                h.cov.add("check: a truncation's cut in the explanation")
        if adm.state != "validated":
            return
        if o.name == "use" and adm.hit_tokens == 0 and lv.run is not None:
            # no hit: the compressor state at boundary 0 holds no row (kvstate/testing/datacheck.py)
            if bool(lv.run.read_tail(0).any()):
                raise _fail(h, o, "tail-at-0", "a run of no hit reads a compressor state")
            stale = lv.run.verify_pins()
            if stale:
                raise _fail(h, o, "pins-at-0", f"a run of no hit has stale pins: {stale}")
            h.cov.add("check: a run of no hit reads an empty compressor state")
        tiers = h.view.tiers
        for p in adm.pins:
            for name, addr in p.data_ptrs.items():
                grp = getattr(tiers, name)
                want = grp.device_data[0, grp.dev_index(p.slot)].data_ptr()
                if addr != want:
                    raise _fail(
                        h,
                        o,
                        "data-ptrs",
                        f"block {p.block}'s pin gives {name} at {addr:#x}, "
                        f"the device page of its slot {p.slot} is at {want:#x}",
                    )
        h.cov.add("check: pins' device addresses")
