"""Reading an entry back: direct and buffered reads serve each chunk (and each block) whole or
not at all, direct reads return the buffered bytes, and a refused direct read falls back to the
page cache."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from disk_checks import KEY

import kvstate.impl.disk as disk_mod
from kvstate.impl.disk import DiskTier


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_scratch_reads_serve_each_chunk_or_nothing(tmp_path: Path, direct: bool) -> None:
    """A load step reads its chunk into the thread's reusable buffer: each read returns that
    chunk's own bytes (a longer chunk read before does not show through a shorter one), a chunk
    whose bytes were edited raises instead of returning them, and the next read after the
    failure is whole again: through the page cache and with direct reads (the chunks start and
    end off the alignment, the last one at an unaligned end of file)."""
    import torch

    tier = DiskTier(tmp_path, {}, 2, key=KEY)
    tier.direct = direct and tier.direct
    g = torch.Generator().manual_seed(3)
    sizes = {b"\x01": (700, 300), b"\x02": (40, 90)}
    want = {}
    for key, (a, b) in sizes.items():
        units = [("u", i, torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8))
                 for i, n in enumerate((a, b))]  # fmt: skip
        tier.write(key, ver=1, gen=1, fmt=0, tail=0, swa=0, units=units, swa_data=None)
        want[key] = [t.clone() for _, _, t in units]
    entries = {e.key: e for e in tier.scan()[0]}
    for key in (b"\x01", b"\x02", b"\x01"):
        for k in range(2):
            got = tier.read_chunk(entries[key], k, True)
            assert torch.equal(got, want[key][k])
    e = entries[b"\x01"]
    raw = bytearray(e.path.read_bytes())
    raw[e.payload_offset + 5] ^= 1  # one bit of chunk 0
    e.path.write_bytes(bytes(raw))
    with pytest.raises(disk_mod.CorruptEntry):
        tier.read_chunk(e, 0, True)
    assert torch.equal(tier.read_chunk(entries[b"\x02"], 1, True), want[b"\x02"][1])


def _direct_supported(d: Path) -> bool:
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    p = d / "probe"
    p.write_bytes(b"x" * 4096)
    try:
        os.close(os.open(p, os.O_RDONLY | flag))
    except OSError:
        return False
    finally:
        p.unlink()
    return True


def _random_entry(tier: DiskTier, key: bytes, seed: int) -> tuple[Any, Any, Any]:
    """Write an entry whose units have odd sizes; returns (entry, payload bytes, window)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    units = [("u", i, torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8))
             for i, n in enumerate((5000, 12345, 777, 9001, 4096))]  # fmt: skip
    swa = torch.randint(0, 256, (333,), generator=g, dtype=torch.uint8)
    tier.write(key, ver=1, gen=1, fmt=0, tail=0, swa=0, units=units, swa_data=swa)
    entry = {e.key: e for e in tier.scan()[0]}[key]
    return entry, torch.cat([t for _, _, t in units]), swa


