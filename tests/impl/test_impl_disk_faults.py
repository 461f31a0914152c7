"""The disk tier on a hung, read-only, full or refusing file system (issue 27, items 1-3).

A stalled unlink or rename never holds the cache's lock (other work waits under 100 ms); every
refusal ends in a documented error or a documented fallback with the accounting intact (no load
waiting forever, no READY block out of the LRU, no slot leaked, no DISK record without its
entry); the constructor and the core raise only documented errors.  The faults come from
:mod:`fs_faults`, a shim over ``os`` (as root, ``chmod`` makes nothing read-only).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from cache_checks import check_compressed, check_window, make
from fs_faults import REFUSALS, creating, faulty_fs
from test_impl_disk import files, persist

from kvstate.impl import (
    DiskWriteError,
    HeterogeneousKVCache,
    InvalidArgument,
    KVStateError,
    StorageError,
)
from kvstate.impl.disk import MAGIC, SUFFIX
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV

G = small()
L = G.lcm_tokens


def accounting(c: HeterogeneousKVCache) -> list[str]:
    """What must hold at rest whatever the disk did: every DISK record has its entry and every
    entry its DISK record, every READY unpinned block is in the device LRU (evictable),
    nothing loads, and the device slots in use are the records' own."""
    core = c.inspect()
    out = []
    with core.lock:
        m = core.meta
        live = list(core.index.values())
        for r in live:
            ck = m.ckv[r]
            if (ck == CKV.DISK) != (r in core.disk_entries):
                out.append(f"record {r}: {CKV(ck).name}, disk entry {r in core.disk_entries}")
            if ck == CKV.READY and m.ref[r] == 0 and r not in core.lru:
                out.append(f"record {r}: READY and unpinned, but not in the LRU")
            if ck == CKV.LOADING:
                out.append(f"record {r}: still LOADING")
        held = sum(1 for r in live if m.slot[r] >= 0)
        if core.tiers.slots.free + held != core.device_blocks:
            out.append(f"device slots: {core.tiers.slots.free} free + {held} held")
        if core.io_inflight:
            out.append(f"io_inflight {core.io_inflight}")
    return out


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- item 1: a hung disk blocks nothing that needs no disk ---------------------------------
def test_a_stalled_unlink_and_rename_block_no_other_work(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """An 8 s unlink (a drop's, a finished load's) and an 8 s rename (a spill's publish) run
    with the cache's lock free: ``stats()``, ``tick()`` and an admission served from the device
    each finish in under 100 ms while all three stall; afterwards everything completes."""
    loaded, dropped = harness_tokens(2 * L + 1, seed=1), harness_tokens(2 * L + 1, seed=2)
    persist(tmp_path, loaded)
    persist(tmp_path, dropped)
    c = HeterogeneousKVCache(
        G, cache_dir=tmp_path, executors="threads", writer=DeterministicWriter()
    )
    hot, warm = harness_tokens(2 * L + 1, seed=3), harness_tokens(L + 1, seed=4)
    try:
        with c.use(c.admit(c.request(hot))):
            pass
        with c.use(c.admit(c.request(warm))):
            pass
        c.tick(10)
        warm_rid = c.inspect().resolve(c.chain(warm))[0]
        c.test_hooks().act("offload", warm_rid)  # one host block, for the spill
        deadline = time.monotonic() + 20
        while c.inspect().meta.ckv[warm_rid] != CKV.HOST and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.inspect().meta.ckv[warm_rid] == CKV.HOST
        # (the loaded prompt's entries are the most recent: drop takes the other prompt's)
        dropped_rids = c.inspect().resolve(c.chain(dropped))
        release = threading.Event()
        threads: list[threading.Thread] = []
        errors: list[BaseException] = []

        def run(fn: Any) -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        with faulty_fs(monkeypatch, tmp_path) as fs:
            for name in ("unlink", "rename", "replace"):
                fs.stall(name, release, 8.0)
            adm = c.admit(c.request(loaded))  # two disk loads: each ends with an unlink
            for fn in (lambda: c.test_hooks().act("drop", dropped_rids[0]), lambda: c.spill(1)):
                threads.append(threading.Thread(target=run, args=(fn,), daemon=True))
                threads[-1].start()

            def serve_hot() -> None:
                with c.use(c.admit(c.request(hot))) as run_:
                    assert run_.hit_tokens == 2 * L  # from the device: no disk call

            try:
                assert fs.wait_entered("unlink", 1, timeout=20)
                fs.wait_entered("rename", 1, timeout=2)
                fs.wait_entered("unlink", 2, timeout=2)
                waits = {
                    "stats": timed(c.stats),
                    "tick": timed(lambda: c.tick(1)),
                    "admission": timed(serve_hot),
                }
                stalled = dict(fs.entered)
                unlinking = c.stats()["disk_unlinking"]  # the unlinks in flight are counted
            finally:
                release.set()
        for t in threads:
            t.join(timeout=30)
        assert not errors, errors
        assert stalled.get("unlink", 0) >= 2 and stalled.get("rename", 0) >= 1, stalled
        assert unlinking >= 2
        with capsys.disabled():
            print(
                "\nduring an 8 s unlink and rename: "
                + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in waits.items())
            )
        assert all(w < 0.1 for w in waits.values()), waits
        with c.use(adm, timeout=30) as run_:
            assert run_.hit_tokens == 2 * L
            check_compressed(run_, loaded)
        c.pipelines.stop()
        assert c.stats()["disk_unlinking"] == 0
        assert c.inspect().meta.ckv[warm_rid] == CKV.DISK
        assert accounting(c) == []
        names = sorted(e.path.name for e in c.inspect().disk_entries.values())
        assert sorted(p.name for p in files(tmp_path)) == names
    finally:
        c.close()


