"""A corpus of small tables with expected verdicts (pySMT style: one corpus, every checker).

Each entry derives a table from the default one by a documented change and states what the
prover must say: ``prove`` for correct tables, or the invariant that must fail and the actions
the replayed counterexample must contain, in order.  The tests run every entry; users can
point ``kvstate prove --spec kvstate.proofs.corpus:<name>`` at one to see a refutation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvstate.spec import CKV, Indexer, Table, default_table, forall_blocks, small
from kvstate.spec.expr import AND, CDIV


@dataclass(frozen=True)
class Case:
    name: str
    doc: str
    build: Callable[[], Table]
    proves: bool
    invariant: str | None = None
    actions: tuple[str, ...] = field(default=())  # must appear in this order in the trace
    predicate: Callable[[list[tuple[str, dict[str, int]]]], bool] | None = None


def _base() -> Table:
    return default_table(small())


def evict_without_refcount() -> Table:
    return _base().derive(
        name="evict without the reference-count guard", drop_guard=[("evict_start", "unpinned")]
    )


def use_without_pinning() -> Table:
    return _base().derive(name="use without pinning", drop_guard=[("validate", "pinned")])


def replay_without_recapture() -> Table:
    return _base().derive(
        name="replay after a recovery without recapture",
        update={("load_done", "graph"): lambda s, p: s.graph},
    )


def admit_past_io_cap() -> Table:
    # An I/O cap of one keeps the counterexample short (two loads instead of three).
    base = default_table(small().with_changes(io_cap=1))
    return base.derive(name="admitting past the I/O cap", drop_guard=[("load_start", "io_cap")])


def _indexer_present_only(s, p):  # type: ignore[no-untyped-def]
    h = s.req(p.r).hit
    return forall_blocks(s, 0, CDIV(h, s.k.L), lambda b: s.idx[b] == Indexer.PRESENT)


def skip_indexer_version() -> Table:
    return _base().derive(
        name="hit that skips the indexer version check",
        replace_guard={("validate", "L3.indexer_synced"): _indexer_present_only},
    )


def unaligned_hit() -> Table:
    return _base().derive(name="unaligned hit length", drop_guard=[("validate", "L1.lcm_aligned")])


def offload_pinned() -> Table:
    return _base().derive(name="offload a pinned block", drop_guard=[("offload", "unpinned")])


def _unaligned_match(trace: list[tuple[str, dict[str, int]]]) -> bool:
    return any(a == "match" and p["h"] % small().lcm_tokens for a, p in trace)


CORPUS: tuple[Case, ...] = (
    Case("default", "the default table", _base, True),
    Case(
        "default_32",
        "the default table with 32-token compressed blocks",
        lambda: default_table(small(32)),
        True,
    ),
    Case(
        "evict_without_refcount",
        "evict_start without its unpinned conjunct",
        evict_without_refcount,
        False,
        "toctou",
        ("pin", "validate", "evict_start"),
    ),
    Case(
        "use_without_pinning",
        "validate (then use) without holding pins",
        use_without_pinning,
        False,
        "toctou",
        ("match", "validate"),
    ),
    Case(
        "replay_without_recapture",
        "load_done moves a buffer but leaves the graph replayable",
        replay_without_recapture,
        False,
        "graph_topology",
        ("capture", "load_done"),
    ),
    Case(
        "admit_past_io_cap",
        "load_start ignores the I/O cap",
        admit_past_io_cap,
        False,
        "admission_cap",
        ("load_start", "load_start"),
    ),
    Case(
        "skip_indexer_version",
        "validate checks indexer presence but not its version",
        skip_indexer_version,
        False,
        "hit_soundness",
        ("index_update", "seal", "validate"),
    ),
    Case(
        "unaligned_hit",
        "validate without the LCM alignment rule",
        unaligned_hit,
        False,
        "hit_soundness",
        ("match", "validate"),
        _unaligned_match,
    ),
    Case(
        "offload_pinned",
        "offload starts moving a block a checked request reads",
        offload_pinned,
        False,
        "toctou",
        ("validate", "offload"),
    ),
)


def case(name: str) -> Case:
    for c in CORPUS:
        if c.name == name:
            return c
    raise KeyError(name)


def is_subsequence(wanted: tuple[str, ...], actions: list[str]) -> bool:
    it = iter(actions)
    return all(any(a == w for a in it) for w in wanted)


__all__ = ["CORPUS", "Case", "case", "is_subsequence", "CKV", "AND"]
