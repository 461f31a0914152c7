"""The disk tier: one file per block, written atomically, verified chunk by chunk when loaded.

File layout: a fixed prefix (magic, header length, CRC-32 of the header), a JSON header, then the
payload.  The header carries the file format version, the geometry fingerprint (a file written
for another layout is rejected, not misread), the block's key, content version and stored form
(``Fmt``), the saved tail/window phases, the payload's units, and one checksum per load chunk
(``kernels.block_checksum``) plus one for the SWA section.  Writes go to a temporary file in the
same directory and are published with ``os.replace``, so a reader (or a restarted process) sees
either the whole old file or the whole new one, never a torn write.

A load verifies each chunk as it lands; a mismatch is a load failure (the hit is truncated and
recomputed, never served from garbage: vLLM 52234).  A file whose header is unreadable, from
another format version or another geometry is rejected when the directory is scanned.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvstate.kernels import block_checksum

from .errors import CorruptEntry

FILE_FORMAT = 1
MAGIC = b"KVSTATE\x01"
_PREFIX = struct.Struct("<8sII")  # magic, header length, header crc32
SUFFIX = ".kvb"
_counter = itertools.count()


def checksum(data: torch.Tensor, backend: str | None = "torch") -> int:
    """Checksum of a byte tensor (CPU), as one row of the kernel's block checksum."""
    if data.numel() == 0:
        return 0
    return int(block_checksum(data.reshape(1, -1), backend=backend)[0])


@dataclass(frozen=True)
class DiskEntry:
    key: bytes
    path: Path
    ver: int
    gen: int
    fmt: int
    tail: int
    swa: int
    units: tuple[tuple[str, int, int], ...]  # (group, layer position in group, bytes)
    chunks: tuple[tuple[int, int, int, int, int], ...]  # (unit lo, unit hi, byte lo, byte hi, sum)
    swa_section: tuple[int, int, int] | None  # (byte lo, byte hi, sum) or None
    payload_offset: int


