"""The writer protocol: what the cache calls to fill a stored block's pages.

In a serving engine the model's forward pass writes every group's pages (compressed KV, indexer
keys, SWA window, compressor state) through its own kernels: the bytes are the caller's, and the
cache only tracks them.  That is the production default, :data:`ENGINE_WRITES` (``None``: the
cache writes no page; storing a block does not derive its indexer pages either unless asked).
A :class:`Writer` is for a cache that fills pages itself: the test content of
:class:`kvstate.impl.testdata.DeterministicWriter` (every byte a function of its position and
token, so a restored block can be checked exactly), or an engine adapter that hands over rows
its model computed (``numerics/``'s ``ModelWriter``).
"""

from __future__ import annotations

from typing import Final, Protocol

import torch


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


# the production default: the engine's kernels write the pages (the caller's bytes)
ENGINE_WRITES: Final[Writer | None] = None
