"""The disk tier: one authenticated file per block, written atomically, verified chunk by chunk.

Threat model (see README, "The disk tier"): whoever can write to ``cache_dir`` but cannot read
its key must not be able to make kvstate serve other content under a key; all they can do is
delete entries (a miss, recomputed).  So every entry is authenticated with a keyed MAC
(BLAKE3 in its keyed mode, a PRF, through the ``blake3`` bindings of the reference Rust crate:
about 4 GB/s a core here against HMAC-SHA256's 1.75 (format 3) and keyed BLAKE2b's 0.8
(format 2); older formats (2 to 4) carry another magic and are deleted as stale, never read; one
key per domain, header, chunk or name, derived from the directory's key with BLAKE3's key
derivation and a context string of this format): the header's MAC covers the header, which
names the block's chained key and holds a per-entry nonce and one MAC per load chunk (and one
for the SWA section); each chunk's MAC covers the key, the nonce, the chunk's index and byte
range, and its bytes.  A file written for another key, a header rewritten with a recomputed
CRC, a payload edit, chunks of two entries mixed: each fails a MAC and is a load failure (the
hit is truncated and recomputed, never served from garbage: vLLM 52234).

Names: an entry is ``<stem><random>.kvb``, the stem a keyed hash of the block's key (the name
key), so nobody without the key can tell from a listing which prompts are cached, nor create a
file at a name an entry will take; the random part makes every write's name new, so an entry
being deleted never shares its name with the key's next one.

The key is the caller's (``disk_key``) or the directory's (``.kvstate-key``; the directory,
its lock and when its files go: :mod:`kvstate.impl.diskdir`).  Each entry's prefix carries the
key's *id* (a one-way derivation of it): an entry of another key or another geometry is someone
else's, left alone and never counted, while one of this key that fails its checks is damage,
deleted.

File layout: a fixed prefix (magic, header length, header MAC, key id), a JSON header (format
version, geometry fingerprint, key, content version and stored form, saved tail/window phases,
the payload's units, the chunk table with its MACs), then the payload.  Writes go to a private
temporary (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600, an unpredictable name) in the same
directory and are published with ``os.rename`` to the entry's fresh name, so a reader or a
restarted process sees a whole entry or none, never a torn write.

No file-system call runs under the cache's lock: a written entry is renamed to its fresh name
before the lock is taken to adopt it, and an entry dropped or loaded back is only doomed under
the lock (``delete``) and unlinked after it (``reap``).

Payload reads use ``O_DIRECT`` where the file system takes it (no copy out of the page cache,
no cached pages to free when the loaded file goes), else the page cache: the same bytes, the same
checks.

Opening a cache scans the directory: every file is opened ``O_NOFOLLOW|O_NONBLOCK`` and must be
a regular file (a directory, FIFO or symlink with an entry's name is left alone), headers are
bounded and schema-checked, and only what carries kvstate's magic *and* naming *and* this key's
id is deleted when stale or damaged (a foreign file is never touched); when the directory holds
more entries than ``disk_blocks``, the most recently written are kept.
"""

from __future__ import annotations

import errno
import hmac  # compare_digest: constant-time tag comparison
import json
import os
import re
import secrets
import stat
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch

from .diskdir import KEY_BYTES, OPEN_FLAGS, Directory, create_private, load_key
from .diskdir import KEY_FILE as KEY_FILE  # (re-exported: the directory's key file)
from .diskheader import MAC_BYTES, DiskEntry, parse_header, text
from .entrymac import (
    KEY_ID_BYTES,
    STEM_HEX,
    Contexts,
    Encoded,
    EntryMacs,
    encode,
    header_fields,
)
from .errors import CorruptEntry, DiskWriteError, InvalidArgument

