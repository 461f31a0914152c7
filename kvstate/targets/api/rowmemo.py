"""The test writer's memos against fresh answers: a cache inside the implementation is checked
by comparing what it hands out with what it would compute.

The harness's writer (``impl/testdata.py``: :class:`DeterministicWriter`) and its byte checks
ask for the same rows again and again, so ``expected_rows`` and ``expected_state_rows`` keep
each answer by its inputs' exact bytes (bounded in entries and bytes), and ``harness_tokens``
keeps each token sequence by ``(n, seed)``.  A wrong key, an answer handed out without a copy,
or a bound that drifts would feed every byte check the same wrong expectation as the writer,
and no comparison with the cache's bytes could see it.  ``row_memo(b)``, an operation that
changes nothing, checks the memos against fresh computations:

* the rows of chain block ``b`` (every group, both row kinds) asked twice equal the fresh
  ``compute_rows``/``compute_state_rows``; the second answer is a copy (writing into the
  first leaves it as it was);
* inputs the memo cannot key (a tensor that requires grad) are computed afresh: the same rows;
* the memo's counted bytes equal what its entries hold, within its bound (``memo_stats``);
* once per process, an answer one byte over the largest the memo keeps
  (``answer_kept_max()``): the fresh rows, and the memo's entries and bytes unchanged;
* ``harness_tokens`` for more lengths than its memo keeps: each a fresh, writable copy, the
  prefix of the longest (the sequence is one sequence).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvstate.targets.api.base import op
from kvstate.targets.api.declare import OpDecl

GROUPS = ("csa", "hca", "indexer", "swa", "compressor")
WIDTH = 8
LENGTHS = 70  # token sequences asked: past the memo's 64 entries
_big_asked = False


def _rows_bad(h: Any, b: int) -> list[str]:
    from kvstate.impl import testdata as td

    L, bad = h.L, []
    layers = torch.arange(2)
    positions = torch.arange(b * L, (b + 1) * L)
    tokens = torch.from_numpy(np.array(h.chain.block_tokens_of(b)))
    kinds = [(g, td.expected_rows, td.compute_rows) for g in GROUPS]
    kinds.append(("compressor", None, td.compute_state_rows))
    for g, memo, fresh in kinds:

        def ask(p: torch.Tensor, memo: Any = memo, g: str = g) -> torch.Tensor:
            if memo is None:
                return td.expected_state_rows(layers, p, tokens, WIDTH)
            return memo(g, layers, p, tokens, WIDTH)

        want = fresh(g, layers, positions, tokens, WIDTH)
        first = ask(positions)
        keep = first.clone()
        first.fill_(0)  # the caller's copy, written into
        second = ask(positions)
        if not torch.equal(keep, want) or not torch.equal(second, want):
            bad.append(f"{g} rows of block {b}: the memo's answer is not the computed one")
        unkeyed = ask(positions.to(torch.float64).requires_grad_())
        if not torch.equal(unkeyed, want):
            bad.append(f"{g} rows of block {b} at positions that require grad differ")
    global _big_asked
    if not _big_asked:  # (16 MiB of rows: once)
        _big_asked = True
        one, w = torch.arange(1), td.answer_kept_max() + 1
        kept = td.memo_stats()
        got = td.expected_rows("swa", one, one, one, w)
        if td.memo_stats() != kept or not torch.equal(
            got, td.compute_rows("swa", one, one, one, w)
        ):
            bad.append(f"an answer of {w} bytes was kept, or is not the computed one")
    n, counted, held = td.memo_stats()
    if counted != held or n <= 0:
        bad.append(f"the row memo counts {counted} bytes for {n} entries holding {held}")
    longest = td.harness_tokens(LENGTHS + b)
    for k in range(1, LENGTHS + 1):
        got = td.harness_tokens(k + b)
        if not np.array_equal(got, longest[: k + b]) or not got.flags.writeable:
            bad.append(f"harness_tokens({k + b}) is not a fresh prefix of the sequence")
            break
        got[:] = -1  # the caller's copy, written into
    if not np.array_equal(td.harness_tokens(LENGTHS + b), longest):
        bad.append("harness_tokens handed out its memo's array")
    return bad


def do_row_memo(h: Any, o: Any) -> int | None:
    b = o.arg("b") % h.N
    bad = _rows_bad(h, b)
    if bad:
        raise h.fail("row-memo", ["row_memo"], f"{o.render()}: " + "; ".join(bad[:4]))
    h.cov.add("check: the test writer's memos against fresh answers")
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: the memos before and after a chain is stored and hit (the writer filled them)."""
    full = N * L + 1
    return {
        "the test writer's memos against fresh answers": [
            op("row_memo", b=0),
            op("request", i=0, n=full, life=1),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("row_memo", b=N - 1),
        ]
    }


DECLS = (OpDecl("row_memo", do_row_memo, "read", lambda s: {"b": s.block}, rule=False),)