# ---- item 2: a read-only or refusing file system -------------------------------------------
@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_load_whose_file_cannot_be_removed_completes(
    tmp_path: Path, monkeypatch: Any, refusal: str
) -> None:
    """A loaded entry whose unlink (or rename) is refused: the load completes from the bytes
    it verified, the block is READY and evictable, no slot leaks; the file is left behind
    (``orphans``: authentic, exact)."""
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = make(cache_dir=tmp_path)
    try:
        free = c.inspect().tiers.slots.free
        with faulty_fs(monkeypatch, tmp_path) as fs:
            for name in ("unlink", "rename", "replace"):
                fs.fail(name, REFUSALS[refusal])
            a = c.admit(c.request(toks))
            c.pipelines.drain()
            with c.use(a) as run:
                assert run.hit_tokens == 2 * L
                check_compressed(run, toks)
                check_window(run, toks)
        assert accounting(c) == []
        st = c.stats()
        assert st["disk_entries"] == 0 and st["disk_orphans"] == 2 and len(files(tmp_path)) == 2
        c.tick(100)
        assert c.evict(100) == 2 and c.inspect().tiers.slots.free == free
    finally:
        c.close()


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_drop_on_a_read_only_directory_falls_back(
    tmp_path: Path, monkeypatch: Any, refusal: str
) -> None:
    """``drop`` whose unlink is refused raises nothing raw and leaves no record "DISK without
    an entry": the entry is let go of (a miss from here on) and its file left behind, counted
    in ``disk_orphans``; the next opener adopts it (it is authentic and exact)."""
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = make(cache_dir=tmp_path)
    try:
        c.tick(10)
        rids = c.inspect().resolve(c.chain(toks))
        with faulty_fs(monkeypatch, tmp_path) as fs:
            fs.fail("unlink", REFUSALS[refusal])
            c.test_hooks().act("drop", rids[0])  # the core's action
            assert c.drop(100) == 1  # and the library's
        assert accounting(c) == []
        assert all(c.inspect().meta.ckv[r] == CKV.FREE for r in rids)
        st = c.stats()
        assert st["disk_entries"] == 0 and st["disk_orphans"] == 2 and len(files(tmp_path)) == 2
    finally:
        c.close()
    c = make(cache_dir=tmp_path)
    try:
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 2 * L
            check_compressed(run, toks)
    finally:
        c.close()


