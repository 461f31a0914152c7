"""Planted bugs for the recovery pipelines' classes of path the API harness checks (read by
:mod:`kvstate.api_planted`, which adds them to its list): a load driven by its job and by the
table's actions in turn, jobs stepped after they ended (kvstate/targets/api/mixedload.py), and
jobs that raise (kvstate/targets/api/jobfaults.py).  Each is (name, bug class, path, old
text, new text), as :class:`kvstate.api_planted.Mutant` takes them.
"""

from __future__ import annotations

RECOVERY_MUTANTS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "abandoned_tail_check_counts_as_verified",
        "readiness: a check that raised taken for one that passed",
        "impl/pipelines.py",
        "            if self.ok is None:\n                self.ok = False",
        "            if self.ok is not None:\n                self.ok = False",
    ),
    (
        "stale_load_job_still_owns_its_record",
        "a job stepped after it ended acts on its record's new load",
        "impl/recovery.py",
        "return self.meta.ckv[rid] == CKV_LOADING and self.pipes.for_pipe(job.pipe).get(rid) is job",
        "return self.meta.ckv[rid] == CKV_LOADING or self.pipes.for_pipe(job.pipe).get(rid) is job",
    ),
    (
        "chunk_read_by_the_job_landed_one_off",
        "offset arithmetic of a load driven two ways",
        "impl/recovery.py",
        "                data = job.chunks[k]  # (read by the job's first step)",
        "                data = job.chunks[k - 1]  # (read by the job's first step)",
    ),
    (
        "raising_load_job_left_loading",
        "an abandoned job leaves its record half done",
        "impl/recovery.py",
        "            if self.owns(job):\n                self.fail_load(job.rid, job, why, corrupt=True)",
        "            if not self.owns(job):\n                self.fail_load(job.rid, job, why, corrupt=True)",
    ),
)
