"""What the disk tier's reliability tests share: a keyed persisted prompt (``persist_keyed``),
a job's view of its cache with methods replaced (``Proxy``), an entry's header rewritten as a
key holder would (``rewrite_header``), and the byte check of whatever a run serves."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from cache_checks import check_compressed as _check_compressed
from cache_checks import make

from kvstate.impl.disk import DiskTier
from kvstate.spec import small

G = small()
L = G.lcm_tokens
KEY = b"k" * 32


def persist_keyed(d: Path, toks: Any, key: bytes = KEY) -> None:
    c = make(cache_dir=d, disk_key=key)
    try:
        a = c.admit(c.request(toks))
        with c.use(a):
            pass
        c.tick(10)
        c.offload(100)
        c.pipelines.drain()
        assert c.spill(100) == toks.size // L
    finally:
        c.close()


class Proxy:
    """A job's view of its cache with some methods replaced (a compiled cache's methods cannot
    be patched; the job's reference to it can)."""

    def __init__(self, target: Any, **replaced: Any) -> None:
        self._target = target
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def check_compressed(run: Any, toks: Any) -> None:
    """Whatever a run serves is this prompt's content (nothing to check for an empty hit)."""
    if run.blocks:
        _check_compressed(run, toks)


def rewrite_header(path: Path, mutate: Any, key: bytes = KEY) -> None:
    """Rewrite an entry's header as a holder of the key would (a valid header MAC)."""
    raw = path.read_bytes()
    pre = struct.Struct("<8sI32s16s")
    magic, hlen, _, kid = pre.unpack(raw[: pre.size])
    header = json.loads(raw[pre.size : pre.size + hlen])
    hb = mutate(header)
    if not isinstance(hb, bytes):
        hb = json.dumps(hb, sort_keys=True).encode()
    tier = DiskTier(path.parent.parent / f"mac-{path.parent.name}", {}, G.load_steps, key=key)
    mac = tier.header_mac(hb)
    tier.close()
    path.write_bytes(pre.pack(magic, len(hb), mac, kid) + hb + raw[pre.size + hlen :])