class DiskTier:
    def __init__(
        self,
        root: str | os.PathLike[str],
        fingerprint: dict[str, Any],
        load_steps: int,
        *,
        durable: bool = False,
        backend: str | None = "torch",
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.load_steps = load_steps
        self.durable = durable
        self.backend = backend

    def path(self, key: bytes) -> Path:
        return self.root / (key.hex() + SUFFIX)

    # ---- writing ------------------------------------------------------------------------
    def write(
        self,
        key: bytes,
        *,
        ver: int,
        gen: int,
        fmt: int,
        tail: int,
        swa: int,
        units: list[tuple[str, int, torch.Tensor]],
        swa_data: torch.Tensor | None,
    ) -> DiskEntry:
        """Write one entry atomically; ``units`` are (group, layer, CPU uint8 tensor)."""
        sizes = [int(t.numel()) for _, _, t in units]
        offsets = [0, *itertools.accumulate(sizes)]
        flat = [t.reshape(-1).cpu() for _, _, t in units]
        chunks = []
        n = len(units)
        for c in range(self.load_steps):
            ulo, uhi = c * n // self.load_steps, (c + 1) * n // self.load_steps
            blo, bhi = offsets[ulo], offsets[uhi]
            data = torch.cat(flat[ulo:uhi]) if uhi > ulo else torch.empty(0, dtype=torch.uint8)
            chunks.append((ulo, uhi, blo, bhi, checksum(data, self.backend)))
        parts = list(flat)
        swa_section = None
        if swa_data is not None:
            s = swa_data.reshape(-1).cpu()
            swa_section = (offsets[-1], offsets[-1] + int(s.numel()), checksum(s, self.backend))
            parts.append(s)
        header = {
            "format": FILE_FORMAT,
            "fingerprint": self.fingerprint,
            "key": key.hex(),
            "ver": ver,
            "gen": gen,
            "fmt": fmt,
            "tail": tail,
            "swa": swa,
            "units": [[g, layer, size] for (g, layer, _), size in zip(units, sizes, strict=True)],
            "chunks": chunks,
            "swa_section": swa_section,
        }
        hb = json.dumps(header, sort_keys=True).encode()
        payload = torch.cat(parts).numpy().tobytes() if parts else b""
        final = self.path(key)
        tmp = self.root / f".{final.name}.{os.getpid()}.{next(_counter)}.tmp"
        with open(tmp, "wb") as f:
            f.write(_PREFIX.pack(MAGIC, len(hb), zlib.crc32(hb)))
            f.write(hb)
            f.write(payload)
            if self.durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
        return self._entry(key, final, header, _PREFIX.size + len(hb))

    # ---- reading ------------------------------------------------------------------------
    def read_header(self, path: Path) -> DiskEntry:
        try:
            with open(path, "rb") as f:
                prefix = f.read(_PREFIX.size)
                if len(prefix) != _PREFIX.size:
                    raise CorruptEntry(f"{path.name}: truncated prefix")
                magic, hlen, crc = _PREFIX.unpack(prefix)
                if magic != MAGIC:
                    raise CorruptEntry(f"{path.name}: bad magic {magic!r}")
                hb = f.read(hlen)
        except OSError as exc:
            raise CorruptEntry(f"{path.name}: {exc}") from exc
        if len(hb) != hlen or zlib.crc32(hb) != crc:
            raise CorruptEntry(f"{path.name}: header checksum mismatch")
        try:
            header = json.loads(hb)
        except ValueError as exc:
            raise CorruptEntry(f"{path.name}: unreadable header: {exc}") from exc
        if header.get("format") != FILE_FORMAT:
            raise CorruptEntry(f"{path.name}: file format {header.get('format')} != {FILE_FORMAT}")
        if header.get("fingerprint") != self.fingerprint:
            raise CorruptEntry(f"{path.name}: written for another geometry/layout")
        try:
            key = bytes.fromhex(header["key"])
            entry = self._entry(key, path, header, _PREFIX.size + hlen)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptEntry(f"{path.name}: malformed header: {exc}") from exc
        if path.name != key.hex() + SUFFIX:
            raise CorruptEntry(f"{path.name}: header names key {key.hex()}")
        return entry

    def _entry(self, key: bytes, path: Path, h: dict[str, Any], offset: int) -> DiskEntry:
        sw = h["swa_section"]
        return DiskEntry(
            key=key,
            path=path,
            ver=int(h["ver"]),
            gen=int(h["gen"]),
            fmt=int(h["fmt"]),
            tail=int(h["tail"]),
            swa=int(h["swa"]),
            units=tuple((str(g), int(layer), int(n)) for g, layer, n in h["units"]),
            chunks=tuple(tuple(int(x) for x in c) for c in h["chunks"]),  # type: ignore[misc]
            swa_section=None if sw is None else (int(sw[0]), int(sw[1]), int(sw[2])),
            payload_offset=offset,
        )

    def read_range(self, entry: DiskEntry, lo: int, hi: int, expect: int) -> torch.Tensor:
        """Bytes ``[lo, hi)`` of the payload, verified against ``expect`` (raises CorruptEntry)."""
        if hi <= lo:
            return torch.empty(0, dtype=torch.uint8)
        try:
            with open(entry.path, "rb") as f:
                f.seek(entry.payload_offset + lo)
                raw = f.read(hi - lo)
        except OSError as exc:
            raise CorruptEntry(f"{entry.path.name}: {exc}") from exc
        if len(raw) != hi - lo:
            raise CorruptEntry(f"{entry.path.name}: payload truncated at byte {lo + len(raw)}")
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if checksum(data, self.backend) != expect:
            raise CorruptEntry(f"{entry.path.name}: checksum mismatch in bytes [{lo}, {hi})")
        return data

    def delete(self, entry_or_key: DiskEntry | bytes) -> None:
        path = entry_or_key.path if isinstance(entry_or_key, DiskEntry) else self.path(entry_or_key)
        try:
            path.unlink()
        except FileNotFoundError:
            pass

    def scan(self) -> tuple[list[DiskEntry], list[tuple[Path, str]]]:
        """Valid entries in the directory, and the rejected files (deleted) with the reason."""
        good: list[DiskEntry] = []
        bad: list[tuple[Path, str]] = []
        for path in sorted(self.root.iterdir()):
            if path.name.endswith(".tmp") and path.name.startswith("."):
                path.unlink(missing_ok=True)  # a write that never got published
                continue
            if not path.name.endswith(SUFFIX):
                continue
            try:
                good.append(self.read_header(path))
            except CorruptEntry as exc:
                bad.append((path, str(exc)))
                path.unlink(missing_ok=True)
        return good, bad
