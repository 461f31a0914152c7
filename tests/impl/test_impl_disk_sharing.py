"""Who may touch a cache directory, and what its names and entries tell (issue 27, items 5-9).

Two caches never share a directory (its lock refuses the second opener, in another process or
this one, and nobody deletes a file it did not create unless it holds the lock); another key's
or geometry's entries are left alone; over budget, the most recently written entries are kept;
entry names are keyed (unpredictable without the key) and a failed spill leaves nothing; an
older authentic entry put back serves exact bytes (entries are content-addressed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cache_checks import check_compressed, check_tail, check_window, make
from test_impl_disk import entry_path, files, persist

from kvstate.impl import DirectoryInUse, HeterogeneousKVCache
from kvstate.impl.disk import KEY_FILE, MAGIC, SUFFIX, name_stem
from kvstate.impl.testdata import DeterministicWriter, harness_tokens
from kvstate.spec import small
from kvstate.spec.phases import CKV

G = small()
L = G.lcm_tokens

# a second process: opens the cache, leaves a temporary as a writer in progress would, says
# so, and holds the directory until told to go (or killed)
_HOLDER = textwrap.dedent(
    """
    import sys
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.disk import MAGIC, SUFFIX
    from kvstate.spec import small

    c = HeterogeneousKVCache(small(), cache_dir=sys.argv[1], executors="manual")
    with open(sys.argv[2], "wb") as f:
        f.write(MAGIC[:5])  # the start of an entry this process is writing
    print("ready", flush=True)
    sys.stdin.readline()
    c.close()
    """
)


def test_a_second_process_is_refused_and_deletes_nothing(tmp_path: Path) -> None:
    """Two real processes on one directory: while the first holds it, the second's open is
    refused with DirectoryInUse and the first's temporary is untouched; once the first is
    gone (here: killed, so nothing of it cleans up), the directory opens, and the temporary,
    now nobody's, is deleted by the lock holder."""
    d = tmp_path / "cache"
    writing = d / f".{'ab' * 24}{SUFFIX}.w1.tmp"
    d.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(d), str(writing)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(DirectoryInUse, match="in use by another cache"):
            make(cache_dir=d)
        assert writing.read_bytes() == MAGIC[:5]  # the other process's file: untouched
        # and within one process: a second cache on a directory a first one holds
        first = make(cache_dir=tmp_path / "mine")
        try:
            with pytest.raises(DirectoryInUse):
                make(cache_dir=tmp_path / "mine")
        finally:
            first.close()
    finally:
        holder.kill()
        holder.wait(timeout=30)
    c = make(cache_dir=d)  # the kernel dropped its lock
    try:
        assert not writing.exists()
    finally:
        c.close()


def test_another_geometry_leaves_the_entries_alone(tmp_path: Path) -> None:
    """Opening a directory with another geometry (another fingerprint: here another
    ``load_steps``) reads and deletes none of its entries; the first geometry serves them
    again.  (Another key: test_impl_disk_trust.py.)"""
    toks = harness_tokens(2 * L + 1)
    persist(tmp_path, toks)
    before = {p.name: p.read_bytes() for p in files(tmp_path)}
    other = G.with_changes(load_steps=G.load_steps + 1)
    c = HeterogeneousKVCache(
        other, cache_dir=tmp_path, executors="manual", writer=DeterministicWriter()
    )
    disk = c.inspect().disk
    try:
        assert c.stats()["disk_entries"] == 0
    finally:
        c.close()
    assert {p.name: p.read_bytes() for p in files(tmp_path)} == before
    assert [why.split(": ")[1] for _, why in disk.foreign] == [
        "written for another geometry/layout"
    ] * 2
    c = make(cache_dir=tmp_path)
    try:
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 2 * L
    finally:
        c.close()


