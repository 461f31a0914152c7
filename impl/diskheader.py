"""The disk entry's header: what a file's authenticated JSON header says, schema-checked.

Why a module of its own: the header is data from a file (authenticated, but still parsed with
care: bounded by the reader, every field typed and checked against the cache's layout), and its
schema is independent of how the disk tier reads, writes and names files (``impl/disk.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAC_BYTES = 32
_HEADER_KEYS = frozenset(
    ("format", "fingerprint", "key", "nonce", "ver", "gen", "fmt", "tail", "swa", "units",
     "chunks", "swa_section")
)  # fmt: skip


@dataclass(frozen=True)
class DiskEntry:
    key: bytes
    path: Path
    ver: int
    gen: int
    fmt: int
    tail: int
    swa: int
    nonce: bytes
    units: tuple[tuple[str, int, int], ...]  # (group, layer position in group, bytes)
    chunks: tuple[tuple[int, int, int, int, bytes], ...]  # (unit lo, unit hi, byte lo, hi, MAC)
    swa_section: tuple[int, int, bytes] | None  # (byte lo, byte hi, MAC) or None
    payload_offset: int
    size: int  # the file's length when its header was read
    mtime_ns: int = 0  # when it was written (the scan keeps the most recent ones)


def parse_header(
    h: dict[str, Any],
    key: bytes,
    path: Path,
    offset: int,
    size: int,
    mtime_ns: int,
    *,
    layout: tuple[tuple[str, int, int], ...] | None,
    load_steps: int,
    swa_bytes: int | None,
) -> DiskEntry:
    """The header as an entry, its schema checked against a cache's layout (any inconsistency
    raises KeyError, TypeError, ValueError or IndexError: the entry is damaged or not
    kvstate's)."""
    if set(h) != _HEADER_KEYS:
        raise ValueError(f"header fields {sorted(h)}")
    ints = {f: h[f] for f in ("ver", "gen", "fmt", "tail", "swa")}
    for f, v in ints.items():
        if type(v) is not int or not 0 <= v < 1 << 62:
            raise ValueError(f"{f}={v!r}")
    nonce = bytes.fromhex(text(h["nonce"]))
    units = tuple((text(g), _nat(layer), _nat(n)) for g, layer, n in _seq(h["units"], 3))
    if layout is not None and units != layout:
        raise ValueError("unit table does not match this cache's layout")
    offsets = [0]
    for _, _, n in units:
        offsets.append(offsets[-1] + n)
    chunks = []
    raw_chunks = _seq(h["chunks"], 5)
    if len(raw_chunks) != load_steps:
        raise ValueError(f"{len(raw_chunks)} chunks, not {load_steps}")
    nu = len(units)
    for c, (ulo, uhi, blo, bhi, mac) in enumerate(raw_chunks):
        want = (c * nu // load_steps, (c + 1) * nu // load_steps)
        if (ulo, uhi) != want or (blo, bhi) != (offsets[want[0]], offsets[want[1]]):
            raise ValueError(f"chunk {c} is not the layout's chunk {want}")
        chunks.append((ulo, uhi, blo, bhi, _mac(mac)))
    sw = h["swa_section"]
    section: tuple[int, int, bytes] | None = None
    end = offsets[-1]
    if sw is not None:
        lo, hi, mac = _seq([sw], 3)[0]
        if lo != end or hi < lo or (swa_bytes is not None and hi - lo != swa_bytes):
            raise ValueError(f"SWA section [{lo}, {hi}) is not the layout's")
        section = (lo, hi, _mac(mac))
        end = hi
    if offset + end != size:
        raise ValueError(f"file is {size} bytes, the header describes {offset + end}")
    return DiskEntry(
        key=key,
        path=path,
        ver=ints["ver"],
        gen=ints["gen"],
        fmt=ints["fmt"],
        tail=ints["tail"],
        swa=ints["swa"],
        nonce=nonce,
        units=units,
        chunks=tuple(chunks),
        swa_section=section,
        payload_offset=offset,
        size=size,
        mtime_ns=mtime_ns,
    )


def text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _nat(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"expected a non-negative int, got {v!r}")
    return v


def _mac(v: Any) -> bytes:
    mac = bytes.fromhex(text(v))
    if len(mac) != MAC_BYTES:
        raise ValueError("MAC of the wrong length")
    return mac


def _seq(v: Any, width: int) -> list[Any]:
    """A list of ``width``-long lists (integers checked by the caller)."""
    if not isinstance(v, list) or not all(isinstance(x, list) and len(x) == width for x in v):
        raise ValueError(f"expected a list of {width}-item lists")
    for x in v:
        for item in x[:-1]:
            if not isinstance(item, str):
                _nat(item)
    return v
