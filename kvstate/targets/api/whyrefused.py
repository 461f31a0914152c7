"""A refused validation's explanation against the hit rules the model finds failing.

``validate`` of a pinned request that the table refuses raises ``Refused`` whose detail names
every rule of the table's hit rule failing at the request's hit (``Coordinator.failures``: one
``Shortening`` a rule, ``"L3.ckv_ready [...] at block 1: ..."``, joined by ``"; "``).  The
harness checked that such a call was refused and changed nothing; which rules the message names
(what an operator reads to learn why a hit was not served) was never compared.  Here, on each
refused ``act`` of ``validate`` whose request the model holds PINNED, the rules named must be
exactly, in the table's order, those whose predicate the model's state falsifies over the
rule's scope (``HitRule.rule_holds``) at that hit.  The walks below reach such a request: the
single actions ``admit``, ``match`` of a hit the state does not hold (one token: not a whole
block; blocks offloaded past their leases), ``pin``, then ``validate``.
"""

from __future__ import annotations

from typing import Any

from kvstate.spec.phases import Req
from kvstate.targets.api.base import CallCheck, op


def failing_rules(h: Any, r: int) -> list[str]:
    """The qualified names of the hit rules the model's state falsifies at request ``r``'s hit
    (``HitRule.rule_holds``: each rule over its scope), in the table's order."""
    s, rules = h.model, h.table.hit_rule
    hit = s.req(r).hit
    return [x.qualname for x in rules.rules if not rules.rule_holds(x, s, r, hit)]


class WhyRefused(CallCheck):
    def refused(self, h: Any, o: Any) -> None:
        from kvstate.impl.errors import Refused

        exc, tried = h.refusal, getattr(h, "act_tried", None)
        if o.name != "act" or tried is None or h.threads or not isinstance(exc, Refused):
            return
        name, p = tried
        if name != "validate" or exc.action != "validate" or "r" not in p:
            return
        r = int(p["r"])
        if int(h.model.req(r).phase) != Req.PINNED:
            return
        named = [part.split(" [", 1)[0] for part in exc.detail.split("; ") if part]
        want = failing_rules(h, r)
        h.cov.add("check: a refused validation names the failing hit rules")
        if named != want:
            raise h.fail(
                "why-refused",
                ["validate"],
                f"{o.render()}: validate{p} refused naming rules {named} ({exc.detail!r}); "
                f"the model's state fails the hit rules {want} at that hit",
            )


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witnesses: a pinned request whose validation the table refuses (``pin`` needs its
    blocks stored): at a hit of one token over a stored chain (L1 fails), and at the chain's
    two blocks once their leases ended and they were offloaded (present, not READY)."""
    from kvstate.spec import default_table
    from kvstate.targets.api.single import actions

    at = {a.name: i for i, a in enumerate(actions(default_table()))}

    def pinned(h: int) -> list[Any]:
        # (``match``'s inputs in the model's order: request 0's hits first, ``h`` tokens)
        return [
            op("act", a=at["admit"], k=0, on=1),
            op("act", a=at["match"], k=h, on=1),
            op("act", a=at["pin"], k=0, on=1),
            op("act", a=at["validate"], k=0, on=0),
        ]

    stored = [
        op("request", i=0, n=2 * L + 1, life=1),
        op("admit", i=0),
        op("use", i=0),
        op("finish", i=0),
    ]
    return {
        "a validation refused under pins at a hit of one token": [*stored, *pinned(1)],
        "a validation refused under pins over blocks offloaded": [
            *stored,
            op("tick", t=lease_max),
            op("offload", n=2),
            *pinned(2 * L),
        ],
    }
