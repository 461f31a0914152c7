"""Planted bugs of the page pools' free lists (``kvstate/targets/api/pagefree.py``).

Each entry is ``(name, bug class, path, old text, new text)`` as
:class:`kvstate.api_mutants.Mutant` takes them (:mod:`kvstate.api_planted` imports this list).

The page pools (the SWA pages, the host slots) were checked only by count: a page given back to
the free list but still marked in use, or taken without being marked, balanced the sums, and
the defensive double-free checks of ``PagePool`` then read wrong marks.  Each bug below leaves
the counts right and the partition wrong, on the paths of exhaustion partway through an
operation (``untake``: an allocation that found no room after taking pages) and of a run's
pages freed at once (``release_run``).
"""

from __future__ import annotations

PLANTED: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "page_untake_keeps_in_use_mark",
        "exhaustion partway: pages given back by an allocation that ran out stay marked in use",
        "impl/storage.py",
        "        busy = self.busy\n        for p in pages:\n            busy[p] = False\n"
        "        self._free.extendleft(reversed(pages))",
        "        self._free.extendleft(reversed(pages))",
    ),
    (
        "page_release_run_keeps_in_use_mark",
        "exhaustion partway: a run's pages freed at once stay marked in use",
        "impl/storage.py",
        "            busy[p] = False  # cleared as checked: a repeat later in the run is caught\n",
        "",
    ),
    (
        "page_take_not_marked",
        "double free: pages taken are not marked in use (a later double free goes unseen)",
        "impl/storage.py",
        "        busy = self.busy\n        for p in out:\n            busy[p] = True\n        return out",
        "        return out",
    ),
    (
        "page_release_keeps_in_use_mark",
        "double free: a block's pages given back stay marked in use",
        "impl/storage.py",
        "        for p in pages:\n            busy[p] = False\n        self._free.extend(pages)",
        "        self._free.extend(pages)",
    ),
)
