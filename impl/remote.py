"""The remote prefix tier: the disk tier's entries, kept in a store a fleet of nodes shares.

A cache built with ``remote=RemoteConfig(...)`` keeps its offloaded blocks in a shared store
(Redis) instead of a local directory.  To the rest of the cache it is the disk tier (it has
:class:`~kvstate.impl.disk.DiskTier`'s surface): a spilled block is ``ckv`` DISK, a load of it
runs in the I/O pipeline under the admission cap (``io_cap`` counts it), its reads run without
the cache's lock (:mod:`kvstate.impl.diskreads`), and a failed read fails the load: the hit is
truncated and the prefix recomputed.  The table's remote tier (``spec/default/remote.py``) says
what the store may do meanwhile and what the cache must check.

Entries: the same chunking and MACs as the disk tier (:mod:`kvstate.impl.entrymac`, under this
tier's own contexts), keyed by the fleet key.  An entry is a header (magic, header MAC, key id,
then the JSON header: the block's chained key, a nonce, one MAC per chunk) at
``<prefix>{<stem>}:h`` and one value per chunk at ``<prefix>{<stem>}:<nonce>:<k>`` (``w`` for
the SWA section).  The stem is a keyed hash of (namespace, model, block key): nobody without the
key can tell which prompts are cached; two deployments sharing a server never share a name.  The
header binds the key, the geometry, the model and the namespace (its fingerprint); each chunk's
MAC binds the key, the nonce, its index and byte range.  Chunks are named by their writer's
nonce, so two nodes storing one prefix at once never mix chunks: the last header wins, and names
only its own writer's chunks.

Threat model: the fleet key is held by the fleet's caches only.  Someone with write access to
the store but not the key can delete, evict, truncate or overwrite anything (denial of service:
every such load fails and is recomputed) but cannot make a wrong byte verify: a chunk of another
writer, another entry, another namespace or model, or garbage fails its MAC.

Entries leave the store by the server's doing only (TTL, ``maxmemory`` eviction, another node):
dropping or loading back a block forgets it locally, never deletes a shared entry another node
may be hitting.  Size the server for the fleet's working set (see README, the remote tier).
"""

from __future__ import annotations

import hmac
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch

from .disk import DiskTier
from .diskheader import MAC_BYTES, DiskEntry, parse_header, text
from .entrymac import KEY_ID_BYTES, Contexts, Encoded, EntryMacs
from .errors import CorruptEntry, DiskWriteError, InvalidArgument, StorageError
from .remotestore import MISSING, ChunkStore, RedisStore, StoreUnavailable

FORMAT: Final = 1
MAGIC: Final = b"KVSREM\x00\x01"
PREFIX: Final = struct.Struct(f"<8sI{MAC_BYTES}s{KEY_ID_BYTES}s")
MAX_HEADER: Final = 1 << 20
KEY_MIN, KEY_MAX = 16, 64
CONTEXTS: Final = Contexts(
    header="kvstate 2026-12-03 remote entry header MAC, format 1",
    chunk="kvstate 2026-12-03 remote entry chunk MAC, format 1",
    name="kvstate 2026-12-03 remote entry name, format 1",
    key_id="kvstate 2026-12-03 remote key id, format 1",
)


