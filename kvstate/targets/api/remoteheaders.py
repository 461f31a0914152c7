"""What a node opening on the server adopts: every damaged header refused, naming it, the others
adopted; an entry gone between the listing and its read; a store without ``read_into``.

A node opening on the server lists the headers and adopts each whose bytes authenticate
(``RemoteTier.scan``/``parse``).  The remote walk's faults damage chunks, never headers, so each
of ``parse``'s refusals ran in no walk: a check dropped or reordered there (a header of another
fleet key, cut short, with a byte changed, of another format re-signed with the fleet's key, an
authentic header copied to another entry's name) was invisible.

``remote_header(b, k)``: block ``b``'s header on the server replaced by the ``k``-th damage of
:data:`DAMAGES` (then put back: node A, which already holds the entry, reads only its chunks);
node B opens: it must adopt none of the damaged entry (its rejection logged as a ``removed``
event naming the header and why) and every other entry of node A whose header is there.

``peer_listed(k)``: node B over a ``ChunkStore`` that is the server's (``RedisStore``) without
``read_into`` (an object store's shape: loads read through ``mget`` and copy), and with ``k=1``
deletes the first header it listed before the node reads it (another node's ``DEL`` or an
eviction between the listing and the read; node A, which reads only chunks, is not concerned):
the node must skip it and adopt the rest, and its hit read the chain byte for byte (:func:`kvstate.targets.api.remote.peer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl


def _resign(v: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """``v`` with its JSON header edited and MAC'd again under the fleet key (a writer that
    holds the key: a node of another format or geometry)."""
    from kvstate.impl.entrymac import EntryMacs
    from kvstate.impl.remote import CONTEXTS, MAGIC, PREFIX
    from kvstate.targets.api.remote import FLEET_KEY

    macs = EntryMacs(FLEET_KEY, CONTEXTS)
    header = json.loads(v[PREFIX.size :])
    edit(header)
    hb = json.dumps(header).encode()
    return PREFIX.pack(MAGIC, len(hb), macs.header_mac(hb), macs.key_id) + hb


def _other_key(v: bytes) -> bytes:
    from kvstate.impl.remote import PREFIX

    magic, n, mac, key_id = PREFIX.unpack_from(v)
    return PREFIX.pack(magic, n, mac, bytes(x ^ 1 for x in key_id)) + v[PREFIX.size :]


def _format(h: dict[str, Any]) -> None:
    h["format"] = 2


def _fingerprint(h: dict[str, Any]) -> None:
    h["fingerprint"] = {**h["fingerprint"], "remote": ["another-namespace", "kvstate-api"]}


# (what, the damaged value from the header's and another entry's header, why it is refused)
DAMAGES: tuple[tuple[str, Callable[[bytes, bytes], bytes], str], ...] = (
    ("garbage", lambda v, o: b"not a header", "not a remote entry header"),
    ("another fleet key", lambda v, o: _other_key(v), "another fleet key"),
    ("cut short", lambda v, o: v[:-1], "does not match"),
    ("a byte changed", lambda v, o: v[:-1] + bytes([v[-1] ^ 1]), "MAC"),
    ("another format, signed", lambda v, o: _resign(v, _format), "format"),
    ("another namespace, signed", lambda v, o: _resign(v, _fingerprint), "another geometry"),
    ("another entry's header", lambda v, o: o, "not at the name of its key"),
)


def _fail(h: Any, what: str, msg: str) -> Any:
    return h.fail("remote-adopt", ["remote_header", what], msg)


def do_remote_header(h: Any, o: Any) -> int | None:
    from kvstate.impl.events import EventKind
    from kvstate.targets.api.remote import WORLD, _entry, _node, remote_of

    b = o.arg("b")
    e = _entry(h, b)
    if remote_of(h) is None or WORLD is None or e is None:
        return None
    r = WORLD.admin()
    name = str(e.path)
    others = [str(x.path) for j in range(h.N) if j != b and (x := _entry(h, j)) is not None]
    held = [n for n in others if r.exists(n)]
    v = r.get(name)
    if v is None or not held:
        return None
    what, damage, why = DAMAGES[o.arg("k") % len(DAMAGES)]
    r.set(name, damage(v, r.get(held[0]) or b""))
    try:
        c = _node(h)
        try:
            got = {str(x.path) for x in c.inspect().disk_entries.values()}
            rejected = [ev.detail for ev in c.events.of(EventKind.REMOVED) if name in ev.detail]
        finally:
            c.close()
    finally:
        r.set(name, v)
    if name in got:
        raise _fail(h, what, f"{o.render()}: node B adopted the entry whose header is {what}")
    if not any(why in d for d in rejected):
        raise _fail(
            h,
            what,
            f"{o.render()}: node B refused the header ({what}) without a removed event saying "
            f"why ({why!r}): {rejected}",
        )
    if set(held) - got:
        raise _fail(
            h,
            what,
            f"{o.render()}: node B did not adopt the sound entries {sorted(set(held) - got)}",
        )
    h.cov.add(f"remote: damaged headers refused ({what})")
    return None


class _Listed:
    """The server's store without ``read_into``; with ``gone``, the first header it lists
    deleted before anyone reads it."""

    def __init__(self, url: str, cluster: bool, gone: bool) -> None:
        from kvstate.impl.remotestore import RedisStore

        self.s = RedisStore(url, timeout=30.0, max_connections=4, cluster=cluster)
        self.gone = gone
        self.deleted: list[str] = []

    def mget(self, names: Any) -> list[bytes | None]:
        return self.s.mget(names)

    def put(self, items: Any, ttl: int | None) -> None:
        self.s.put(items, ttl)

    def scan(self, pattern: str) -> Iterator[str]:
        from kvstate.targets.api.remote import WORLD

        names = list(self.s.scan(pattern))
        if self.gone and names and WORLD is not None:
            WORLD.admin().delete(names[0])
            self.deleted.append(names[0])
            self.gone = False
        return iter(names)

    def close(self) -> None:
        self.s.close()


def _restores(h: Any, store: Any) -> tuple[int, int]:
    """Node B over ``store`` hits the chain: (its hit, the blocks it restored); its bytes are
    the prompt's own."""
    import numpy as np

    from kvstate.targets.api.base import NAMESPACE
    from kvstate.targets.api.remote import _node
    from kvstate.testing.datacheck import verify_run

    toks = np.array(h.tokens[: h.N * h.L + 1], dtype=np.int64)
    c = _node(h, url=None, store=store)
    try:
        loaded: list[Any] = []
        c.events.subscribe(lambda ev: loaded.append(ev) if ev.kind.value == "loaded" else None)
        a = c.admit(c.request(toks, namespace=NAMESPACE))
        c.pipelines.drain()
        with c.use(a) as run:
            wrong = verify_run(run, toks)
            hit = run.hit_tokens
    finally:
        c.close()
    if wrong:
        raise h.fail("data", ["peer_listed"], "node B reads wrong bytes:\n  " + "\n  ".join(wrong))
    return hit, len(loaded)


