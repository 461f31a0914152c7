"""Node B: a second cache in its own OS process on the same remote store, driven over a pipe.

A fleet's nodes share a store, not a process: node A's writes reach node B only through the
server, and B's loads race A's entries being evicted, deleted or rewritten by other processes.
This module is node B's side (``python -m kvstate.testing.node FD``, FD one end of a socket
pair); :class:`NodeB` is the driver's side (``kvstate/targets/api/twonode.py``).  The node
imports the cache and nothing of the harness (it starts in about a second), opens its own
:class:`~kvstate.impl.cache.HeterogeneousKVCache` on the server it is told, and answers one
command at a time: ``(name, *args)`` in, ``("ok", value)`` or ``("error", text)`` out.

* ``open(kwargs, geometry)``: a fresh cache (its own temporary directory, manual pipelines, the
  default table on ``geometry``): the entries it adopted from the store, block key -> nonce.
* ``use(tokens, namespace, seam)``: admit, drain, ``use``, every read :func:`verify_run` makes
  recorded (:class:`Recording`: the bytes B read, returned for the driver to judge against the
  deterministic writer's content: :class:`Replayed`), the hit, B's load events, then B brought
  to rest (every pool free again: :func:`rest`).  ``seam``: "before" pauses B's first remote
  read before it reaches the server, "after" once it has read and authenticated its chunks and
  before any lands: the node sends ``("paused", block key)`` and waits for ``("resume",)``
  while the driver changes the store.
* ``store(tokens, namespace)``: B computes the prefix with its own writer and brings every
  block to its host tier, sends ``("ready", None)``, waits for ``("go",)`` and spills them all
  (the driver spills node A's at the same moment: two writers of one prefix at once).
* ``where()``: its pid and the file its ``kvstate.impl`` was imported from; ``close()``,
  ``exit()``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

PAUSES = ("before", "after")  # where a load of node B may be paused: around its remote read


class Recording:
    """A :class:`~kvstate.impl.cache.Run` as :func:`verify_run` reads it, each read kept (as
    NumPy arrays: they cross the pipe by value)."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self.cache = run.cache
        self.hit_tokens = run.hit_tokens
        self.blocks = run.blocks
        self.reads: dict[tuple[Any, ...], tuple[str, Any]] = {}

    def _read(self, name: str, *a: Any) -> Any:
        try:
            v = getattr(self._run, name)(*a)
        except Exception as exc:
            self.reads[(name, *a)] = ("raise", f"{type(exc).__name__}: {exc}")
            raise
        self.reads[(name, *a)] = ("ok", v.numpy().copy() if hasattr(v, "numpy") else v)
        return v

    def read_compressed(self, *a: Any) -> Any:
        return self._read("read_compressed", *a)

    def read_window(self, *a: Any) -> Any:
        return self._read("read_window", *a)

    def read_tail(self, *a: Any) -> Any:
        return self._read("read_tail", *a)

    def verify_pins(self) -> Any:
        return self._read("verify_pins")


class ReadMissing(RuntimeError):
    """The judge asked for a read node B did not make (another geometry)."""


class Replayed:
    """Node B's recorded reads, as a run :func:`verify_run` judges: the geometry and tiers
    are ``cache``'s (node A's, the same shape), the bytes are B's."""

    def __init__(self, cache: Any, hit_tokens: int, blocks: int, reads: Mapping[Any, Any]) -> None:
        self.cache = cache
        self.hit_tokens = hit_tokens
        self.blocks = blocks
        self.reads = reads

    def _get(self, *key: Any) -> Any:
        import torch

        if key not in self.reads:
            raise ReadMissing(f"node B did not read {key}")
        kind, v = self.reads[key]
        if kind == "raise":
            raise RuntimeError(v)
        return torch.from_numpy(v) if isinstance(v, np.ndarray) else v

    def read_compressed(self, *a: Any) -> Any:
        return self._get("read_compressed", *a)

    def read_window(self, *a: Any) -> Any:
        return self._get("read_window", *a)

    def read_tail(self, *a: Any) -> Any:
        return self._get("read_tail", *a)

    def verify_pins(self) -> Any:
        return self._get("verify_pins")


