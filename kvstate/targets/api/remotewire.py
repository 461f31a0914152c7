"""The remote store's replies cut at every boundary, cut short, out of step or malformed.

A load's reads are one pipeline of ``GET`` s whose replies ``RedisStore.read_into``
(``impl/remotestore.py``) frames itself: header lines through a 64 KiB buffer (a line without its
end refused past 4 KiB), each value received straight into its span of the caller's buffer.  A
real server on a quiet machine sends a load's replies in one piece, so the paths a cut takes
(a header split before its ``\\n``, a value split in its middle, the framing buffer full and
moved to its start, the connection dropped inside a reply), a server's error reply, and every
malformed reply ran in no walk; a parser that copies the wrong range on a split value, or waits
for more on an empty line, was invisible.

``resp_wire(k)`` answers one read of :data:`CASES` from :class:`~kvstate.testing.respserver.
RespServer` (a Unix socket, each piece received alone) and compares ``read_into``'s answer with
what the replies say by RESP's framing (the model here): each value placed in its span and its
size returned (a value of another size: its size, its span untouched; ``$-1`` and ``_``: none);
an error reply fails the call with the first error's text, once every reply was read (the
connection stays in the pool); a broken reply fails the call (``StoreUnavailable`` naming why)
and its connection is never given back (the next read opens a new one).  Every case is followed
by a sound read, byte for byte.  Nothing here touches the cache: the harness checks, as after
every operation, that nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl

ECHO = 23  # the ECHO reply's bytes ("$16\r\n", a 16-byte token, "\r\n") before the GETs'
FILL = 0xA5  # the caller's buffer before a read: a span nothing was placed in keeps it


@dataclass(frozen=True)
class Part:
    """One ``GET`` 's reply: its ``wire`` bytes, the value it carries (``value``, None: none),
    the span the read offers it (``span``, None: the value's own size), an error's text."""

    wire: bytes
    value: bytes | None = None
    span: int | None = None
    error: bytes = b""

    @property
    def room(self) -> int:
        return self.span if self.span is not None else len(self.value or b"")


def val(data: bytes, span: int | None = None) -> Part:
    return Part(b"$%d\r\n%s\r\n" % (len(data), data), data, span)


def blob(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed * 13 + 1) % 251 for i in range(n))


def err(text: bytes) -> Part:
    return Part(b"-%s\r\n" % text, error=text)


NIL, NIL3 = Part(b"$-1\r\n"), Part(b"_\r\n")


@dataclass(frozen=True)
class Case:
    """One crafted answer: its ``parts``; the stream (the ECHO reply, then the parts' bytes)
    cut at ``cuts(stream_len)``; the connection closed after it when ``close``; ``broken``: the
    reason the read must fail with (None: the parts' own outcome)."""

    what: str
    parts: tuple[Part, ...]
    cuts: Callable[[Sequence[Part]], Sequence[int]] = lambda ps: (ECHO,)
    close: bool = False
    broken: str | None = None
    echo: Callable[[bytes], bytes] | None = None  # the ECHO reply (None: the token's own)


def starts(ps: Sequence[Part]) -> list[int]:
    """Each part's offset in the stream."""
    out, at = [], ECHO
    for p in ps:
        out.append(at)
        at += len(p.wire)
    return out


def every_byte(ps: Sequence[Part]) -> Sequence[int]:
    return range(1, ECHO + sum(len(p.wire) for p in ps))


def boundaries(ps: Sequence[Part]) -> Sequence[int]:
    """Inside each header, between its CR and LF, at its value's start, middle and end, and
    between the value's CR and LF."""
    out = []
    for at, p in zip(starts(ps), ps, strict=True):
        head = p.wire.index(b"\r\n") + 2
        n = len(p.wire) - head - 2
        out += [
            at + 1,
            at + head - 1,
            at + head,
            at + head + n // 2,
            at + head + n,
            at + head + n + 1,
        ]
    return out


def cut_short(wire: bytes, at: int) -> Case:
    return Case(
        f"a reply cut short after {at} of its {len(wire)} bytes",
        (Part(wire[:at]),),
        lambda ps: (ECHO, ECHO + max(at - 1, 0)),
        close=True,
        broken="the server closed the connection",
    )


def _filling() -> tuple[tuple[Part, ...], Callable[[Sequence[Part]], Sequence[int]]]:
    """Small values past 64 KiB in pieces of at most ~15 KiB, each ending inside a header: the
    framing buffer fills to its end with a header line cut there, and is moved to its start."""
    unit = val(b"v" * 100)
    for x in range(200):
        first = val(blob(x, 3))
        rem = (65536 - ECHO - len(first.wire)) % len(unit.wire)
        if 1 <= rem <= 4:
            break
    parts = (first, *[unit] * 620)

    def cuts(ps: Sequence[Part]) -> Sequence[int]:
        out, last = [], 0
        for at in starts(ps):
            if at - last > 15000:
                out.append(at + 1)
                last = at + 1
        return out

    return parts, cuts


_FILL_PARTS, _FILL_CUTS = _filling()
_SMALL = val(b"abcde").wire

CASES: tuple[Case, ...] = (
    Case(
        "every byte apart",
        (val(b"abcde"), NIL, val(b""), NIL3, val(b"xyz", span=5), val(b"0123456789", span=2)),
        every_byte,
    ),
    Case("values around 4 KiB cut at every boundary", tuple(val(blob(n, n)) for n in (4095, 4096, 4097)), boundaries),
    Case("values around 64 KiB cut at every boundary", tuple(val(blob(n, n)) for n in (65535, 65536, 65537)), boundaries),
    Case("the framing buffer full, moved to its start", _FILL_PARTS, _FILL_CUTS),
    Case("a value of another size than its span, cut", (val(blob(9000), span=10), val(b"ok")), boundaries),
    Case("an error line of 4095 bytes cut before its LF", (err(b"E" * 4094),), lambda ps: (ECHO, ECHO + 4096)),
    Case(
        "error replies mid-pipeline",
        (val(b"a1"), err(b"WRONGTYPE Operation against a key holding the wrong kind of value"),
         val(b"b2"), err(b"ERR the second error")),
        every_byte,
    ),
    Case("an empty line", (Part(b"\r\n"),), close=True, broken="unexpected reply b''"),
    Case("a line past 4 KiB without its end", (Part(b"-" + b"E" * 5000 + b"\r\n"),),
         lambda ps: range(ECHO, ECHO + 5001, 1000), close=True, broken="a reply line without its end"),
    Case("a simple string", (val(b"a"), Part(b"+OK\r\n")), broken="unexpected reply b'+OK'"),
    Case("a negative length", (Part(b"$-2\r\nab\r\n"),), close=True, broken="unexpected reply b'$-2'"),
    Case("a length that is not a number", (Part(b"$x1\r\n"),), close=True, broken="ValueError"),
    Case("a value without its end", (Part(b"$3\r\nabcXY"), val(b"z")), every_byte, broken="a value without its end"),
    Case("a reply out of step (the header)", (val(b"a"),), echo=lambda t: b"+OK\r\n", broken="out of step"),
    Case("a reply out of step (the token)", (val(b"a"),), echo=lambda t: b"$16\r\n" + t[::-1] + b"\r\n",
         broken="out of step"),
    Case("the connection dropped inside a 64 KiB value", (Part(val(blob(70000)).wire[:40000], span=70000),),
         lambda ps: (ECHO, ECHO + 20000), close=True, broken="the server closed the connection"),
    *(cut_short(_SMALL, at) for at in range(len(_SMALL))),
)  # fmt: skip


def _fail(h: Any, c: Case, msg: str) -> Any:
    return h.fail("remote-wire", [c.what], f"resp_wire: {c.what}: {msg}")


def _want(c: Case, spans: list[tuple[int, int]]) -> tuple[list[int], bytearray, str]:
    """What RESP's framing says of the parts: each size, the buffer, the first error's text."""
    from kvstate.impl.remotestore import MISSING

    buf = bytearray([FILL]) * (spans[-1][1] if spans else 0)
    sizes = []
    for p, (lo, hi) in zip(c.parts, spans, strict=True):
        if p.value is None:
            sizes.append(MISSING)
            continue
        sizes.append(len(p.value))
        if len(p.value) == hi - lo:
            buf[lo:hi] = p.value
    first = next((p.error for p in c.parts if p.error), b"")
    return sizes, buf, first[:63].decode()


def run_wire_case(h: Any, c: Case) -> None:
    from kvstate.impl.remotestore import RedisStore, StoreUnavailable
    from kvstate.testing.respserver import RespServer, Script

    srv = RespServer()
    store = RedisStore(srv.url, timeout=2.0, max_connections=2)
    try:
        spans, at = [], 0
        for p in c.parts:
            spans.append((at, at + p.room))
            at += p.room
        names = [f"w:{i}" for i in range(len(c.parts))]
        store.read_into([], memoryview(bytearray()), [])  # (a connection opened: the pool's)
        before = srv.accepted

        def reply(token: bytes, _: list[bytes]) -> bytes:
            echo = c.echo(token) if c.echo else b"$%d\r\n%s\r\n" % (len(token), token)
            return echo + b"".join(p.wire for p in c.parts)

        srv.script = Script(reply, len(names), tuple(c.cuts(c.parts)), c.close)
        buf = bytearray([FILL]) * at
        sizes, want_buf, error = _want(c, spans)
        try:
            got = store.read_into(names, memoryview(buf), spans)
        except StoreUnavailable as exc:
            want = c.broken or (f"GET: {error}" if error else None)
            if want is None or want not in str(exc) or not str(exc).startswith("remote store"):
                raise _fail(
                    h, c, f"read_into raised {exc!r}; the replies say: {want or sizes}"
                ) from exc
        else:
            if c.broken or error:
                raise _fail(h, c, f"read_into returned {got}: it must fail ({c.broken or error})")
            if got != sizes:
                raise _fail(h, c, f"read_into returned sizes {got}, the replies {sizes}")
            if buf != want_buf:
                bad = next(i for i in range(len(buf)) if buf[i] != want_buf[i])
                raise _fail(
                    h, c, f"the caller's buffer differs from the replies' values at byte {bad}"
                )
        # a sound read next: the framing of the case is not carried over, and a connection
        # whose framing was lost is not given back to the pool
        srv.values = {n.encode(): blob(5, i) for i, n in enumerate(names)}
        srv.script = Script(srv.sound, len(names))
        buf2 = bytearray(5 * len(names))
        spans2 = [(5 * i, 5 * i + 5) for i in range(len(names))]
        try:
            got2 = store.read_into(names, memoryview(buf2), spans2)
        except StoreUnavailable as exc:
            raise _fail(h, c, f"the sound read after it failed: {exc}") from exc
        if got2 != [5] * len(names) or bytes(buf2) != b"".join(
            srv.values[n.encode()] for n in names
        ):
            raise _fail(h, c, f"the sound read after it read {got2} / wrong bytes")
        fresh = srv.accepted - before
        if fresh != (1 if c.broken else 0):
            raise _fail(
                h, c, f"the sound read after it opened {fresh} connection(s): "
                + ("a connection whose framing was lost must not go back to the pool" if c.broken
                   else "a read whose replies were all read keeps its connection"),
            )  # fmt: skip
    finally:
        store.close()
        srv.close()
    h.cov.add(f"remote wire: {'broken' if c.broken else 'read'} replies checked")


def do_resp_wire(h: Any, o: Any) -> int | None:
    from kvstate.targets.api.remote import remote_of

    if remote_of(h) is None:
        return None
    run_wire_case(h, CASES[o.arg("k") % len(CASES)])
    return None


# drawn only when the run has a remote tier (registry.REMOTE_ONLY); every case once in a witness
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "resp_wire",
        do_resp_wire,
        "read",
        lambda s: {"k": st.integers(0, len(CASES) - 1)},
        rule=False,
    ),
)


def walks() -> dict[str, list[Any]]:
    """Scripted (kvstate/targets/api/witnesses.py, in a run with a remote tier): every case."""
    from kvstate.targets.api.base import op

    return {
        "remote: every crafted reply of the store": [
            op("resp_wire", k=k) for k in range(len(CASES))
        ]
    }