FILE_FORMAT = 5  # 5: keyed names and a key id (4: keyed BLAKE3, 3: HMAC-SHA256, 2: keyed BLAKE2b)
MAGIC = b"KVSTATE\x05"
MAGIC_FAMILY = b"KVSTATE"  # any format version: kvstate's own (a stale one is deleted)
MAC_NAME = "keyed BLAKE3"
KEY_MIN, KEY_MAX = 16, 64
# domain separation: a header MAC is never a chunk MAC (each keyed state starts with its label)
CONTEXTS = Contexts(
    header="kvstate 2026-12-03 disk entry header MAC, format 5",
    chunk="kvstate 2026-12-03 disk entry chunk MAC, format 5",
    name="kvstate 2026-12-03 disk entry name, format 5",
    key_id="kvstate 2026-12-03 disk key id, format 5",
)
# magic, header length, header MAC, key id (the MAC first: a damaged header MAC is damage)
# an entry file's fixed prefix: magic, header length, header MAC, key id (public: a checker forging
# authentic headers with the directory's key lays them out the same way)
PREFIX: Final = struct.Struct(f"<8sI{MAC_BYTES}s{KEY_ID_BYTES}s")
MAX_HEADER = 1 << 20  # a header is a few KiB; a bigger length field is damage, not a read
SUFFIX = ".kvb"
NAME_HEX = STEM_HEX + 16  # and a random part: every write's name is new
# the names kvstate gives (and gave: a format before 5 named an entry by its key's hex) entries
_ENTRY_NAME = re.compile(r"[0-9a-f]{2,128}\.kvb")
_TMP_NAME = re.compile(r"\.[0-9a-f]{2,128}\.kvb\.[A-Za-z0-9_.]+\.tmp")
_KEY_TMP_NAME = re.compile(r"\.kvstate-key\.[A-Za-z0-9_]+\.new")
_OPEN_FLAGS = OPEN_FLAGS
# Direct reads (``O_DIRECT``: the device writes into our buffer, no page-cache copy and no cached
# pages to free when the loaded file is deleted) need a buffer, a file offset and a length
# aligned to the device's logical block; 4096 covers every common one.  A chunk's bytes are read
# inside the aligned window that encloses them (at most one block more at each end, bytes that
# are never looked at), so the file format needs no padding.  Where a file system refuses direct
# I/O (EINVAL: tmpfs, some FUSE ones), reads go through the page cache: the same bytes, the same
# checks.
_O_DIRECT = getattr(os, "O_DIRECT", 0)
DIRECT_ALIGN = 4096


def name_stem(secret: bytes, key: bytes) -> str:
    """The keyed stem of ``key``'s entry names under the directory key ``secret`` (what
    :meth:`DiskTier.stem` computes from its derived state; for tools and tests that hold the
    key)."""
    return EntryMacs(secret, CONTEXTS).stem(key)


class ForeignEntry(CorruptEntry):
    """An entry that is not this cache's to read or delete: written under another key, or
    authentic under this key for another geometry.  Left alone, never counted."""


