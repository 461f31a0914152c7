"""The writer protocol: what the cache calls to fill a stored block's pages, and the writer a
serving engine uses.

A stored block's pages hold the rows its request's forward pass computed: per layer of each
group, one row per compressed entry (CSA, HCA), per token (SWA) and the compressor's float32
state rows at the block's end.  :class:`HandedRows`, the cache's default, stores exactly the
rows its caller handed over (:meth:`HandedRows.hand`) and nothing else: no synthetic content,
and a block whose rows were not handed is not stored (the cache raises ``WriterFailed``).  With
``writer=None`` (:data:`ENGINE_WRITES`) the engine's own kernels write the pages in place and
the cache only tracks them.  Tests pass :class:`kvstate.impl.testdata.DeterministicWriter`
(every byte a function of its position and token, so a restored block is checked exactly); an
engine adapter may pass its own :class:`Writer` (``numerics/``'s ``ModelWriter``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Final, Protocol

import torch

from kvstate.spec.phases import Fmt

from .errors import InvalidArgument
from .phasecodes import FMT_PRIMARY


class Writer(Protocol):
    """What the cache calls to fill a block's pages with content.  A writer may also have an
    ``fmt`` attribute: the ``Fmt`` of the blocks it writes (default: the primary form)."""

    def rows(
        self,
        group: str,
        layers: torch.Tensor,
        positions: torch.Tensor,
        tokens: torch.Tensor,
        width: int,
    ) -> torch.Tensor:
        """uint8 ``[len(layers), len(positions), width]``."""
        ...

    def state_rows(
        self, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
    ) -> torch.Tensor:
        """float32 ``[len(layers), len(positions), width]`` (compressor kv|score rows)."""
        ...


# the engine's kernels write the pages in place (the caller's bytes): the cache writes none
ENGINE_WRITES: Final[Writer | None] = None

# the group whose rows are the compressor's float32 state (every other group's: KV bytes)
_STATE: Final = "compressor"


class RowsNotHanded(LookupError):
    """The cache asked :class:`HandedRows` for rows its caller did not hand over (or handed in
    another shape): the block is not stored, and the cache raises ``WriterFailed`` with this as
    its cause (a writer's failure, not one of the cache's own errors)."""


class HandedRows:
    """The production writer: a stored block's pages are the rows its caller handed over.

    The engine runs the request's forward pass inside ``with cache.use(adm)`` and hands each
    group's rows to the writer with :meth:`hand`; the cache stores the request's blocks from
    them when the block exits (and at each ``append`` that completes one):

    * ``"csa"``, ``"hca"``: uint8 ``[layers, n, entry_bytes]``, position ``start + i`` the
      compressed entry that covers tokens up to ``(start + i + 1) * ratio - 1``;
    * ``"swa"``: uint8 ``[layers, n, entry_bytes]``, one row per token position;
    * ``"compressor"``: float32 ``[layers, n, 2 * head_dim]`` (kv | score), one row per token
      position (the cache reads the last ``csa_ratio`` before each stored block's end).

    ``layers`` are the model's layers of the group's kind, in order; the indexer's pages are
    derived from the CSA rows (``derive_index``).  Positions are a request's own, so rows are
    kept per thread, for the request that thread serves: ``with rows.handing():`` around the
    ``use`` block forgets them when it ends (:meth:`clear` does it at any time).  A store that
    asks for a row that was not handed raises :class:`RowsNotHanded` and stores nothing of that
    block; :meth:`hand` refuses a malformed argument with ``InvalidArgument`` and keeps nothing
    of it.
    """

    def __init__(self, fmt: int = FMT_PRIMARY) -> None:
        if type(fmt) is not int or fmt not in {f.value for f in Fmt}:
            raise InvalidArgument(f"fmt must be a Fmt value, got {fmt!r}")
        self.fmt = fmt  # the stored form of the rows handed (Writer's ``fmt``)
        self._local = threading.local()

    def _kept(self) -> dict[tuple[str, int], torch.Tensor]:
        kept: dict[tuple[str, int], torch.Tensor] | None = getattr(self._local, "rows", None)
        if kept is None:
            kept = self._local.rows = {}
        return kept

    def hand(self, group: str, start: int, rows: torch.Tensor) -> None:
        """Keep ``rows[:, i]`` as ``group``'s rows at position ``start + i`` (replacing any
        kept there): uint8 rows for a KV group, float32 for ``"compressor"``."""
        if not isinstance(group, str) or not group:
            raise InvalidArgument(f"group must be a group's name, got {group!r}")
        if type(start) is not int or start < 0:
            raise InvalidArgument(f"start must be an int >= 0, got {start!r}")
        if not isinstance(rows, torch.Tensor) or rows.dim() != 3:
            raise InvalidArgument("rows must be a 3-D tensor [layers, positions, width]")
        want = torch.float32 if group == _STATE else torch.uint8
        if rows.dtype != want:
            raise InvalidArgument(f"{group} rows must be {want}, got {rows.dtype}")
        copied = rows.detach().to("cpu", copy=True)  # the caller may reuse its buffer at once
        kept = self._kept()
        for i in range(copied.shape[1]):
            kept[group, start + i] = copied[:, i]

    def held(self) -> int:
        """Rows this thread handed and still keeps."""
        return len(self._kept())

    def clear(self) -> None:
        """Forget the rows this thread handed."""
        self._kept().clear()

    @contextlib.contextmanager
    def handing(self) -> Iterator[HandedRows]:
        """Rows handed inside the block are forgotten when it ends (put it around ``use``)."""
        try:
            yield self
        finally:
            self.clear()

    def _get(self, group: str, layers: torch.Tensor, positions: torch.Tensor, width: int) -> Any:
        kept = self._kept()
        at = [int(p) for p in positions.tolist()]
        missing = [p for p in at if (group, p) not in kept]
        if missing:
            raise RowsNotHanded(
                f"no {group} rows handed at positions {missing[:4]}"
                f"{'...' if len(missing) > 4 else ''} (HandedRows.hand, on this thread)"
            )
        shape = (len(layers), width)
        bad = [p for p in at if tuple(kept[group, p].shape) != shape]
        if bad:
            got = tuple(kept[group, bad[0]].shape)
            raise RowsNotHanded(f"{group} rows at position {bad[0]} are {got}, not {shape}")
        if not at:  # pragma: no cover: a stored block asks for >= 1 position of every group
            want = torch.float32 if group == _STATE else torch.uint8
            return torch.empty(len(layers), 0, width, dtype=want)
        return torch.stack([kept[group, p] for p in at], dim=1)

    def rows(
        self,
        group: str,
        layers: torch.Tensor,
        positions: torch.Tensor,
        tokens: torch.Tensor,
        width: int,
    ) -> torch.Tensor:
        """The handed uint8 rows ``[len(layers), len(positions), width]`` (``tokens``: unused,
        the rows are what the caller computed for them)."""
        out: torch.Tensor = self._get(group, layers, positions, width)
        return out

    def state_rows(
        self, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
    ) -> torch.Tensor:
        """The handed float32 compressor rows ``[len(layers), len(positions), width]``."""
        out: torch.Tensor = self._get(_STATE, layers, positions, width)
        return out
