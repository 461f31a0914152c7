"""The identity of a prefix, as the API harness checks it: prompts that differ early and agree
later.

The harness's requests are cut from one token sequence, so every prompt it sends agrees with
every other on their common length: a key that forgot part of a block's tokens, or did not
chain over the blocks before it, is never asked to tell two prompts apart.  (Nor do the bytes
show it: the test writer's rows depend on a token and its position, not on the tokens before.)
``variant(p, n)`` sends a whole request in the harness's *own* namespace whose first ``n``
tokens are the chain's except at position ``p`` of block 0 (its first or its last token): it
shares no block with the chain, while every later block's tokens equal the chain's there.  What
the table says of such a request is what it says of one in another namespace (``spec/api.py``
``foreign``: its stores make room and touch none of the chain's blocks), and it may hit only
blocks an earlier variant with the same edit stored; its reads are byte-checked against its own
tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl

POSITIONS = ("first", "last")  # the edited token of block 0


def variant_tokens(tokens: Any, L: int, n: int, p: int) -> np.ndarray:
    """The chain's first ``n`` tokens with block 0's first (``p == 0``) or last token changed."""
    out = np.array(tokens[:n], dtype=np.int64)
    at = 0 if p == 0 else L - 1
    out[at] = (out[at] + 1 + p) % 1000 + 1
    return out


def use_or_give_up(h: Any, req: Any) -> Any:
    """``use`` of a request outside the chain (a variant, another namespace's).  Its hit
    (blocks it stored earlier, offloaded since) may wait on loads the manual pipelines run only
    when driven: its own jobs (none is on a chain block) are driven to their end, as an engine
    would before using it, so the call, like ``foreign``'s mapping (``ROOM*``), leaves neither
    a request nor a job behind; ``None`` (the request given up) if it still waits."""
    from kvstate.impl.errors import NotReady
    from kvstate.targets.api.faults import _jobs, _step_job

    chain = set(h.rids)
    for _ in range(10_000):
        try:
            return h.cache.use(req)
        except NotReady:
            own = [(e, j) for e, j in _jobs(h) if j.rid not in chain]
            if not own:
                break
            for e, j in own:
                _step_job(h, e, j)
            h.cov.add("check: requests outside the chain waiting on their own recovery")
    h.cache.abort(req)
    h.cache.forget(req)
    return None


def read_outside_chain(h: Any, req: Any, want: np.ndarray, what: str) -> bool:
    """``use`` a request outside the chain, check every byte it reads against ``want`` (a
    ``data`` finding naming ``what``), then forget it; ``False`` if it was given up (see
    :func:`use_or_give_up`), when nothing was read and nothing of it is stored."""
    from kvstate.testing.datacheck import verify_run

    ctx = use_or_give_up(h, req)
    if ctx is None:
        return False
    with ctx as run:
        problems = verify_run(run, want)
        h.cov.add("reads checked")
        if problems:
            raise h.fail(
                "data",
                [problems[0].split(":")[0]],
                f"{what} reads wrong bytes:\n  " + "\n  ".join(problems),
            )
    h.cache.forget(req)
    h.outside_req = req  # (kvstate/targets/api/storeroom.py)
    return True


def do_variant(h: Any, o: Any) -> int | None:
    from kvstate.targets.api.base import NAMESPACE

    p, n = o.arg("p") % len(POSITIONS), o.arg("n")
    want = variant_tokens(h.tokens, h.L, n, p)
    req = h.cache.request(want.copy(), namespace=NAMESPACE, lifetime=1)
    adm = h.cache.admit(req)
    assert req.slot is not None
    h.foreign_slot = req.slot.index
    h.cov.add("check: requests differing early, agreeing later")
    if adm.hit_tokens and p not in h.variants_stored:
        raise h.fail(
            "prefix-identity",
            ["hit"],
            f"a prompt whose block 0 differs from the chain's at its {POSITIONS[p]} token (and "
            f"agrees after it), where no such prompt was stored, hit {adm.hit_tokens} tokens",
        )
    if read_outside_chain(h, req, want, "a prompt differing early"):
        h.variants_stored.add(p)
    return None


# a prompt sharing no block with the chain (kvstate/targets/api/declare.py: the form)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "variant",
        do_variant,
        "foreign",
        lambda s: {"p": st.integers(0, 1), "n": st.sampled_from([2 * s.L + 1, s.N * s.L + 1])},
    ),
)
