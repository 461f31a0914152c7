"""The production writer: a chain stored through :class:`~kvstate.impl.writer.HandedRows`.

Every other example's cache is built with the test writer (``DeterministicWriter``: the cache
asks it for any row and it computes one), so the cache's default writer -- which stores only the
rows its caller handed over (``HandedRows.hand``) and refuses to make one up -- is never on the
request path the fuzz drives.  ``handed(k)``, an example's first operation (a no-op anywhere
else, like ``geometry``), rebuilds the example's cache with a ``HandedRows`` writer; then
:class:`HandRows` plays the engine's forward pass: before each call that may store a request's
blocks (``use``'s end at ``finish``, ``append``) it hands that request's rows on this thread, as
the writer's contract lays them out (per group, its layers' rows at the group's positions) with
the content the test writer would compute from the request's *own* tokens, and forgets them
after the call (``HandedRows.handing``).  So every byte check of the harness holds unchanged: a
row kept at the wrong position, one handed for another request, a stacked copy of the wrong
layers, or a store that reads past what was handed shows as a byte difference or a
``WriterFailed`` the model does not explain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.args import SAME, run_case
from kvstate.targets.api.base import CallCheck, op
from kvstate.targets.api.declare import OpDecl

Step = tuple[str, dict[str, int]]


def forward(g: Any, tokens: np.ndarray) -> dict[str, tuple[int, torch.Tensor]]:
    """What an engine's forward pass over ``tokens`` hands (``HandedRows``'s layout): group ->
    (start, rows), with the test writer's content (``kvstate.impl.testdata``)."""
    from kvstate.impl.testdata import expected_rows, expected_state_rows

    n = len(tokens)
    tok = torch.tensor(np.asarray(tokens), dtype=torch.int64)
    kinds = list(g.layers)
    out: dict[str, tuple[int, torch.Tensor]] = {}
    for name, ratio in (("csa", g.csa_ratio), ("hca", g.hca_ratio)):
        layers = torch.tensor([i for i, k in enumerate(kinds) if k == name], dtype=torch.int64)
        pos = torch.arange(n // ratio, dtype=torch.int64)
        out[name] = (
            0,
            expected_rows(name, layers, pos, tok[ratio - 1 :: ratio][: len(pos)], g.entry_bytes),
        )
    every = torch.arange(len(kinds), dtype=torch.int64)
    out["swa"] = (0, expected_rows("swa", every, torch.arange(n), tok, g.entry_bytes))
    csa = torch.tensor([i for i, k in enumerate(kinds) if k == "csa"], dtype=torch.int64)
    out["compressor"] = (0, expected_state_rows(csa, torch.arange(n), tok, 2 * g.head_dim))
    return out


class HandRows(CallCheck):
    """The engine's side of ``HandedRows``: the acting request's rows handed before a call
    that may store, forgotten after it."""

    _STORES = ("use", "finish", "append", "foreign", "variant")

    def __init__(self) -> None:
        self.handing: Any = None

    def _writer(self, h: Any) -> Any:
        from kvstate.impl.writer import HandedRows

        w = h.view.writer
        return w if isinstance(w, HandedRows) else None

    def before(self, h: Any, o: Any) -> None:
        w = self._writer(h) if o.name in self._STORES else None
        # ``foreign``: a whole request over the harness's first ``n`` tokens (another namespace);
        # ``variant``: one over a prompt differing early (kvstate/targets/api/prefix.py)
        whole = o.name in ("foreign", "variant")
        lv = h.live[o.arg("i")] if w is not None and not whole else None
        if w is None or (lv is None and not whole):
            return
        n = o.arg("n") if lv is None else len(lv.req.tokens)
        if o.name == "append":
            n = min(n + o.arg("k") * h.scale, len(h.tokens))
        tokens = h.tokens[:n]
        if o.name == "variant":
            from kvstate.targets.api.prefix import POSITIONS, variant_tokens

            tokens = variant_tokens(h.tokens, h.L, n, o.arg("p") % len(POSITIONS))
        self.handing = w.handing()
        self.handing.__enter__()
        for group, (start, rows) in forward(h.table.geometry, tokens).items():
            w.hand(group, start, rows)
        h.cov.add("check: stores from rows handed (HandedRows)")

    def _done(self) -> None:
        if self.handing is not None:
            self.handing.__exit__(None, None, None)
            self.handing = None

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        w = self.handing
        self._done()
        if w is not None and self._writer(h).held():
            raise h.fail("handed-rows", [o.name], "rows handed inside handing() were kept")

    def refused(self, h: Any, o: Any) -> None:
        self._done()


def do_handed(h: Any, o: Any) -> int | None:
    from kvstate.impl.writer import HandedRows

    if any(s.name not in ("pools", "geometry") for s in h.steps[:-1]):
        h.call_override = "read"  # a running cache keeps its writer
        return None
    steps, cov, threads, kw = h.steps, h.cov, h.threads, dict(h.cache_kwargs)
    h.close()
    h.renew(h.table, threads=threads, coverage=cov, cache_kwargs={**kw, "writer": HandedRows()})
    h.steps = steps
    h.cov.add("check: examples on the production writer")
    return None


def _fresh(h: Any, call: Callable[[Any], Any]) -> Any:
    """``call(cache)`` on a new cache over a new directory, with the default writer."""
    import os
    import tempfile

    from kvstate.impl.cache import HeterogeneousKVCache

    d = tempfile.mkdtemp(prefix="kvstate-handed-")
    try:
        with HeterogeneousKVCache(table=h.table, cache_dir=d, executors="manual") as c:
            return call(c)
    finally:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)


