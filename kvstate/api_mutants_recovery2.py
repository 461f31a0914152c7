"""Planted bugs of the recovery classes ``kvstate/targets/api/corruptmarks.py`` and the
longest-hit check of admissions validated at once (``kvstate/targets/api/recoveryhit.py``)
close: which failed loads mark their record corrupt, and which hit an admission picks where a
recovery would serve a longer one.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_planted.Mutant` takes them.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "completion_fault_of_a_disk_load_marked_corrupt",
        "a failed load's corrupt mark: a sound entry kept out of every later recovery",
        "impl/recovery.py",
        'self.fail_load(rid, job, "injected I/O fault at completion", corrupt=False)',
        'self.fail_load(rid, job, "injected I/O fault at completion", corrupt=from_disk)',
    ),
    (
        "damaged_disk_entry_left_unmarked",
        "a failed load's corrupt mark: an entry whose bytes failed recovered again",
        "impl/recovery.py",
        "        if corrupt:\n            m.corrupt[rid] = True",
        "        if corrupt and not from_disk:\n            m.corrupt[rid] = True",
    ),
    (
        "next_stored_block_not_counted_as_growth",
        "which hit an admission picks: a recovery that serves longer never planned, validated short",
        "impl/requests.py",
        "grows = any(r != NULL_RID for r in rids[now.hit // L : nb_max])",
        "grows = any(r != NULL_RID for r in rids[now.hit // L + 1 : nb_max])",
    ),
    (
        "busy_drain_counts_rounds_not_steps",
        "a returned count: the library's drain() counts its rounds over the executors",
        "impl/pipelines.py",
        "                    steps += 1\n                    progressed = True\n            if not progressed:\n                break",
        "                    progressed = True\n            if not progressed:\n                break\n            steps += 1",
    ),
    (
        "host_load_failed_by_name_marked_corrupt",
        "a failed load's corrupt mark: the table's load_fail asked by name keeps a sound copy out",
        "impl/recovery.py",
        'self.fail_load(rid, self.load_job(rid), "load failed", corrupt=False)',
        'job = self.load_job(rid)\n            self.fail_load(rid, job, "load failed", corrupt=job.pipe is Pipe.DMA)',
    ),
    (
        "one_step_plan_skips_its_tail_check",
        "readiness: a plan that loads its boundary block alone never checks the tail it brings",
        "impl/recovery.py",
        "if loads_boundary and nb > 0 and self.load_pending(rids[nb - 1]):",
        "if loads_boundary and len(steps) > 1 and self.load_pending(rids[nb - 1]):",
    ),
    (
        "job_drops_the_window_it_read",
        "I/O count: a disk load's one read, its window's bytes dropped and read again",
        "impl/diskreads.py",
        "job.buffer, job.chunks, job.swa_data = self.disk.read_block(",
        "job.buffer, job.chunks, _ = self.disk.read_block(",
    ),
    (
        "step_reads_a_chunk_the_job_read",
        "I/O count: a disk load's one read, a chunk its job read read again by a table step",
        "impl/recovery.py",
        "if data is None and job.chunks is not None and k < len(job.chunks):",
        "if data is None and job.chunks is not None and k < len(job.chunks) - 1:",
    ),
    (
        "queued_tail_check_not_waited_for",
        "readiness: a use served at a loaded boundary while its tail check is still queued",
        "impl/recovery.py",
        "                tc.key in self.pipes.cpu.jobs\n",
        "                False\n",
    ),
    (
        "failed_boundary_load_waited_on_forever",
        "readiness: a tail check whose block's load failed counted as pending: NotReady forever",
        "impl/recovery.py",
        "                or tc.rid in self.io_waiting\n            )",
        "                or tc.rid in self.io_waiting\n                or bool(m.corrupt[tc.rid])\n            )",
    ),
)
