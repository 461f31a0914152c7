"""The remote tier's configuration: each documented refusal of ``RemoteConfig``, each limit it
must accept, and a node built over an explicit ``ChunkStore`` (``store=``, not ``url=``).

A run with a remote tier builds every ``RemoteConfig`` from the harness's one good
configuration, so the config's checks never met a bad value and its limits were never touched:
a check one off at a limit (a 64-byte fleet key refused, a one-connection pool refused), or a
check that lets a value through (a ``timeout`` of ``True``, a ``cluster`` of ``1``), is
invisible.  ``refuse_remote_arg(k)`` sends the ``k``-th case of :data:`CASES` through
:func:`kvstate.targets.api.args.run_case`: a refused value must raise exactly
``InvalidArgument`` (docs/remote.md's table, ``RemoteConfig``'s docstring), an accepted limit
must build a config that keeps the value; the harness checks, as for every refusal, that
nothing changed.

``peer_store``: node B over ``RemoteConfig(store=RedisStore(url))``, the interface an object
store would implement, instead of ``url``: it must hit node A's entries and read them byte for
byte (:func:`kvstate.targets.api.remote.peer`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.args import SAME, run_case
from kvstate.targets.api.declare import OpDecl

_KEY = b"kvstate-api-remote-args-key-0123"  # 32 bytes: a good fleet key


class _Store:
    """A ``ChunkStore`` by shape (never connected to)."""

    def mget(self, names: Any) -> list[bytes | None]:
        return [None for _ in names]


def _config(**kw: Any) -> Any:
    from kvstate.impl.remote import RemoteConfig

    base: dict[str, Any] = {"url": "unix:///nowhere/redis.sock", "key": _KEY}
    return RemoteConfig(**{**base, **kw})


def _refused(**kw: Any) -> Callable[[Any], Any]:
    return lambda h: _config(**kw)


def _kept(field: str, value: Any, **kw: Any) -> Callable[[Any], Any]:
    """A limit the config must accept: built, it keeps the value (as the field's type)."""

    def call(h: Any) -> Any:
        got = getattr(_config(**{field: value, **kw}), field)
        return (type(got), got), (type(value) if not isinstance(value, bytearray) else bytes, value)

    return call


NAN = float("nan")
CASES: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("RemoteConfig(key=15 bytes)", "InvalidArgument", _refused(key=b"k" * 15)),
    ("RemoteConfig(key=65 bytes)", "InvalidArgument", _refused(key=b"k" * 65)),
    ("RemoteConfig(key=str)", "InvalidArgument", _refused(key="k" * 32)),
    ("RemoteConfig(key=16 bytes)", SAME, _kept("key", b"k" * 16)),
    ("RemoteConfig(key=64 bytes)", SAME, _kept("key", b"k" * 64)),
    ("RemoteConfig(key=bytearray)", SAME, _kept("key", bytearray(_KEY))),
    ("RemoteConfig(url and store)", "InvalidArgument", _refused(store=_Store())),
    ("RemoteConfig(neither url nor store)", "InvalidArgument", _refused(url=None)),
    ("RemoteConfig(store=, no url)", SAME, lambda h: (type(_config(url=None, store=_Store()).store), _Store)),
    ("RemoteConfig(store=not a ChunkStore)", "InvalidArgument", _refused(url=None, store=object())),
    ("RemoteConfig(url='localhost')", "InvalidArgument", _refused(url="localhost")),
    ("RemoteConfig(url=5)", "InvalidArgument", _refused(url=5)),
    ("RemoteConfig(model with NUL)", "InvalidArgument", _refused(model="m\x00")),
    ("RemoteConfig(namespace=3)", "InvalidArgument", _refused(namespace=3)),
    ("RemoteConfig(prefix with NUL)", "InvalidArgument", _refused(prefix="p\x00")),
    ("RemoteConfig(ttl=0)", "InvalidArgument", _refused(ttl=0)),
    ("RemoteConfig(ttl=2**31 + 1)", "InvalidArgument", _refused(ttl=(1 << 31) + 1)),
    ("RemoteConfig(ttl=True)", "InvalidArgument", _refused(ttl=True)),
    ("RemoteConfig(ttl=1.5)", "InvalidArgument", _refused(ttl=1.5)),
    ("RemoteConfig(ttl=1)", SAME, _kept("ttl", 1)),
    ("RemoteConfig(ttl=2**31)", SAME, _kept("ttl", 1 << 31)),
    ("RemoteConfig(timeout=0)", "InvalidArgument", _refused(timeout=0)),
    ("RemoteConfig(timeout=3600.5)", "InvalidArgument", _refused(timeout=3600.5)),
    ("RemoteConfig(timeout=nan)", "InvalidArgument", _refused(timeout=NAN)),
    ("RemoteConfig(timeout=True)", "InvalidArgument", _refused(timeout=True)),
    ("RemoteConfig(timeout='2')", "InvalidArgument", _refused(timeout="2")),
    ("RemoteConfig(timeout=3600)", SAME, _kept("timeout", 3600)),
    ("RemoteConfig(timeout=0.001)", SAME, _kept("timeout", 0.001)),
    ("RemoteConfig(max_connections=0)", "InvalidArgument", _refused(max_connections=0)),
    ("RemoteConfig(max_connections=4097)", "InvalidArgument", _refused(max_connections=4097)),
    ("RemoteConfig(max_connections=True)", "InvalidArgument", _refused(max_connections=True)),
    ("RemoteConfig(max_connections=1)", SAME, _kept("max_connections", 1)),
    ("RemoteConfig(max_connections=4096)", SAME, _kept("max_connections", 4096)),
    ("RemoteConfig(cluster=1)", "InvalidArgument", _refused(cluster=1)),
    ("RemoteConfig(cluster=True)", SAME, _kept("cluster", True)),
)  # fmt: skip


def do_refuse_remote_arg(h: Any, o: Any) -> int | None:
    return run_case(h, *CASES[o.arg("k") % len(CASES)])


def do_peer_store(h: Any, o: Any) -> int | None:
    """Node B over an explicit ``ChunkStore`` (the Redis one, as an object store's would be
    passed): a cross-node hit read byte for byte."""
    from kvstate.impl.remotestore import RedisStore
    from kvstate.targets.api.remote import WORLD, peer, remote_of

    if remote_of(h) is None or WORLD is None:
        return None
    store = RedisStore(WORLD.url, timeout=30.0, max_connections=4, cluster=WORLD.cluster)
    try:
        peer(h, 0, url=None, store=store)
    finally:
        store.close()
    h.cov.add("remote: nodes over an explicit ChunkStore")
    return None


# the operations of this module, each declared once (kvstate/targets/api/declare.py); drawn only
# when the run has a remote tier (registry.REMOTE_ONLY)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "refuse_remote_arg",
        do_refuse_remote_arg,
        "read",
        lambda s: {"k": st.integers(0, len(CASES) - 1)},
    ),
    OpDecl("peer_store", do_peer_store, "fault"),
)


def walks() -> dict[str, list[Any]]:
    """Scripted (kvstate/targets/api/witnesses.py, in a run with a remote tier): every case."""
    from kvstate.targets.api.base import op

    return {"remote: every RemoteConfig refusal and limit": [
        op("refuse_remote_arg", k=k) for k in range(len(CASES))
    ]}  # fmt: skip