@dataclass(frozen=True)
class RemoteConfig:
    """Where a fleet's shared prefix tier lives, and what its entries are bound to.

    ``url``: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path/to/redis.sock``.
    ``key``: the fleet key (16 to 64 bytes), the same on every node of the fleet and nowhere
    else.  ``model`` and ``namespace``: bound into every entry (a node of another model or
    namespace never reads this one's entries).  ``ttl``: seconds an entry lives (None: until the
    server evicts it).  ``timeout``: seconds any call to the server may take.
    ``max_connections``: the connection pool's size.  ``cluster``: the URL names a Redis
    Cluster node.  ``prefix``: the store's key prefix.  ``store``: a :class:`ChunkStore` to use
    instead of connecting to ``url``.  Bad values raise :class:`InvalidArgument`."""

    url: str | None = None
    key: bytes = b""
    model: str = ""
    namespace: str = ""
    ttl: int | None = None
    timeout: float = 2.0
    max_connections: int = 16
    cluster: bool = False
    prefix: str = "kvstate:"
    store: ChunkStore | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.key, bytearray):
            object.__setattr__(self, "key", bytes(self.key))
        if not isinstance(self.key, bytes) or not KEY_MIN <= len(self.key) <= KEY_MAX:
            raise InvalidArgument("RemoteConfig.key must be 16 to 64 bytes (the fleet key)")
        if (self.url is None) == (self.store is None):
            raise InvalidArgument("RemoteConfig needs exactly one of url and store")
        if self.url is not None and (not isinstance(self.url, str) or "://" not in self.url):
            raise InvalidArgument(
                f"RemoteConfig.url must be a redis:// or unix:// URL: {self.url!r}"
            )
        for name in ("model", "namespace", "prefix"):
            v = getattr(self, name)
            if not isinstance(v, str) or "\x00" in v:
                raise InvalidArgument(f"RemoteConfig.{name} must be a string without NUL")
        if self.ttl is not None and (type(self.ttl) is not int or not 1 <= self.ttl <= 1 << 31):
            raise InvalidArgument(f"RemoteConfig.ttl must be None or 1 to 2**31 s: {self.ttl!r}")
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 3600:
            raise InvalidArgument(f"RemoteConfig.timeout must be in (0, 3600] s: {t!r}")
        m = self.max_connections
        if type(m) is not int or not 1 <= m <= 4096:
            raise InvalidArgument(f"RemoteConfig.max_connections must be 1 to 4096: {m!r}")
        if type(self.cluster) is not bool:
            raise InvalidArgument("RemoteConfig.cluster must be a bool")
        if self.store is not None and not callable(getattr(self.store, "mget", None)):
            raise InvalidArgument("RemoteConfig.store must be a ChunkStore")

    def connect(self) -> ChunkStore:
        """The store: ``store`` itself, else a :class:`RedisStore` on ``url`` (raises
        StorageError when the client is missing or the URL is refused)."""
        if self.store is not None:
            return self.store  # type: ignore[no-any-return]
        assert self.url is not None
        return RedisStore(
            self.url,
            timeout=float(self.timeout),
            max_connections=self.max_connections,
            cluster=self.cluster,
        )


