"""The guard gate's rule epoch and the one read-set analysis behind it.

What the hit rules read is computed once, off their Z3 terms (``CompiledHitRule.reads``,
``spec.compile.term_reads``); the core's epoch moves, in one place, exactly for the actions whose
frame meets that set, so a search stays a proof of the rules while the epoch has not moved."""

from __future__ import annotations

from dataclasses import replace

import z3

from kvstate.impl import HeterogeneousKVCache
from kvstate.impl.testdata import DeterministicWriter
from kvstate.spec import default_table
from kvstate.spec.compile import compile_hit_rule, term_reads
from kvstate.spec.layers import Rule, RuleScope
from kvstate.spec.phases import Req


def test_term_reads_names_table_variables_and_request_fields_only() -> None:
    b, h = z3.Int("p_b"), z3.Int("h")
    ckv = z3.Array("t_ckv", z3.IntSort(), z3.IntSort())
    t = z3.And(z3.Select(ckv, b) == 1, z3.Int("t_now") < h, z3.Int("r0_phase") == 2)
    assert term_reads(t) == {"ckv", "now", "phase"}


def test_the_rules_reads_follow_the_rules() -> None:
    """A rule that reads one more variable adds it to the read set; an untraceable rule makes
    the set unknown (None: no action is taken as neutral)."""
    t = default_table()
    k = replace(t.consts, R=2)
    base = compile_hit_rule(t.hit_rule, t, k).reads
    assert base is not None and "ckv" in base and "now" not in base
    clock = Rule("clock", "L1", "Compressed KV", "csa", RuleScope.HIT, lambda s, r, h: s.now >= 0)
    more = compile_hit_rule(replace(t.hit_rule, rules=(*t.hit_rule.rules, clock)), t, k).reads
    assert more == base | {"now"}
    opaque = Rule("opaque", "L3", "Compressed KV", "csa", RuleScope.HIT, lambda s, r, h: bool(h))
    hr = replace(t.hit_rule, rules=(*t.hit_rule.rules, opaque))
    assert compile_hit_rule(hr, t, k).reads is None


def test_the_epoch_moves_exactly_for_actions_that_meet_the_rules_reads() -> None:
    t = default_table()
    c = HeterogeneousKVCache(
        table=t, executors="manual", device_blocks=8, host_blocks=4, writer=DeterministicWriter()
    )
    try:
        core = c.inspect()
        reads = core.rule_reads
        assert reads is not None
        by_name = {a.name: a for a in t.actions}
        assert not by_name["tick"].modifies & reads  # the clock: neutral
        e = core.epoch
        c.tick(1)
        assert core.epoch == e
        req = c.request(list(range(3 * t.consts.L + 1)))
        adm = c.admit(req)  # admit / match / pin / validate: pin and validate meet the reads?
        moved = sum(1 for a in ("admit", "match", "pin", "validate") if by_name[a].modifies & reads)
        assert core.epoch - e >= moved
        with c.use(adm):
            assert req.slot is not None and req.slot.phase == Req.USING
        assert core.epoch - e > moved  # storing the new blocks moves block columns the rules read
    finally:
        c.close()
