"""A tiny Redis stand-in on a Unix socket that answers a pipeline of ``GET`` s with crafted bytes,
cut into pieces that each reach the client alone.

The remote store's reply parser (``impl/remotestore.py``, ``_Replies``) receives straight into
the caller's buffer and frames through a small one; where a reply is cut (inside a header line,
between its ``\\r`` and ``\\n``, inside a value, at the framing buffer's end) decides which of its
paths runs.  A real server's cuts are the kernel's and the network's: this server makes them
exact.  It sends one piece, then waits until the client has received all of it (the socket's
unread count, ``TIOCOUTQ``, back to 0) before it sends the next, so no ``recv`` ever returns
bytes of two pieces.  A piece of 16 KiB or less is one socket buffer: the client's ``recv``
takes it whole (or up to the room it offers).

Everything but the scripted pipeline is answered as a server would: ``CLIENT ...`` (redis-py's
``SETINFO`` at connect) with ``+OK``; a pipeline ``ECHO token, GET a, GET b ...`` with the token
and then the script's bytes (``reply(token)``), or, with no script, each name's value from
:attr:`values` (``$-1`` where there is none).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DRAIN_S = 2.0  # the longest a piece waits for the client to take it (then the rest is dropped)


@dataclass
class Script:
    """The answer to the next pipeline (its ``ECHO`` and ``gets`` GETs): ``reply(token, names)``
    (the bytes, the ``ECHO`` reply included) cut at ``cuts`` (offsets into them), the connection closed after the last piece
    when ``close``."""

    reply: Callable[[bytes, list[bytes]], bytes]
    gets: int  # the pipeline's GETs after its ECHO
    cuts: tuple[int, ...] = ()
    close: bool = False


@dataclass
class RespServer:
    """The server (see the module's docstring); :attr:`url` for ``RedisStore``; :attr:`accepted`
    counts the connections it took (a connection a failed read must not give back to the pool
    shows as a new one at the next read)."""

    values: dict[bytes, bytes] = field(default_factory=dict)
    script: Script | None = None
    accepted: int = 0

    def __post_init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvresp-")
        self.path = os.path.join(self.dir, "s.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def close(self) -> None:
        _shut(self.sock)  # (a shutdown wakes the accepting thread; a close alone does not)
        for c in self.conns:
            _shut(c)
        for t in self.threads:
            t.join(DRAIN_S)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return  # (closed)
            self.accepted += 1
            self.conns.append(c)
            t = threading.Thread(target=self._serve, args=(c,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, c: socket.socket) -> None:
        cmds = _Commands(c)
        try:
            while True:
                cmd = cmds.next()
                if cmd is None:
                    return
                name = cmd[0].upper()
                if name == b"ECHO":
                    n = self.script.gets if self.script else cmds.pending()
                    gets = [cmds.next() for _ in range(n)]
                    self._answer(c, cmd[1], [g[1] for g in gets if g])
                else:  # CLIENT SETINFO and the like
                    c.sendall(b"+OK\r\n")
        except OSError:
            return
        finally:
            _shut(c)

    def sound(self, token: bytes, names: list[bytes]) -> bytes:
        """A server's answer: the token, then each name's value from :attr:`values`."""
        out = b"$%d\r\n%s\r\n" % (len(token), token)
        for n in names:
            v = self.values.get(n)
            out += b"$-1\r\n" if v is None else b"$%d\r\n%s\r\n" % (len(v), v)
        return out

    def _answer(self, c: socket.socket, token: bytes, names: list[bytes]) -> None:
        script, self.script = self.script, None
        if script is None:
            c.sendall(self.sound(token, names))
            return
        data = script.reply(token, names)
        edges = [0, *sorted(x for x in script.cuts if 0 < x < len(data)), len(data)]
        for lo, hi in zip(edges, edges[1:], strict=False):
            c.sendall(data[lo:hi])
            _drained(c)
        if script.close:
            _shut(c)


class _Commands:
    """The client's commands off a socket (RESP arrays of bulk strings)."""

    def __init__(self, c: socket.socket) -> None:
        self.c, self.buf = c, b""

    def _fill(self) -> bool:
        got = self.c.recv(1 << 16)
        self.buf += got
        return bool(got)

    def _line(self) -> bytes | None:
        while b"\r\n" not in self.buf:
            if not self._fill():
                return None
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def next(self) -> list[bytes] | None:
        head = self._line()
        if head is None or not head.startswith(b"*"):
            return None
        out = []
        for _ in range(int(head[1:])):
            n = int((self._line() or b"$0")[1:])
            while len(self.buf) < n + 2:
                if not self._fill():
                    return None
            out.append(self.buf[:n])
            self.buf = self.buf[n + 2 :]
        return out

    def pending(self) -> int:
        """The commands already received (a short pipeline arrives in one piece)."""
        return self.buf.count(b"*")  # (the scripted names hold no '*')


def _drained(c: socket.socket) -> None:
    """Wait until the client has received every byte sent (or the deadline)."""
    end = time.monotonic() + DRAIN_S
    while time.monotonic() < end:
        try:
            left = struct.unpack("i", fcntl.ioctl(c.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        except (OSError, ValueError):  # (closed meanwhile)
            return
        if not left:
            return
        time.sleep(0.0002)


def _shut(c: socket.socket) -> None:
    try:
        c.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    c.close()
