"""Planted bugs of the classes the store-room, pin-diagnostic, refusal-explanation, read-only,
callback-error, graph-counter and restored-tail checks close (``kvstate/targets/api/storeroom.py``,
``writerfails.py``, ``pinreads.py``, ``whyrefused.py``, ``readonly.py``, ``handout.py``,
``graphcounts.py`` and the
witness "a damaged host tail, then the prefix hit again").

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (``kvstate/api_planted.py`` imports this list).
Each is a sibling of a generated mutant that survived the ci walk before these checks, not
the generated edit itself.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "slide_passes_every_window",
        "store room: a store gives up where the table lets it slide a window",
        "impl/blocks.py",
        "            if not pages[rid]:\n                continue\n            try:\n"
        '                gate.check_block("slide", rid)',
        "            if pages[rid]:\n                continue\n            try:\n"
        '                gate.check_block("slide", rid)',
    ),
    (
        "verify_pins_skips_block_0",
        "diagnostics: verify_pins never names a prefix's first block",
        "impl/requests.py",
        "        return [b for b in range(len(rids)) if not check(view, 0, b)]",
        "        return [b for b in range(len(rids)) if b and not check(view, 0, b)]",
    ),
    (
        "refusal_omits_length_rules",
        "messages: a refused validation never names a failing length rule",
        "impl/coordinator.py",
        "                if not rule.pred(view, r, h):\n                    out.append(",
        "                if False and not rule.pred(view, r, h):\n                    out.append(",
    ),
    (
        "request_tokens_writeable",
        "integrity: the token array a request hands out accepts writes",
        "impl/hashing.py",
        "    out.flags.writeable = False\n    return out",
        "    out.flags.writeable = bool(out.size)\n    return out",
    ),
    (
        "callback_errors_keep_64",
        "limits: callback_errors keeps fewer than the documented latest 100",
        "impl/events.py",
        "deque(maxlen=100)",
        "deque(maxlen=64)",
    ),
    (
        "graph_replays_uncounted",
        "statistics: the graph registry's replay counter never moves",
        "impl/graphs.py",
        "        self.replays += 1",
        "        self.replays += 0",
    ),
    (
        "truncation_trusts_restored_tail",
        "readiness: a cut back onto a restored tail serves it unchecked",
        "impl/requests.py",
        "                if self.recovery.check_tail(rids[nb - 1], nb * L):",
        "                if nb or self.recovery.check_tail(rids[nb - 1], nb * L):",
    ),
)
