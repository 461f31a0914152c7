"""Planted bugs of the paths ``kvstate/targets/api/covreach.py``, ``sigforms.py``, the
production writer's shape case (``handed.py``) and the row memo's bound (``rowmemo.py``) reach:
the engine's ``load_fail`` by name, a host load short of SWA pages, room that cannot be made
(an offload with every host slot held, a spill on a disk pool whose entries are pinned), a
disk load that brings no window back, a queued disk load that finds no room, the signature made for a
parameter form no public class has, rows handed in another shape, an answer over the memo's
per-answer bound.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (``kvstate/api_planted.py`` imports this list).
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "load_fail_by_name_deferred",
        "pipelines' actions by name: load_fail leaves the load running (failed at its next step)",
        "impl/recovery.py",
        '            self.fail_load(rid, self.load_job(rid), "load failed", corrupt=False)',
        "            self.load_job(rid).fault = True",
    ),
    (
        "var_keyword_shown_keyword_only",
        "published signatures: a **kwargs parameter shown as a keyword-only one",
        "impl/signatures.py",
        "_KINDS.VAR_KEYWORD, annotation=ann))",
        "_KINDS.KEYWORD_ONLY, annotation=ann))",
    ),
    (
        "handed_rows_width_unchecked",
        "production writer: rows handed in another width are taken (only their layers checked)",
        "impl/writer.py",
        "        bad = [p for p in at if tuple(kept[group, p].shape) != shape]",
        "        bad = [p for p in at if tuple(kept[group, p].shape)[0] != shape[0]]",
    ),
    (
        "load_short_of_swa_loses_the_claim",
        "exhaustion partway: a load short of SWA pages gives its slot back unclaimed",
        "impl/recovery.py",
        "                    self.tiers.slots.untake(dst, claimant)\n",
        "                    self.tiers.slots.release(dst)\n",
    ),
    (
        "row_memo_keeps_big_answers",
        "caches inside the implementation: the memo keeps an answer past its per-answer bound",
        "impl/testdata.py",
        "        if size <= answer_kept_max():",
        "        if size <= 2 * answer_kept_max():",
    ),
    (
        "spill_not_adopted_keeps_its_file",
        "exhaustion partway: a spill's file written but not adopted (no room) is left behind",
        "impl/spills.py",
        "            if not still:\n                self.disk.delete(entry)\n                return 0",
        "            if not still:\n                return 0",
    ),
    (
        "offload_without_room_returns",
        "exhaustion partway: an offload that finds no host room returns as if it offloaded",
        "impl/recovery.py",
        "                if victim is None:\n                    raise OutOfCapacity(\n"
        '                        "offload", (), f"all {self.host_blocks} host slots are busy"\n'
        "                    )\n",
        "                if victim is None:\n                    return\n",
    ),
    (
        "disk_load_keeps_an_unwritten_window",
        "recovery: a disk load under a policy that keeps no window on disk claims a valid window",
        "impl/recovery.py",
        "                if not self.k.swa_restored_from_disk:\n                    m.swa[rid] = SWA_NULL\n",
        "",
    ),
    (
        "queued_load_without_room_stays_queued",
        "exhaustion partway: a queued disk load that finds no room stays in the I/O queue",
        "impl/recovery.py",
        "            if got != STARTED:  # refused, or no device room now: its admission truncates\n"
        "                self.io_waiting.pop(rid, None)\n",
        "            if got != STARTED:  # refused, or no device room now: its admission truncates\n",
    ),
)
