"""The longest valid hit, found by running the spec's hit rules as data, and why it is shorter.

Like vLLM's ``HybridKVCacheCoordinator``, every group can only lower the hit.  The search is
generated from ``hit_rule.rules`` (:func:`kvstate.impl.fastforms.compile_search`: every rule
inlined, each scope read with :func:`kvstate.spec.layers.scope_range`):

1. rules of scope ALL (every block of the hit) are prefix-closed, so one pass over the blocks
   finds the first block where any of them fails; the hit is cut to the LCM boundary before it;
2. rules of scope HIT, WINDOW and BOUNDARY are checked at the current length; when one fails
   the length steps down to the previous LCM boundary and they are checked again (ALL rules keep
   holding on a shorter prefix, so they are not re-run).

Each cut is recorded as a :class:`Shortening` (layer, rule, state, group, first failing block,
from and to lengths): the library reports *why* a hit was shortened (vllm-ascend 16270: an LCM
of 4096 silently gave a 0% hit rate).  The same search on a *projected* view (what the state will
be once the recovery pipelines have run) gives the hit worth recovering, and the difference
between the two is the :class:`RecoveryPlan`.  ``kvstate/testing/search.py`` is the search's
rule-by-rule oracle (tests/impl/test_impl_search.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvstate.spec.apply import apply, holds
from kvstate.spec.layers import HitRule, Rule, RuleScope, scope_range
from kvstate.spec.phases import CKV, Indexer, Pipe
from kvstate.spec.state import ConcreteState, initial_values, req_var_names
from kvstate.spec.table import Scope, Table

from .errors import InternalError
from .fastforms import CompiledSearch
from .meta import BlockMeta


class Shortening(NamedTuple):
    """One rule that cut the hit: from ``from_tokens`` down to ``to_tokens``."""

    rule: str  # qualified name, e.g. "L3.ckv_ready"
    layer: str
    state: str
    group: str
    block: int | None  # first failing block (None: a rule on the hit length itself)
    from_tokens: int
    to_tokens: int
    doc: str = ""

    def __str__(self) -> str:
        where = f" at block {self.block}" if self.block is not None else ""
        return (
            f"{self.rule} [{self.state}, group {self.group}]{where}: "
            f"{self.from_tokens} -> {self.to_tokens} tokens ({self.doc})"
        )


class HitSearch(NamedTuple):
    """The result of one search (named tuples: one or two are built per admission)."""

    requested: int
    hit: int
    shortenings: tuple[Shortening, ...]
    rejected: Shortening | None = None  # a length rule fails even at 0: no hit at all


def _short(rule: Rule, block: int | None, frm: int, to: int) -> Shortening:
    return Shortening(rule.qualname, rule.layer, rule.state, rule.group, block, frm, to, rule.doc)


class Coordinator:
    """Hit search over a ``ChainView`` with the rules of one :class:`HitRule`."""

    def __init__(self, hit_rule: HitRule, compiled: CompiledSearch) -> None:
        self.hit_rule = hit_rule
        # the one search (.fastforms): every rule inlined, the table's callable where a rule
        # did not translate; the direct form for direct views
        self._search = compiled.search
        self._search_direct = compiled.search_direct

    def search(self, view: Any, r: int, h_max: int) -> HitSearch:
        whole = self._search_direct if getattr(view, "_direct", False) else self._search
        h, cuts, rejected = whole(view, r, h_max)
        rules = self.hit_rule.rules
        return HitSearch(
            h_max,
            h,
            tuple(_short(rules[i], b, frm, to) for i, b, frm, to in cuts),
            _short(rules[rejected[0]], rejected[1], 0, 0) if rejected is not None else None,
        )

    def failures(self, view: Any, r: int, h: int) -> list[Shortening]:
        """Every rule that fails at exactly ``h`` (no search: the explanation of a refused
        validation names each of them, with its first failing block), by the table's
        callables."""
        out = []
        for rule in self.hit_rule.rules:
            if rule.scope is RuleScope.HIT:
                if not rule.pred(view, r, h):
                    out.append(_short(rule, None, h, h))
                continue
            lo, hi = scope_range(rule, view, h)
            bad = next(
                (b for b in range(max(lo, 0), min(hi, view.N)) if not rule.pred(view, r, b)), None
            )
            if bad is not None:
                out.append(_short(rule, bad, h, h))
        return out


# ---- recovery: projection and plan ---------------------------------------------------------
@dataclass(frozen=True)
class RecoveryStep:
    block: int  # chain block index
    rid: int
    state: str  # the cache state it restores ("On-disk Prefix", "Compressed KV", "Indexer State")
    pipeline: Pipe
    action: str  # load_start / offload_cancel / rebuild_start / wait_load / wait_rebuild


@dataclass(frozen=True)
class RecoveryPlan:
    steps: tuple[RecoveryStep, ...] = ()
    target: int = 0  # hit length the plan recovers to
    search: HitSearch | None = None  # the search on the projected state
    notes: tuple[str, ...] = field(default=())

    def by_state(self) -> dict[str, list[RecoveryStep]]:
        out: dict[str, list[RecoveryStep]] = {}
        for s in self.steps:
            out.setdefault(s.state, []).append(s)
        return out

    def __bool__(self) -> bool:
        return bool(self.steps)


MOVING = (CKV.HOST, CKV.DISK, CKV.LOADING, CKV.OFFLOADING)

# the recovery pipelines' transitions, tried in this order on each block until none is enabled
RECOVERY = (
    "offload_cancel", "load_start", "load_progress", "load_done", "rebuild_start", "rebuild_done",
)  # fmt: skip
# the admission cap only delays a load (it queues): the projection is the state once it ran
IO_CAP = "io_cap"


def nothing_to_recover(meta: BlockMeta, rids: Sequence[int]) -> bool:
    """The fast test: no block of ``rids`` is moving between tiers and every resident one's
    indexer is in sync, so the recovery pipelines would change nothing.  The projection
    (:func:`projection`, the table's own updates) is its oracle (tests/impl/test_impl_projection.py)."""
    m_ckv, m_idx, m_iver, m_ver, m_corrupt = meta.ckv, meta.idx, meta.iver, meta.ver, meta.corrupt
    ready_p, present = CKV.READY, Indexer.PRESENT
    for i in rids:
        c = m_ckv[i]
        if (c in MOVING or (c == ready_p and (m_idx[i] != present or m_iver[i] != m_ver[i]))) and (
            not m_corrupt[i]
        ):
            return False
    return True


def projection(
    table: Table,
    meta: BlockMeta,
    rids: Sequence[int],
    *,
    shortcut: bool = True,
    trace: dict[int, list[tuple[str, int, int]]] | None = None,
) -> dict[str, dict[int, int]]:
    """The metadata the recovery pipelines will produce for ``rids``: each block (not corrupt)
    run through the table's own recovery transitions (:data:`RECOVERY`, each applied while its
    guard holds, the I/O cap aside) on a one-block state -- so a disk load comes back in the
    file's stored form, without indexer pages and (under the zero-SWA policy) without its
    window, and a rebuild brings the indexer in sync, exactly as the table says.
    Returns ``field -> {rid: value}`` for the block columns that change (empty: none); into
    ``trace`` (when given), per block the transitions applied, each with the load and indexer
    pipelines the table's updates leave (``(action, ldpipe, ixpipe)``): the recovery plan."""
    if shortcut and nothing_to_recover(meta, rids):
        return {}
    base = initial_values(table, 1)
    req_names = req_var_names(table)
    actions = [table.action(a) for a in RECOVERY]
    columns = [v.name for v in table.vars if v.scope is Scope.BLOCK and not v.ghost]
    limit = meta.load_steps + 2 * len(actions)
    out: dict[str, dict[int, int]] = {}
    for i in rids:
        if meta.corrupt[i]:
            continue
        vals = dict(base)
        before = {name: getattr(meta, name)[i] for name in columns}
        for name, v in before.items():
            vals[name] = (v,)
        s = ConcreteState(vals, 1, table.consts, req_names)
        params = {"b": 0, "a": before["addr"], "f": meta.disk_fmt[i]}
        for _ in range(limit):
            a = next((a for a in actions if holds(a, s, params, (IO_CAP,))), None)
            if a is None:
                break
            s = apply(a, s, params)
            if trace is not None:
                trace.setdefault(i, []).append((a.name, int(s.ldpipe[0]), int(s.ixpipe[0])))
        else:
            raise InternalError(f"recovery of record {i} did not settle in {limit} steps")
        for name in columns:
            after = getattr(s, name)[0]
            if after != before[name]:
                out.setdefault(name, {})[i] = int(after)
    return out


def plan_steps(
    meta: BlockMeta,
    rids: Sequence[int],
    blocks: int,
    trace: dict[int, list[tuple[str, int, int]]],
) -> list[RecoveryStep]:
    """The jobs that bring the first ``blocks`` chain blocks to the projected state: the
    transitions :func:`projection` applied that start a job (``offload_cancel``,
    ``load_start``, ``rebuild_start``, on the pipeline the table's update records), and a wait
    for a job already running (the block's first transition ends a load or a rebuild that
    started before).  Each is labelled with the state it brings back: a load from the I/O
    pipeline the On-disk Prefix, any other load or a cancelled offload the Compressed KV, a
    rebuild the Indexer State."""
    steps: list[RecoveryStep] = []
    for b in range(min(blocks, len(rids))):
        i = rids[b]
        started: set[str] = set()
        for n, (a, ldpipe, ixpipe) in enumerate(trace.get(i, ())):
            if a == "offload_cancel":
                pipe = Pipe(meta.ldpipe[i])
                steps.append(RecoveryStep(b, i, "Compressed KV", pipe, a))
            elif a == "load_start":
                state = "On-disk Prefix" if ldpipe == Pipe.IO else "Compressed KV"
                steps.append(RecoveryStep(b, i, state, Pipe(ldpipe), a))
            elif a == "rebuild_start":
                steps.append(RecoveryStep(b, i, "Indexer State", Pipe(ixpipe), a))
            elif n == 0 and a in ("load_progress", "load_done"):
                pipe = Pipe(meta.ldpipe[i])
                steps.append(RecoveryStep(b, i, "On-disk Prefix", pipe, "wait_load"))
            elif a == "rebuild_done" and "rebuild_start" not in started:
                pipe = Pipe(meta.ixpipe[i])
                steps.append(RecoveryStep(b, i, "Indexer State", pipe, "wait_rebuild"))
            started.add(a)
    return steps
