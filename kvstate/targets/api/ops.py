"""The harness's core operations: the engine's calls and the faults of the disk and the
process, each a handler driving the public API for ``h``
(:class:`kvstate.targets.api.state.ApiHarness`) and returning the request it concerns, declared
once in :data:`DECLS` (the form: :mod:`kvstate.targets.api.declare`; the tables derived from
every module's declarations: :mod:`kvstate.targets.api.registry`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.harness.trace import TraceStep
from kvstate.spec.phases import CKV, Req
from kvstate.targets.api.base import NAMESPACE, OTHER_NAMESPACE, Harness, Live
from kvstate.targets.api.declare import OpDecl, Sizes
from kvstate.targets.api.faults import _InjectedJobError, _jobs, _step_job
from kvstate.targets.api.prefix import read_outside_chain
from kvstate.targets.api.stored import at_restart


def _slot_of(h: Harness, i: int) -> int | None:
    lv = h.live[i]
    return lv.req.slot.index if lv is not None and lv.req.slot is not None else None


def _do_request(h: Harness, o: TraceStep) -> int | None:
    i, life = o.arg("i"), o.arg("life")
    n = min(o.arg("n") * h.scale, len(h.tokens))  # (another geometry's block: geometry.py)
    if h.live[i] is not None:
        return None  # the mapping of request() changes nothing either way
    h.done[i] = None
    buf = np.array(h.tokens, dtype=np.int64)  # the caller's reusable buffer
    want = np.array(h.tokens[:n], dtype=np.int64)
    req = h.cache.request(buf[:n], namespace=NAMESPACE, lifetime=life)
    h.live[i] = Live(req, want, buf)
    return None


def _do_admit(h: Harness, o: TraceStep) -> int | None:
    i = o.arg("i")
    lv = h.live[i]
    back = h.done[i]
    if lv is None and back is not None:  # the request that ended here, admitted again
        back.ctx = back.run = None
        lv = h.live[i] = back
        h.done[i] = None
        h.cov.add("admissions again")
    if lv is None or lv.req.slot is not None:
        h.call_override = "read"
        return None
    adm = h.cache.admit(lv.req)
    h.cov.add(f"admissions {adm.state}")
    return _slot_of(h, o.arg("i"))


def _do_use(h: Harness, o: TraceStep) -> int | None:
    from kvstate.impl.errors import NotReady

    lv = h.live[o.arg("i")]
    if lv is None or lv.ctx is not None:
        h.call_override = "read"
        return None
    r = _slot_of(h, o.arg("i"))
    try:
        # a pending admission is waited for through its own ``wait`` first (the same
        # finalization ``use`` runs; it must leave the admission ready), then used
        adm = lv.req.admission
        if adm is not None and not adm.ready:
            adm.wait(timeout=0.5 if h.threads else 30.0)
            if not adm.ready:
                raise h.fail("api", ["wait"], "Admission.wait() returned while still pending")
        ctx = h.cache.use(lv.req, timeout=0.5 if h.threads else 30.0)
        run = ctx.__enter__()
    except NotReady:
        h.cov.add("fault stall")  # the recovery is still running: the Run waits / times out
        raise
    lv.ctx, lv.run = ctx, run
    return r


def _end(h: Harness, i: int, finish: bool) -> int | None:
    lv = h.live[i]
    if lv is None:
        h.call_override = "read"
        return None
    r = _slot_of(h, i)
    if lv.ctx is not None and lv.req.slot is not None and lv.req.slot.phase == Req.USING:
        if finish:
            lv.ctx.__exit__(None, None, None)
        else:
            h.cache.abort(lv.req)
    elif lv.req.slot is not None:
        h.call_override = "abort"
        h.cache.abort(lv.req)
    else:
        h.call_override = "read"
    if lv.run is not None:
        h.released[i] = (lv.run, lv.want[: len(lv.req.tokens)].copy())
    h.live[i] = None
    h.done[i] = lv
    h.ended = lv
    return r


def _do_finish(h: Harness, o: TraceStep) -> int | None:
    return _end(h, o.arg("i"), True)


def _do_abort(h: Harness, o: TraceStep) -> int | None:
    return _end(h, o.arg("i"), False)


def _do_append(h: Harness, o: TraceStep) -> int | None:
    lv = h.live[o.arg("i")]
    n0 = len(lv.req.tokens) if lv is not None else 0
    n1 = min(n0 + o.arg("k") * h.scale, len(h.tokens))
    if lv is None or lv.run is None or lv.req.slot is None or n1 == n0:
        h.call_override = "read"
        return None
    lv.want = np.array(h.tokens[:n1], dtype=np.int64)
    lv.run.append(h.tokens[n0:n1])
    return _slot_of(h, o.arg("i"))


def _do_read(h: Harness, o: TraceStep) -> int | None:
    return None  # the bytes check after the call does the reading


def _do_read_released(h: Harness, o: TraceStep) -> int | None:
    h.read_released(o.arg("i"))
    return None


def _do_mutate(h: Harness, o: TraceStep) -> int | None:
    lv = h.live[o.arg("i")]
    if lv is None:
        return None
    from kvstate.impl.testdata import harness_tokens

    h.cov.add("fault token_reuse")
    lv.buf.flags.writeable = True
    lv.buf[:] = harness_tokens(len(lv.buf), seed=7)  # the engine reuses its buffer
    return None


def _do_abort_in_use(h: Harness, o: TraceStep) -> int | None:
    i = o.arg("i")
    lv = h.live[i]
    if lv is None or lv.ctx is None or lv.req.slot is None:
        h.call_override = "read"
        return None
    r = _slot_of(h, i)
    errs: list[BaseException] = []

    def other() -> None:
        try:
            h.cache.abort(lv.req)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errs.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    if errs:
        raise errs[0]
    h.cov.add("fault abort_in_use")
    lv.ctx.__exit__(None, None, None)  # the with block ends after the abort: nothing more
    h.released[i] = (lv.run, lv.want[: len(lv.req.tokens)].copy())
    h.live[i] = None
    h.done[i] = lv
    return r


def _do_foreign(h: Harness, o: TraceStep) -> int | None:
    """A whole request over the same tokens in another namespace: no hit (namespaces share no
    block), its own bytes right, its blocks stored next to the chain's (evicting some)."""
    n, ns = o.arg("n"), o.arg("ns")
    want = np.array(h.tokens[:n], dtype=np.int64)
    req = h.cache.request(want.copy(), namespace=f"{OTHER_NAMESPACE}-{ns}", lifetime=1)
    adm = h.cache.admit(req)
    assert req.slot is not None
    h.foreign_slot = req.slot.index
    h.cov.add("foreign requests")
    if adm.hit_tokens:
        h.cov.add("foreign hits")
        if ns not in h.foreign_stored:
            raise h.fail(
                "namespace",
                ["hit"],
                f"a request in namespace {ns}, where nothing was stored, hit {adm.hit_tokens} "
                "tokens (namespaces share no block)",
            )
    if read_outside_chain(h, req, want, "foreign request"):
        h.foreign_stored.add(ns)
    return None