@pytest.mark.parametrize("call", ["create", "write", "rename"])
def test_a_refused_spill_is_a_documented_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: Any, call: str
) -> None:
    """A spill the file system refuses (the temporary's creation, its write: ENOSPC, its rename:
    EPERM) raises DiskWriteError, keeps the block on host and leaves no file behind."""
    toks = harness_tokens(L + 1)
    c = make(cache_dir=tmp_path)
    try:
        with c.use(c.admit(c.request(toks))):
            pass
        c.tick(10)
        c.offload(1)
        c.pipelines.drain()
        rid = c.inspect().resolve(c.chain(toks))[0]
        assert c.inspect().meta.ckv[rid] == CKV.HOST
        before = sorted(p.name for p in tmp_path.iterdir())
        with faulty_fs(monkeypatch, tmp_path) as fs:
            if call == "create":
                fs.fail("open", errno.EROFS, when=creating)
            elif call == "write":
                fs.fail("fdopen", errno.ENOSPC)
            else:
                fs.fail("rename", errno.EPERM)
                fs.fail("replace", errno.EPERM)
            with pytest.raises(DiskWriteError):
                c.spill(1)
            with pytest.raises(DiskWriteError):
                c.test_hooks().act("spill", rid)
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary left
        assert c.inspect().meta.ckv[rid] == CKV.HOST and accounting(c) == []
        assert c.spill(1) == 1  # the disk is back: the same block spills
    finally:
        c.close()


# ---- item 3: documented errors only, from the constructor and the core ---------------------
@pytest.mark.parametrize("case", ["full", "read-only", "read-only, stale temporary", "nul"])
def test_the_constructor_raises_only_documented_errors(
    tmp_path: Path, monkeypatch: Any, case: str
) -> None:
    """A full disk on first open (the key cannot be written), a fresh read-only directory (it
    cannot be created), a read-only directory holding a stale temporary (it cannot be removed:
    left, the cache opens), a NUL in the name: StorageError / InvalidArgument or an open cache,
    never a raw OSError or ValueError, and nothing left locked or behind."""
    d = tmp_path / "cache"
    if case == "read-only, stale temporary":
        make(cache_dir=d).close()
        stale = d / f".{'ab' * 24}{SUFFIX}.x1.tmp"
        stale.write_bytes(MAGIC[:5])
    got: Any
    with faulty_fs(monkeypatch, tmp_path) as fs:
        if case == "full":
            fs.fail("write", errno.ENOSPC)
            fs.fail("fdopen", errno.ENOSPC)
            fs.fail("fsync", errno.ENOSPC)
        elif case.startswith("read-only"):
            for name in ("mkdir", "unlink", "rename", "replace", "link"):
                fs.fail(name, errno.EROFS)
            fs.fail("open", errno.EROFS, when=creating)
        try:
            got = make(cache_dir=str(d) + ("\x00b" if case == "nul" else ""))
        except KVStateError as exc:
            got = exc
    if case == "read-only, stale temporary":
        assert isinstance(got, HeterogeneousKVCache), got
        assert stale.exists() and got.stats()["disk_orphans"] == 1
        got.close()
    else:
        want = InvalidArgument if case == "nul" else StorageError
        assert type(got) is want, got
        assert not any(p.name.endswith((".tmp", ".new")) for p in tmp_path.rglob("*"))
    make(cache_dir=d).close()  # not left locked


