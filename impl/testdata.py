"""Deterministic KV content: every byte is a function of (group, layer, position, token).

Restored blocks, windows and tails can then be checked exactly: a test (or the conformance
adapter) recomputes the expected rows from the positions and tokens alone and compares bytes, so
a block restored from the wrong slot, a window one block late or a tail spliced at the wrong
boundary shows up as a byte mismatch, not as "plausible-looking" data.

The generator is vectorised torch integer arithmetic (a 31-bit multiply-xorshift mix); there is
no per-token Python work.  :class:`DeterministicWriter` implements the writer protocol
(:mod:`kvstate.impl.writer`) with this content: the tests and the conformance fuzzers pass it
to the cache; a serving engine writes its own pages (the protocol's production default).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import torch

from .writer import Writer

__all__ = [
    "DeterministicWriter",
    "Writer",
    "expected_rows",
    "expected_state_rows",
    "harness_tokens",
]

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
        """uint8 ``[len(layers), len(positions), width]``, a function of (group, layer,
        position, token) alone: a byte check recomputes what any block should hold."""
        return expected_rows(group, layers, positions, tokens, width)

    def state_rows(
        self, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
    ) -> torch.Tensor:
        """float32 ``[len(layers), len(positions), width]`` compressor rows, likewise a
        function of the inputs alone (the tail splice check recomputes them)."""
        return expected_state_rows(layers, positions, tokens, width)


def expected_rows(
    group: str, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
) -> torch.Tensor:
    """The bytes :class:`DeterministicWriter` writes for these rows."""
    return _kept(("rows", group), layers, positions, tokens, width, compute_rows)


def compute_rows(
    group: str, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
) -> torch.Tensor:
    base = _base(group, layers, positions, tokens)
    step = (_h(base + 0x1234567) | 1).unsqueeze(-1)
    j = torch.arange(width, dtype=torch.int64)
    return ((base.unsqueeze(-1) + j * step) & 255).to(torch.uint8)


def expected_state_rows(
    layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
) -> torch.Tensor:
    """The float32 compressor rows :class:`DeterministicWriter` writes (exact small dyadics)."""
    return _kept(("state rows", "compressor"), layers, positions, tokens, width, compute_state_rows)


def compute_state_rows(
    group: str, layers: torch.Tensor, positions: torch.Tensor, tokens: torch.Tensor, width: int
) -> torch.Tensor:
    base = _base(group, layers, positions, tokens)
    step = (_h(base + 0x7654321) | 1).unsqueeze(-1)
    j = torch.arange(width, dtype=torch.int64)
    return ((base.unsqueeze(-1) + j * step) & 1023).to(torch.float32) / 64.0 - 8.0


_KEPT: OrderedDict[tuple[object, ...], torch.Tensor] = OrderedDict()
_KEPT_MAX = 4096  # row blocks kept; the least recently asked is forgotten first
# ... and their bytes: a small geometry's row block is a few KiB, but one DeepSeek-V4-Flash
# block's window rows are 6.1 MiB: 4096 of them (a 1M-token prefix's writes) held 25 GiB
_KEPT_BYTES = 256 * 2**20
_kept_bytes = 0
_KEPT_LOCK = threading.Lock()


def _key(t: torch.Tensor) -> tuple[object, ...] | None:
    if t.device.type != "cpu" or t.requires_grad:
        return None
    return (str(t.dtype), tuple(t.shape), t.contiguous().numpy().tobytes())


def answer_kept_max() -> int:
    """Bytes of the largest answer the memo keeps (a sixteenth of its bound; a bigger one is
    computed each time, never kept)."""
    return _KEPT_BYTES // 16


def _kept(
    kind: tuple[str, str],
    layers: torch.Tensor,
    positions: torch.Tensor,
    tokens: torch.Tensor,
    width: int,
    compute: Callable[[str, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor],
) -> torch.Tensor:
    """The rows, computed once per exact input and handed out as a fresh copy.

    The content is a pure function of its inputs, and the conformance fuzzers ask for the same
    rows again and again (the writer stores a block, the byte checks recompute what every read
    must return): one ``ci`` run of the API fuzz spent a seventh of its time in ``_h``.  The
    key is the inputs' exact bytes with their dtype and shape (equal bytes of another dtype or
    shape are other values); a caller may write into what it gets: each answer is a clone.
    """
    parts = [_key(t) for t in (layers, positions, tokens)]
    if any(p is None for p in parts):
        return compute(kind[1], layers, positions, tokens, width)
    key = (*kind, *parts, int(width))
    with _KEPT_LOCK:  # writers on pipeline threads and the checker share it
        got = _KEPT.get(key)
        if got is not None:
            _KEPT.move_to_end(key)
    if got is None:
        got = compute(kind[1], layers, positions, tokens, width)
        size = got.numel() * got.element_size()
        if size <= answer_kept_max():  # (a bigger answer is computed each time, never kept)
            global _kept_bytes
            with _KEPT_LOCK:
                old = _KEPT.pop(key, None)  # (another thread kept it meanwhile)
                if old is not None:
                    _kept_bytes -= old.numel() * old.element_size()
                _KEPT[key] = got
                _kept_bytes += size
                while len(_KEPT) > _KEPT_MAX or _kept_bytes > _KEPT_BYTES:
                    _, gone = _KEPT.popitem(last=False)
                    _kept_bytes -= gone.numel() * gone.element_size()
    return got.clone()


_TOKENS: dict[tuple[int, int], np.ndarray] = {}


def memo_stats() -> tuple[int, int, int]:
    """(row blocks kept, bytes the memo counts, bytes the kept tensors hold): the memo's bound
    is checked against the last two being equal and at most the bound."""
    with _KEPT_LOCK:
        held = sum(t.numel() * t.element_size() for t in _KEPT.values())
        return len(_KEPT), _kept_bytes, held


def harness_tokens(n: int, seed: int = 0) -> np.ndarray:
    """A deterministic token sequence of length ``n`` (the conformance harness's prefix chain).

    A fresh array each call (callers edit theirs: the engine's reused buffer), copied from one
    computed once per ``(n, seed)``: the block fuzz asks for it at every step's byte check."""
    key = (int(n), int(seed))
    got = _TOKENS.get(key)
    if got is None:
        i = np.arange(n, dtype=np.int64)
        got = (i * 7919 + 104_729 * (seed + 1) + (i * i) % 97) % 50_000
        got.flags.writeable = False
        if len(_TOKENS) >= 64:
            _TOKENS.clear()
        _TOKENS[key] = got
    return got.copy()
