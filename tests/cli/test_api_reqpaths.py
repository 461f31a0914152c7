"""The request-side path classes of the API fuzz: the cache's own worker threads
(``targets/api/workers.py``), the library's pipeline drivers (``libdrive.py``), an admission's
readers (``readers.py``), maintenance by record (``actmaint.py``), a full request table
(``slotsfull.py``), calls before ``use`` (``notinuse.py``), slot forms (``slotforms.py``) and the
constructor's forms (``construct.py``): each walk conforms and reaches what it is for."""

from __future__ import annotations

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import Coverage, parse_ops, replay, witnesses
from kvstate.targets.api.workers import run_workers

TABLE = default_table()
N = 4
L = TABLE.consts.L

# a recovering request whose deadline runs out and one of whose loads fails: at ``use`` not even
# the truncated hit validates, and the request is downgraded to a recompute (docs/library.md).
# spec/api.py's FINALIZE did not explain that path (abort admit match pin? downgrade) until the
# walk of libdrive.py reached it: this replay fails on the mapping without it
GIVE_UP = (
    "request(i=0, n=64, life=1); admit(i=0); use(i=0); finish(i=0); tick(t=1); offload(n=1); "
    "drain(); request(i=1, n=65, life=1); admit(i=1); tick(t=4); read_error(b=3); drain_lib(); "
    "use(i=1)"
)


def test_a_failed_recovery_given_up_at_use_is_explained() -> None:
    cov = Coverage()
    assert replay(TABLE, N, parse_ops(GIVE_UP), coverage=cov) is None
    assert cov.counts["check: a downgraded admission's readers"] > 0, dict(cov.counts)


# a host tail that fails its splice check marks its record corrupt; a later admission whose hit
# ends at that record is cut by one block (``_sound_search``), and its explanation must name the
# cut: it read "requested 64 tokens" for a hit of 48 until the search recorded the failed
# recovery's cut (impl/requests.py)
CORRUPT_END = (
    "request(i=0, n=65, life=1); admit(i=0); use(i=0); finish(i=0); tick(t=1); offload(n=1); "
    "drain(); host_tail(b=3); request(i=1, n=65, life=1); admit(i=1); drain(); admit(i=0)"
)


def test_a_hit_cut_at_a_corrupt_record_is_explained() -> None:
    cov = Coverage()
    assert replay(TABLE, N, parse_ops(CORRUPT_END), coverage=cov) is None
    assert cov.counts["check: the explanation accounts for the hit (validated)"] > 0


@pytest.mark.parametrize(
    ("name", "reached"),
    [
        ("jobs raise under step and the library's drain (host recovery)", "fault load job raises"),
        ("a host load fails once every chunk has landed", "fault read_error"),
        (
            "offloads cancelled by an admission, their jobs stepped again",
            "check: a stale offload job changed nothing (record busy again)",
        ),
        (
            "the maintenance actions by record, the host tier full",
            "check: act_maint offload made room first",
        ),
        (
            "an admission with every request slot busy",
            "check: an admission with every request slot busy",
        ),
        ("finish and append before use (validated)", "check: append before use refused"),
        ("the constructor's other forms", "check: constructor form (a run read after close)"),
    ],
)
def test_walk_conforms_and_reaches_its_class(name: str, reached: str) -> None:
    cov = Coverage()
    w = witnesses(N, L, TABLE.consts.lease_max)[name]
    assert replay(TABLE, N, w, coverage=cov) is None
    assert cov.counts[reached] > 0, dict(cov.counts)


def test_worker_threads_conform() -> None:
    r = run_workers(TABLE, N)
    assert r.problems == []
    assert r.counts["use timed out"] == 1 and r.counts["job raised in a worker"] == 1, r.counts
    assert r.counts["sections checked"] > 0


# the chain's records are registered FREE (its tombstones, the oldest); with the smallest pools
# (``pools(k=4)``: the index's bound 4 * (6 + 2 + 3) + 64 = 108 records) the 27th foreign
# prompt's blocks passed the bound and the purge forgot them: their ids went to the foreign
# keys, addr and gaddr -1 where the table keeps the chain's addresses (impl/blocks.py now never
# purges a registered record).  Shrunk by hand from the ci walk's 67 operations
PURGED_CHAIN = "pools(k=4); " + "; ".join(f"foreign(ns={ns}, n=65)" for ns in range(2, 29))


def test_foreign_prompts_past_the_index_bound_keep_the_chain() -> None:
    cov = Coverage()
    assert replay(TABLE, N, parse_ops(PURGED_CHAIN), coverage=cov) is None
    assert cov.counts["check: examples with other pool sizes"] > 0, dict(cov.counts)