def test_offload_spilling_on_a_full_disk_raises_a_documented_error(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """``core.offload`` with every host slot taken spills the LRU host block first: on a full
    disk that is DiskWriteError, the block to offload still on the device, the host block
    still on host, no file behind."""
    c = make(cache_dir=tmp_path, host_blocks=1)
    try:
        first, second = harness_tokens(L + 1, seed=1), harness_tokens(L + 1, seed=2)
        for toks in (first, second):
            with c.use(c.admit(c.request(toks))):
                pass
        c.tick(10)
        a, b = c.inspect().resolve(c.chain(first))[0], c.inspect().resolve(c.chain(second))[0]
        c.test_hooks().act("offload", a)
        c.pipelines.drain()
        assert c.inspect().meta.ckv[a] == CKV.HOST
        with faulty_fs(monkeypatch, tmp_path) as fs:
            fs.fail("fdopen", errno.ENOSPC)
            with pytest.raises(DiskWriteError):
                c.test_hooks().act("offload", b)
        assert (c.inspect().meta.ckv[a], c.inspect().meta.ckv[b]) == (CKV.HOST, CKV.READY)
        assert files(tmp_path) == [] and not list(tmp_path.glob(".*.tmp"))
        assert accounting(c) == []
        c.test_hooks().act("offload", b)  # the disk is back: a spills, b offloads
        c.pipelines.drain()
        assert (c.inspect().meta.ckv[a], c.inspect().meta.ckv[b]) == (CKV.DISK, CKV.HOST)
    finally:
        c.close()


def test_the_cache_directory_is_created_private(tmp_path: Path) -> None:
    """A cache directory kvstate creates is 0700 (item 8): nobody else can list which entries
    it holds.  (An existing directory keeps the mode its owner gave it.)"""
    old = os.umask(0o022)
    try:
        d = tmp_path / "a" / "cache"
        make(cache_dir=d).close()
    finally:
        os.umask(old)
    assert d.stat().st_mode & 0o777 == 0o700


def test_the_cores_step_by_step_load_touches_no_file_under_the_lock(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The core's surface (the conformance adapter drives loads action by action): each
    ``load_progress`` reads and authenticates its chunk, and ``load_done`` the window, before
    taking the lock; the loaded file is unlinked after it.  No open or unlink of the cache's
    files runs with the lock held, and the block lands whole."""
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    c = make(cache_dir=tmp_path)
    core, act = c.inspect(), c.test_hooks().act
    calls: list[tuple[str, bool]] = []
    for name in ("open", "unlink", "rename"):
        real = getattr(os, name)

        def spy(path: Any, *a: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            if os.fspath(path).startswith(str(tmp_path)):
                calls.append((_name, core.lock._is_owned()))
            return _real(path, *a, **kw)

        monkeypatch.setattr(os, name, spy)
    try:
        for rid in core.resolve(c.chain(toks)):
            act("load_start", rid)
            for _ in range(G.load_steps):
                act("load_progress", rid)
            act("load_done", rid)
            assert core.meta.ckv[rid] == CKV.READY
        monkeypatch.undo()
        assert calls and [call for call in calls if call[1]] == []
        assert [n for n, _ in calls].count("unlink") == 2 and files(tmp_path) == []
        a = c.admit(c.request(toks))
        c.pipelines.drain()  # (the indexer rebuilds a disk load asks for)
        with c.use(a) as run:
            assert run.hit_tokens == 2 * L
            check_compressed(run, toks)
            check_window(run, toks)
    finally:
        c.close()


def test_a_bounded_reap_runs_alone(monkeypatch: Any, tmp_path: Path) -> None:
    """The bounded reap in the middle of a recovery (``reap(alone=True)``) lets one worker
    unlink while the others go back to loading: a second one returns at once, its files left
    for the first or for the next reap; an unbounded reap (the last load's end) still joins
    in.  When every worker that ended a load joined the bounded reap, no read was in flight
    for the ~200 ms that 256 unlinks took."""
    from kvstate.impl.diskdir import Directory

    d = Directory(tmp_path)
    names = [tmp_path / f"f{i}" for i in range(4)]
    for p in names:
        p.write_bytes(b"x")
        d.doom(p)
    release = threading.Event()
    with faulty_fs(monkeypatch, tmp_path) as fs:
        fs.stall("unlink", release, 10.0)
        first = threading.Thread(target=d.reap, kwargs={"alone": True}, daemon=True)
        first.start()
        try:
            assert fs.wait_entered("unlink", 1, timeout=10)
            t0 = time.perf_counter()
            d.reap(alone=True)  # another bounded reap: returns at once, nothing unlinked
            assert time.perf_counter() - t0 < 1.0
            assert fs.entered["unlink"] == 1 and d.unlinking == 4
            joined = threading.Thread(target=d.reap, daemon=True)  # an unbounded one joins
            joined.start()
            assert fs.wait_entered("unlink", 2, timeout=10)
        finally:
            release.set()
        first.join(timeout=10)
        joined.join(timeout=10)
    assert d.unlinking == 0 and not any(p.exists() for p in names)
    d.close()