class RemoteTier(DiskTier):
    """The disk tier's surface over a shared store (see the module's docstring).  A
    :class:`DiskTier` by type, because the compiled parts take one; every method they call is
    overridden here but ``prepare`` (the encoding and MACs, shared; ``stage`` is this tier's)
    and ``give_back`` (a load's read buffer back to the pool ``block_buffer`` hands out, shared),
    and no directory is opened."""

    entry_format = FORMAT

    def __init__(
        self,
        config: RemoteConfig,
        fingerprint: dict[str, Any],
        load_steps: int,
        *,
        layout: Any = None,
        swa_bytes: int | None = None,
    ) -> None:
        self.config = config
        self.namespace, self.model = config.namespace, config.model
        self.fingerprint = {**fingerprint, "remote": list(self._binding())}
        self.load_steps = load_steps
        self.layout = None if layout is None else tuple(layout)
        self.swa_bytes = swa_bytes
        self.macs = EntryMacs(config.key, CONTEXTS)
        self.key_id = self.macs.key_id
        self.prefix = config.prefix
        self.foreign: list[tuple[Path, str]] = []
        self.orphans: list[tuple[Path, str]] = []  # (the disk tier's: never any here)
        self.direct = False
        self._spare: list[torch.Tensor] = []  # read buffers of finished loads (block_buffer)
        self.store = config.connect()

    def _binding(self) -> tuple[str, str]:
        """What an entry is bound to besides its key, geometry and layout."""
        return (self.namespace, self.model)

    def close(self) -> None:
        self.store.close()

    # ---- names --------------------------------------------------------------------------
    def stem(self, key: bytes) -> str:
        ns, model = self._binding()
        return self.macs.stem(b"\0".join((ns.encode(), model.encode(), key)))

    def header_name(self, key: bytes) -> str:
        return f"{self.prefix}{{{self.stem(key)}}}:h"

    def chunk_name(self, entry: DiskEntry, k: int) -> str:
        """The store's name of chunk ``k`` of ``entry`` (-1: the SWA section): under the
        entry's own nonce, so two writers' chunks never share a name."""
        base = str(entry.path)[:-2]  # the header's name without ":h"
        return f"{base}:{entry.nonce.hex()}:{'w' if k < 0 else k}"

    # ---- writing ------------------------------------------------------------------------
    def stage(
        self, key: bytes, enc: Encoded, header: dict[str, Any], hb: bytes
    ) -> tuple[Any, DiskEntry]:
        """The store's items of the encoded entry (no call to the store: ``publish`` writes
        them)."""
        name = self.header_name(key)
        entry = self._remote_entry(header, key, name)
        payload = b"".join(enc.parts)
        items = [
            (self.chunk_name(entry, k), payload[c[2] : c[3]]) for k, c in enumerate(enc.chunks)
        ]
        if enc.swa_section is not None:
            lo, hi = enc.swa_section[0], enc.swa_section[1]
            items.append((self.chunk_name(entry, -1), payload[lo:hi]))
        items.append(
            (name, PREFIX.pack(MAGIC, len(hb), self.macs.header_mac(hb), self.key_id) + hb)
        )
        return items, entry

    def publish(self, prepared: tuple[Any, DiskEntry]) -> DiskEntry:
        """Write the chunks, then the header that names them (one pipeline, no lock held).
        Raises DiskWriteError when the store refuses or does not answer."""
        items, entry = prepared
        try:
            self.store.put(items, self.config.ttl)
        except StorageError as exc:
            err = DiskWriteError(f"writing a remote entry: {exc}")
            err.__cause__ = exc
            raise err from exc
        return entry

    def discard(self, prepared: Any) -> None:
        """Nothing was written."""

    def delete(self, entry: DiskEntry) -> None:
        """Forget an entry locally: a shared entry is the server's to evict (TTL, maxmemory),
        never one node's to delete while another may be hitting it."""

    def reap(self, alone: bool = False) -> None:
        """Nothing to unlink (the disk tier's surface)."""

    @property
    def unlinking(self) -> int:
        return 0

    # ---- reading ------------------------------------------------------------------------
    def _span(self, entry: DiskEntry, index: int) -> tuple[int, int]:
        """Where chunk ``index`` (-1: the SWA section) lies in the entry's payload."""
        if index < 0:
            sec = entry.swa_section
            if sec is None:
                raise CorruptEntry(f"{entry.path}: the entry has no window")
            return sec[0], sec[1]
        return entry.chunks[index][2], entry.chunks[index][3]

    def _verified(self, entry: DiskEntry, index: int, got: np.ndarray | None) -> np.ndarray:
        """``got`` (the chunk's bytes as read, a view of the load's buffer, of its span's size:
        :meth:`_read` refused another; None: not in the store) if authentic; else
        CorruptEntry.  The MAC runs over the buffer itself: what lands is what was checked."""
        if index < 0:
            sec = entry.swa_section
            assert sec is not None  # (its span was asked first: _span refuses an entry without)
            lo, hi, mac = sec
        else:
            _, _, lo, hi, mac = entry.chunks[index]
        if got is None:
            raise CorruptEntry(f"{entry.path}: chunk {index} is gone from the store")
        if not self.macs.verify(entry.key, entry.nonce, index, lo, hi, mac, got.data):
            raise CorruptEntry(f"{entry.path}: MAC (keyed checksum) mismatch in chunk {index}")
        return got

    def _read(
        self, entry: DiskEntry, idx: list[int], base: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[np.ndarray]]:
        """Chunks ``idx`` of ``entry`` in one pipelined read, each received into its payload
        span of one buffer (``base``, else a fresh one) and authenticated there: (the buffer,
        each chunk's numpy view of it: no torch call, which takes the GIL back and forth, on
        the I/O workers' path).  CorruptEntry if any is gone, of another size, or fails its
        MAC, or when the store does not answer."""
        spans = [self._span(entry, k) for k in idx]
        end = max((hi for _, hi in spans), default=0)
        if base is None or base.numel() < end:
            base = torch.empty(end, dtype=torch.uint8)
        names = [self.chunk_name(entry, k) for k in idx]
        view = base.numpy().data
        try:
            read_into = getattr(self.store, "read_into", None)
            if read_into is not None:
                sizes = read_into(names, view, spans)
            else:  # (a store without it: its values copied into the buffer)
                sizes = []
                for (lo, hi), v in zip(spans, self.store.mget(names), strict=True):
                    if v is not None and len(v) == hi - lo:
                        view[lo:hi] = v
                    sizes.append(MISSING if v is None else len(v))
        except StoreUnavailable as exc:
            raise CorruptEntry(str(exc)) from exc
        finally:
            view.release()
        arr = base.numpy()
        out = []
        for k, (lo, hi), size in zip(idx, spans, sizes, strict=True):
            if size != MISSING and size != hi - lo:
                raise CorruptEntry(f"{entry.path}: chunk {k} is {size} bytes, not {hi - lo}")
            out.append(self._verified(entry, k, None if size == MISSING else arr[lo:hi]))
        return base, out

    def read_block(
        self, entry: DiskEntry, with_swa: bool
    ) -> tuple[torch.Tensor, list[np.ndarray], torch.Tensor | None]:
        """Every chunk (and, ``with_swa``, the window's section) in one pipelined read into one
        buffer (the disk tier's :meth:`~DiskTier.block_buffer`, given back once the load
        ends), each authenticated before anything is returned; CorruptEntry if any is gone or
        fails."""
        idx = [*range(len(entry.chunks)), *([-1] if with_swa else [])]
        end = max((self._span(entry, k)[1] for k in idx), default=0)
        base, out = self._read(entry, idx, self.block_buffer(end))
        swa = torch.from_numpy(out.pop()) if with_swa else None
        return base, out, swa

    def read_chunk(self, entry: DiskEntry, k: int, scratch: bool = False) -> torch.Tensor:
        if not 0 <= k < len(entry.chunks):  # pragma: no cover: callers pass a load's progress
            raise CorruptEntry(f"{entry.path}: no chunk {k}")
        return torch.from_numpy(self._read(entry, [k])[1][0])

    def read_swa(self, entry: DiskEntry) -> torch.Tensor:
        return torch.from_numpy(self._read(entry, [-1])[1][0])

    # ---- headers ------------------------------------------------------------------------
    def _remote_entry(self, header: dict[str, Any], key: bytes, name: str) -> DiskEntry:
        chunks = header["chunks"]
        sec = header["swa_section"]
        size = sec[1] if sec is not None else (chunks[-1][3] if chunks else 0)
        return parse_header(
            header, key, Path(name), 0, size, 0,
            layout=self.layout, load_steps=self.load_steps, swa_bytes=self.swa_bytes,
        )  # fmt: skip

    def parse(self, name: str, value: bytes) -> DiskEntry:
        """The entry whose header is ``value`` at ``name``, authenticated.  Raises
        CorruptEntry: damaged, of another key (``foreign``), of another geometry, model or
        namespace, or not at its key's name."""
        if len(value) < PREFIX.size or value[: len(MAGIC)] != MAGIC:
            raise CorruptEntry(f"{name}: not a remote entry header")
        _, hlen, mac, key_id = PREFIX.unpack_from(value)
        if not hmac.compare_digest(key_id, self.key_id):
            raise CorruptEntry(f"{name}: written under another fleet key")
        hb = value[PREFIX.size :]
        if hlen > MAX_HEADER or len(hb) != hlen:
            raise CorruptEntry(f"{name}: header length {hlen} does not match")
        if not hmac.compare_digest(self.macs.header_mac(hb), mac):
            raise CorruptEntry(f"{name}: header MAC (keyed checksum) mismatch")
        try:
            header = json.loads(hb)
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ValueError("not a header of this format")
            if header.get("fingerprint") != self.fingerprint:
                raise ValueError("written for another geometry, model or namespace")
            key = bytes.fromhex(text(header.get("key")))
            if name != self.header_name(key):
                raise ValueError("not at the name of its key")
            return self._remote_entry(header, key, name)
        except (KeyError, TypeError, ValueError, IndexError, RecursionError) as exc:
            raise CorruptEntry(f"{name}: {exc}") from exc

    def scan(self) -> tuple[list[DiskEntry], list[tuple[Path, str]]]:
        """The store's entries of this fleet, model, namespace and layout; the others with why
        (left in the store: not this node's to delete).  Raises StorageError when the store does
        not answer."""
        names = list(self.store.scan(f"{self.prefix}{{*}}:h"))
        good: list[DiskEntry] = []
        bad: list[tuple[Path, str]] = []
        for i in range(0, len(names), 256):
            batch = names[i : i + 256]
            for name, value in zip(batch, self.store.mget(batch), strict=True):
                if value is None:
                    continue  # gone since the listing
                try:
                    good.append(self.parse(name, value))
                except CorruptEntry as exc:
                    bad.append((Path(name), str(exc)))
        return good, bad
