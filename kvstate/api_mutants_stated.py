"""Planted bugs of the classes ``kvstate/targets/api/stated.py``, ``shortreads.py``, the key's
mode bits (``stored.py``'s refusals) and the library's drain count (``libdrive.py``) close.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_planted.Mutant` takes them.  What the harness did not look at: the figures
a refusal states (only the error's class was checked), a disk that answers a read in pieces
(the harness's answered whole), a key file with one permission bit beyond 0644's, the
count ``pipelines.drain()`` returns, a descriptor left open by a refused open (descriptor 0
too), a stray the scan cannot read, and a load's read sized for two chunks (``load_steps``
at its one value: ``constvals.py``).
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "memory_limit_stated_in_mib",
        "what an error states: the limit's figure in MiB under a GiB label",
        "impl/tiers.py",
        'memory_limit {memory_limit / 2**30:.1f} GiB); "',
        'memory_limit {memory_limit / 2**20:.1f} GiB); "',
    ),
    (
        "graph_table_staging_counted_off_cuda",
        "a limit: the CUDA-graph table's host staging copy counted where there is no device",
        "impl/core.py",
        '12 * (2 if device.type == "cuda" else 1)',
        "12 * 2",
    ),
    (
        "unknown_request_unnamed",
        "what an error states: an unknown request's refusal that does not name it",
        "impl/cache.py",
        'raise UnknownRequest(f"unknown request id {rid!r}")',
        'raise UnknownRequest("unknown request id")',
    ),
    (
        "short_read_refills_buffer_start",
        "a short read: the read goes on at the right offset into the buffer's start",
        "impl/disk.py",
        "got = os.preadv(fd, [buf[done:]], offset + done)",
        "got = os.preadv(fd, [buf], offset + done)",
    ),
    (
        "key_mode_ignores_execute_bits",
        "a stored form's permissions: a key file's execute bits for group and others let through",
        "impl/diskdir.py",
        "if st.st_mode & 0o077:",
        "if st.st_mode & 0o066:",
    ),
    (
        "drain_counts_its_idle_pass",
        "a returned count: drain() counts the pass that found nothing to step",
        "impl/pipelines.py",
        "        return steps\n",
        "        return steps + 1\n",
    ),
    (
        "failed_key_leaks_descriptor_zero",
        "descriptors on a failure path: descriptor 0 taken for none, left open",
        "impl/diskdir.py",
        "        if fd >= 0:\n            os.close(fd)\n        try:\n            os.unlink(tmp)",
        "        if fd > 0:\n            os.close(fd)\n        try:\n            os.unlink(tmp)",
    ),
    (
        "scan_deletes_unreadable_stray",
        "a stored form the scan cannot read: taken for kvstate's and deleted",
        "impl/disk.py",
        "            head = os.pread(fd, len(MAGIC_FAMILY), 0)\n        except OSError:\n            return False",
        "            head = os.pread(fd, len(MAGIC_FAMILY), 0)\n        except OSError:\n            return True",
    ),
    (
        "payload_sized_by_second_chunk",
        "a constant met at one value: a load's read sized by the second chunk, not the last",
        "impl/disk.py",
        "hi = chunks[-1][3] if chunks else 0",
        "hi = chunks[1][3] if chunks else 0",
    ),
    (
        "disk_key_shortest_refused",
        "what an error states: a key of the shortest length the refusal names is refused too",
        "impl/disk.py",
        "not KEY_MIN <= len(key) <= KEY_MAX",
        "not KEY_MIN < len(key) <= KEY_MAX",
    ),
)
