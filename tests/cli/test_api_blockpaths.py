"""The block-side path classes of the API harness: each witness conforms and reaches its path
(kvstate/targets/api/swaout.py, directio.py, unlinks.py, registered.py); the planted bugs of
kvstate/api_mutants_blockpaths.py show that each check can fail (``python -m kvstate.api_mutants
-k NAME``, minutes: not run here)."""

from __future__ import annotations

import pytest

from kvstate.spec import default_table
from kvstate.targets.api import Coverage, parse_ops, replay, witnesses

TABLE = default_table()
N = 4
L = TABLE.consts.L


@pytest.mark.parametrize(
    ("name", "reached"),
    [
        ("the SWA pages run out at block 1 of a store, every window pinned", "scarce SWA pages"),
        (
            "a disk load when the file system refuses direct I/O at open",
            "fault direct I/O refused at open",
        ),
        (
            "a disk load when the file system refuses direct I/O at read time",
            "fault direct I/O refused at read time",
        ),
        ("disk files let go while the file system refuses unlinks", "fault an unlink refused"),
        ("disk files let go while the file system finds them done", "fault an unlink finds"),
        ("prompts registered past the device's spare slots", "registered with no spare slot"),
    ],
)
def test_block_path_witness_conforms_and_reaches_its_path(name: str, reached: str) -> None:
    cov = Coverage()
    w = witnesses(N, L, TABLE.consts.lease_max)[name]
    assert replay(TABLE, N, w, coverage=cov) is None
    assert any(k.startswith(reached) or reached in k for k in cov.counts), sorted(cov.counts)


def test_variant_under_the_production_writer_hands_its_rows() -> None:
    # without its rows handed (HandRows), the variant's store raised WriterFailed at the Run's
    # exit: a refusal the harness requires to change nothing
    trace = parse_ops("handed(k=1); variant(n=33, p=0); variant(n=65, p=1)")
    assert replay(TABLE, N, trace, coverage=Coverage()) is None
