"""Planted bugs of the remote path: five known defects, each an exact edit of ``impl/``'s sources.

The remote tier's checks are only as good as the bugs they catch.  Each bug below is one a
shared-store prefix cache can ship with; ``tests/impl/test_impl_remote_bugs.py`` plants each in a
staged copy of ``impl/`` (:mod:`kvstate.testing.seeded`'s staging, the same ``Edit`` form) and
runs the remote tier's tests against two nodes of it on a real ``redis-server``: every one must
fail.  They are registered with the staging by name (``seeded.BY_NAME``) when this module is
imported, and are not in the conformance fuzzer's menu (``seeded.SEEDED``/``BUGS``): the fuzzer
runs without a server.

======================================  ================================================================
name                                    what the planted code does
======================================  ================================================================
``remote_chunk_mac_not_checked``        a chunk read from the store is used without its MAC check
``remote_vanished_chunk_as_zeros``      a chunk gone from the store (DEL, eviction) reads as zeros
``remote_cap_ignores_remote_loads``     the admission cap does not count remote loads
``remote_load_under_lock``              a load's read of the store runs under the cache's lock
``remote_entry_keyed_without_namespace`` an entry's name and binding leave its namespace out
======================================  ================================================================
"""

from __future__ import annotations

from kvstate.testing import seeded
from kvstate.testing.seeded import Edit, Seeded

_REMOTE = "impl/remote.py"

REMOTE_BUGS: tuple[Seeded, ...] = (
    Seeded(
        "remote_chunk_mac_not_checked",
        "integrity",
        "a store's bytes trusted (LMCache-style remote backends without checksums)",
        "a chunk read from the store is used without its MAC check",
        (
            Edit(
                _REMOTE,
                "        if not self.macs.verify(entry.key, entry.nonce, index, lo, hi, mac, got.data):",
                "        if False:",
            ),
        ),
    ),
    Seeded(
        "remote_vanished_chunk_as_zeros",
        "integrity",
        "a missing value read as an empty/zero buffer",
        "a chunk gone from the store (DEL, eviction) reads as zeros",
        (
            Edit(
                _REMOTE,
                '            raise CorruptEntry(f"{entry.path}: chunk {index} is gone from the store")',
                "            return torch.zeros(hi - lo, dtype=torch.uint8)",
            ),
        ),
    ),
    Seeded(
        "remote_cap_ignores_remote_loads",
        "admission",
        "remote loads outside the I/O bandwidth cap",
        "the admission cap does not count remote loads",
        (
            Edit(
                "impl/recovery.py",
                "            self.gate.io_inflight += int(from_disk)",
                "            self.gate.io_inflight += int(from_disk) - int("
                'from_disk and type(self.disk).__name__ == "RemoteTier")',
            ),
        ),
    ),
    Seeded(
        "remote_load_under_lock",
        "liveness",
        "a stalled server stalls every request",
        "a load's read of the store runs under the cache's lock",
        (
            Edit(
                "impl/diskreads.py",
                "                job.buffer, job.chunks, job.swa_data = self.disk.read_block(\n"
                "                    entry, bool(job.swa_pages)\n"
                "                )",
                "                with self.gate.lock:\n"
                "                    job.buffer, job.chunks, job.swa_data = self.disk.read_block(\n"
                "                        entry, bool(job.swa_pages)\n"
                "                    )",
            ),
        ),
    ),
    Seeded(
        "remote_entry_keyed_without_namespace",
        "isolation",
        "two tenants' prefixes share entries",
        "an entry's name and binding leave its namespace out",
        (
            Edit(
                _REMOTE,
                "        return (self.namespace, self.model)",
                '        return ("", self.model)',
            ),
        ),
    ),
)

seeded.BY_NAME.update({b.name: b for b in REMOTE_BUGS})