def _one_slot(h: Any) -> None:
    """Every key of one of node A's entries lies in the header's cluster slot (one hash tag:
    docs/remote.md), so a cluster serves a load's pipeline from one node."""
    from redis.crc import key_slot

    from kvstate.targets.api.remote import _entry, _names

    for b in range(h.N):
        e = _entry(h, b)
        if e is None:
            continue
        header, chunks = _names(h, e)
        other = [c for c in chunks if key_slot(c.encode()) != key_slot(header.encode())]
        if other:
            raise h.fail(
                "remote-slot",
                ["peer_listed"],
                f"block {b}'s chunks {other} lie outside its header's slot ({header})",
            )
        h.cov.add("remote: entries in one cluster slot")


def do_peer_listed(h: Any, o: Any) -> int | None:
    """``peer_listed(k)``: k=0, node B over the store without ``read_into`` restores what node
    B over the store itself restores, byte for byte; k=1, a header gone after the listing."""
    from kvstate.impl.remotestore import RedisStore
    from kvstate.targets.api.remote import WORLD, peer, remote_of

    if remote_of(h) is None or WORLD is None:
        return None
    store = _Listed(WORLD.url, WORLD.cluster, bool(o.arg("k")))
    try:
        if o.arg("k"):
            peer(h, 0, url=None, store=store)
        else:
            _one_slot(h)
            plain = RedisStore(WORLD.url, timeout=30.0, max_connections=4, cluster=WORLD.cluster)
            try:
                want = _restores(h, plain)
            finally:
                plain.close()
            got = _restores(h, store)
            if got != want:
                raise h.fail(
                    "remote-mget",
                    ["peer_listed"],
                    f"{o.render()}: node B over a store without read_into hit {got[0]} tokens "
                    f"and restored {got[1]} blocks; over the same store with it, {want[0]} and "
                    f"{want[1]}",
                )
    finally:
        store.close()
    h.cov.add("remote: nodes over a store without read_into")
    return None


# only in a run with a remote tier (registry.REMOTE_ONLY), scripted (the ci walk's draws unmoved)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "remote_header",
        do_remote_header,
        "fault",
        lambda s: {"b": s.block, "k": st.integers(0, len(DAMAGES) - 1)},
        rule=False,
    ),
    OpDecl("peer_listed", do_peer_listed, "fault", lambda s: {"k": st.integers(0, 1)}, rule=False),
)


def walks(to_disk: list[Any]) -> dict[str, list[Any]]:
    """Scripted (kvstate/targets/api/witnesses.py, in a run with a remote tier): every damage
    of a header, on the blocks in turn; node B over a store without ``read_into``."""
    from kvstate.targets.api.base import op

    return {
        "remote: every damage of a header, node B opening": [
            *to_disk,
            *[op("remote_header", b=k % 2, k=k) for k in range(len(DAMAGES))],
            op("peer_listed", k=0),
            op("remote_resize", b=0),  # (kvstate/targets/api/remotesteps.py)
            op("remote_del", b=1, kind=1),
            op("peer_listed", k=0),
            op("peer_listed", k=1),
        ]
    }
