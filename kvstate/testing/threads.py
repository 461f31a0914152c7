"""One torch intra-op thread for the verification stack's targets.

A conformance target's tier tensors are a few KB to a few hundred KB.  torch splits a fill or a
copy of that size across its OpenMP pool, and on a loaded 2-core machine a parallel region waits
for a worker the scheduler has not run: ``torch.zeros((3, 14, 8256), dtype=torch.uint8)`` took
24 ms with two threads and 0.01 ms with one (load 5, this repository's CI kind of machine).
The fuzzers build a fresh cache per example, so that wait was a fifth of a ``ci`` run.  The
setting is process-wide (torch has no per-call knob), so only the entry points of the
verification stack apply it, never the library: a server sizes torch's pool for its own model.
"""

from __future__ import annotations

import os


def single_intraop_thread() -> None:
    """Set torch's intra-op pool to one thread unless ``KVSTATE_TORCH_THREADS`` says otherwise."""
    import torch

    want = os.environ.get("KVSTATE_TORCH_THREADS", "1")
    try:
        n = int(want)
    except ValueError:
        raise ValueError(f"KVSTATE_TORCH_THREADS={want!r} is not an integer") from None
    if n >= 1 and torch.get_num_threads() != n:
        torch.set_num_threads(n)
