"""``RedisStore.read_into`` on crafted replies (:class:`kvstate.testing.respserver.RespServer`, a
Unix socket that cuts a reply where it is told): a length no value has (``$-2``) is a broken
reply, refused, never a size; the fuzz's cases (kvstate/targets/api/remotewire.py) each answered
as RESP's framing says."""

from __future__ import annotations

from typing import Any

import pytest

from kvstate.impl.remotestore import RedisStore, StoreUnavailable
from kvstate.testing.respserver import RespServer, Script

pytest.importorskip("redis")


def test_a_negative_length_is_a_broken_reply() -> None:
    """``$-2`` once came back as a size of -2, the parser's position moved 2 bytes back."""
    srv = RespServer()
    store = RedisStore(srv.url, timeout=5.0, max_connections=2)
    try:
        echo = lambda t, ns: b"$%d\r\n%s\r\n" % (len(t), t) + b"$-2\r\nab\r\n"  # noqa: E731
        srv.script = Script(echo, 1)
        with pytest.raises(StoreUnavailable, match="unexpected reply b'\\$-2'"):
            store.read_into(["a"], memoryview(bytearray(2)), [(0, 2)])
        srv.values = {b"a": b"xy"}
        buf = bytearray(2)
        assert store.read_into(["a"], memoryview(buf), [(0, 2)]) == [2] and buf == b"xy"
    finally:
        store.close()
        srv.close()


class _Harness:
    """What :func:`run_wire_case` needs of the API harness."""

    class cov:  # noqa: N801
        add = staticmethod(lambda *a: None)

    def fail(self, kind: str, detail: Any, message: str) -> AssertionError:
        return AssertionError(message)


def test_every_crafted_reply_is_read_as_resp_frames_it() -> None:
    from kvstate.targets.api.remotewire import CASES, run_wire_case

    for c in CASES:
        run_wire_case(_Harness(), c)
