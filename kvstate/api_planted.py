"""The planted bugs of ``python -m kvstate.api_mutants``: single-edit source mutants of ``impl/``.

Each :class:`Mutant` is one exact edit (``old`` -> ``new``, its text occurring once in ``path``)
at the spot a real engine bug of its class lives; :mod:`kvstate.api_mutants` applies them one at
a time to a staged copy of the package and runs the API harness against each.  A mutant the
harness's geometry cannot tell from the original says why (``equivalent``): it is applied but
not run, and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstate.api_mutants_admission import PLANTED as PLANTED_ADMISSION
from kvstate.api_mutants_blockpaths import PLANTED as PLANTED_BLOCKPATHS
from kvstate.api_mutants_blockpaths2 import PLANTED as PLANTED_BLOCKPATHS2
from kvstate.api_mutants_blocks import PLANTED as PLANTED_BLOCKS
from kvstate.api_mutants_blockside import PLANTED as PLANTED_BLOCKSIDE
from kvstate.api_mutants_claims import PLANTED as PLANTED_CLAIMS
from kvstate.api_mutants_covblocks import PLANTED as PLANTED_COVBLOCKS
from kvstate.api_mutants_coverage import PLANTED as PLANTED_COVERAGE
from kvstate.api_mutants_covreach import PLANTED as PLANTED_COVREACH
from kvstate.api_mutants_disk import DISK_MUTANTS
from kvstate.api_mutants_evict import PLANTED as PLANTED_EVICT
from kvstate.api_mutants_facade import PLANTED as PLANTED_FACADE
from kvstate.api_mutants_forms import PLANTED as PLANTED_FORMS
from kvstate.api_mutants_interpreted import PLANTED as PLANTED_INTERPRETED
from kvstate.api_mutants_recovery import RECOVERY_MUTANTS
from kvstate.api_mutants_recovery2 import PLANTED as PLANTED_RECOVERY2
from kvstate.api_mutants_reqpaths import PLANTED as PLANTED_REQPATHS
from kvstate.api_mutants_stated import PLANTED as PLANTED_STATED


@dataclass(frozen=True)
class Mutant:
    name: str
    bug_class: str
    path: str  # relative to the repository root
    old: str
    new: str
    # why the harness's geometry cannot tell this mutant from the original (it is then applied
    # but not run, and not counted in the kill rate; a test checks the reason still holds)
    equivalent: str = ""


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "pin_takes_no_reference",
        "missing pin",
        "impl/requests.py",
        "            ref[rid] += 1\n            if rid in lru:\n                lru.move_to_end(rid)\n        s.rids = held",
        "            ref[rid] += 0\n            if rid in lru:\n                lru.move_to_end(rid)\n        s.rids = held",
    ),
    Mutant(
        "unpin_skips_deepest_block",
        "reference count off by one",
        "impl/requests.py",
        "        for rid in reversed(s.rids):\n            ref[rid] -= 1",
        "        for rid in reversed(s.rids[1:]):\n            ref[rid] -= 1",
    ),
    Mutant(
        "pinned_counter_off_by_one",
        "reference count off by one",
        "impl/requests.py",
        "        self.gate.pinned_blocks += len(held)",
        "        self.gate.pinned_blocks += len(held) + (1 if held else 0)",
    ),
    Mutant(
        "freed_keeps_window",
        "free without reset",
        "impl/blocks.py",
        "        m.tail[rid] = TAIL_NONE\n        m.swa[rid] = SWA_NULL\n        m.idx[rid] = IDX_ABSENT\n        if in_lru:",
        "        m.tail[rid] = TAIL_NONE\n        m.idx[rid] = IDX_ABSENT\n        if in_lru:",
    ),
    Mutant(
        "evict_keeps_swa_pages",
        "free without reset (leak)",
        "impl/blocks.py",
        "        if m.swa_pages[rid]:\n            self.tiers.swa_pool.release(m.swa_pages[rid])\n            m.swa_pages[rid] = ()\n\n    def _free_run",
        "        if m.swa_pages[rid]:\n            m.swa_pages[rid] = ()\n\n    def _free_run",
    ),
    Mutant(
        "slide_keeps_swa_pages",
        "free without reset (leak)",
        "impl/blocks.py",
        "        m = self.meta\n        if m.swa_pages[rid]:\n            self.tiers.swa_pool.release(m.swa_pages[rid])\n            m.swa_pages[rid] = ()\n        job = ",
        "        m = self.meta\n        job = ",
    ),
    Mutant(
        "index_stamp_reads_old_version",
        "stale indexer version",
        "impl/blocks.py",
        "        m.iver[rid] = m.ver[rid]",
        "        m.iver[rid] = m.ver[rid] - 1",
    ),
    Mutant(
        "disk_load_keeps_indexer",
        "stale indexer after a disk load",
        "impl/recovery.py",
        "                self.gate.io_inflight -= 1\n                m.idx[rid] = IDX_ABSENT",
        "                self.gate.io_inflight -= 1",
    ),
    Mutant(
        "load_progress_skips_a_chunk",
        "load completion marked early",
        "impl/recovery.py",
        "            self.meta.prog[rid] += 1",
        "            self.meta.prog[rid] += 2",
    ),
    Mutant(
        "landed_chunk_skips_a_chunk",
        "a disk load's landed chunk counted twice (its job's own step)",
        "impl/recovery.py",
        "            self.meta.prog[rid] = k + 1",
        "            self.meta.prog[rid] = k + 2",
    ),
    Mutant(
        "rebuild_done_by_name_computes_no_keys",
        "an indexer rebuild completed by name stamps keys it never computed",
        "impl/recovery.py",
        "        self._rebuild_done(rid, build=True)",
        "        self._rebuild_done(rid, build=False)",
    ),
    Mutant(
        "disk_checksum_not_verified",
        "MAC never verified",
        "impl/disk.py",
        "        if not hmac.compare_digest(tag, mac):",
        "        if False and not hmac.compare_digest(tag, mac):",
    ),
    Mutant(
        "host_copy_without_indexer",
        "host copy without indexer pages",
        "impl/tiers.py",
        "    def to_host(self, slot: int, swa_pages: Sequence[int], hslot: int) -> None:\n        for grp in self.slot_groups:",
        "    def to_host(self, slot: int, swa_pages: Sequence[int], hslot: int) -> None:\n        for grp in self.disk_groups:",
    ),
    Mutant(
        "window_read_one_row_late",
        "wrong window offset",
        "impl/tiers.py",
        "        lo = max(0, h - n_win) - first * bt",
        "        lo = max(0, h - n_win) - first * bt + 1",
    ),
    Mutant(
        "offload_done_keeps_device_slot",
        "free without reset (leak)",
        "impl/recovery.py",
        "            self.tiers.to_host(m.slot[rid], pages, m.hslot[rid])\n            self.store.free_device(rid)",
        "            self.tiers.to_host(m.slot[rid], pages, m.hslot[rid])",
    ),
    Mutant(
        "offload_cancel_keeps_host_slot",
        "free without reset (leak)",
        "impl/recovery.py",
        "    def _fx_offload_cancel(self, rid: int) -> None:\n        m = self.meta\n        self.tiers.host_slots.release([m.hslot[rid]])\n",
        "    def _fx_offload_cancel(self, rid: int) -> None:\n        m = self.meta\n",
    ),
    Mutant(
        "drop_leaves_disk_file",
        "free without reset (leak)",
        "impl/spills.py",
        "                if entry is not None:\n                    self.disk.delete(entry)",
        "                if entry is not None:\n                    pass",
    ),
    Mutant(
        "failed_load_keeps_slot",
        "free without reset (leak)",
        "impl/recovery.py",
        "        self.tiers.slots.release(job.dst)\n        self.tiers.slots.unclaim(job.dst, rid)",
        "        self.tiers.slots.unclaim(job.dst, rid)",
    ),
    Mutant(
        "io_counter_not_decremented",
        "admission cap accounting",
        "impl/recovery.py",
        "            if from_disk:\n                self.gate.io_inflight -= 1\n                m.idx[rid] = IDX_ABSENT",
        "            if from_disk:\n                m.idx[rid] = IDX_ABSENT",
    ),
    Mutant(
        "store_skips_seal",
        "tail never sealed",
        "impl/blocks.py",
        '            self.fx_seal(rid)\n        gate.check_run("index_update", rids)',
        '            pass\n        gate.check_run("index_update", rids)',
    ),
    Mutant(
        "snapshot_records_no_generation",
        "state_data_ptrs snapshot of the wrong field",
        "impl/requests.py",
        "        s.pgen = tuple([gen[i] for i in rids])",
        "        s.pgen = tuple([0 for i in rids])",
    ),
    Mutant(
        "allocate_keeps_generation",
        "generation not bumped on reuse",
        "impl/blocks.py",
        "        m.ckv[rid] = CKV_WRITING\n        m.gen[rid] += 1",
        "        m.ckv[rid] = CKV_WRITING",
    ),
    Mutant(
        "gather_first_page_only",
        "block table built wrong",
        "impl/handles.py",
        "                [s * ppl + i for s in self._block_table() for i in range(ppl)],",
        "                [s * ppl for s in self._block_table() for i in range(ppl)],",
        equivalent="small(): every slot group has one page per block (ppl == 1), so "
        "s * ppl + i == s * ppl; checked by test_equivalent_mutants_are_equivalent_on_small",
    ),
    Mutant(
        "block_table_reversed",
        "block table built wrong",
        "impl/handles.py",
        "        return [slot[r] for r in self.rids]",
        "        return [slot[r] for r in reversed(self.rids)]",
    ),
    Mutant(
        "host_load_keeps_host_slot",
        "free without reset (leak)",
        "impl/recovery.py",
        "            else:\n                self.tiers.host_slots.release([job.src])\n                m.hslot[rid] = -1",
        "            else:\n                m.hslot[rid] = -1",
    ),
    Mutant(
        "lease_not_capped",
        "residency lease beyond the request",
        "impl/cache.py",
        "                req, req.lifetime, h_max, min(req.lifetime, self.table.consts.lease_max), recover",
        "                req, req.lifetime, h_max, self.table.consts.lease_max, recover",
    ),
    Mutant(
        "spill_keeps_host_slot",
        "free without reset (leak)",
        "impl/spills.py",
        "        self.tiers.host_slots.release([m.hslot[rid]])\n        m.hslot[rid] = -1\n        m.ckv[rid] = CKV_DISK",
        "        m.hslot[rid] = -1\n        m.ckv[rid] = CKV_DISK",
    ),
    Mutant(
        "disk_load_wrong_form",
        "stored form lost on a disk load",
        "impl/recovery.py",
        "                m.fmt[rid] = job.src.fmt",
        "                m.fmt[rid] = 0 if job.src.fmt else 1",
    ),
    Mutant(
        "truncation_keeps_failed_boundary",
        "corrupt entry served",
        "impl/requests.py",
        "        cap = min(hit, (-(-hit // L) - 1) * L) if boundary_failed else hit",
        "        cap = min(hit, -(-hit // L) * L) if boundary_failed else hit",
    ),
    # where the mutants above do not reach: disk files, held-back loads, raising jobs, tombstones
    # (docs/api-harness-findings.md, "Bugs planted by hand")
    Mutant(
        "scan_deletes_foreign_files",
        "file kvstate did not write deleted",
        "impl/disk.py",
        "                if self._ours(path, magic_prefix_ok=False):",
        "                if True:",
    ),
    Mutant(
        "scan_keeps_unpublished_temporary",
        "crash leftover never reaped",
        "impl/disk.py",
        "                    self.remove(path)  # a write that never got published",
        "                    pass  # a write that never got published",
    ),
    Mutant(
        "reap_never_unlinks",
        "doomed file never reaped",
        "impl/diskdir.py",
        "                self.remove(path)  # (refused: left in orphans)",
        "                pass  # (refused: left in orphans)",
    ),
    Mutant(
        "failed_load_keeps_io_counter",
        "admission cap accounting",
        "impl/recovery.py",
        "        if from_disk:\n            self.gate.io_inflight -= 1\n            self.disk_lru[rid] = None",
        "        if from_disk:\n            self.disk_lru[rid] = None",
    ),
    Mutant(
        "finished_load_starts_no_held_back_load",
        "held-back load never started",
        "impl/recovery.py",
        "        if from_disk:\n            self._start_waiting_io()\n\n    def _start_waiting_io",
        "        if from_disk:\n            pass\n\n    def _start_waiting_io",
    ),
    Mutant(
        "failed_load_starts_no_held_back_load",
        "held-back load never started",
        "impl/recovery.py",
        "        if from_disk:\n            self._start_waiting_io()\n        self.gate.notify_changed()",
        "        self.gate.notify_changed()",
    ),
    Mutant(
        "unwanted_load_keeps_follow_ups",
        "follow-up left waiting",
        "impl/recovery.py",
        "            if ref[rid] == 0:\n                self.io_waiting.pop(rid, None)\n                self.drop_wants(rid)",
        "            if ref[rid] == 0:\n                self.io_waiting.pop(rid, None)",
    ),
    Mutant(
        "raising_offload_not_cancelled",
        "raising job left stuck",
        "impl/recovery.py",
        "            if self.meta.ckv[rid] == CKV_OFFLOADING and self.pipes.dma.get(rid) is job:",
        "            if False:",
    ),
    Mutant(
        "raising_job_not_abandoned",
        "raising job left stuck",
        "impl/pipelines.py",
        '            job.abandon(f"{type(exc).__name__}: {exc}")',
        "            pass",
    ),
    Mutant(
        "freed_record_not_tombstoned",
        "record leaked",
        "impl/blocks.py",
        "        if in_lru:\n            self.lru.pop(rid, None)\n        self.tombstones[rid] = None",
        "        if in_lru:\n            self.lru.pop(rid, None)",
    ),
    # staleness by the admission's number; the harness admits an ended request
    # again (kvstate/targets/api/ops.py ``_do_admit``) for this one
    Mutant(
        "run_live_across_readmission",
        "stale run served",
        "impl/handles.py",
        "            and req.admissions == self._seq\n",
        "            and True\n",
    ),
    # found by a random mutant campaign (docs/api-harness-findings.md): the harness read a
    # released run through read_compressed only
    Mutant(
        "block_table_after_release",
        "stale run served",
        "impl/handles.py",
        '            self._check("block_table")\n',
        "            pass\n",
    ),
    Mutant(
        "odd_length_entry_name_read",
        "file kvstate did not write trusted",
        "impl/disk.py",
        "            if not _ENTRY_NAME.fullmatch(name) or len(name) % 2:",
        "            if not _ENTRY_NAME.fullmatch(name) and len(name) % 2:",
    ),
    Mutant(
        "wait_does_not_finalize",
        "pending admission reported ready",
        "impl/handles.py",
        "        cache._finalize(self, timeout=wait)\n",
        "        pass\n",
    ),
    # the orders the library documents and the table leaves open (kvstate/targets/api/orders.py)
    Mutant(
        "unpin_forward_order",
        "observable order: LRU after unpinning",
        "impl/requests.py",
        "        for rid in reversed(s.rids):\n            ref[rid] -= 1",
        "        for rid in s.rids:\n            ref[rid] -= 1",
    ),
    Mutant(
        "evict_most_recent_first",
        "observable order: eviction victim",
        "impl/blocks.py",
        "        for rid in self.lru:\n            try:  # the head",
        "        for rid in reversed(self.lru):\n            try:  # the head",
    ),
    Mutant(
        "spill_most_recent_first",
        "observable order: host spill victim",
        "impl/spills.py",
        "                (r for r in self.host_lru if r not in tried",
        "                (r for r in reversed(self.host_lru) if r not in tried",
    ),
    Mutant(
        "queued_loads_last_first",
        "observable order: queued loads start",
        "impl/recovery.py",
        "        for rid in list(self.io_waiting):\n            got = self.admit_load(rid)",
        "        for rid in list(self.io_waiting)[::-1]:\n            got = self.admit_load(rid)",
    ),
    Mutant(
        "drop_host_before_disk",
        "observable order: drop victim",
        "impl/spills.py",
        "            for rid in [*list(self.disk_lru), *list(self.host_lru)]:",
        "            for rid in [*list(self.host_lru), *list(self.disk_lru)]:",
    ),
    # the identity of a prefix (kvstate/targets/api/prefix.py)
    Mutant(
        "key_skips_last_token",
        "prefix identity: part of a block unhashed",
        "impl/hashing.py",
        "        h = blake(h + mv[k * width : (k + 1) * width], digest_size=KEY_BYTES).digest()",
        "        h = blake(h + mv[k * width : (k + 1) * width - 8], digest_size=KEY_BYTES).digest()",
    ),
    Mutant(
        "key_not_chained",
        "prefix identity: a block's key ignores the blocks before it",
        "impl/hashing.py",
        "        h = blake(h + mv[k * width : (k + 1) * width], digest_size=KEY_BYTES).digest()",
        "        h = blake(parent + mv[k * width : (k + 1) * width], digest_size=KEY_BYTES).digest()",
    ),
    # bad input at a public entry point (kvstate/targets/api/inputs.py)
    Mutant(
        "integer_takes_bool",
        "bad input accepted",
        "impl/args.py",
        "        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):",
        "        if not isinstance(v, (int, np.integer)):",
    ),
    Mutant(
        "flag_takes_int",
        "bad input accepted",
        "impl/args.py",
        "    if isinstance(v, np.bool_):\n        return bool(v)",
        "    if isinstance(v, (np.bool_, int)):\n        return bool(v)",
    ),
    # a pool exhausted partway through an operation (the witnesses "... runs out partway")
    Mutant(
        "store_run_keeps_untaken_pages",
        "exhaustion mid-operation: half-allocated run",
        "impl/blocks.py",
        "                pool.untake(pages[used:])  # as if the rest had never been taken",
        "                pass",
    ),
    # what the library hands out besides reads (kvstate/targets/api/handout.py)
    Mutant(
        "graph_row_not_repadded",
        "CUDA-graph row: stale padding",
        "impl/graphs.py",
        "        if old > n:  # beyond ``old`` the row is still padding",
        "        if old > n + 1:  # beyond ``old`` the row is still padding",
    ),
    Mutant(
        "raising_subscriber_stops_delivery",
        "event delivery: a raising subscriber",
        "impl/events.py",
        '                self.callback_errors.append(f"{cb!r} on {ev.kind.value}: {exc!r}")',
        '                self.callback_errors.append(f"{cb!r} on {ev.kind.value}: {exc!r}")\n                break',
    ),
    Mutant(
        "event_run_delivered_reversed",
        "event payloads out of order",
        "impl/events.py",
        "            for raw in raws:\n                self._deliver",
        "            for raw in raws[::-1]:\n                self._deliver",
    ),
    # the graph protocol and events at delivery (kvstate/targets/api/graphs.py, kvstate/targets/api/delivery.py)
    Mutant(
        "stale_graph_reported_mid_move",
        "event delivered before the move it reports",
        "impl/recovery.py",
        "            why = self.store.moved(rid, job.dst)\n",
        "            why = self.store.moved(rid, job.dst)\n            self.store.stale(rid, why)\n"
        '            why = ""\n',
    ),
    Mutant(
        "move_keeps_graph_captured",
        "CUDA graph not staled by a move",
        "impl/graphs.py",
        "        if self.phase == GRAPH_CAPTURED and new != old and self.meta.gaddr[rid] >= 0:",
        "        if self.phase == GRAPH_CAPTURED and new != old and self.meta.gaddr[rid] > 0:",
    ),
    Mutant(
        "refill_writes_the_next_row",
        "CUDA-graph row of another request",
        "impl/graphs.py",
        "        self._bt_rows[row][:n] = bs",
        "        self._bt_rows[(row + 1) % len(self._bt_rows)][:n] = bs",
    ),
    Mutant(
        "replay_skips_the_work",
        "CUDA-graph replay runs nothing",
        "impl/graphs.py",
        "        elif self._fn is not None:\n            self._fn()",
        "        elif self._fn is None:\n            self._fn()",
    ),
    Mutant(
        "store_policy_end_off_by_one",
        "window policy asked for the wrong prefix",
        "impl/handles.py",
        "        self.store.store_run(run, ticks, chain.blocks)",
        "        self.store.store_run(run, ticks, chain.blocks - 1)",
    ),
    # damage to each stored form on disk (kvstate/targets/api/damage.py)
    Mutant(
        "window_mac_not_checked",
        "integrity: one stored form unchecked",
        "impl/disk.py",
        "                self._check(entry, -1, lo, end, mac, view[lo:end])\n",
        "                pass\n",
    ),
    Mutant(
        "first_chunk_mac_not_checked",
        "integrity: one stored form unchecked",
        "impl/disk.py",
        "                self._check(entry, k, lo, end, mac, view[lo:end])\n",
        "                if k:\n                    self._check(entry, k, lo, end, mac, view[lo:end])\n",
    ),
    # readiness ordering in recovery (the witnesses "use tried at every step ...")
    Mutant(
        "finalize_before_recovery_ends",
        "readiness: use before the recovery's jobs end",
        "impl/cache.py",
        "            elif self._pending(adm):\n",
        "            elif False:\n",
    ),
    # concurrency: killed by the threaded mode's schedules (kvstate/targets/api/schedule.py), which the
    # child runs after the lockstep run (the manual pipelines never wait, so only threads see)
    Mutant(
        "finish_without_lock",
        "lock omitted",
        "impl/handles.py",
        "        with self.core.lock:\n            self._finish_locked(req, store)",
        "        if self.core.lock:\n            self._finish_locked(req, store)",
    ),
    Mutant(
        "load_done_drops_notify",
        "lost wake-up",
        "impl/recovery.py",
        "            self._after_load(rid, from_disk)\n            self.gate.notify_changed()\n",
        "            self._after_load(rid, from_disk)\n",
    ),
    # refusals the table does not require (docs/generated-mutants.md): caught by asking the
    # model whether the table refuses the call (kvstate/targets/api/refusals.py), and by a run whose
    # hits and reads all stayed at zero
    Mutant(
        "admit_refuses_idle_requests",
        "refusal not required by the table",
        "impl/cache.py",
        '            if req.slot is not None:\n                raise requests.refusal("admit"',
        '            if req.slot is None:\n                raise requests.refusal("admit"',
    ),
    Mutant(
        "no_request_slot_is_free",
        "refusal not required by the table",
        "impl/requests.py",
        "            if s.phase == REQ_IDLE and s.request is None:",
        "            if s.phase == REQ_IDLE and s.request is not None:",
    ),
    # argument checks (kvstate/targets/api/args.py): a NaN timeout taken as a wait, a closed cache
    # that still answers (a changed default is planted by cosmic-ray's NumberReplacer only: a
    # default edited in the staged copy fails at import, before any check runs)
    Mutant(
        "nan_timeout_accepted",
        "argument check lets a bad value through",
        "impl/args.py",
        "    if math.isnan(f) or f < 0 or f > MAX_TIMEOUT:",
        "    if f < 0 or f > MAX_TIMEOUT:",
    ),
    Mutant(
        "decode_slides_from_past_the_window",
        "window policy not applied",
        "impl/handles.py",
        "max(0, before - W - 1), max(0, n - W), n)",
        "max(0, before + W - 1), max(0, n - W), n)",
    ),
    Mutant(
        "closed_cache_reports_stats",
        "closed handle still served",
        "impl/cache.py",
        "        self._open()\n        return self.core.stats()",
        "        return self.core.stats()",
    ),
    # kvstate/targets/api/stored.py: authentic headers not of this layout, the directory's refusals
    Mutant(
        "header_unit_table_unchecked",
        "stored-form field never compared",
        "impl/diskheader.py",
        "    if layout is not None and units != layout:",
        "    if False and layout is not None and units != layout:",
    ),
    Mutant(
        "key_file_mode_unchecked",
        "cache directory: a key readable by others accepted",
        "impl/diskdir.py",
        "            if st.st_mode & 0o077:",
        "            if st.st_mode & 0o000:",
    ),
    Mutant(
        "refused_open_keeps_lock",
        "cache directory: a refused open leaks its lock",
        "impl/disk.py",
        "        except BaseException:\n            self.close()\n            raise",
        "        except BaseException:\n            raise",
    ),
    Mutant(
        "scan_keeps_older_copy",
        "restart: two entries of one key, the older kept",
        "impl/disk.py",
        "                if (old.mtime_ns, old.path.name) > (e.mtime_ns, e.path.name):",
        "                if (old.mtime_ns, old.path.name) < (e.mtime_ns, e.path.name):",
    ),
    # kvstate/targets/api/exhaust.py: a disk full partway through a spill, counts, "up to n"
    Mutant(
        "spill_raises_after_partial",
        "exhaustion partway through a store",
        "impl/spills.py",
        "                if done:\n                    return done\n                raise",
        "                if not done:\n                    return done\n                raise",
    ),
    Mutant(
        "spill_stops_early",
        "maintenance call does less than it may",
        "impl/spills.py",
        "        while done < n:\n            snap = self._next_spill(tried)",
        "        while done < n - 1:\n            snap = self._next_spill(tried)",
    ),
    Mutant(
        "short_read_accepted",
        "short read taken for a full one",
        "impl/disk.py",
        "            if got < n:\n                raise CorruptEntry(",
        "            if got < 0:\n                raise CorruptEntry(",
    ),
)

# the disk-tier classes' planted bugs (kvstate/api_mutants_disk.py)
MUTANTS += tuple(Mutant(*m) for m in DISK_MUTANTS)
MUTANTS += tuple(Mutant(*m) for m in RECOVERY_MUTANTS)
# the block-level classes' planted bugs (kvstate/api_mutants_blocks.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_BLOCKS)
# a store run's eviction past a protected LRU head (kvstate/api_mutants_evict.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_EVICT)
# the façade's and the production writer's planted bugs (kvstate/api_mutants_facade.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_FACADE)
# device-slot claims, pool sizes, the record purge (kvstate/api_mutants_claims.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_CLAIMS)
# the admission classes' planted bugs (kvstate/api_mutants_admission.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_ADMISSION)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_FORMS)
# block-side path classes: SWA pages exhausted partway (kvstate/api_mutants_blockpaths.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_BLOCKPATHS)
# the page pools' free lists against their pages in use (kvstate/api_mutants_blockpaths2.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_BLOCKPATHS2)
# the cache's own worker threads and the library's pipeline drivers (kvstate/api_mutants_reqpaths.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_REQPATHS)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_INTERPRETED)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_COVERAGE)
# what refusals state, short reads, the key's mode bits, drain's count (kvstate/api_mutants_stated.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_STATED)
# store room, pin diagnostics, refusal explanations, read-only tokens, callback errors,
# restored tails cut back onto (kvstate/api_mutants_covblocks.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_COVBLOCKS)
# failed loads' corrupt marks, hits where a recovery serves longer (kvstate/api_mutants_recovery2.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_RECOVERY2)
# declared forms, slot order, store-room order, truncation, memo answers
# (kvstate/api_mutants_blockside.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_BLOCKSIDE)
# the engine's load_fail by name, signature forms, handed rows' shape (kvstate/api_mutants_covreach.py)
MUTANTS += tuple(Mutant(*m) for m in PLANTED_COVREACH)
