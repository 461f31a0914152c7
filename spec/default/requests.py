"""The default table's request actions (admit, match, pin, validate, use, release, abort,
downgrade), the residency lease (touch), the clock (tick) and the captured CUDA graph."""

from __future__ import annotations

from kvstate.spec.expr import AND, B2I, CDIV, IN, MAX, NOT, array, store
from kvstate.spec.layers import HitRule
from kvstate.spec.phases import CKV, Graph, Req
from kvstate.spec.table import Action

from .common import (
    ACTIVE,
    B,
    Fn,
    H,
    R,
    T,
    action,
    conj,
    covers,
    give_up_pins,
    pinned_blocks_total,
)


def captured() -> dict[str, Fn]:
    """The updates of a (re)capture: the graph is captured and records every block's address."""
    return {
        "graph": lambda s, p: int(Graph.CAPTURED),
        "gaddr": lambda s, p: s.addr,
    }


def request_actions(hit_rule: HitRule) -> list[Action]:
    return [
        action(
            "touch",
            [B, T],
            [conj("resident", lambda s, p: NOT(IN(s.ckv[p.b], (CKV.FREE, CKV.EVICTING))))],
            {
                "lease": lambda s, p: store(s, s.lease, p.b, MAX(s.lease[p.b], s.now + p.t)),
            },
            "Compressed KV",
            "extend a residency lease (never shortens it)",
        ),
        action(
            "tick",
            [T],
            [conj("always", lambda s, p: True)],
            {"now": lambda s, p: s.now + p.t},
            "Scheduler",
            "time passes (t ticks)",
        ),
        # ---- CUDA graph ------------------------------------------------------------------
        action(
            "capture",
            [],
            [conj("none", lambda s, p: s.graph == Graph.NONE)],
            captured(),
            "CUDA Graph",
            "capture over the persistent buffers; record their addresses",
        ),
        action(
            "replay",
            [],
            [conj("captured", lambda s, p: s.graph == Graph.CAPTURED)],
            {},
            "CUDA Graph",
            "replay the captured graph (reads the recorded addresses)",
        ),
        action(
            "recapture",
            [],
            [conj("stale", lambda s, p: s.graph == Graph.STALE)],
            captured(),
            "CUDA Graph",
            "recapture after a recovery moved a buffer",
        ),
        # ---- requests --------------------------------------------------------------------
        action(
            "admit",
            [R, T],
            [conj("idle", lambda s, p: s.req(p.r).phase == Req.IDLE)],
            {
                "phase": lambda s, p: int(Req.WAITING),
                "deadline": lambda s, p: s.now + p.t,
                "hit": lambda s, p: 0,
            },
            "Request",
            "admit a request that will live t ticks",
        ),
        action(
            "match",
            [R, H],
            [
                conj("waiting", lambda s, p: s.req(p.r).phase == Req.WAITING),
                conj("in_pool", lambda s, p: AND(p.h >= 0, p.h <= s.N * s.k.L)),
            ],
            {
                "phase": lambda s, p: int(Req.MATCHED),
                "hit": lambda s, p: p.h,
            },
            "Request",
            "prefix-hash lookup: a candidate length; nothing is locked",
        ),
        action(
            "pin",
            [R],
            [
                conj("matched", lambda s, p: s.req(p.r).phase == Req.MATCHED),
                conj(
                    "present",
                    lambda s, p: s.forall_blocks(
                        0,
                        CDIV(s.req(p.r).hit, s.k.L),
                        lambda b: NOT(IN(s.ckv[b], (CKV.FREE, CKV.EVICTING))),
                    ),
                    "only existing blocks can be pinned",
                ),
                conj(
                    "pin_cap",
                    lambda s, p: (
                        pinned_blocks_total(s) + CDIV(s.req(p.r).hit, s.k.L) <= s.k.pin_cap
                    ),
                    "admission cap: pinned blocks stay within capacity",
                ),
            ],
            {
                "phase": lambda s, p: int(Req.PINNED),
                "pinned": lambda s, p: s.req(p.r).hit,
                "ref": lambda s, p: array(
                    s, lambda b: s.ref[b] + B2I(covers(s, b, s.req(p.r).hit))
                ),
            },
            "Request",
            "take reference counts on the hit's blocks",
        ),
        action(
            "validate",
            [R],
            [
                conj(
                    "pinned",
                    lambda s, p: s.req(p.r).phase == Req.PINNED,
                    "check only under pins, so the check stays true until use",
                ),
                *[
                    conj(
                        rule.qualname,
                        (
                            lambda rule: (
                                lambda s, p: hit_rule.rule_holds(rule, s, p.r, s.req(p.r).hit)  # noqa: B023
                            )
                        )(rule),
                        rule.doc,
                    )
                    for rule in hit_rule.rules
                ],
            ],
            {
                "phase": lambda s, p: int(Req.VALIDATED),
                "pgen": lambda s, p: s.gen,
                "paddr": lambda s, p: s.addr,
            },
            "Request",
            "the four layers hold: record state_data_ptrs (generations and addresses)",
        ),
        action(
            "use",
            [R],
            [
                conj("checked", lambda s, p: IN(s.req(p.r).phase, (Req.VALIDATED, Req.RECOMPUTE))),
            ],
            {"phase": lambda s, p: int(Req.USING)},
            "Request",
            "compute from the hit",
        ),
        action(
            "release",
            [R],
            [conj("using", lambda s, p: s.req(p.r).phase == Req.USING)],
            give_up_pins(Req.IDLE),
            "Request",
            "finish: drop the pins",
        ),
        action(
            "abort",
            [R],
            [conj("active", lambda s, p: IN(s.req(p.r).phase, ACTIVE))],
            give_up_pins(Req.IDLE),
            "Request",
            "abort at any point; in-flight loads finish in their pipeline, so nothing is reused mid-write",
        ),
        action(
            "downgrade",
            [R],
            [
                conj(
                    "unchecked",
                    lambda s, p: IN(s.req(p.r).phase, (Req.MATCHED, Req.PINNED)),
                    "a hit that cannot pass (cap, failed load, layer) is never blocked forever",
                ),
            ],
            give_up_pins(Req.RECOMPUTE),
            "Request",
            "give up the hit and recompute from scratch",
        ),
    ]
