"""Delta debugging over a trace's operations (Zeller and Hildebrandt's ddmin, complements only).

Every target's minimizer: the target says how to replay a candidate on a fresh system and
whether it fails *the same way*; this module chooses the candidates.  ``picire`` (the
maintained ddmin library) was weighed and left out: its tests answer pass/fail on index
sets, while a replay here returns the candidate cut after its failing step (the later steps
are dropped at once), which ddmin below keeps as its new configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ddmin(
    items: Sequence[T],
    fails: Callable[[list[T]], tuple[list[T], R] | None],
    result: R,
    *,
    over: Callable[[], bool] = lambda: False,
) -> tuple[list[T], R, bool]:
    """Remove chunks of ``items`` while ``fails`` still fails, halving chunks to single items.

    ``fails(candidate)`` replays a candidate and returns ``(kept, result)`` when it fails the
    same way (``kept``: the candidate as it should continue, e.g. cut after its failing step)
    or None.  ``result`` is the answer for ``items`` itself.  Returns the smallest kept list,
    its result, and whether any removal succeeded.  ``over()`` stops the search early.
    """
    cur, res, changed = list(items), result, False
    n = 2
    while cur and not over():
        size = -(-len(cur) // n)
        for k in range(0, len(cur), size):
            got = fails(cur[:k] + cur[k + size :])
            if got is not None:
                (cur, res), changed = got, True
                n = max(n - 1, 2)
                break
            if over():
                break
        else:
            if size == 1:
                break
            n = min(2 * n, len(cur))
    return cur, res, changed


def shrink(
    items: Sequence[T],
    fails: Callable[[list[T]], tuple[list[T], R] | None],
    result: R,
    *,
    simpler: Callable[[T], Iterable[T]] = lambda item: (),
    rewrites: Sequence[Callable[[list[T]], list[T]]] = (),
    over: Callable[[], bool] = lambda: False,
    rounds: int | None = None,
) -> tuple[list[T], R, bool]:
    """Every target's minimizer: :func:`ddmin`, then each item replaced by the first of
    ``simpler(item)`` (smaller arguments, smallest first) that still fails, then each whole-list
    ``rewrites`` (canonical names, say), repeated while the second and third phases change
    something (a removal alone leaves a 1-minimal list: another :func:`ddmin` finds nothing).

    ``fails`` and ``result`` as for :func:`ddmin`.  ``rounds``: at most that many rounds (a
    target whose replays are slow stops after one).  Returns the smallest kept list, its result,
    and whether the search ended at its fixpoint (False: ``over()`` or ``rounds`` stopped it).
    """
    cur, res = list(items), result
    done = 0
    while not over() and (rounds is None or done < rounds):
        done += 1
        cur, res, _ = ddmin(cur, fails, res, over=over)
        changed = False
        j = 0
        while j < len(cur) and not over():
            for cand in simpler(cur[j]):
                got = fails([*cur[:j], cand, *cur[j + 1 :]])
                if got is not None:
                    (cur, res), changed = got, True
                    break  # the same position again, from the new item's simpler ones
                if over():
                    break
            else:
                j += 1
        for rewrite in rewrites:
            cand_list = rewrite(cur)
            if cand_list != cur and not over():
                got = fails(cand_list)
                if got is not None:
                    (cur, res), changed = got, True
        if not changed:
            return cur, res, not over()
    return cur, res, False
