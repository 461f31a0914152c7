"""The check classes of the scheduler target and the table's invariants they project.

The checks themselves live in :mod:`.standalone` (they read only vLLM's objects, so a reproducer
carries them); this module says which of the table's invariants each one stands for, and why the
others are not checked here.  It fails at import if the table gains an invariant that has
neither, or loses one named below.
"""

from __future__ import annotations

from kvstate.spec.default import default_table

# check class -> (the table's invariants it projects; what it checks)
CHECK_CLASSES: dict[str, tuple[tuple[str, ...], str]] = {
    "conservation": (
        ("refcount", "ghost_counters"),
        "free + held = pool; ref_cnt = the request slots holding the block; the free counter",
    ),
    "hygiene": (("request_hygiene",), "no finished, aborted or preempted request holds a block"),
    "window": (
        ("toctou", "reading_truth"),
        "every block a running request's next position reads (window, Mamba state) is held",
    ),
    "liveness": ((), "admission: a request that fits an idle pool is scheduled (no over-count)"),
    "preemption": ((), "the preemption victim is the one vLLM's policy documents"),
    "crash": ((), "no scheduler call raises: every admitted request gets its slots"),
}

# Invariants not checked through the scheduler, and why.
NOT_HERE = {
    "hit_soundness": "the hit rule is checked by --target vllm on the same get_computed_blocks",
    "hit_truth": "the hit rule is checked by --target vllm on the same get_computed_blocks",
    "graph_truth": "no CUDA graph in the scheduler",
    "graph_topology": "no CUDA graph in the scheduler",
    "load_truth": "a connector's transfer is its own; the scheduler sees only its result",
    "load_integrity": "a connector's transfer is its own; the scheduler sees only its result",
    "mechanism_truth": "relates the spec's own mechanism variables to its ghost truth",
    "admission_cap": "no disk I/O queue; admission is checked as liveness instead",
    "separation": "no recovery pipelines in the scheduler",
    "domains": "typing of the spec's own phase variables",
}


def _check_coverage() -> None:
    names = {i.name for i in default_table().invariants}
    projected = {n for invs, _ in CHECK_CLASSES.values() for n in invs}
    unknown = (projected | set(NOT_HERE)) - names
    missing = names - projected - set(NOT_HERE)
    if unknown or missing:
        raise RuntimeError(
            f"scheduler projection out of date: unknown {sorted(unknown)}, missing {sorted(missing)}"
        )


_check_coverage()