def _unhanded(h: Any, misshapen: str | None = None) -> Any:
    """A request used without handing its rows, on the default writer: ``WriterFailed`` (its
    cause ``RowsNotHanded``), nothing pinned, nothing stored (the same request hits nothing).
    With ``misshapen``, every group's rows are handed but that group's one byte too narrow
    (the writer's contract: ``[layers, n, entry_bytes]``): the same failure."""
    from kvstate.impl.errors import WriterFailed
    from kvstate.impl.writer import HandedRows, RowsNotHanded

    toks = h.tokens[: 2 * h.L + 1]

    def call(c: Any) -> Any:
        got: list[Any] = []
        w = c.inspect().writer
        got.append(isinstance(w, HandedRows))
        adm = c.admit(c.request(toks))
        try:
            with w.handing(), c.use(adm):
                if misshapen is not None:
                    for group, (start, rows) in forward(h.table.geometry, toks).items():
                        w.hand(group, start, rows[:, :, :-1] if group == misshapen else rows)
            got.append("stored")
        except WriterFailed as exc:
            got.append(type(exc.__cause__).__name__)
        again = c.admit(c.request(toks))
        got += [
            adm.request.slot is None,
            c.stats()["pinned_blocks"] - len(again.pins),
            again.hit_tokens,
        ]
        c.abort(again.request)
        return got, [True, RowsNotHanded.__name__, True, 0, 0]

    return _fresh(h, call)


def _hand(*args: Any, **kw: Any) -> Callable[[Any], Any]:
    def call(h: Any) -> Any:
        from kvstate.impl.writer import HandedRows

        w = HandedRows()
        try:
            w.hand(*args, **kw)
        finally:
            if w.held():
                raise h.fail("handed-rows", ["hand"], f"hand{args} refused yet kept rows")

    return call


def _u8(*shape: int) -> Any:
    return torch.zeros(shape, dtype=torch.uint8)


# the writer's documented refusals (InvalidArgument, nothing kept) and its failure on a store
WRITER_CASES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    (
        "HandedRows(fmt=99)",
        "InvalidArgument",
        lambda h: __import__("kvstate.impl.writer", fromlist=["HandedRows"]).HandedRows(fmt=99),
    ),
    (
        "HandedRows(fmt=True)",
        "InvalidArgument",
        lambda h: __import__("kvstate.impl.writer", fromlist=["HandedRows"]).HandedRows(fmt=True),
    ),
    ("hand('', 0, rows)", "InvalidArgument", _hand("", 0, _u8(1, 2, 3))),
    ("hand(5, 0, rows)", "InvalidArgument", _hand(5, 0, _u8(1, 2, 3))),
    ("hand('swa', -1, rows)", "InvalidArgument", _hand("swa", -1, _u8(1, 2, 3))),
    ("hand('swa', True, rows)", "InvalidArgument", _hand("swa", True, _u8(1, 2, 3))),
    ("hand('swa', 0, 2-D rows)", "InvalidArgument", _hand("swa", 0, _u8(2, 3))),
    ("hand('swa', 0, a list)", "InvalidArgument", _hand("swa", 0, [[[0]]])),
    ("hand('swa', 0, float32 rows)", "InvalidArgument", _hand("swa", 0, torch.zeros(1, 2, 3))),
    ("hand('compressor', 0, uint8 rows)", "InvalidArgument", _hand("compressor", 0, _u8(1, 2, 3))),
    ("a use whose rows were not handed", SAME, _unhanded),
    ("a use whose swa rows were handed too narrow", SAME, lambda h: _unhanded(h, "swa")),
)


def do_refuse_writer(h: Any, o: Any) -> int | None:
    return run_case(h, *WRITER_CASES[o.arg("k") % len(WRITER_CASES)])


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    """Witness: through HandedRows, a chain stored, appended, taken to disk, restored, hit, read."""
    full = N * L + 1
    return {
        "the production writer: a chain handed, stored, spilled, restored and hit": [
            op("handed", k=1),
            op("request", i=0, n=full - L, life=1),
            op("admit", i=0),
            op("use", i=0),
            op("append", i=0, k=L),
            op("read", i=0),
            op("finish", i=0),
            op("tick", t=lease_max),
            op("offload", n=N),
            op("drain"),
            op("spill", n=N),
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
            op("finish", i=1),
            *[op("refuse_writer", k=k) for k in range(len(WRITER_CASES))],
        ]
    }


DECLS = (
    OpDecl("handed", do_handed, "read", rule=False),
    OpDecl("refuse_writer", do_refuse_writer, "read", rule=False),
)
