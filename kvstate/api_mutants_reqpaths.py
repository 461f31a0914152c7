"""Planted bugs of the request-side path classes the API fuzz closes in
``kvstate/targets/api/``: ``workers.py`` (the cache's own worker threads), ``libdrive.py``
(the library's own drivers of manual pipelines, a failed recovery given up at ``use``, stale
offload jobs), ``readers.py`` (an admission's explanation and pins), ``actmaint.py`` (offload,
spill and drop fired by record), ``slotsfull.py`` (every request slot busy), ``notinuse.py``
(finish and append before use), ``slotforms.py`` (a slot in every form) and ``construct.py``
(a run of a closed cache).

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (``kvstate/api_planted.py`` imports this list).
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    # workers.py: a job that raises in a worker thread
    (
        "worker_drops_a_failed_job",
        "concurrency: a worker that fails silently (the job neither abandoned nor dropped)",
        "impl/pipelines.py",
        "            except Exception as exc:  # noqa: BLE001 - a worker must not die silently\n"
        "                self.fail(job, exc)",
        "            except Exception:  # noqa: BLE001 - a worker must not die silently\n"
        "                job.over = True",
    ),
    (
        "worker_failure_unrecorded",
        "concurrency: a job's failure abandoned but never recorded",
        "impl/pipelines.py",
        "        if not isinstance(exc, Refused):",
        "        if isinstance(exc, KVStateError) and not isinstance(exc, Refused):",
    ),
    # workers.py: use's wait on the lock's condition, its timeout
    (
        "use_timeout_ignored",
        "readiness: a use that goes on after its wait timed out",
        "impl/cache.py",
        "                if not core.gate.wait_changed(lambda: not self._pending(adm), timeout):",
        "                if not core.gate.wait_changed(lambda: not self._pending(adm), timeout) and 0:",
    ),
    # workers.py: close stops the workers
    (
        "stop_leaves_workers_running",
        "concurrency: close leaves the worker threads running",
        "impl/pipelines.py",
        "        for _ in self._threads:\n            self._q.put(None)",
        "        for _ in self._threads:\n            pass",
    ),
    # libdrive.py: the library's own drain, a job that raises inside it
    (
        "drain_drops_a_raising_job",
        "exhaustion: the library's drain drops a raising job without abandoning it",
        "impl/pipelines.py",
        "                    except Exception as exc:  # as in a worker thread: abandoned, recorded\n"
        "                        e.fail(job, exc)",
        "                    except Exception:  # as in a worker thread: abandoned, recorded\n"
        "                        e._drop(job)",
    ),
    # libdrive.py: a failed recovery whose truncated hit fails too, given up at use
    (
        "given_up_keeps_its_hit",
        "readiness: a downgraded admission still shows its hit",
        "impl/cache.py",
        "        adm.hit_tokens = 0\n",
        "",
    ),
    # libdrive.py: an offload job that ended, stepped again while its record offloads anew
    (
        "stale_offload_completes_the_new_one",
        "concurrency: a stale offload job acts for its record's new job",
        "impl/pipelines.py",
        "            if c.pipes.dma.get(self.rid) is not self:",
        "            if c.pipes.dma.get(self.rid) is None:",
    ),
    # readers.py: an admission's explanation and pins
    (
        "truncation_cut_unrecorded",
        "readers: a failed recovery's truncation left out of the explanation",
        "impl/cache.py",
        "            adm.explanation.truncations.append(cut)\n",
        "",
    ),
    (
        "recoverable_hit_explained_as_unrecoverable",
        "readers: the explanation names the wrong search",
        "impl/cache.py",
        "                expl.after_recovery = ext",
        "                expl.unrecoverable = ext",
    ),
    (
        "pin_addresses_by_block",
        "readers: a pin's device addresses computed from the block, not its slot",
        "impl/handles.py",
        "base + self.slot * stride for name, base, stride in self.bases",
        "base + self.block * stride for name, base, stride in self.bases",
    ),
    # actmaint.py: the maintenance actions by record
    (
        "offload_never_makes_room",
        "exhaustion: an offload by record that never spills a host block to make room",
        "impl/recovery.py",
        '                victim = next((r for r in self.host_lru if self.gate.can("spill", r)), None)',
        "                victim = None",
    ),
    # slotsfull.py: an admission with every request slot busy
    (
        "full_request_table_hands_out_a_busy_slot",
        "exhaustion: the request table, full, hands out its last slot",
        "impl/requests.py",
        '        raise OutOfCapacity("admit", (), f"all {len(self.slots)} request slots are busy")',
        "        return self.slots[-1]",
    ),
    # notinuse.py: finish and append before use
    (
        "finish_before_use_releases",
        "refusal: finish of a request not in use releases it",
        "impl/handles.py",
        "        if not requests.in_use(s):\n",
        "        if False:\n",
    ),
    (
        "append_before_use_accepted",
        "refusal: append to a request not in use",
        "impl/handles.py",
        "            if req.slot is None or not self.req_table.in_use(req.slot):",
        "            if req.slot is None:",
    ),
    # construct.py: a run of a closed cache
    (
        "closed_run_refused_as_released",
        "refusal: a run of a closed cache refused as a released request",
        "impl/handles.py",
        '            if self.cache._closed:\n                raise CacheClosed(f"{what}: the cache is closed")\n',
        "",
    ),
    # slotforms.py: a slot argument as a NumPy integer
    (
        "numpy_slot_refused",
        "argument forms: a NumPy integer slot refused",
        "impl/requests.py",
        "        if isinstance(slot, np.integer) and not isinstance(slot, np.bool_):\n            slot = int(slot)\n",
        "",
    ),
    (
        "refused_open_keeps_its_temporary_directory",
        "leak: an open refused after its temporary directory was made leaves it",
        "impl/core.py",
        "            if self._tmp is not None:\n                self._tmp.cleanup()\n            raise",
        "            raise",
    ),
)