def _do_tick(h: Harness, o: TraceStep) -> int | None:
    h.cache.tick(o.arg("t"))
    return None


def _maint(name: str) -> Callable[[Harness, TraceStep], int | None]:
    def do(h: Harness, o: TraceStep) -> int | None:
        h.returned = getattr(h.cache, name)(o.arg("n"))  # (kvstate/targets/api/exhaust.py)
        return None

    return do


def _do_step(h: Harness, o: TraceStep) -> int | None:
    jobs = _jobs(h)
    if jobs:
        e, j = jobs[o.arg("k") % len(jobs)]
        _step_job(h, e, j)
    return None


def _do_drain(h: Harness, o: TraceStep) -> int | None:
    if h.threads:
        return None
    h.drained = []  # what the library shows after each job step: each is explained
    for _ in range(10_000):
        jobs = _jobs(h)
        if not jobs:
            break
        for e, j in jobs:
            _step_job(h, e, j)
            h.drained.append(h.observe())
    return None


def _entry_path(h: Harness, b: int) -> Any:
    e = h.view.disk_entries.get(h.rids[b])
    return e


def _do_corrupt(h: Harness, o: TraceStep) -> int | None:
    b, kind = o.arg("b"), ("truncate", "bitflip", "header")[o.arg("kind") % 3]
    e = _entry_path(h, b)
    if e is None or b in h.corrupt:
        return None
    data = bytearray(e.path.read_bytes())
    if kind == "truncate":
        data = data[: max(e.payload_offset + 1, len(data) - 7)]
    elif kind == "bitflip":
        pos = e.payload_offset + (len(data) - e.payload_offset) // 2
        data[pos] ^= 0x10
    else:
        data[20] ^= 0x01  # inside the JSON header: its CRC no longer matches
    e.path.write_bytes(bytes(data))
    h.corrupt[b] = kind
    h.cov.add(f"fault {kind}")
    return None


