"""The store interface a remote tier keeps its entries in, and its Redis implementation.

Small on purpose (pipelined multi-get, pipelined put, scan by pattern, close), so that an object
store can follow; no delete, because the remote tier never deletes a shared entry (the server's
TTL and eviction do); a store may also read values straight into a caller's buffer
(:meth:`RedisStore.read_into`: what a load uses where the store has it).  A store trusts nothing and promises nothing: a value may vanish (another
node's ``DEL``, ``maxmemory`` eviction, a TTL, a restart without persistence) or change (another
writer) between any two calls; :mod:`kvstate.impl.remote` authenticates everything it reads.

Every failure of the store (refused connection, timeout, a dropped connection, an error reply)
is raised as :class:`StoreUnavailable`; the remote tier turns it into a failed load (the hit is
truncated and recomputed) or a failed write (the block stays on host).
"""

from __future__ import annotations

import secrets
import socket
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from .errors import StorageError


class StoreUnavailable(StorageError):
    """The store did not answer, or answered with an error."""


MISSING = -1  # read_into's size of a value the store does not hold
_LINE_MAX = 64  # a reply's header line (``$<length>``, an error's text is cut at this)


class ChunkStore(Protocol):
    def mget(self, names: Sequence[str]) -> list[bytes | None]: ...

    def put(self, items: Sequence[tuple[str, Any]], ttl: int | None) -> None: ...

    def scan(self, pattern: str) -> Iterator[str]: ...

    def close(self) -> None: ...


def _blocking(sock: socket.socket) -> float | None:
    """Put ``sock`` in blocking mode for a read, its wait bounded by the kernel
    (``SO_RCVTIMEO``, the socket's own timeout): each value then arrives in one
    ``recv_into(..., MSG_WAITALL)``, the GIL released once for the whole value, where a
    non-blocking socket returns each piece the server has written so far (a fifth of a value, on
    a Unix socket) and takes the GIL back for each: with ``io_cap`` loads in flight that
    hand-off was half the receive's CPU.  Returns the socket's timeout (:func:`_restore`)."""
    timeout = sock.gettimeout()
    t = 0.0 if timeout is None else timeout
    sec = int(t)
    usec = max(1, int((t - sec) * 1e6)) if t else 0
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, usec))
    sock.settimeout(None)
    return timeout


def _restore(sock: socket.socket, timeout: float | None) -> bool:
    """The socket's own timeout back (the client's other calls rely on it); True."""
    sock.settimeout(timeout)
    return True


