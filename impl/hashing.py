"""Chained prefix hashes per LCM block, salted with a namespace.

Block ``k``'s key is ``blake2b(key[k-1] || tokens[kL:(k+1)L])`` with ``key[-1]`` derived from the
namespace (a tenant salt, a LoRA id), so two tenants with the same tokens never share an entry by
accident, and a block's key names its whole prefix (a hit on block ``k`` implies the tokens of
every earlier block match).  Keys are stable across processes (no ``hash()`` randomisation), which
is what lets a restarted cache find its disk entries again.  Hashing is one C call per block over
the block's token bytes; there is no per-token Python work.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from .args import text
from .errors import InvalidArgument

KEY_BYTES: Final = 16
MAX_TOKEN_ID: Final = 2**40  # anything larger is not a token id, it is a bug upstream


def namespace_root(namespace: Any) -> bytes:
    return hashlib.blake2b(
        b"kvstate/chain/v1\0" + text("namespace", namespace).encode(), digest_size=KEY_BYTES
    ).digest()


def as_tokens(tokens: Any, *, max_len: int) -> np.ndarray:
    """Tokens as a read-only little-endian int64 array of the library's own; rejects what
    cannot be a prompt.  Always a copy: keys are computed now and pages are written later from
    these tokens, so a caller that reuses its buffer (an engine's ``input_ids``) must not change
    what is stored under the keys; and the caller's array is never made read-only."""
    if isinstance(tokens, np.ndarray):
        arr = tokens
    else:
        try:
            import torch

            if isinstance(tokens, torch.Tensor):
                if tokens.is_meta or tokens.is_complex() or tokens.is_floating_point():
                    raise TypeError(f"a {tokens.dtype} tensor on {tokens.device}")
                arr = tokens.detach().cpu().numpy()
            else:
                arr = np.asarray(tokens)
        except (TypeError, ValueError, RuntimeError, NotImplementedError, OverflowError) as exc:
            raise InvalidArgument(f"tokens must be a 1-D sequence of ints: {exc}") from None
    if arr.ndim != 1:
        raise InvalidArgument(f"tokens must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidArgument(f"tokens must be integers, got dtype {arr.dtype}")
    if arr.size > max_len:
        raise InvalidArgument(f"{arr.size} tokens exceed max_model_len {max_len}")
    out = np.array(arr, dtype="<i8", order="C", copy=True)
    if out.size and (int(out.min()) < 0 or int(out.max()) >= MAX_TOKEN_ID):
        raise InvalidArgument("token ids must be in [0, 2**40)")
    out.flags.writeable = False
    return out


def extend_keys(
    parent: bytes, tokens: np.ndarray, block_tokens: int, first_block: int, count: int
) -> list[bytes]:
    """Keys of blocks ``first_block .. first_block + count - 1`` given the key before them."""
    out: list[bytes] = []
    mv = tokens.data.cast("B")
    width = block_tokens * 8
    h = parent
    blake = hashlib.blake2b
    for k in range(first_block, first_block + count):
        h = blake(h + mv[k * width : (k + 1) * width], digest_size=KEY_BYTES).digest()
        out.append(h)
    return out


class Chain:
    """The block keys of one token sequence in one namespace (grows with :meth:`extend`)."""

    __slots__ = ("namespace", "block_tokens", "root", "keys", "tokens")

    def __init__(self, tokens: np.ndarray, block_tokens: int, namespace: str = "") -> None:
        self.namespace = namespace
        self.block_tokens = block_tokens
        self.root = namespace_root(namespace)
        self.tokens = tokens
        self.keys: list[bytes] = extend_keys(
            self.root, tokens, block_tokens, 0, len(tokens) // block_tokens
        )

    @property
    def blocks(self) -> int:
        """Full LCM blocks (only those have keys: a partial block is never cached)."""
        return len(self.keys)

    def extend(self, tokens: np.ndarray) -> Sequence[bytes]:
        """Adopt a longer token sequence with this one as its prefix; returns the new keys."""
        n_old = len(self.keys)
        self.tokens = tokens
        add = len(tokens) // self.block_tokens - n_old
        if add <= 0:
            return []
        parent = self.keys[-1] if self.keys else self.root
        new = extend_keys(parent, tokens, self.block_tokens, n_old, add)
        self.keys.extend(new)
        return new

    def block_tokens_of(self, k: int) -> np.ndarray:
        L = self.block_tokens
        return self.tokens[k * L : (k + 1) * L]