def _do_host_tail(h: Harness, o: TraceStep) -> int | None:
    """A bit flip in the host copy of a block's compressor state (host memory has no checksum):
    the restored tail no longer splices at that boundary, so a hit ending there must be cut by
    one block (the tail check), never served."""
    b = o.arg("b")
    rid = h.rids[b]
    m = h.view.meta
    if m.ckv[rid] != CKV.HOST or m.hslot[rid] < 0:
        return None
    grp = h.view.tiers.compressor
    v = h.hooks.host_copy("compressor", rid)  # writable: host memory has no checksum
    h_end = (b + 1) * h.L  # the boundary this state belongs to; its last position's ring slot
    v[..., grp.state_bytes + 8 * ((h_end - 1) % grp.ring)] ^= 0x01  # the splice check must fail
    h.tail_damaged.add(b)
    h.cov.add("fault host_tail")
    return None


def _do_read_error(h: Harness, o: TraceStep) -> int | None:
    """The next step of the block's job fails: a load's read (an I/O error), an offload's copy
    (the job raises: the library abandons it, which cancels the offload)."""
    b = o.arg("b")
    rid = h.rids[b]
    ck = h.view.meta.ckv[rid]
    if ck == CKV.OFFLOADING and not h.threads:
        job = h.view.job("dma", rid)
        if job is not None:

            def broken() -> bool:
                raise _InjectedJobError(f"injected copy error in the offload of record {rid}")

            job.step = broken
            h.cov.add("fault offload job raises")
        return None
    if ck != CKV.LOADING:
        return None
    h.hooks.inject_load_fault(rid)
    h.read_error.add(b)
    h.cov.add("fault read_error")
    return None