def rest(c: Any) -> dict[str, Any]:
    """Node B brought to rest through its public API (its request ended, leases run out,
    every copy evicted and dropped: entries are forgotten locally, never deleted from the
    store), and what it then still holds: each pool as (free, size), and the counts that must
    be 0 (pins, entries, loads in flight, jobs)."""
    big = 1 << 10
    c.pipelines.drain()
    c.tick(c.table.consts.lease_max)
    c.pipelines.drain()
    c.evict(big)
    c.drop(big)
    v = c.inspect()
    t = v.tiers
    return {
        "pools": {
            "device slots": (t.slots.free, t.slots.n),
            "host slots": (t.host_slots.free, t.host_slots.n),
            "SWA pages": (t.swa_pool.free, t.swa_pool.n - t.swa_pool.first),
        },
        "held": {
            "pinned blocks": v.pinned_blocks,
            "entries": len(v.disk_entries),
            "remote loads in flight": v.io_inflight,
            "jobs": sum(len(j) for j in v.pending().values()),
        },
    }


class _Node:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.cache: Any = None
        self.dir = ""

    def cmd_open(self, kw: dict[str, Any], geometry: Any) -> dict[str, str]:
        from kvstate.impl.cache import HeterogeneousKVCache
        from kvstate.impl.testdata import DeterministicWriter

        self.cmd_close()
        table = table_on(geometry)
        self.dir = tempfile.mkdtemp(prefix="kvstate-node-b-")
        self.cache = HeterogeneousKVCache(
            table=table,
            writer=DeterministicWriter(),
            executors="manual",
            cache_dir=self.dir,
            **kw,
        )
        return self.adopted()

    def adopted(self) -> dict[str, str]:
        return {e.key.hex(): e.nonce.hex() for e in self.cache.inspect().disk_entries.values()}

    def _pause(self, where: str, entry: Any) -> None:
        self.conn.send(("paused", (where, entry.key.hex())))
        msg = self.conn.recv()
        if msg != ("resume",):
            raise RuntimeError(f"node B paused at a read, told {msg!r}")

    def _seam(self, seam: str | None) -> Callable[[], None]:
        """The first remote read paused ``seam`` (None: no pause); undo with the result."""
        if seam is None:
            return lambda: None
        if seam not in PAUSES:
            raise ValueError(f"no seam {seam!r}")
        hooks = self.cache.test_hooks()
        real: list[Callable[..., Any]] = []  # the tier's own read (replace_disk_method's)
        left = [1]

        def read_block(entry: Any, with_swa: bool) -> Any:
            if not left:
                return real[0](entry, with_swa)
            left.clear()
            if seam == "before":
                self._pause(seam, entry)
                return real[0](entry, with_swa)
            got = real[0](entry, with_swa)  # (read and authenticated: it raises otherwise)
            self._pause(seam, entry)
            return got

        real.append(hooks.replace_disk_method("read_block", read_block))
        return lambda: hooks.replace_disk_method("read_block", None)

    def cmd_use(self, tokens: np.ndarray, namespace: str, seam: str | None) -> dict[str, Any]:
        from kvstate.testing.datacheck import verify_run

        c = self.cache
        events: list[str] = []
        c.events.subscribe(lambda ev: events.append(ev.kind.value))
        undo = self._seam(seam)
        try:
            a = c.admit(c.request(tokens, namespace=namespace))
            c.pipelines.drain()
        finally:
            undo()
        with c.use(a) as run:
            rec = Recording(run)
            problems = verify_run(rec, tokens)  # (B's own view; the driver judges the reads)
        return {
            "hit_tokens": rec.hit_tokens,
            "blocks": rec.blocks,
            "reads": rec.reads,
            "own_problems": problems,
            "loaded": events.count("loaded"),
            "load_failed": events.count("load_failed"),
            "rest": rest(c),
            "paused": seam is not None,
        }

    def cmd_store(self, tokens: np.ndarray, namespace: str) -> dict[str, Any]:
        c = self.cache
        c.drop(1 << 10)  # the entries found on the server forgotten: B hits none, computes all
        a = c.admit(c.request(tokens, namespace=namespace))
        with c.use(a):
            pass
        c.tick(c.table.consts.lease_max)
        c.offload(1 << 10)
        c.pipelines.drain()
        self.conn.send(("ready", None))
        msg = self.conn.recv()
        if msg != ("go",):
            raise RuntimeError(f"node B ready to spill, told {msg!r}")
        spilled = c.spill(1 << 10)
        return {"spilled": spilled, "rest": rest(c)}

    def cmd_where(self) -> dict[str, Any]:
        """This process and the package it runs (a staged copy, where one is first on the path)."""
        import kvstate.impl

        return {"pid": os.getpid(), "impl": kvstate.impl.__file__}

    def cmd_close(self) -> None:
        if self.cache is not None:
            c, self.cache = self.cache, None
            c.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = ""


