"""The API run shared with a forked process when a second CPU is there: the parent runs the
witnesses, a dry pass records Hypothesis' examples, and both processes take them from one work
queue; the child's outcome comes back through a pipe.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import settings

from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep
from kvstate.spec.table import Table
from kvstate.targets.api.base import Coverage
from kvstate.targets.api.explore import _coverage_pass, _example, _hypothesis, _Recorder


def _second_cpu() -> bool:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return hasattr(os, "fork") and cpus >= 2


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _take(fd: int) -> int | None:
    """The next example number from the queue both processes read (None: no more).  The queue
    is written once, in one write, two bytes a number, so a two-byte read takes one whole."""
    rec = os.read(fd, 2)
    return int.from_bytes(rec, "little") if rec else None


def _work_queue(
    table: Table,
    N: int,
    exs: Sequence[Sequence[TraceStep]],
    q: int,
    done: dict[int, tuple[dict[str, int], dict[str, int]]],
    stop: Callable[[], bool] = lambda: False,
) -> tuple[int, str] | None:
    """Examples taken from the queue ``q`` and run until it is empty (or ``stop()``), the
    counts of each that passed put in ``done``: None, or the first one that failed and how
    (the queue is then emptied: the other process stops)."""
    while not stop():
        k = _take(q)
        if k is None:
            return None
        cov, stats = Coverage(), Counter[str]()
        try:
            _example(table, N, exs[k], cov, stats)
            done[k] = (dict(cov.counts), dict(stats))
        except Exception as exc:  # noqa: BLE001 - reported from the run in place
            while _take(q) is not None:
                pass
            return k, f"{type(exc).__name__}: {exc}"[:2000]
    return None


_BEFORE_FORK = 2  # witnesses run before the fork (see _run_beside)


def _run_beside(
    table: Table,
    N: int,
    wit: Mapping[str, Sequence[TraceStep]],
    dry_cls: Callable[[Callable[..., Any]], Any],
    prof: settings,
    cov: Coverage,
    stats: Counter[str],
    explore: Callable[[int], tuple[Nonconformance | None, str, str | None]],
    out: Callable[[str], None],
) -> tuple[Nonconformance | None, str, str | None]:
    """The run's work shared by this process and a forked one, reported as the run in place.

    This process runs the coverage pass (the witnesses) exactly as in place, and reports its
    finding exactly as before.  Meanwhile the child runs Hypothesis' exploration dry
    (:class:`_Recorder`: the same examples, drawn without running them) and puts the recorded
    examples on a queue both processes then take from; each is run exactly as the state machine
    runs it (:func:`_example`).  Every witness and every example still runs on a fresh cache and
    model, every operation is explained and every read byte-checked; the two processes share
    nothing but caches kept per pure input (the model's answers per state value), so the split
    changes no check and no count (the child's counts are added here).

    An example that fails (here or there) is not reported from the split: Hypothesis then runs
    here for real, the coverage pass's counts kept, and reports its finding, example number and
    blob as before.  The examples before the first that failed, which passed in the split, are
    drawn again but not run again (their counts are added), so the finding costs little more
    than in place.  A recorded example that fails there but not in Hypothesis' run is an
    error, never a pass.  A child that crashes leaves the rest of the exploration to run here.
    """
    import contextlib
    import gc
    import pickle
    import select
    import signal
    import sys

    # The first witnesses run before the fork: the guards are compiled once, for both, and
    # the model's answers and the test rows about the states every witness starts with (a
    # whole chain stored, offloaded, spilled) are kept once, for both; a finding there is
    # reported at once, as in place.
    found, origin = _coverage_pass(table, N, wit, cov, stats, 0, _BEFORE_FORK)
    if found is not None:
        return found, origin, None
    r_res, w_res = os.pipe()  # child -> parent: its outcome, once
    r_ex, w_ex = os.pipe()  # child -> parent: the recorded examples, once
    r_q, w_q = os.pipe()  # the queue of example numbers both take from
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the dry run, then examples from the queue; its exit handlers
        code = 1  # (the parent's scratch folder, open files) are not run
        try:
            os.close(r_res)
            os.close(r_ex)
            # GNU OpenMP (torch's CPU pool) is not fork-safe: one thread never enters it
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)
            # what the parent made stays out of this process's collections: a collection that
            # walked it would write to (and so copy) every page the two processes share
            gc.freeze()
            msg: dict[str, Any] = {}
            exs: list[list[TraceStep]] = []
            dry_found, _ = _hypothesis(dry_cls(lambda *a, **k: _Recorder(exs)), prof)
            if dry_found is not None:  # a recorder checks nothing: this cannot happen
                raise dry_found
            data = pickle.dumps(exs)

            def send(fd: int) -> None:
                with contextlib.suppress(OSError), os.fdopen(fd, "wb") as fh:
                    fh.write(data)  # the parent reads it after the witnesses

            writer = threading.Thread(target=send, args=(w_ex,), daemon=True)
            writer.start()
            os.write(w_q, b"".join(k.to_bytes(2, "little") for k in range(len(exs))))
            os.close(w_q)
            done: dict[int, tuple[dict[str, int], dict[str, int]]] = {}
            msg["example"] = _work_queue(table, N, exs, r_q, done)
            msg["done"] = done
            writer.join()
            with os.fdopen(w_res, "wb") as fh:
                fh.write(pickle.dumps(msg))
            code = 0
        finally:
            os._exit(code)
    os.close(w_res)
    os.close(w_ex)
    os.close(w_q)
    child: dict[str, Any] | None = None
    failed_here: tuple[int, str] | None = None
    done: dict[int, tuple[dict[str, int], dict[str, int]]] = {}
    exs = None
    try:
        found, origin = _coverage_pass(table, N, wit, cov, stats, _BEFORE_FORK)
        if found is not None:  # found here, as in place: the child's work is not needed
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            return found, origin, None
        out(f"  coverage pass: {len(wit)} witnesses replayed in lockstep")
        try:
            exs: list[list[TraceStep]] | None = pickle.loads(_read_all(r_ex))
        except Exception:  # noqa: BLE001 - the child crashed before it sent them all
            exs = None
        if exs is not None:

            def child_failed() -> bool:
                nonlocal child
                if child is None and select.select([r_res], [], [], 0)[0]:
                    child = _child_outcome(r_res, pid)
                return child is not None and child.get("example") is not None

            failed_here = _work_queue(table, N, exs, r_q, done, stop=child_failed)
        if child is None:
            child = _child_outcome(r_res, pid)
    except BaseException:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        for fd in (r_res, r_ex, r_q):
            with contextlib.suppress(OSError):
                os.close(fd)
    done.update(child.get("done", {}))
    failed = failed_here or child.get("example")
    if failed is None and exs is not None and len(done) == len(exs):
        for c, st_ in done.values():
            cov.counts.update(c)
            stats.update(st_)
        return None, "", None
    # An example failed (here or there), or the child crashed: Hypothesis runs here and reports
    # what it finds as before.  The examples before the first that did not pass (all taken from
    # the queue in order, and all passed) are drawn again without being run: their counts are
    # added here (the steps and examples the state machine counts itself).
    passed = 0
    while passed in done:
        cov.counts.update(done[passed][0])
        passed += 1
    found, origin, blob = explore(passed)
    if found is None and failed is not None:
        raise RuntimeError(
            f"a recorded example failed beside the exploration ({failed}), not in Hypothesis' run"
        )
    return found, origin, blob


def _child_outcome(fd: int, pid: int) -> dict[str, Any]:
    """What the child sent (it writes once, then leaves), with its exit status."""
    import pickle

    data = _read_all(fd)
    _, status = os.waitpid(pid, 0)
    try:
        msg: dict[str, Any] = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a crashed child sends nothing
        return {"why": f"the process ended with status {status} and sent nothing"}
    if status != 0:
        return {"why": f"the process ended with status {status}"}
    return msg