class _Replies:
    """Pipelined ``GET`` replies off one socket (RESP): each value received straight into its
    place in the caller's buffer (``recv_into``, the GIL released while the kernel copies: one
    copy, kernel to buffer, where a client library's parser copies each value into a buffer
    of its own and then into a ``bytes`` object), the framing through a small buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(1 << 16)
        self.view = memoryview(self.buf)
        self.lo = self.hi = 0

    def _more(self) -> None:
        if self.lo == self.hi:
            self.lo = self.hi = 0
        elif self.hi == len(self.buf):
            n = self.hi - self.lo
            self.buf[:n] = self.view[self.lo : self.hi]
            self.lo, self.hi = 0, n
        got = self.sock.recv_into(self.view[self.hi :])
        if not got:
            raise ConnectionError("the server closed the connection")
        self.hi += got

    def line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n", self.lo, self.hi)
            if i >= 0:
                out = bytes(self.view[self.lo : i])
                self.lo = i + 2
                return out
            if self.hi - self.lo > 1 << 12:
                raise ConnectionError("a reply line without its end")
            self._more()

    def into(self, dst: memoryview) -> None:
        n = min(len(dst), self.hi - self.lo)
        dst[:n] = self.view[self.lo : self.lo + n]
        self.lo += n
        while n < len(dst):
            # (a wait past SO_RCVTIMEO raises BlockingIOError, an OSError: the read fails)
            got = self.sock.recv_into(dst[n:], 0, socket.MSG_WAITALL)
            if not got:
                raise ConnectionError("the server closed the connection")
            n += got

    def skip(self, n: int) -> None:
        """Drop ``n`` bytes (a value of another size than its span's)."""
        while n:
            if self.lo == self.hi:
                self._more()
            k = min(n, self.hi - self.lo)
            self.lo += k
            n -= k

    def end(self) -> None:
        """A value's ``\\r\\n``."""
        while self.hi - self.lo < 2:
            self._more()
        if self.view[self.lo : self.lo + 2] != b"\r\n":
            raise ConnectionError("a value without its end")
        self.lo += 2


class RedisStore:
    """A Redis server (or Redis Cluster) through the ``redis`` client's connection pool.

    ``url``: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path/to/socket``.  A load's
    reads are one pipeline of ``GET`` s received straight into its buffer (:meth:`read_into`;
    one round trip; an entry's keys share one hash tag, so one cluster slot); writes are one pipeline, chunks before the header that names them.
    ``timeout`` bounds every call (connect and socket): a stalled server fails the call after it,
    never later."""

    def __init__(
        self, url: str, *, timeout: float, max_connections: int, cluster: bool = False
    ) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover: the walks run with the ``remote`` extra
            raise StoreUnavailable(
                "the remote tier needs the redis client: pip install 'kvstate[remote]'"
            ) from exc
        self._errors: tuple[type[BaseException], ...] = (redis.exceptions.RedisError, OSError)
        opts = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "max_connections": max_connections,
        }
        try:
            if cluster:
                from redis.cluster import RedisCluster

                self.client: Any = RedisCluster.from_url(url, **opts)
            else:
                self.client = redis.Redis.from_url(url, protocol=2, **opts)
        except (ValueError, *self._errors) as exc:
            raise StoreUnavailable(f"remote store {url!r}: {exc}") from exc
        self.url = url
        self.cluster = cluster

    def _fail(self, what: str, exc: BaseException) -> StoreUnavailable:
        err = StoreUnavailable(f"remote store {self.url}: {what}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err

    def mget(self, names: Sequence[str]) -> list[bytes | None]:
        if not names:
            return []
        try:
            if hasattr(self.client, "mget_nonatomic"):
                got = self.client.mget_nonatomic(list(names))
            else:
                got = self.client.mget(list(names))
        except self._errors as exc:
            raise self._fail("MGET", exc) from exc
        return [None if v is None else bytes(v) for v in got]

    def read_into(
        self, names: Sequence[str], buf: memoryview, spans: Sequence[tuple[int, int]]
    ) -> list[int]:
        """``GET`` each name (one pipeline, one connection of the pool, one round trip) into
        ``buf[lo:hi]`` of its span; returns each value's size (:data:`MISSING` where the store
        holds none).  A value of another size is not placed (the caller fails its chunk).  A
        cluster reads through :meth:`mget` and copies."""
        if any(not 0 <= lo <= hi <= len(buf) for lo, hi in spans):
            raise ValueError("read_into: a span outside the buffer")
        if self.cluster:
            sizes = []
            for (lo, hi), v in zip(spans, self.mget(names), strict=True):
                if v is not None and len(v) == hi - lo:
                    buf[lo:hi] = v
                sizes.append(MISSING if v is None else len(v))
            return sizes
        pool = self.client.connection_pool
        try:
            conn = pool.get_connection()
        except self._errors as exc:
            raise self._fail("GET", exc) from exc
        clean = False
        try:
            # an ECHO of a fresh token first: a reply nobody read on this connection (whenever
            # it arrives) comes before the token's and fails the call, never passes for a value
            token = secrets.token_hex(8).encode()
            cmds = [("ECHO", token), *(("GET", n) for n in names)]
            conn.send_packed_command(conn.pack_commands(cmds), False)
            sock = conn._sock
            replies = _Replies(sock)
            blocking = _blocking(sock)
            if replies.line() != b"$%d" % len(token):
                raise ConnectionError("a reply out of step on a pooled connection")
            echo = bytearray(len(token))
            replies.into(memoryview(echo))
            replies.end()
            if echo != token:
                raise ConnectionError("a reply out of step on a pooled connection")
            sizes, error = [], b""
            for lo, hi in spans:
                head = replies.line()
                kind = head[:1]
                if kind == b"$" and head[1:] != b"-1":
                    n = int(head[1:])
                    if n < 0:  # (a length no value has: skipping it would go backwards)
                        raise ConnectionError(f"unexpected reply {head[:_LINE_MAX]!r}")
                    if n == hi - lo:
                        replies.into(buf[lo:hi])
                    else:
                        replies.skip(n)
                    replies.end()
                    sizes.append(n)
                elif kind in (b"$", b"_"):  # RESP2's and RESP3's nil: no such value
                    sizes.append(MISSING)
                elif kind == b"-":
                    error = error or head[1:_LINE_MAX]
                    sizes.append(MISSING)
                else:
                    raise ConnectionError(f"unexpected reply {head[:_LINE_MAX]!r}")
            clean = _restore(sock, blocking)
        except ValueError as exc:  # (a length that is not a number)
            raise self._fail("GET", exc) from exc
        except self._errors as exc:
            raise self._fail("GET", exc) from exc
        finally:
            if not clean:  # (its framing is lost: never back to the pool as it is)
                conn.disconnect()
            pool.release(conn)
        if error:
            raise StoreUnavailable(
                f"remote store {self.url}: GET: {error.decode(errors='replace')}"
            )
        return sizes

    def put(self, items: Sequence[tuple[str, Any]], ttl: int | None) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for name, value in items:
                pipe.set(name, bytes(value) if isinstance(value, memoryview) else value, ex=ttl)
            pipe.execute()
        except self._errors as exc:
            raise self._fail("SET", exc) from exc

    def scan(self, pattern: str) -> Iterator[str]:
        try:
            names = [
                n.decode() if isinstance(n, bytes) else str(n)
                for n in self.client.scan_iter(match=pattern, count=1000)
            ]
        except self._errors as exc:
            raise self._fail("SCAN", exc) from exc
        return iter(names)

    def close(self) -> None:
        try:
            self.client.close()
        except self._errors:  # pragma: no cover: redis-py's disconnect swallows socket errors
            pass  # (closing a pool whose server went away, with a client that raises them)
