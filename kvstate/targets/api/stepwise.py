"""A load driven through the table's step-by-step surface, and the reads it makes unlocked.

The harness's ``step`` and ``drain`` run a load's *job*: a disk load's first step reads the
whole file at once (``DiskReads.disk_load_step``) and later steps land the chunks it read.  A
load can also be driven one table action at a time (``test_hooks().act("load_progress", rid)``,
what the block-level adapters and step-by-step engines call): each ``load_progress`` then reads
and authenticates *its own* chunk without the lock first (``DiskReads.read_ahead``), and
``load_done`` reads the window's section before installing it (``read_window_ahead``).  That
path has its own offset arithmetic (which chunk the record's progress names, which units it
lands in) and its own failure handling (a read that fails unlocked fails the load under the
lock, if the load is still where the read left it), which the job's path never runs.

``act_step(b, k)``: the next table action of block ``b``'s load (``load_done`` where the guard
allows it, else ``load_progress``; with no load there, its queued indexer rebuild's
``rebuild_done``), through ``act``, with the disk's read replaced for that
call by the world's ``k``-th answer (:data:`READS`): the real bytes, an I/O error, a short
read (the file ends early), or an exception no file system raises (a bug in a reader).  A
failed read is a failed load (the table's ``load_fail``: ``CorruptEntry``, absorbed here as the
job's runner absorbs it), explained by the same ``JOB`` pattern a job's step is; a sound read
lands bytes the later reads compare byte for byte with the request's tokens.  The world past
:data:`READS` (:data:`FAIL`) is the engine's own report that a transfer failed: ``load_fail``
by name, of a disk or a host load, which ends the load (explained as ``load_fail``): the first
running load from block ``b`` on (cyclically), as a block-level engine fails a load it gave up
on; nothing was read wrong, so its record is not marked corrupt (corruptmarks.py) and a later
admission recovers it again.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from kvstate.spec.phases import CKV, Pipe
from kvstate.targets.api.declare import OpDecl


def _eio(real: Callable[..., int]) -> Callable[..., int]:
    def read(fd: int, buf: Any, offset: int, need: int | None = None) -> int:
        raise OSError(errno.EIO, "Input/output error (injected)")

    return read


def _short(real: Callable[..., int]) -> Callable[..., int]:
    def read(fd: int, buf: Any, offset: int, need: int | None = None) -> int:
        got = real(fd, buf, offset, need)
        return max(0, min(got, (need if need is not None else len(buf)) // 2))

    return read


def _raises(real: Callable[..., int]) -> Callable[..., int]:
    def read(fd: int, buf: Any, offset: int, need: int | None = None) -> int:
        raise RuntimeError("a reader's own bug (injected): not an OSError")

    return read


# the world's answer to the action's reads: (name, the read that replaces the tier's, or None)
READS: tuple[tuple[str, Callable[[Callable[..., int]], Callable[..., int]] | None], ...] = (
    ("a sound read", None),
    ("an I/O error", _eio),
    ("a short read", _short),
    ("a reader that raises", _raises),
)


# the world past READS: the engine reports the transfer failed (``load_fail`` by name)
FAIL = len(READS)


def _world(o: Any) -> int:
    return int(o.arg("k")) % (len(READS) + 1)


def _load(h: Any, b: int) -> Any:
    """Block ``b``'s running load job, or None (no load, or the threaded mode)."""
    rid = h.rids[b]
    if h.threads or h.view.meta.ckv[rid] != CKV.LOADING:
        return None
    return h.view.load_job(rid)


def _fail_target(h: Any, b: int) -> int | None:
    """The first block from ``b`` on (cyclically) whose load is running: the one the world
    :data:`FAIL` fails."""
    return next((x % h.N for x in range(b, b + h.N) if _load(h, x % h.N) is not None), None)


def fails(h: Any, o: Any) -> set[int]:
    """The blocks whose load this call's world fails (``act_step`` with a failing read of a
    disk load): the harness rules their ``load_done`` out for the call, and allows their
    ``load_fail`` (``ApiHarness._forbid``; ``o`` None: no operation, as ``act`` asks)."""
    if o is None or o.name != "act_step" or not _world(o):
        return set()
    if _world(o) == FAIL:
        b = _fail_target(h, o.arg("b"))
        return set() if b is None else {b}
    job = _load(h, o.arg("b"))
    if job is None or job.pipe is not Pipe.IO:
        return set()
    return {o.arg("b")}


