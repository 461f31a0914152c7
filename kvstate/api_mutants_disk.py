"""Planted bugs for the disk-tier classes of path the API harness checks (read by
:mod:`kvstate.api_mutants`, which adds them to its list): a load driven action by action
(kvstate/targets/api/stepwise.py), a spill's refused writes (refusedwrites.py), a run read at
its inner boundaries (prefixreads.py) and ``stats()`` against the model (stats.py).  Each is
(name, bug class, path, old text, new text), as :class:`kvstate.api_mutants.Mutant` takes them.
"""

from __future__ import annotations

DISK_MUTANTS: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "read_ahead_reads_under_the_lock",
        "file-system call under the cache's lock",
        "impl/diskreads.py",
        "or job.fault or job.chunks is not None:",
        "or job.fault or job.chunks is None:",
    ),
    (
        "failed_read_keeps_the_load",
        "a failed read that does not fail its load",
        "impl/diskreads.py",
        "if self.owner.owns(job) and (k < 0 or self.meta.prog[rid] == k):",
        "if self.owner.owns(job) and (k < 0 and self.meta.prog[rid] == k):",
    ),
    (
        "refused_rename_leaves_its_temporary",
        "a refused write leaves a file behind",
        "impl/disk.py",
        "            os.rename(tmp, entry.path)\n        except OSError as exc:\n"
        "            self.remove(tmp)",
        "            os.rename(tmp, entry.path)\n        except OSError as exc:\n            pass",
    ),
    (
        "refused_spill_returns_zero",
        "a refused write reported as nothing to spill",
        "impl/spills.py",
        "                if done:\n                    return done\n                raise",
        "                if done:\n                    return done\n                return 0",
    ),
    (
        "window_one_row_short",
        "window offset arithmetic",
        "impl/tiers.py",
        "got = rows[lo : lo + min(h, n_win)]",
        "got = rows[lo : lo + min(h, n_win - 1)]",
    ),
    (
        "loaded_entry_stays_counted",
        "stats() drifting from the blocks' phases",
        "impl/recovery.py",
        "                self.disk_entries.pop(rid, None)\n                m.on_disk[rid] = False",
        "                m.on_disk[rid] = False",
    ),
    (
        "any_key_temporary_taken_as_ours",
        "a file kvstate did not write deleted: a key temporary's name trusted whatever its size",
        "impl/disk.py",
        "return st.st_size <= KEY_BYTES",
        "return True",
    ),
    (
        "loaded_files_unlinked_only_while_loads_run",
        "a file kvstate let go of left on disk: the loaded files' unlinks wait for a load in "
        "flight, and the last load to end leaves them",
        "impl/diskreads.py",
        "        if not self.gate.io_inflight:\n            self.disk.reap()\n",
        "        if False:\n            self.disk.reap()\n",
    ),
    (
        "landing_copies_each_run_from_the_chunk_start",
        "wrong bytes served: a chunk's runs landed from the chunk's first byte (the numpy copies)",
        "impl/tiers.py",
        "dst[...] = src[off : off + n].reshape(dst.shape)",
        "dst[...] = src[:n].reshape(dst.shape)",
    ),
    (
        "landing_into_the_slot_before",
        "wrong bytes served: a chunk landed into another block's slot (the numpy copies)",
        "impl/tiers.py",
        "            return self._np_land(nruns, data, slot)",
        "            return self._np_land(nruns, data, max(slot - 1, 0))",
    ),
    (
        "waiters_woken_only_while_nothing_holds",
        "a lost wake-up: a use waiting for its recovery woken only where nothing it waits for holds",
        "impl/gate.py",
        "                if not ready():\n                    continue",
        "                if ready():\n                    continue",
    ),
    (
        "threaded_load_batches_past_its_chunks",
        "a load completed before its chunks landed: a worker's batched steps skip the landing",
        "impl/diskreads.py",
        "                    if job.chunks is not None:  # (chunk k on are in the slot already: _land)",
        "                    if job.chunks is not None or self.pipes.mode == \"threads\":",
    ),
)