class DiskTier:
    entry_format: int = FILE_FORMAT  # the header's "format" this tier writes and reads

    def __init__(
        self,
        root: str | os.PathLike[str],
        fingerprint: dict[str, Any],
        load_steps: int,
        *,
        durable: bool = False,
        key: bytes | None = None,
        layout: Sequence[tuple[str, int, int]] | None = None,
        swa_bytes: int | None = None,
    ) -> None:
        if isinstance(root, str) and root == "":
            raise InvalidArgument("cache_dir must name a directory, got '' (use '.' explicitly)")
        if not isinstance(root, (str, os.PathLike)):
            raise InvalidArgument(f"cache_dir must be a path, got {type(root).__name__}")
        name = os.fspath(root)
        if not isinstance(name, str) or "\x00" in name:
            raise InvalidArgument(f"cache_dir {name!r} is not a directory name (a NUL byte)")
        if key is not None and (not isinstance(key, bytes) or not KEY_MIN <= len(key) <= KEY_MAX):
            raise InvalidArgument("disk_key must be 16 to 64 bytes")
        self.root = Path(name)
        self.fingerprint = fingerprint
        self.load_steps = load_steps
        self.durable = durable
        self.layout = None if layout is None else tuple(layout)
        self.swa_bytes = swa_bytes
        # entries the scan left alone: another key's, or this key's for another geometry
        self.foreign: list[tuple[Path, str]] = []
        self.dir = Directory(self.root)  # created 0700 if missing, and locked
        # files whose unlink the file system refused (a read-only mount): left behind, with why
        self.orphans = self.dir.orphans
        try:
            self._key = key if key is not None else load_key(self.root)
        except BaseException:
            self.close()
            raise
        # one key per domain (a header MAC is never a chunk MAC, a name no MAC), derived once
        self.macs = EntryMacs(self._key, CONTEXTS)
        self.key_id = self.macs.key_id
        self._scratch = threading.local()  # each reading thread's reusable chunk buffer
        # whole-payload buffers of finished loads, for the next ones (``read_block``): a fresh
        # one would fault in new pages on every block (list.pop / append are atomic)
        self._spare: list[torch.Tensor] = []
        # payload reads bypass the page cache while the file system allows it (set False, for
        # good, at the first refusal; a test may set it to choose the path)
        self.direct = bool(_O_DIRECT)

    def close(self) -> None:
        """Release the directory's lock (the files stay)."""
        self.dir.close()

    def new_path(self, key: bytes) -> Path:
        """A fresh name for one of ``key``'s entries: its keyed stem and a random part."""
        return self.root / f"{self.stem(key)}{secrets.token_hex(8)}{SUFFIX}"

    def stem(self, key: bytes) -> str:
        """The keyed hash of a block's key that starts its entries' names (nobody without
        the directory's key can compute it)."""
        return self.macs.stem(key)

    # ---- MACs (impl/entrymac.py: shared with the remote tier) ------------------------------
    def header_mac(self, hb: bytes) -> bytes:
        return self.macs.header_mac(hb)

    def _chunk_mac(
        self, key: bytes, nonce: bytes, index: int, lo: int, hi: int, *data: bytes | memoryview
    ) -> bytes:
        return self.macs.chunk_mac(key, nonce, index, lo, hi, *data)

    # ---- writing ------------------------------------------------------------------------
    def write(self, key: bytes, **fields: Any) -> DiskEntry:
        """Write one entry atomically (``prepare`` then ``publish``)."""
        return self.publish(self.prepare(key, **fields))

    def prepare(
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
    ) -> tuple[Any, DiskEntry]:
        """Encode and MAC an entry, then stage it where this tier keeps entries (``stage``: no
        lock needed, nothing is visible yet); ``publish`` makes it the key's entry, ``discard``
        throws it away."""
        enc = encode(self.macs, key, units, swa_data, self.load_steps)
        fields = {"ver": ver, "gen": gen, "fmt": fmt, "tail": tail, "swa": swa}
        header = header_fields(enc, self.entry_format, self.fingerprint, key, units, fields)
        return self.stage(key, enc, header, json.dumps(header, sort_keys=True).encode())

    def stage(
        self, key: bytes, enc: Encoded, header: dict[str, Any], hb: bytes
    ) -> tuple[Any, DiskEntry]:
        """The encoded entry written to a private temporary file (``publish`` renames it)."""
        parts = enc.parts  # the tensors' own bytes (no copies): MACed and written from them
        final = self.new_path(key)
        try:
            fd, tmp = create_private(self.root, f".{final.name}.", ".tmp")
        except OSError as exc:  # a read-only or full directory: nothing was created
            raise self._write_error(key, exc) from exc
        try:
            try:
                f = os.fdopen(fd, "wb")
            except BaseException:
                os.close(fd)
                raise
            with f:
                f.write(PREFIX.pack(MAGIC, len(hb), self.header_mac(hb), self.key_id))
                f.write(hb)
                for p in parts:
                    f.write(p)
                if self.durable:
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException as exc:
            self.remove(tmp)
            if isinstance(exc, OSError):
                raise self._write_error(key, exc) from exc
            raise
        size = PREFIX.size + len(hb) + sum(len(p) for p in parts)
        entry = self._entry(header, key, final, PREFIX.size + len(hb), size, time.time_ns())
        return tmp, entry

    def publish(self, prepared: tuple[Path, DiskEntry]) -> DiskEntry:
        """Give a prepared entry its name (a rename to a name nothing else has: no lock needed,
        nobody else's file replaced).  Raises DiskWriteError, the temporary removed, when the
        file system refuses."""
        tmp, entry = prepared
        try:
            os.rename(tmp, entry.path)
        except OSError as exc:
            self.remove(tmp)
            raise self._write_error(entry.key, exc) from exc
        return entry

    def discard(self, prepared: tuple[Path, DiskEntry]) -> None:
        self.remove(prepared[0])

    def _write_error(self, key: bytes, exc: OSError) -> DiskWriteError:
        err = DiskWriteError(f"writing an entry in {self.root}: {exc}")
        err.__cause__ = exc  # (kept when a compiled caller re-raises it)
        return err

    def remove(self, path: Path) -> bool:
        return self.dir.remove(path)

    # ---- reading ------------------------------------------------------------------------
    def pread(self, fd: int, buf: memoryview, offset: int, need: int | None = None) -> int:
        """Fill ``buf`` from ``offset``, or at least its first ``need`` bytes (fewer only at end
        of file); returns the bytes read.  One read of the disk tier: a test replaces it to stall
        or fail the disk.

        ``os.preadv`` reads straight into the caller's buffer (no per-read ``bytes`` and no
        joining copies) and releases the GIL while the disk works.  A direct read asks for the
        whole aligned window and stops once it holds ``need`` bytes (its last block may lie past
        the end of the file: the read is short there, and continuing at an unaligned offset
        would be refused)."""
        done, n = 0, len(buf)
        want = n if need is None else need
        while done < want:
            got = os.preadv(fd, [buf[done:]], offset + done)
            if not got:
                break
            done += got
        return done

    def _read_exact(self, fd: int, n: int, offset: int) -> bytes:
        buf = bytearray(n)
        got = self.pread(fd, memoryview(buf), offset)
        return bytes(buf[:got]) if got < n else bytes(buf)

    def _open(self, path: Path, extra: int = 0) -> int:
        """A read descriptor for a regular file (no symlink followed, no FIFO waited on);
        ``extra``: more open flags (``O_DIRECT``)."""
        fd = os.open(path, _OPEN_FLAGS | extra)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IsADirectoryError(f"{path.name} is not a regular file")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_payload(self, path: Path) -> tuple[int, bool]:
        """A read descriptor for an entry's payload, direct (no page cache) where the file system
        allows it; returns (descriptor, direct)."""
        if self.direct:
            try:
                return self._open(path, _O_DIRECT), True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct = False  # this file system refuses direct I/O: buffered from now on
        return self._open(path), False

    def read_header(self, path: Path) -> DiskEntry:
        """The entry at ``path``, its header authenticated.  Raises :class:`ForeignEntry` for
        an entry of another key (its key id) or, authentic, of another geometry (not this
        cache's: left alone), CorruptEntry for anything else (damaged, stale, not kvstate's)."""
        try:
            fd = self._open(path)
        except OSError as exc:
            raise CorruptEntry(f"{path.name}: {exc}") from exc
        try:
            st = os.fstat(fd)
            size = st.st_size
            prefix = self._read_exact(fd, PREFIX.size, 0)
            magic = prefix[: len(MAGIC)]
            if magic != MAGIC:
                raise CorruptEntry(f"{path.name}: bad magic {magic!r} (file format)")
            if len(prefix) != PREFIX.size:
                raise CorruptEntry(f"{path.name}: truncated prefix")
            _, hlen, mac, key_id = PREFIX.unpack(prefix)
            if not hmac.compare_digest(key_id, self.key_id):
                raise ForeignEntry(f"{path.name}: written under another key")
            if hlen > MAX_HEADER or PREFIX.size + hlen > size:
                raise CorruptEntry(f"{path.name}: header length {hlen} out of bounds")
            hb = self._read_exact(fd, hlen, PREFIX.size)
        except OSError as exc:
            raise CorruptEntry(f"{path.name}: {exc}") from exc
        finally:
            os.close(fd)
        if len(hb) != hlen or not hmac.compare_digest(self.header_mac(hb), mac):
            raise CorruptEntry(f"{path.name}: header MAC (keyed checksum) mismatch")
        try:
            header = json.loads(hb)
        except (ValueError, RecursionError) as exc:
            raise CorruptEntry(f"{path.name}: unreadable header: {exc}") from exc
        if not isinstance(header, dict):
            raise CorruptEntry(f"{path.name}: header is not an object")
        if header.get("format") != self.entry_format:
            raise CorruptEntry(
                f"{path.name}: file format {header.get('format')} != {self.entry_format}"
            )
        if header.get("fingerprint") != self.fingerprint:
            raise ForeignEntry(f"{path.name}: written for another geometry/layout")
        try:
            key = bytes.fromhex(text(header.get("key")))
        except (TypeError, ValueError) as exc:
            raise CorruptEntry(f"{path.name}: malformed key: {exc}") from exc
        name = path.name
        if len(name) != NAME_HEX + len(SUFFIX) or not name.startswith(self.stem(key)):
            raise CorruptEntry(f"{path.name}: not the name of an entry of its key")
        try:
            entry = self._entry(header, key, path, PREFIX.size + hlen, size, st.st_mtime_ns)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CorruptEntry(f"{path.name}: malformed header: {exc}") from exc
        return entry

    def _entry(
        self, h: dict[str, Any], key: bytes, path: Path, offset: int, size: int, mtime_ns: int
    ) -> DiskEntry:
        return parse_header(
            h, key, path, offset, size, mtime_ns,
            layout=self.layout, load_steps=self.load_steps, swa_bytes=self.swa_bytes,
        )  # fmt: skip

    def _buffer(self, n: int, scratch: bool | torch.Tensor) -> torch.Tensor:
        """An ``n``-byte buffer starting on a :data:`DIRECT_ALIGN` boundary: fresh, or with
        ``scratch`` this thread's reusable one, or ``scratch`` itself when it is a tensor (the
        caller's, used when big enough).  A chunk read into a fresh buffer paid for
        faulting in new pages on every chunk; a load step lands its chunk before the same thread
        reads the next one, so one buffer per thread is enough.  Uninitialised (torch.empty): a
        zero-filled one cost a memset of every byte about to be overwritten by the read."""
        want = n + DIRECT_ALIGN
        base: torch.Tensor | None
        if isinstance(scratch, torch.Tensor):  # a buffer the caller owns (``read_block``)
            base = scratch
        else:
            base = getattr(self._scratch, "buf", None) if scratch else None
        if base is None or base.numel() < want:
            base = torch.empty(want, dtype=torch.uint8)
            if scratch is True:
                self._scratch.buf = base
        skip = -base.data_ptr() % DIRECT_ALIGN
        return base[skip : skip + n]

    def _read_payload(
        self, entry: DiskEntry, lo: int, hi: int, scratch: bool | torch.Tensor
    ) -> torch.Tensor:
        """The payload bytes ``[lo, hi)`` as read from the file, not yet authenticated: a view
        of a buffer that holds them (with a direct read, inside the aligned window around
        them).  Raises CorruptEntry on a replaced, truncated or unreadable file."""
        n = hi - lo
        start = entry.payload_offset + lo
        for _ in range(2):
            direct = False
            try:
                fd, direct = self._open_payload(entry.path)
                try:
                    if os.fstat(fd).st_size != entry.size:
                        raise CorruptEntry(
                            f"{entry.path.name}: replaced or truncated since its scan"
                        )
                    if direct:
                        a0 = start - start % DIRECT_ALIGN
                        a1 = -(-(start + n) // DIRECT_ALIGN) * DIRECT_ALIGN
                        skip = start - a0
                        buf = self._buffer(a1 - a0, scratch)
                        view = buf.numpy().data
                        got = self.pread(fd, view, a0, skip + n) - skip
                    else:
                        skip, buf = 0, self._buffer(n, scratch)
                        view = buf.numpy().data
                        got = self.pread(fd, view, start)
                    view.release()
                finally:
                    os.close(fd)
            except OSError as exc:
                if direct and exc.errno == errno.EINVAL:  # direct I/O refused at read time
                    self.direct = False
                    continue
                raise CorruptEntry(f"{entry.path.name}: {exc}") from exc
            if got < n:
                raise CorruptEntry(
                    f"{entry.path.name}: payload truncated at byte {lo + max(got, 0)}"
                )
            return buf[skip : skip + n]
        raise CorruptEntry(  # pragma: no cover: the retry is buffered, only a direct read retries
            f"{entry.path.name}: unreadable"
        )

    def _read_verified(
        self, entry: DiskEntry, index: int, lo: int, hi: int, mac: bytes, scratch: bool = False
    ) -> torch.Tensor:
        """The bytes ``[lo, hi)`` of the payload, read into one buffer and authenticated in
        place: the tensor returned wraps that buffer (no copy), and nobody sees it unless its
        MAC matched.  The buffer is fresh, or with ``scratch`` this thread's reusable one (the
        tensor is then valid only until this thread's next scratch read: the caller copies it
        out first)."""
        data = self._read_payload(entry, lo, hi, scratch)
        view = data.numpy().data
        try:
            self._check(entry, index, lo, hi, mac, view)
        finally:
            view.release()
        return data

    def read_chunk(self, entry: DiskEntry, k: int, scratch: bool = False) -> torch.Tensor:
        """Load chunk ``k``'s bytes, authenticated (raises CorruptEntry); with ``scratch``, into
        this thread's reusable buffer (valid until its next scratch read)."""
        if not 0 <= k < len(entry.chunks):
            raise CorruptEntry(f"{entry.path.name}: no chunk {k}")
        _, _, lo, hi, mac = entry.chunks[k]
        if hi <= lo:
            return torch.empty(0, dtype=torch.uint8)
        return self._read_verified(entry, k, lo, hi, mac, scratch)

    def read_block(
        self, entry: DiskEntry, with_swa: bool
    ) -> tuple[torch.Tensor, list[np.ndarray], torch.Tensor | None]:
        """A disk load's whole payload in one read (one open, one ``fstat``, one direct read,
        where a read per chunk paid them per chunk), then every chunk's MAC (and, ``with_swa``,
        the window section's) verified before anything is returned: (the buffer, to give back
        with :meth:`give_back` once nothing uses it; each chunk's authenticated bytes, numpy
        views of the buffer, landed without the lock by numpy copies where torch calls took
        the GIL back and forth; the window's, or None).  Raises CorruptEntry if any MAC fails:
        no byte of a block whose file fails anywhere is returned."""
        chunks = entry.chunks
        hi = chunks[-1][3] if chunks else 0
        if with_swa:
            sec = entry.swa_section
            if sec is None:
                raise CorruptEntry(f"{entry.path.name}: the entry has no window")
            hi = sec[1]
        # the aligned window around [0, hi), and its alignment
        base = self.block_buffer(hi + 3 * DIRECT_ALIGN)
        data = self._read_payload(entry, 0, hi, base)
        arr = data.numpy()
        view = arr.data
        try:
            out = []
            for k, (_, _, lo, end, mac) in enumerate(chunks):
                self._check(entry, k, lo, end, mac, view[lo:end])
                out.append(arr[lo:end])
            swa = None
            if with_swa and entry.swa_section is not None:
                lo, end, mac = entry.swa_section
                self._check(entry, -1, lo, end, mac, view[lo:end])
                swa = data[lo:end]
        finally:
            view.release()
        return base, out, swa

    def _check(
        self, entry: DiskEntry, index: int, lo: int, hi: int, mac: bytes, data: memoryview
    ) -> None:
        """Raise CorruptEntry unless ``data`` (the payload's bytes ``[lo, hi)``) carries ``mac``
        (section ``index``): the one place a chunk's or a window's MAC is compared."""
        tag = self._chunk_mac(entry.key, entry.nonce, index, lo, hi, data)
        if not hmac.compare_digest(tag, mac):
            raise CorruptEntry(
                f"{entry.path.name}: MAC (keyed checksum) mismatch in bytes [{lo}, {hi})"
            )

    def block_buffer(self, n: int) -> torch.Tensor:
        """A buffer of at least ``n`` bytes for one load's read (both tiers'): a finished
        load's (:meth:`give_back`), else a fresh one, uninitialised: a fresh one per block
        faulted in new pages on every block, a zeroed one paid a memset of bytes about to be
        overwritten."""
        try:
            base = self._spare.pop()
        except IndexError:
            base = torch.empty(0, dtype=torch.uint8)
        if base.numel() < n:
            base = torch.empty(n, dtype=torch.uint8)
        return base

    def give_back(self, base: torch.Tensor) -> None:
        """A :meth:`read_block` buffer nothing reads any more, for the next block's read."""
        if len(self._spare) < 16:
            self._spare.append(base)

    def read_swa(self, entry: DiskEntry) -> torch.Tensor:
        """The SWA section's bytes, authenticated (raises CorruptEntry)."""
        sec = entry.swa_section
        if sec is None:
            raise CorruptEntry(f"{entry.path.name}: the entry has no window")
        return self._read_verified(entry, -1, sec[0], sec[1], sec[2])

    def delete(self, entry: DiskEntry) -> None:
        """Doom an entry the cache let go of (dropped, or loaded back): no file-system call, so
        the cache's lock may be held; :meth:`reap` unlinks it once the lock is released.  Its
        name is its own (random, never reused), so a later entry of its key is never hit."""
        self.dir.doom(entry.path)

    def reap(self, alone: bool = False) -> None:
        """Unlink the doomed entries (any thread, never under the cache's lock; ``alone``:
        :meth:`Directory.reap`).  A refused unlink (a read-only file system) leaves the file in
        ``orphans``: authentic and exact, it is only space (a later opener may adopt it)."""
        self.dir.reap(alone)

    @property
    def unlinking(self) -> int:
        """Doomed files not yet unlinked (an unlink in flight counts until it returns)."""
        return self.dir.unlinking

    @property
    def doomed(self) -> tuple[str, ...]:
        """The names of the doomed files not yet handed to an unlink (``reap`` takes them)."""
        return self.dir.doomed

    # ---- the directory ------------------------------------------------------------------
    def _ours(self, path: Path, magic_prefix_ok: bool | None) -> bool:
        """Does ``path`` carry kvstate's magic (a regular file of this user; a temporary may
        hold only the start of the magic: a writer killed before its first write)?  With
        ``magic_prefix_ok=None``: a key temporary (no magic, at most a key's bytes)."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return False
            if magic_prefix_ok is None:
                return st.st_size <= KEY_BYTES
            head = os.pread(fd, len(MAGIC_FAMILY), 0)
        except OSError:
            return False
        finally:
            os.close(fd)
        if magic_prefix_ok and len(head) < len(MAGIC_FAMILY):
            return MAGIC_FAMILY.startswith(head)
        return head == MAGIC_FAMILY

    def scan(self) -> tuple[list[DiskEntry], list[tuple[Path, str]]]:
        """Valid entries in the directory, oldest first (one per key: the most recent), and
        the rejected ones (deleted: the scan runs with the directory's lock) with the reason.
        Files without kvstate's naming and magic are left alone, whatever they hold, and so
        are entries of another key or geometry (``foreign``).  Raises StorageError when the
        directory cannot be listed."""
        good: dict[bytes, DiskEntry] = {}
        bad: list[tuple[Path, str]] = []
        for name in self.dir.listing():
            path = self.root / name
            if _KEY_TMP_NAME.fullmatch(name):
                if self._ours(path, magic_prefix_ok=None):
                    self.remove(path)  # a key being created when its writer died
                continue
            if _TMP_NAME.fullmatch(name):
                if self._ours(path, magic_prefix_ok=True):
                    self.remove(path)  # a write that never got published
                continue
            if not _ENTRY_NAME.fullmatch(name) or len(name) % 2:
                continue
            try:
                e = self.read_header(path)
            except ForeignEntry as exc:
                self.foreign.append((path, str(exc)))
                continue
            except CorruptEntry as exc:
                if self._ours(path, magic_prefix_ok=False):
                    bad.append((path, str(exc)))
                    self.remove(path)
                continue
            old = good.get(e.key)
            if old is not None:  # two entries of one key (a crash before a reap): the newer
                if (old.mtime_ns, old.path.name) > (e.mtime_ns, e.path.name):
                    old, e = e, old
                bad.append((old.path, f"{old.path.name}: superseded by {e.path.name}"))
                self.remove(old.path)
            good[e.key] = e
        return sorted(good.values(), key=lambda e: (e.mtime_ns, e.path.name)), bad
