"""Planted bugs of the classes ``kvstate/targets/api/facade.py`` and ``handed.py`` close.

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_planted.Mutant` takes them.  Without those checks each is out of the ci
run's sight: no call of the harness read a guard's refusal by conjunct, sent ``act`` a block
action without its record or ``check_tail`` a boundary past its record, used a stale
``Admission``, or stored through the production writer.
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    # kvstate/targets/api/facade.py: guard reads against the model's conjuncts
    (
        "refusal_names_skip_the_first_conjunct",
        "guard read: a refusal named by the wrong conjuncts",
        "impl/guards.py",
        "            return [name for name, fn in conj if not fn(view, params)]",
        "            return [name for name, fn in conj[1:] if not fn(view, params)]",
    ),
    # ... and the rule epoch: a hit search stays a proof of the rules only while it has not moved
    (
        "rule_epoch_stays_on_a_block_guard",
        "caches inside the implementation: a memoized proof kept past a change",
        "impl/gate.py",
        "            if self.accept[action](self.records, params):\n                self.admitted(action, 1)",
        "            if self.accept[action](self.records, params):\n                self.admitted(action, 0)",
    ),
    # a tail check of a block with no device pages (only on host or disk) answers False
    (
        "offdevice_tail_check_passes",
        "readiness: a tail check passed where no tail was read",
        "impl/recovery.py",
        "            if m.slot[rid] < 0:\n                return False",
        "            if m.slot[rid] < 0:\n                return True",
    ),
    # the façade's own refusals
    (
        "act_block_action_without_record",
        "façade refusal: a block action without its record",
        "impl/core.py",
        "            if not args:\n",
        "            if not args and action == 'no action':\n",
    ),
    (
        "check_tail_any_block_end",
        "façade refusal: check_tail at a boundary not the record's end",
        "impl/core.py",
        "        if b % self.L or (start >= 0 and b != start + self.L):",
        "        if b % self.L:",
    ),
    (
        "use_of_a_stale_admission",
        "façade refusal: an Admission from before the request was admitted again",
        "impl/cache.py",
        "            if req.admissions != admission.seq:",
        "            if req.admissions < admission.seq:",
    ),
    # kvstate/targets/api/handed.py: the production writer on the request path
    (
        "handed_rows_keep_the_first_row",
        "writer: a handed row kept at the wrong position",
        "impl/writer.py",
        "            kept[group, start + i] = copied[:, i]",
        "            kept[group, start + i] = copied[:, 0]",
    ),
    (
        "another_caches_request_taken_as_own",
        "identity: a live request of another cache accepted by this one (its fields checked, "
        "not its cache)",
        "impl/handles.py",
        "if request.__class__ is not Request or request.cache is not self or not request.owned:",
        "if request.__class__ is not Request or not request.owned:",
    ),
)
