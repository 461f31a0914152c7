"""Deterministic KV content: every byte is a function of (group, layer, position, token).

Restored blocks, windows and tails can then be checked exactly: a test (or the conformance
adapter) recomputes the expected rows from the positions and tokens alone and compares bytes, so
a block restored from the wrong slot, a window one block late or a tail spliced at the wrong
boundary shows up as a byte mismatch, not as "plausible-looking" data.

The generator is vectorised torch integer arithmetic (a 31-bit multiply-xorshift mix); there is
no per-token Python work.  :class:`DeterministicWriter` implements the writer protocol the cache
uses to fill pages when it stores a block; an engine plugs in its own writer (its forward pass).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

GROUP_IDS: dict[str, int] = {"csa": 1, "hca": 2, "indexer": 3, "swa": 4, "compressor": 5}
_M31 = 0x7FFFFFFF


def _h(x: torch.Tensor) -> torch.Tensor:
    """31-bit integer mix; inputs and every intermediate product stay below 2**62."""
    x = x & _M31
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & _M31
    x = ((x ^ (x >> 12)) * 0x297A2D39) & _M31
    return x ^ (x >> 15)


def _base(
    group: str, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    gid = GROUP_IDS.get(group, 0)
    t = _h(tokens.to(torch.int64) + 0x51ED27)
    p = _h(positions.to(torch.int64) * 1_000_003 + t)
    lay = layers.to(torch.int64).view(-1, 1)
    return _h(p.view(1, -1) + lay * 7919 + gid * 104_729)  # [layers, n]


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


class DeterministicWriter:
    """The test writer: content from (group, layer, position, token) only, in the geometry's
    primary block form (``fmt``: the :class:`kvstate.spec.phases.Fmt` it produces)."""

    fmt = 0  # Fmt.PRIMARY

    def rows(
        self,
        group: str,
        layers: torch.Tensor,
        positions: torch.Tensor,
        tokens: torch.Tensor,
        width: int,
    ) -> torch.Tensor:
        return expected_rows(group, layers, positions, tokens, width)

    def state_rows(
        self, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
    ) -> torch.Tensor:
        return expected_state_rows(layers, positions, tokens, width)


def expected_rows(
    group: str, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
) -> torch.Tensor:
    """The bytes :class:`DeterministicWriter` writes for these rows."""
    base = _base(group, layers, positions, tokens)
    step = (_h(base + 0x1234567) | 1).unsqueeze(-1)
    j = torch.arange(width, dtype=torch.int64)
    return ((base.unsqueeze(-1) + j * step) & 255).to(torch.uint8)


def expected_state_rows(
    layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
) -> torch.Tensor:
    """The float32 compressor rows :class:`DeterministicWriter` writes (exact small dyadics)."""
    base = _base("compressor", layers, positions, tokens)
    step = (_h(base + 0x7654321) | 1).unsqueeze(-1)
    j = torch.arange(width, dtype=torch.int64)
    return ((base.unsqueeze(-1) + j * step) & 1023).to(torch.float32) / 64.0 - 8.0


def harness_tokens(n: int, seed: int = 0) -> np.ndarray:
    """A deterministic token sequence of length ``n`` (the conformance harness's prefix chain)."""
    i = np.arange(n, dtype=np.int64)
    return (i * 7919 + 104_729 * (seed + 1) + (i * i) % 97) % 50_000