_TABLES: dict[Any, Any] = {}  # geometry -> the default table on it (kept: a cache compiles it)


def table_on(geometry: Any) -> Any:
    from kvstate.spec import default_table

    if geometry not in _TABLES:
        table = default_table()
        if table.geometry != geometry:
            table = table.derive(name=f"{table.name}@node-b", geometry=geometry)
        _TABLES[geometry] = table
    return _TABLES[geometry]


def warm() -> None:
    """What the first command would import and build, done before the driver asks (the node
    is started early: this runs while the driver works): a small cache opened and closed."""
    import kvstate.testing.datacheck  # noqa: F401
    from kvstate.impl.cache import HeterogeneousKVCache
    from kvstate.impl.testdata import DeterministicWriter
    from kvstate.spec import default_table

    table = table_on(default_table().geometry)
    with tempfile.TemporaryDirectory(prefix="kvstate-node-b-") as d:
        HeterogeneousKVCache(
            table=table,
            writer=DeterministicWriter(),
            executors="manual",
            cache_dir=d,
            max_requests=table.consts.R,
            device_blocks=4,
            swa_blocks=2,
            host_blocks=2,
            disk_blocks=2,
            max_model_len=8 * table.consts.L,
        ).close()


def serve(conn: Connection) -> None:
    """Answer commands until ``exit`` or the driver goes away."""
    warm()
    node = _Node(conn)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        name, args = msg[0], msg[1:]
        if name == "exit":
            node.cmd_close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(node, f"cmd_{name}")(*args)))
        except BaseException as exc:  # noqa: BLE001 - the driver judges it (a finding)
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    node.cmd_close()


class NodeError(RuntimeError):
    """Node B raised (its traceback in the text), or went away."""


class NodeB:
    """The driver's side: node B's process, started once and kept (a run's examples share it:
    its start, about a second with torch, is paid once).  ``env`` and ``cwd``: the process's
    environment and folder (a staged copy of the package, first on ``PYTHONPATH`` and the
    folder, plants a bug in node B alone: ``python -m`` puts the folder first on the path)."""

    def __init__(self, env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
        import socket

        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-W", "ignore", "-m", "kvstate.testing.node", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.pid = os.getpid()  # the driver's (a forked driver starts its own node)

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def recv(self, timeout: float = 120.0) -> tuple[str, Any]:
        if not self.conn.poll(timeout):
            raise NodeError(f"node B did not answer within {timeout} s")
        try:
            kind, value = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise NodeError(f"node B went away (exit code {self.proc.poll()})") from exc
        if kind == "error":
            raise NodeError(f"node B raised {value}")
        return kind, value

    def call(self, *msg: Any) -> Any:
        self.send(*msg)
        kind, value = self.recv()
        if kind != "ok":
            raise NodeError(f"node B answered {kind!r} to {msg[0]!r}")
        return value

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("exit")
                self.recv(30.0)
        except (NodeError, OSError):
            pass
        finally:
            self.conn.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