def _do_short_read(h: Harness, o: TraceStep) -> int | None:
    """The next disk read of the block's running load returns fewer bytes than it asked for,
    its buffer holding the whole block all the same (a reused read buffer may: only the count
    tells, the MACs cannot).  The load must fail as a damaged entry's does (the hit truncated
    and recomputed), never land bytes the read did not deliver; the world rules out its
    completion as for ``read_error``.  Armed only where a read is still to come (a disk load
    whose one read has not run), through the disk tier's read seam."""
    b = o.arg("b")
    rid = h.rids[b]
    m = h.view.meta
    if h.threads or b in h.read_error or m.ckv[rid] != CKV.LOADING:
        return None
    job = h.view.job("io", rid)
    if job is None or job.fault or job.chunks is not None:
        return None
    if m.prog[rid] >= h.table.consts.load_steps:
        return None
    entry = job.src
    st_ = os.stat(entry.path)
    target = (st_.st_dev, st_.st_ino)
    fired: list[bool] = []

    def short(fd: int, buf: Any, offset: int, need: int | None = None) -> int:
        got: int = real(fd, buf, offset, need)
        want = len(buf) if need is None else need
        if fired or offset + want <= entry.payload_offset:
            return got  # (a header's read, or the fault spent)
        s = os.fstat(fd)
        if (s.st_dev, s.st_ino) != target:
            return got
        fired.append(True)
        h.cov.add("fault short_read")
        return min(got, want // 2)

    real = h.hooks.replace_disk_read(short)  # (an earlier fault's reader, or the tier's own)
    h.read_error.add(b)  # the world: this load fails
    return None


def _do_disk_full(h: Harness, o: TraceStep) -> int | None:
    on = bool(o.arg("on"))
    if on == h.disk_full:
        return None
    h.disk_full = on
    h._arm_disk_full()
    if on:
        h.cov.add("fault disk_full")
    return None


def _do_restart(h: Harness, o: TraceStep) -> int | None:
    h.cov.add("fault crash")
    try:
        h.hooks.crash()  # the process dies, the kernel drops its lock on the directory
    finally:
        h.live = [None] * h.R
        h.released = [None] * h.R
        h.done = [None] * h.R
        _plant_files(h, len(h.steps))
        at_restart(h, len(h.steps))  # kvstate/targets/api/stored.py: a refused open, our leftovers
        h._open()
    return None


def _plant_files(h: Harness, n: int) -> None:
    """What a crash and other programs leave in the directory: a temporary of a writer killed
    after its first bytes (kvstate's: the scan deletes it), and files kvstate did not write
    under names like its own (an entry's, a temporary's: left alone, never read as entries)."""
    tag = f"{n:04x}{len(h.foreign_files):04x}"
    killed = f".{'ab' * 8}{tag}.kvb.killed{tag}.tmp"
    with open(os.path.join(h.dir, killed), "wb") as f:
        f.write(b"KVSTA")  # the start of the magic
    from kvstate.impl.disk import MAGIC

    for name, data in (
        (f"{'cd' * 8}{tag}.kvb", b"not kvstate's: an entry's name, another program's bytes"),
        (f".{'ef' * 8}{tag}.kvb.other.tmp", b"not kvstate's: a temporary's name"),
        # kvstate's magic under a name it never gives an entry (an odd number of hex digits):
        # not an entry, so never read as one, nor deleted as a damaged one
        (f"{'cd' * 8}{tag}0.kvb", MAGIC + b"\x00\x00\x00\x00 not kvstate's: odd-length name"),
    ):
        with open(os.path.join(h.dir, name), "wb") as f:
            f.write(data)
        h.foreign_files[name] = data
    h.cov.add("files planted")


def _slot(s: Sizes) -> Mapping[str, Any]:
    return {"i": s.slot}


def _block(s: Sizes) -> Mapping[str, Any]:
    return {"b": s.block}


def _count(s: Sizes) -> Mapping[str, Any]:
    return {"n": st.integers(1, s.N)}


# the operations of this module, each declared once (kvstate/targets/api/declare.py)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "request",
        _do_request,
        "request",
        lambda s: {
            "i": s.slot,
            "n": st.sampled_from(
                [s.L + 1, 2 * s.L + 1, s.N * s.L + 1, s.N * s.L, 3 * s.L + 5, 2 * s.L]
            ),
            "life": st.integers(1, s.lease_max),
        },
    ),
    OpDecl("admit", _do_admit, "admit", _slot),
    OpDecl("use", _do_use, "use", _slot, faults=("stall",)),
    OpDecl("finish", _do_finish, "finish", _slot),
    OpDecl("abort", _do_abort, "abort", _slot),
    OpDecl(
        "append",
        _do_append,
        "append",
        lambda s: {"i": s.slot, "k": st.sampled_from([1, s.L, 2 * s.L])},
    ),
    OpDecl("read", _do_read, "read", _slot),
    OpDecl("read_released", _do_read_released, "read", _slot, faults=("read_after_release",)),
    OpDecl("mutate_tokens", _do_mutate, "mutate_tokens", _slot, faults=("token_reuse",)),
    OpDecl("abort_in_use", _do_abort_in_use, "abort", _slot, faults=("abort_in_use",)),
    OpDecl(
        "foreign",
        _do_foreign,
        "foreign",
        lambda s: {"ns": st.integers(0, 1), "n": st.sampled_from([2 * s.L + 1, s.N * s.L + 1])},
    ),
    OpDecl("tick", _do_tick, "tick", lambda s: {"t": st.integers(1, s.lease_max)}),
    *(OpDecl(m, _maint(m), m, _count) for m in ("evict", "offload", "spill", "drop")),
    OpDecl("step", _do_step, "step", lambda s: {"k": st.integers(0, 3)}),
    OpDecl("drain", _do_drain, "drain"),
    OpDecl(
        "corrupt",
        _do_corrupt,
        "corrupt",
        lambda s: {"b": s.block, "kind": st.integers(0, 2)},
        faults=("truncate", "bitflip", "header"),
        disk_only=True,
    ),
    OpDecl("read_error", _do_read_error, "fault", _block, faults=("read_error",)),
    OpDecl(
        "short_read",
        _do_short_read,
        "fault",
        _block,
        faults=("short_read",),
        like="read_error",
        disk_only=True,
    ),
    OpDecl("host_tail", _do_host_tail, "corrupt", _block, faults=("host_tail",)),
    OpDecl(
        "disk_full",
        _do_disk_full,
        "fault",
        lambda s: {"on": st.integers(0, 1)},
        faults=("disk_full",),
        disk_only=True,
    ),
    OpDecl("restart", _do_restart, "fault", faults=("crash",), disk_only=True),
)
