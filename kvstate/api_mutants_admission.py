"""Planted bugs for the admission classes of path the API harness checks (read by
:mod:`kvstate.api_planted`, which adds them to its list): which hit a recovering admission
picks and the plan it shows (kvstate/targets/api/recoveryhit.py), a writer failing partway
through ``finish`` and a ``finish`` that stores too little (kvstate/targets/api/writerfails.py),
the admission cap (kvstate/targets/api/pincap.py) and queued loads nobody waits for
(kvstate/targets/api/queued.py).  Each is (name, bug class, path, old
text, new text), as :class:`kvstate.api_planted.Mutant` takes them.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "recovery_plan_drops_its_last_block",
        "the last block of a recovery plan",
        "impl/projection.py",
        "        for b in range(min(blocks, len(rids))):",
        "        for b in range(min(blocks - 1, len(rids))):",
    ),
    (
        "recovering_admission_aims_one_block_short",
        "which hit length a recovering admission picks",
        "impl/requests.py",
        "            ext = self._sound_search(gate.chain_view(rids, s, over), rids, h_max)",
        "            ext = self._sound_search(gate.chain_view(rids, s, over), rids, h_max - self.L)",
    ),
    (
        "writer_failure_keeps_the_pins",
        "a writer failing partway through a store",
        "impl/handles.py",
        "                self._release_used(req, s)\n                raise",
        "                req.admission = None\n                raise",
    ),
    (
        "finish_stores_nothing_by_default",
        "a finish that skips its store",
        "impl/handles.py",
        "    def finish(self, request: Checked[Any, Request], *, store: Checked[Any, bool] = True)",
        "    def finish(self, request: Checked[Any, Request], *, store: Checked[Any, bool] = False)",
    ),
    (
        "downgraded_admission_reports_its_hit",
        "the admission cap: the hit given up still reported",
        "impl/cache.py",
        '            adm = Admission(req, h_max, 0, "downgraded", expl, seq=req.admissions)',
        '            adm = Admission(req, h_max, got.immediate.hit, "downgraded", expl, seq=req.admissions)',
    ),
    (
        "queued_loads_kept_for_nobody",
        "readiness: a scan of pending loads that never runs",
        "impl/requests.py",
        "            if self.recovery.io_waiting:  # queued loads nobody is waiting for any more",
        "            if not self.recovery.io_waiting:  # queued loads nobody is waiting for any more",
    ),
)
