"""Planted bugs of the paths the coverage checks reach: a store refused partway
(``kvstate/targets/api/storerun.py``), the inspection view's contract
(``kvstate/targets/api/viewcontract.py``), the tables ``impl/`` does not serve
(``kvstate/targets/api/unservable.py``), the test writer's memos
(``kvstate/targets/api/rowmemo.py``) and the pipelines' actions fired where the table refuses them
(``kvstate/targets/api/refusedjobs.py``).

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (``kvstate/api_planted.py`` imports this list).
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "refused_store_drops_a_one_block_head",
        "exhaustion partway: a store refused at its second block stores nothing before it",
        "impl/blocks.py",
        "            if at:  # the prefix stored ends where the refused block starts",
        "            if at > 1:  # the prefix stored ends where the refused block starts",
    ),
    (
        "first_refused_one_past",
        "exhaustion partway: the refused block of a run judged block by block found one late",
        "impl/gate.py",
        "            if not self.guards.allows(action, state, params):\n                return i\n",
        "            if not self.guards.allows(action, state, params):\n                return i + 1\n",
    ),
    (
        "view_serves_private_names",
        "inspection: a wrapped part hands out its private attributes",
        "impl/inspection.py",
        '    def __getattr__(self, name: str) -> Any:\n        if name.startswith("_"):\n'
        '            raise AttributeError(f"{name} is not part of the inspection interface")\n'
        "        v = getattr(self._obj, name)\n        if callable(v) and",
        '    def __getattr__(self, name: str) -> Any:\n        if name.startswith("__"):\n'
        '            raise AttributeError(f"{name} is not part of the inspection interface")\n'
        "        v = getattr(self._obj, name)\n        if callable(v) and",
    ),
    (
        "table_missing_an_action_served",
        "construction: a table with fewer actions than the action map is served",
        "impl/actions.py",
        "    if names != set(ACTIONS):",
        "    if names - set(ACTIONS):",
    ),
    (
        "phase_start_unchecked",
        "construction: a table whose phase variable starts elsewhere is served",
        "impl/meta.py",
        "            if v.domain is not None and want != got:",
        "            if v.domain is not None and want < got:",
    ),
    (
        "refused_table_leaves_a_key",
        "construction: a refused table leaves a key file in the cache directory",
        "impl/core.py",
        "        check_actions(table)  # (before the directory is opened: a refused table leaves nothing)\n",
        "",
    ),
    (
        "row_memo_hands_out_its_own_rows",
        "caches inside the implementation: a memoized answer handed out without a copy",
        "impl/testdata.py",
        "    return got.clone()\n",
        "    return got\n",
    ),
    (
        "load_fail_by_name_unguarded",
        "pipelines' actions by name: load_fail performed where the table refuses it",
        "impl/recovery.py",
        '            self.gate.check_block("load_fail", rid)\n'
        '            self.fail_load(rid, self.load_job(rid), "load failed", corrupt=False)',
        '            self.fail_load(rid, self.load_job(rid), "load failed", corrupt=False)',
    ),
)
