"""The harness's byte checks: a read of a running request against the content derived from
the request's own tokens (a copy the harness keeps, :mod:`kvstate.testing.datacheck`), and
every reader of a :class:`~kvstate.impl.cache.Run` whose pins are gone refusing with a
documented error (one that still answers may serve someone else's blocks)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from kvstate.targets.api.base import Harness


def check_bytes(h: Harness, run: Any, want: np.ndarray, who: str) -> None:
    from kvstate.testing.datacheck import verify_run

    problems = verify_run(run, want)
    n = run.hit_tokens
    if n:
        g = h.view.geometry
        per_tok = sum(len(g.layers) * g.entry_bytes for _ in (0,))
        h.cov.add("bytes compared", int(n * per_tok + g.n_win * g.entry_bytes * len(g.layers)))
        if any(b in h.restored for b in range(run.blocks)):
            h.cov.add("reads over restored blocks")
    h.cov.add("reads checked")
    if problems:
        raise h.fail(
            "data",
            [re.sub(r":.*", "", p) for p in problems][:1],
            f"{who} reads wrong bytes:\n  " + "\n  ".join(problems),
        )


def read_released(h: Harness, i: int) -> None:
    from kvstate.impl.errors import KVStateError

    got = h.released[i]
    if got is None:
        return
    run, want = got
    if run.hit_tokens == 0:
        return  # a run without a hit reads no pages: nothing to serve after release
    h.cov.add("fault read_after_release")
    L = h.view.geometry.lcm_tokens
    # every reader a Run has: each must refuse with a documented error (one that still
    # answers serves a block table, pages or a view of blocks that may be someone else's)
    readers: list[tuple[str, Callable[[], Any]]] = [
        ("read_compressed", lambda: run.read_compressed("csa", 0)),
        ("read_window", lambda: run.read_window(0)),
        ("read_tail", lambda: run.read_tail(0)),
        ("block_table", run.block_table),
        ("prefix", lambda: run.prefix(L)),
    ]
    for name, read in readers:
        try:
            got = read()
        except KVStateError:
            continue  # documented: the pins are gone
        except Exception as exc:  # noqa: BLE001 - an undocumented error is a finding too
            raise h.fail(
                "read-after-release",
                [type(exc).__name__],
                f"{name} after release raised {type(exc).__name__}: {exc} (not a KVStateError)",
            ) from exc
        from kvstate.testing.datacheck import verify_run

        wrong = verify_run(run, want) if name == "read_compressed" else []
        shape = tuple(got.shape) if hasattr(got, "shape") else type(got).__name__
        raise h.fail(
            "read-after-release",
            ["served"],
            f"a Run whose pins were released still answers {name} ({shape}"
            + (f"; wrong bytes: {wrong[0]}" if wrong else "")
            + "): it must raise a documented error",
        )