def test_over_budget_the_most_recently_written_entries_are_kept(tmp_path: Path) -> None:
    """A directory holding more entries than ``disk_blocks`` keeps the most recently written
    (file times, not names), adopted oldest first in the LRU; the older ones are deleted."""
    prompts = [harness_tokens(L + 1, seed=s) for s in range(4)]
    for toks in prompts:
        persist(tmp_path, toks)
    by_name = files(tmp_path)
    assert len(by_name) == 4
    # the later a name sorts, the more recently written: a choice by name keeps the others
    for i, p in enumerate(by_name):
        os.utime(p, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))
    c = make(cache_dir=tmp_path, disk_blocks=2)
    try:
        kept = [c.inspect().disk_entries[r].path.name for r in c.inspect().disk_lru]
        assert kept == [by_name[2].name, by_name[3].name]
        assert [p.name for p in files(tmp_path)] == kept
    finally:
        c.close()


def test_entry_names_are_keyed(tmp_path: Path) -> None:
    """An entry's name is the keyed stem of its block's key and a random part: no unkeyed
    hash of the prompt (the block key's hex) appears in a listing, the same block gets another
    name under another key and at every write, and a name planted at a predictable place
    (here a directory where the unkeyed scheme put the entry) stops no spill."""
    toks = harness_tokens(2 * L + 1)
    d1, d2 = tmp_path / "one", tmp_path / "two"
    d1.mkdir()
    c = make(cache_dir=d1)
    keys = c.chain(toks).keys
    c.close()
    for k in keys:  # another local user's names where the entries would have gone
        (d1 / (k.hex() + SUFFIX)).mkdir()
    persist(d1, toks)
    persist(d2, toks)
    names = [sorted(p.name for p in files(d) if p.is_file()) for d in (d1, d2)]
    for k in keys:
        assert not any(k.hex()[:16] in n for n in names[0] + names[1])
        s1, s2 = (name_stem((d / KEY_FILE).read_bytes(), k) for d in (d1, d2))
        assert s1 != s2 and any(n.startswith(s1) for n in names[0])
    assert len(names[0]) == len(names[1]) == 2
    assert all(len(n) == 48 + len(SUFFIX) for n in names[0] + names[1])
    assert sorted(p.name for p in d1.iterdir() if p.name.endswith(".tmp")) == []


def test_an_older_authentic_entry_put_back_serves_exact_bytes(tmp_path: Path) -> None:
    """Rollback: a copy of an entry taken before the block was loaded back and written again,
    put back in place of the newer one, is accepted (it is authentic) and serves exactly the
    block's bytes: an entry is addressed by its content (the chained key of the tokens it
    holds), so an older entry of a key holds the same bytes as a newer one.  A format whose
    entry could change content under one key must fail this test (docs/library.md, threat model)."""
    toks = harness_tokens(3 * L + 1)
    persist(tmp_path, toks)
    c = make(cache_dir=tmp_path)
    keys = c.chain(toks).keys
    c.close()
    old = {k: (entry_path(tmp_path, k), entry_path(tmp_path, k).read_bytes()) for k in keys}
    c = make(cache_dir=tmp_path)
    try:  # loaded back (the files go), served, then written again under new names
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 3 * L
        c.tick(10)
        c.offload(100)
        c.pipelines.drain()
        assert c.spill(100) == 3
    finally:
        c.close()
    for k, (path, data) in old.items():  # the rollback
        newer = entry_path(tmp_path, k)
        assert newer != path
        newer.unlink()
        path.write_bytes(data)
    c = make(cache_dir=tmp_path)
    try:
        assert c.stats()["disk_entries"] == 3
        a = c.admit(c.request(toks))
        c.pipelines.drain()
        with c.use(a) as run:
            assert run.hit_tokens == 3 * L
            check_compressed(run, toks)
            check_window(run, toks)
            check_tail(run, toks)
        assert all(c.inspect().meta.ckv[r] == CKV.READY for r in c.inspect().resolve(c.chain(toks)))
    finally:
        c.close()
