"""Damage to each stored form of a disk entry, as the API harness inflicts it.

A disk entry holds several forms one after another (``impl/disk.py``): the compressed KV of
each compressed group (CSA, HCA), the compressor state the tail is rebuilt from, and, where
the window policy kept it, the block's SWA window; each section carries its own MAC.  The
harness's ``corrupt`` flips a byte in the middle of the payload, which lands in one section
only (the compressor state), so a MAC check skipped for another section, or a window restored
unchecked, is never exercised.  ``damage(b, part)`` flips one byte of the chosen section
(:data:`PARTS`) of block ``b``'s published entry, read off the entry's own header (its units and
window section), and the world then knows it as corrupt, like a bit flip: its load must fail,
never complete, and the hit is truncated before it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl

PARTS = ("csa", "hca", "compressor", "window", "last byte")


def _offset(e: Any, part: str) -> int | None:
    """The byte of the entry's payload to flip for ``part`` (None: the entry has none)."""
    if part == "window":
        return None if e.swa_section is None else (e.swa_section[0] + e.swa_section[1]) // 2
    if part == "last byte":
        return e.size - e.payload_offset - 1
    at = 0
    for group, _, size in e.units:
        if group == part:
            return at + size // 2
        at += size
    return None


def do_damage(h: Any, o: Any) -> int | None:
    b, part = o.arg("b"), PARTS[o.arg("part") % len(PARTS)]
    e = h.view.disk_entries.get(h.rids[b])
    if e is None or b in h.corrupt:
        return None
    at = _offset(e, part)
    if at is None:
        return None
    data = bytearray(e.path.read_bytes())
    data[e.payload_offset + at] ^= 0x04
    e.path.write_bytes(bytes(data))
    h.corrupt[b] = "bitflip"
    h.cov.add(f"fault damage {part}")
    return None


# one section of an entry damaged (kvstate/targets/api/declare.py: the form)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "damage",
        do_damage,
        "corrupt",
        lambda s: {"b": s.block, "part": st.integers(0, 4)},
        faults=("damage",),
    ),
)
