"""A disk load driven by its job reads its block's file once, window and chunks included.

``docs/library.md``: a load reads its block's whole file in one read and verifies every chunk
before any lands.  The job's first step (``DiskReads.disk_load_step``) reads the payload with
the window's section when the load restores the window (``DiskTier.read_block``); ``load_done``
then installs the window from that read.  A read that authenticated the window but dropped it
leaves the job to read the window's section again (``DiskTier.read_swa``): the same bytes, so
no byte check tells, and the table has no notion of reads.  Here both reads are watched on the
disk tier's seam (``test_hooks().replace_disk_method``): an entry read whole with its window,
then its window read again, is a finding.  So is one read whole, then a chunk of it read again
(``DiskTier.read_chunk``) while the same load runs: the job's read chunks are what its later
steps land, the table's ``load_progress`` included (``Recovery._chunk``), and a second read of
the same authenticated bytes is invisible to every byte check.  (A load driven by the table's
actions from its start reads each chunk and then the window on purpose,
``kvstate/targets/api/stepwise.py``: it never reads the whole entry first.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


class OneRead(CallCheck):
    def __init__(self) -> None:
        self.cache: Any = None
        self.whole: set[Any] = set()  # entries read whole with their window
        self.read: set[Any] = set()  # entries read whole, with or without it
        self.again: list[str] = []  # what of those was read a second time

    def before(self, h: Any, o: Any) -> None:
        if h.cache is self.cache or h.cache is None:
            return
        self.cache, self.whole, self.read, self.again = h.cache, set(), set(), []
        try:
            read_block = h.hooks.replace_disk_method("read_block", None)
            read_swa = h.hooks.replace_disk_method("read_swa", None)
            read_chunk = h.hooks.replace_disk_method("read_chunk", None)
        except AttributeError:  # (no disk tier)
            return

        def block(entry: Any, with_swa: bool = False, *a: Any, **k: Any) -> Any:
            out = read_block(entry, with_swa, *a, **k)
            self.read.add(entry.path)
            if with_swa:
                self.whole.add(entry.path)
            return out

        def swa(entry: Any, *a: Any, **k: Any) -> Any:
            if entry.path in self.whole:
                self.again.append(f"the window of {entry.path.name}")
            return read_swa(entry, *a, **k)

        def chunk(entry: Any, k: int, *a: Any, **kw: Any) -> Any:
            if entry.path in self.read:
                self.again.append(f"chunk {k} of {entry.path.name}")
            return read_chunk(entry, k, *a, **kw)

        h.hooks.replace_disk_method("read_block", block)
        h.hooks.replace_disk_method("read_swa", swa)
        h.hooks.replace_disk_method("read_chunk", chunk)

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if h.cache is not self.cache:
            return
        if self.again:
            names, self.again = self.again, []
            raise h.fail(
                "disk-reads",
                ["read_again"],
                f"{o.render()}: {', '.join(names)} read again after the load's one read of "
                "the whole entry (docs/library.md: one read)",
            )
        if self.read:
            h.cov.add("check: a disk load's one read")
            # a read counts for the load that made it: an entry loaded again later (its first
            # load failed) is read afresh
            from kvstate.spec.phases import CKV

            m = h.view.meta
            loading = {
                h.view.load_job(rid).src.path
                for rid in h.rids
                if m.ckv[rid] == CKV.LOADING and h.view.job("io", rid) is not None
            }
            self.whole &= loading
            self.read &= loading