def fails_by_name(o: Any) -> bool:
    """Is ``o`` the engine's report of a failed transfer (the world :data:`FAIL`)?"""
    return o.name == "act_step" and _world(o) == FAIL


def _reads(h: Any, job: Any, action: str) -> bool:
    """Does ``action`` read the load's file (before it takes the lock)?"""
    if job.fault:
        return False
    if action == "load_progress":
        return job.chunks is None
    return bool(job.swa_pages) and job.swa_data is None


def do_act_step(h: Any, o: Any) -> int | None:
    """``act_step(b, k)``: the next action of block ``b``'s load through ``act``."""
    from kvstate.impl.errors import CorruptEntry

    world = _world(o)
    b = _fail_target(h, o.arg("b")) if world == FAIL else o.arg("b")
    job = None if b is None else _load(h, b)
    if b is None or job is None:
        return _rebuild_by_name(h, o.arg("b")) if world != FAIL else None
    rid = h.rids[b]
    disk = job.pipe is Pipe.IO
    name, fault = READS[world] if disk and world != FAIL else READS[0]
    action = "load_done" if h.view.can("load_done", rid) else "load_progress"
    if world == FAIL:
        name, action = "the engine's report of a failed transfer", "load_fail"
    if fault is not None and not _reads(h, job, action):
        name = "an I/O fault, no read"  # the action reads nothing: its I/O fails all the same
        h.hooks.inject_load_fault(rid)
    real = h.hooks.replace_disk_method("pread", None)  # (None: the tier's own, returned)
    answer = fault(real) if fault else real
    locked: list[int] = []
    lock = h.view.lock

    def read(fd: int, buf: Any, offset: int, need: int | None = None) -> int:
        if lock._is_owned():  # (RLock's own query, as threading.Condition asks it)
            locked.append(offset)
        return answer(fd, buf, offset, need)

    h.hooks.replace_disk_method("pread", read)
    prog = h.view.meta.prog[rid]
    try:
        h.hooks.act(action, rid)
    except CorruptEntry:
        pass  # the load failed (load_fail), as a job's runner absorbs it
    finally:
        h.hooks.replace_disk_method("pread", None)
    m = h.view.meta
    kept = m.ckv[rid] == CKV.LOADING and h.view.load_job(rid) is job
    if kept and (fault is not None or world == FAIL or m.prog[rid] == prog):
        raise h.fail(
            "act-step",
            [action, name],
            f"{o.render()}: {action} over {name} left the load where it was (record {rid} "
            f"LOADING at chunk {m.prog[rid]}): "
            + (
                "a failed read fails the load"
                if fault or world == FAIL
                else "an allowed action acts"
            ),
        )
    if locked:
        raise h.fail(
            "io-under-lock",
            [action],
            f"{o.render()}: {action} read the disk (offsets {locked}) holding the cache's lock "
            "(a disk load's reads run without it: DiskReads.read_ahead / read_window_ahead)",
        )
    h.cov.add(f"act {action} of a {'disk' if disk else 'host'} load ({name})")
    return None


def _rebuild_by_name(h: Any, b: int) -> int | None:
    """No load runs at block ``b``: the indexer rebuild queued there (a disk load's follow-up)
    completed by name, ``rebuild_done`` through ``act``, as a step-by-step engine completes
    it.  The call computes the keys itself (the job's own step computes them before the
    lock); the later reads compare them with the compressed KV they index."""
    from kvstate.spec.phases import Indexer

    rid = h.rids[b]
    if h.threads or h.view.meta.idx[rid] != Indexer.REBUILDING:
        return None
    h.hooks.act("rebuild_done", rid)
    h.cov.add("act rebuild_done of a queued rebuild")
    return None


# scripted only (kvstate/targets/api/witnesses.py): a load's actions one at a time
DECLS = (
    OpDecl(
        "act_step",
        do_act_step,
        "step",
        lambda s: {"b": s.block, "k": st.integers(0, len(READS))},
        rule=False,
    ),
)
