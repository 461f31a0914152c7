"""The store interface a remote tier keeps its entries in, and its Redis implementation.

Small on purpose (get, pipelined multi-get, pipelined put, delete, scan by pattern), so that an
object store can follow.  A store trusts nothing and promises nothing: a value may vanish (another
node's ``DEL``, ``maxmemory`` eviction, a TTL, a restart without persistence) or change (another
writer) between any two calls; :mod:`kvstate.impl.remote` authenticates everything it reads.

Every failure of the store (refused connection, timeout, a dropped connection, an error reply)
is raised as :class:`StoreUnavailable`; the remote tier turns it into a failed load (the hit is
truncated and recomputed) or a failed write (the block stays on host).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from .errors import StorageError


class StoreUnavailable(StorageError):
    """The store did not answer, or answered with an error."""


class ChunkStore(Protocol):
    def get(self, name: str) -> bytes | None: ...

    def mget(self, names: Sequence[str]) -> list[bytes | None]: ...

    def put(self, items: Sequence[tuple[str, Any]], ttl: int | None) -> None: ...

    def delete(self, names: Sequence[str]) -> None: ...

    def scan(self, pattern: str) -> Iterator[str]: ...

    def close(self) -> None: ...


class RedisStore:
    """A Redis server (or Redis Cluster) through the ``redis`` client's connection pool.

    ``url``: ``redis://host:port/db``, ``rediss://...`` or ``unix:///path/to/socket``.  Reads of
    an entry's chunks are one pipelined ``MGET`` (one round trip; the entry's keys share one hash
    tag, so one cluster slot); writes are one pipeline, chunks before the header that names them.
    ``timeout`` bounds every call (connect and socket): a stalled server fails the call after it,
    never later."""

    def __init__(
        self, url: str, *, timeout: float, max_connections: int, cluster: bool = False
    ) -> None:
        try:
            import redis
        except ImportError as exc:  # the ``remote`` extra is not installed
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
                self.client = redis.Redis.from_url(url, **opts)
        except (ValueError, *self._errors) as exc:
            raise StoreUnavailable(f"remote store {url!r}: {exc}") from exc
        self.url = url

    def _fail(self, what: str, exc: BaseException) -> StoreUnavailable:
        err = StoreUnavailable(f"remote store {self.url}: {what}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err

    def ping(self) -> None:
        try:
            self.client.ping()
        except self._errors as exc:
            raise self._fail("ping", exc) from exc

    def get(self, name: str) -> bytes | None:
        try:
            v = self.client.get(name)
        except self._errors as exc:
            raise self._fail("GET", exc) from exc
        return None if v is None else bytes(v)

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

    def put(self, items: Sequence[tuple[str, Any]], ttl: int | None) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            for name, value in items:
                pipe.set(name, bytes(value) if isinstance(value, memoryview) else value, ex=ttl)
            pipe.execute()
        except self._errors as exc:
            raise self._fail("SET", exc) from exc

    def delete(self, names: Sequence[str]) -> None:
        if not names:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.delete(name)
            pipe.execute()
        except self._errors as exc:
            raise self._fail("DEL", exc) from exc

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
        except self._errors:  # (closing a pool whose server went away)
            pass