def test_direct_reads_are_the_buffered_bytes(tmp_path: Path) -> None:
    """Where the file system takes ``O_DIRECT``, payload reads use it (and keep using it), and
    every chunk and the window read direct, fresh or into the scratch buffer, are the bytes a
    buffered read returns (the aligned window around a chunk never leaks into it)."""
    import torch

    if not _direct_supported(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    tier = DiskTier(tmp_path, {}, 3, key=KEY)
    assert tier.direct
    entry, flat, swa = _random_entry(tier, b"\x05", 11)
    for scratch in (True, False, True):
        for k in range(3):
            lo, hi = entry.chunks[k][2], entry.chunks[k][3]
            assert torch.equal(tier.read_chunk(entry, k, scratch), flat[lo:hi])
    assert torch.equal(tier.read_swa(entry), swa)
    assert tier.direct  # nothing was refused: still direct
    tier.direct = False
    for k in range(3):
        lo, hi = entry.chunks[k][2], entry.chunks[k][3]
        assert torch.equal(tier.read_chunk(entry, k, True), flat[lo:hi])


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_a_block_read_serves_every_chunk_or_nothing(tmp_path: Path, direct: bool) -> None:
    """``read_block`` (a disk load's one read of its file) returns each chunk's and the
    window's own bytes, through a buffer given back and reused by a bigger and a smaller entry
    (nothing of a previous block shows through); one edited byte anywhere it covers (any chunk,
    the window when asked for) raises and returns nothing; the window is not read unless
    asked for (an edit there does not fail a load that does not restore it)."""
    import torch

    tier = DiskTier(tmp_path, {}, 3, key=KEY)
    tier.direct = direct and tier.direct and _direct_supported(tmp_path)
    small_entry = _random_entry(tier, b"\x07", 13)
    big_entry = _random_entry(tier, b"\x08", 14)
    for entry, flat, swa in (big_entry, small_entry, big_entry, small_entry):
        for with_swa in (True, False):
            base, chunks, got_swa = tier.read_block(entry, with_swa)
            assert len(chunks) == 3
            for k, data in enumerate(chunks):
                lo, hi = entry.chunks[k][2], entry.chunks[k][3]
                assert torch.equal(torch.from_numpy(data), flat[lo:hi])
            assert (got_swa is not None) == with_swa
            if got_swa is not None:
                assert torch.equal(got_swa, swa)
            tier.give_back(base)
    entry, flat, swa = big_entry
    good = entry.path.read_bytes()
    spots = [entry.chunks[k][2] + (entry.chunks[k][3] - entry.chunks[k][2]) // 2 for k in range(3)]
    assert entry.swa_section is not None
    for at in [*spots, entry.chunks[2][3] - 1, entry.swa_section[0], entry.swa_section[1] - 1]:
        raw = bytearray(good)
        raw[entry.payload_offset + at] ^= 1
        entry.path.write_bytes(bytes(raw))
        in_window = at >= entry.swa_section[0]
        with pytest.raises(disk_mod.CorruptEntry):
            tier.read_block(entry, True)
        if in_window:
            tier.read_block(entry, False)  # the window is not read, nor needed
        else:
            with pytest.raises(disk_mod.CorruptEntry):
                tier.read_block(entry, False)
    entry.path.write_bytes(good)
    assert torch.equal(
        torch.from_numpy(tier.read_block(entry, True)[1][2]), flat[entry.chunks[2][2] :]
    )


@pytest.mark.parametrize("where", ["open", "read"])
def test_refused_direct_io_falls_back_to_the_page_cache(
    tmp_path: Path, monkeypatch: Any, where: str
) -> None:
    """A file system that refuses ``O_DIRECT`` (EINVAL at open, as tmpfs did, or at the read)
    gets buffered reads: the same bytes, the same checks (an edited chunk still raises), and
    the tier stops asking for direct I/O."""
    import errno

    import torch

    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        pytest.skip("no O_DIRECT on this platform")
    tier = DiskTier(tmp_path, {}, 3, key=KEY)
    entry, flat, swa = _random_entry(tier, b"\x06", 12)
    tier.direct = True
    real_open, real_preadv = os.open, os.preadv
    refused: list[str] = []

    def open_(path: Any, flags: int, *a: Any) -> int:
        if where == "open" and flags & flag:
            refused.append("open")
            raise OSError(errno.EINVAL, "Invalid argument (O_DIRECT refused)")
        return real_open(path, flags, *a)

    def preadv(fd: int, bufs: Any, off: int) -> int:
        if where == "read" and fcntl_direct(fd):
            refused.append("read")
            raise OSError(errno.EINVAL, "Invalid argument (O_DIRECT refused)")
        return real_preadv(fd, bufs, off)

    def fcntl_direct(fd: int) -> bool:
        import fcntl

        return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & flag)

    monkeypatch.setattr(disk_mod.os, "open", open_)
    monkeypatch.setattr(disk_mod.os, "preadv", preadv)
    lo, hi = entry.chunks[1][2], entry.chunks[1][3]
    assert torch.equal(tier.read_chunk(entry, 1, True), flat[lo:hi])
    assert refused == [where] and not tier.direct
    for k in range(3):
        lo, hi = entry.chunks[k][2], entry.chunks[k][3]
        assert torch.equal(tier.read_chunk(entry, k), flat[lo:hi])
    assert torch.equal(tier.read_swa(entry), swa)
    monkeypatch.undo()
    raw = bytearray(entry.path.read_bytes())
    raw[entry.payload_offset + entry.chunks[2][2] + 7] ^= 1
    entry.path.write_bytes(bytes(raw))
    with pytest.raises(disk_mod.CorruptEntry):
        tier.read_chunk(entry, 2, True)
    assert refused == [where]  # asked once, then buffered for good
