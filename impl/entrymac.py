"""What the disk tier and the remote tier share: an entry's chunking and its keyed MACs.

An offloaded block is stored as one entry, wherever it lives: a header (the block's chained key,
a per-entry nonce, one MAC per load chunk and one for the SWA section) and a payload cut into the
table's ``load_steps`` chunks.  Every MAC is keyed BLAKE3 under a key derived from the tier's key
with a context string per domain (header, chunk, name, key id), so a header MAC is never a chunk
MAC, and a disk entry's MACs are never a remote entry's (each tier names its own contexts).  A
chunk's MAC covers the block's key, the nonce, the chunk's index and byte range, and its bytes:
chunks of two entries (two writers of one prefix), of another key (another namespace's prefix)
or of another layout fail it.  One module, so both tiers cut and authenticate entries the same
way (:mod:`kvstate.impl.disk` for files, :mod:`kvstate.impl.remote` for a shared store).
"""

from __future__ import annotations

import hmac
import secrets
import struct
from dataclasses import dataclass
from typing import Any

import torch
from blake3 import blake3

KEY_ID_BYTES = 16
STEM_HEX = 32  # the keyed hash of the block's key, in hex digits


@dataclass(frozen=True)
class Contexts:
    """A tier's BLAKE3 key-derivation contexts, one per domain."""

    header: str
    chunk: str
    name: str
    key_id: str


class EntryMacs:
    """The keyed MACs of one tier's entries, derived once from its key (each MAC copies the
    keyed state)."""

    def __init__(self, key: bytes, ctx: Contexts) -> None:
        self._header = blake3(key=blake3(key, derive_key_context=ctx.header).digest())
        self._chunk = blake3(key=blake3(key, derive_key_context=ctx.chunk).digest())
        self._name = blake3(key=blake3(key, derive_key_context=ctx.name).digest())
        self.key_id = blake3(key, derive_key_context=ctx.key_id).digest(KEY_ID_BYTES)

    def header_mac(self, hb: bytes) -> bytes:
        h = self._header.copy()
        h.update(self.key_id)
        h.update(hb)
        return h.digest()

    def chunk_mac(
        self, key: bytes, nonce: bytes, index: int, lo: int, hi: int, *data: bytes | memoryview
    ) -> bytes:
        """One pass over the chunk's buffers (``blake3`` releases the GIL on long ones)."""
        h = self._chunk.copy()
        h.update(struct.pack("<I", len(key)))
        h.update(key)
        h.update(nonce)
        h.update(struct.pack("<qqq", index, lo, hi))
        for d in data:
            h.update(d)
        return h.digest()

    def verify(
        self, key: bytes, nonce: bytes, index: int, lo: int, hi: int, mac: bytes, data: Any
    ) -> bool:
        """Whether ``data`` carries ``mac`` (constant-time comparison)."""
        return hmac.compare_digest(self.chunk_mac(key, nonce, index, lo, hi, data), mac)

    def stem(self, key: bytes) -> str:
        """The keyed hash of a block's key that names its entries (nobody without the tier's
        key can compute it, nor tell from a listing which prompts are cached)."""
        h = self._name.copy()
        h.update(key)
        return h.hexdigest(STEM_HEX // 2)


@dataclass
class Encoded:
    """An entry's payload cut into chunks and MAC'd (nothing written yet)."""

    nonce: bytes
    parts: list[memoryview]  # the payload's buffers in order (the tensors' own bytes)
    sizes: list[int]  # each unit's bytes
    chunks: list[list[Any]]  # per load chunk: [unit lo, unit hi, byte lo, byte hi, MAC hex]
    swa_section: list[Any] | None  # [byte lo, byte hi, MAC hex] or None


def encode(
    macs: EntryMacs,
    key: bytes,
    units: list[tuple[str, int, torch.Tensor]],
    swa_data: torch.Tensor | None,
    load_steps: int,
) -> Encoded:
    """Cut the units into ``load_steps`` chunks (unit ``c*n//steps`` to ``(c+1)*n//steps``) and
    MAC each, and the SWA section after them, under a fresh nonce."""
    flat = [t.reshape(-1).cpu().contiguous() for _, _, t in units]
    sizes = [int(t.numel()) for t in flat]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    nonce = secrets.token_bytes(16)
    parts: list[memoryview] = [t.numpy().data.cast("B") for t in flat]
    chunks: list[list[Any]] = []
    n = len(units)
    for c in range(load_steps):
        ulo, uhi = c * n // load_steps, (c + 1) * n // load_steps
        blo, bhi = offsets[ulo], offsets[uhi]
        mac = macs.chunk_mac(key, nonce, c, blo, bhi, *parts[ulo:uhi])
        chunks.append([ulo, uhi, blo, bhi, mac.hex()])
    swa_section = None
    if swa_data is not None:
        swa_flat = swa_data.reshape(-1).cpu().contiguous()
        sb = swa_flat.numpy().data.cast("B")
        lo, hi = offsets[-1], offsets[-1] + len(sb)
        swa_section = [lo, hi, macs.chunk_mac(key, nonce, -1, lo, hi, sb).hex()]
        parts.append(sb)
    return Encoded(nonce, parts, sizes, chunks, swa_section)


def header_fields(
    enc: Encoded,
    fmt_version: int,
    fingerprint: dict[str, Any],
    key: bytes,
    units: list[tuple[str, int, torch.Tensor]],
    fields: dict[str, int],
) -> dict[str, Any]:
    """An entry's header (the schema :func:`kvstate.impl.diskheader.parse_header` reads)."""
    return {
        "format": fmt_version,
        "fingerprint": fingerprint,
        "key": key.hex(),
        "nonce": enc.nonce.hex(),
        **fields,
        "units": [[g, layer, size] for (g, layer, _), size in zip(units, enc.sizes, strict=True)],
        "chunks": enc.chunks,
        "swa_section": enc.swa_section,
    }
