"""Planted bugs of the block-side path classes the API ci walk closes beyond the random walk.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (:mod:`kvstate.api_planted` imports this list).

* SWA pages exhausted partway through an allocation (``kvstate/targets/api/swaout.py``): the
  harness's caches always found a free page or a window to slide, so an allocation never
  failed after its device slot was taken, and what such a failure leaves (a slot claimed by a
  record whose address is elsewhere, pages held by no block, a window slid that the table
  protects) was never seen.
* A file system that refuses direct I/O (``kvstate/targets/api/directio.py``): the harness's
  directory takes ``O_DIRECT``, so the disk tier's fallback to buffered reads never ran.
* Unlinks the file system refuses or finds done (``kvstate/targets/api/unlinks.py``): every
  unlink of the harness's directory succeeded, so ``orphans`` and the reap's going on past a
  refusal were never seen.
* Device slots reserved past the spare ones (``kvstate/targets/api/registered.py``): the
  harness registered only its own chain, shorter than the device, so ``claim_free`` never ran
  out of unclaimed slots.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "swa_exhausted_slot_kept_claimed",
        "exhaustion partway: a slot taken before the SWA pages ran out keeps its new claim",
        "impl/blocks.py",
        "        except OutOfCapacity:\n            self.tiers.slots.untake(slot, claimant)\n",
        "        except OutOfCapacity:\n            self.tiers.slots.release(slot)\n",
    ),
    (
        "swa_exhausted_slot_leaked",
        "exhaustion partway: a slot taken before the SWA pages ran out is never given back",
        "impl/blocks.py",
        "        except OutOfCapacity:\n            self.tiers.slots.untake(slot, claimant)\n",
        "        except OutOfCapacity:\n",
    ),
    (
        "swa_untake_files_claimed_as_unclaimed",
        "exhaustion partway: a slot given back under the wrong free list",
        "impl/storage.py",
        "        (self._claimed if claimant else self._unclaimed)[slot] = None\n\n    def release",
        "        self._unclaimed[slot] = None\n\n    def release",
    ),
    (
        "swa_slide_ignores_pins",
        "exhaustion partway: a full SWA pool slides a window the table protects",
        "impl/blocks.py",
        '            try:\n                gate.check_block("slide", rid)\n            except Refused:\n'
        "                continue\n            self.fx_slide(rid)\n            return True\n",
        "            self.fx_slide(rid)\n            return True\n",
    ),
    (
        "direct_io_refused_at_open_fails_the_load",
        "disk faults: direct I/O refused at open fails the read instead of falling back",
        "impl/disk.py",
        "                if exc.errno != errno.EINVAL:\n                    raise\n",
        "                raise\n",
    ),
    (
        "direct_io_refused_at_read_not_remembered",
        "disk faults: direct I/O refused at read time is retried direct",
        "impl/disk.py",
        "                    self.direct = False\n                    continue\n",
        "                    continue\n",
    ),
    (
        "direct_io_refused_at_read_fails_the_load",
        "disk faults: direct I/O refused at read time fails the read",
        "impl/disk.py",
        "                if direct and exc.errno == errno.EINVAL:",
        "                if direct and exc.errno == errno.EIO:",
    ),
    (
        "unlink_gone_listed_as_orphan",
        "disk faults: a file another cleaner removed first is listed as left behind",
        "impl/diskdir.py",
        "        except FileNotFoundError:\n            return True\n        except OSError as exc:",
        "        except OSError as exc:",
    ),
    (
        "unlink_refused_not_listed",
        "disk faults: a file whose unlink was refused is left behind unlisted",
        "impl/diskdir.py",
        '            self.orphans.append((path, f"{type(exc).__name__}: {exc}"))\n',
        "",
    ),
    (
        "unlink_refusal_raised",
        "disk faults: a refused unlink raised out of the call that let the file go",
        "impl/diskdir.py",
        '            self.orphans.append((path, f"{type(exc).__name__}: {exc}"))\n'
        "            return False\n",
        "            raise\n",
    ),
    (
        "claim_free_past_the_spare_slots",
        "slot claims: a reservation with no unclaimed slot left names slot 0",
        "impl/storage.py",
        "        if not self._unclaimed:\n            return -1\n",
        "        if not self._unclaimed:\n            return 0\n",
    ),
    (
        "register_reclaims_slot_zero",
        "slot claims: a block registered again at slot 0 reserves another slot",
        "impl/blocks.py",
        "                if self.meta.addr[rid] < 0:\n                    home = self.tiers.slots.claim_free(rid)",
        "                if self.meta.addr[rid] <= 0:\n                    home = self.tiers.slots.claim_free(rid)",
    ),
    (
        "append_keeps_the_old_end_window",
        "the window policy: decode slides from the old end's window on, keeping the window the "
        "policy kept for the boundary one block earlier (windows no hit uses fill the pool)",
        "impl/handles.py",
        "max(0, before - W - 1), max(0, n - W), n)",
        "max(0, before - W), max(0, n - W), n)",
    ),
)
