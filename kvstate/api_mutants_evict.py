"""Planted bugs of the class ``kvstate/targets/api/evictrun.py`` closes: a store run's
eviction that does not pass over a least recently used block the table protects.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (``kvstate/api_planted.py`` imports this list).
Without those walks the ci run meets the run's one-by-one fallback only where it runs out of
evictable blocks, never where the LRU's head is refused and the blocks behind it may go.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "evict_run_takes_a_refused_head",
        "eviction order: a run evicts the LRU head the table protects",
        "impl/blocks.py",
        '        if len(victims) < count or run is None or run(gate.records, {"b": NULL_RID}, victims) >= 0:',
        '        if len(victims) < count or run is None or run(gate.records, {"b": NULL_RID}, victims) > 0:',
    ),
)
