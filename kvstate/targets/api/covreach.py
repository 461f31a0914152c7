"""Witnesses of paths the other walks leave out, each checked by the harness's own checks.

* The engine's report that a transfer failed: ``act_step``'s world :data:`~kvstate.targets.api.
  stepwise.FAIL` fires ``load_fail`` by name through ``test_hooks().act`` at a disk load and at
  a host load (``impl/recovery.py``'s ``load_fail``: its guard, then the failure's effects);
  the harness explains the change by ``load_fail`` alone and the admission waiting on the load
  truncates at ``use`` (the read checks compare what it serves with the request's tokens).
* A host load short of SWA pages: with one block's worth of pages (``swa_scarce``), block 0's
  window goes to host, its load failed by the engine so that block 1 is stored with its
  window and goes to host too; an admission over both loads block 0 into the pool's one
  window, and block 1's load takes a device slot, finds no page and nothing to slide, and
  does not start (``RecoveryPart.load_start``): its slot goes back with the claim it had
  (the pool checks: no slot claimed by a record whose address is elsewhere), the hit
  truncates at block 1, and block 1 is recomputed.
* Room that cannot be made: an offload fired by record (``act_maint``) with both host slots
  held by host loads still running for an aborted admission, none of them a block the table
  lets spill (``OutOfCapacity``: ``act_maint``'s check finds no block that could have made
  room); and, with the library's disk pool one entry short of the chain (``pools``), a
  ``spill`` whose file is written while every disk entry is pinned by an admission: no entry
  may be dropped for it, so the file is thrown away and the spill does nothing
  (``exhaust.py``'s check accepts it only where the table keeps every entry; the accounting
  check finds no file left behind).
* ``zero_swa(k)``, an example's first operation (a no-op anywhere else), starts the example
  over on the table derived for ``small()`` with ``swa_disk_policy`` ``"zero"``
  (``Table.derive(geometry=...)``): a window is not kept on disk, so a disk load brings its
  block back with a NULL window (``load_done``'s effect under the table's
  ``swa_restored_from_disk``).  Blocks 0 and 1 go to disk and 2 and 3 to host by record
  (``act_maint``), and a hit over the four stands on the host blocks' windows.
* A resident block whose indexer the table finds stale: the store's actions (``STORE``) before
  the one that writes the indexer page fired by name (``act``), and not that one, so an admission over it rebuilds its
  indexer first (the recovery plan's ``rebuild_start`` of a resident block).
* A queued disk load that finds no room when its turn comes: ``scarce_io(k)`` (an example's
  first operation) starts the example over on ``constvals``' table (``io_cap`` 1) with one
  block's worth of SWA pages; blocks 0 and 1 go to disk with their windows (block 0's first
  load failed by the engine, as above), and an admission over both starts block 0's load
  and queues block 1's; when block 0 lands, block 1's load takes a device slot and finds no
  page (block 0's window is pinned): it leaves the queue (``_start_waiting_io``) and the
  admission truncates at block 1.
* ``durable(k)``, an example's first operation (a no-op anywhere else, like ``handed``),
  rebuilds the example's cache with ``durable=True``: every entry written is flushed and synced
  before it is published (``DiskTier.publish``), and the walk's checks hold as on any cache.
* ``entry_names`` (changes nothing): each chain block's disk entry is named with the stem
  ``name_stem(the directory key, the block's key)`` gives (``impl/disk.py``: the helper tools
  and tests find a block's entry by), and each name appears once.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from kvstate.spec.api import MACROS
from kvstate.targets.api.actmaint import actions as maint_actions
from kvstate.targets.api.base import chain, derive_once, first_in_example, op, renew_on
from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.pools import choices
from kvstate.targets.api.single import _words as single_words
from kvstate.targets.api.single import actions as single_actions
from kvstate.targets.api.stepwise import FAIL

ACTMAINT = maint_actions()  # act_maint's actions, by index


def _zero_swa(table: Any) -> Any:
    g = table.geometry
    if g.name != "small":
        return None
    other = dataclasses.replace(g, swa_disk_policy="zero")
    return table.derive(name=f"{table.name}@swa-zero", geometry=other)


def do_zero_swa(h: Any, o: Any) -> int | None:
    if not first_in_example(h):  # a running cache keeps its table
        return None
    other = derive_once(h.table, "swa-zero", _zero_swa)
    if other is not None:
        renew_on(h, other, "check: examples whose windows are not kept on disk")
    return None


def do_scarce_io(h: Any, o: Any) -> int | None:
    """Start the example over on ``constvals``' table (``io_cap`` 1) with one block's worth of
    SWA pages (``swa_scarce``'s cache argument)."""
    from kvstate.targets.api import constvals

    if not first_in_example(h):  # a running cache keeps its table
        return None
    other = constvals.derived(h.table)
    if other is None:
        return None
    h.cache_kwargs["swa_blocks"] = 1
    renew_on(h, other, "check: examples at io_cap 1 with one window's SWA pages")
    return None


def do_durable(h: Any, o: Any) -> int | None:
    if any(s.name not in ("pools", "geometry") for s in h.steps[:-1]):
        h.call_override = "read"  # a running cache keeps its durability
        return None
    steps, cov, threads, kw = h.steps, h.cov, h.threads, dict(h.cache_kwargs)
    h.close()
    h.renew(h.table, threads=threads, coverage=cov, cache_kwargs={**kw, "durable": True})
    h.steps = steps
    h.cov.add("check: examples on a durable cache")
    return None


def do_entry_names(h: Any, o: Any) -> int | None:
    from kvstate.impl.disk import KEY_FILE, name_stem

    h.call_override = "read"
    if h.threads:
        return None
    with open(os.path.join(h.dir, KEY_FILE), "rb") as f:
        secret = f.read()
    bad, names = [], []
    with h.view.lock:
        entries = dict(h.view.disk_entries)
        keys = {b: bytes(h.view.meta.key[h.rids[b]]) for b in range(h.N)}
    for b in range(h.N):
        e = entries.get(h.rids[b])
        if e is None:
            continue
        names.append(e.path.name)
        if not e.path.name.startswith(name_stem(secret, keys[b])):
            bad.append(f"block {b}'s entry {e.path.name} is not named by name_stem")
    if len(set(names)) != len(names):
        bad.append(f"entries share a name: {sorted(names)}")
    if bad:
        raise h.fail("entry-names", ["entry_names"], f"{o.render()}: " + "; ".join(bad))
    h.cov.add("check: disk entries named by name_stem", len(names))
    return None


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    from kvstate.spec import default_table

    disk_short = next(k for k, c in enumerate(choices(N)) if c.get("disk_blocks", N) < N)
    c = chain(N, L, lease_max)
    out: dict[str, list[Any]] = {}
    hit = [
        op("request", i=0, n=c.full, life=1),
        op("admit", i=0),
        op("drain"),
        op("use", i=0),
        op("read", i=0),
        op("finish", i=0),
    ]
    for tier, there, blocks in (("disk", c.to_disk, (0, 1)), ("host", c.to_host, (N - 1,))):
        for b in blocks:  # (to_host leaves blocks 0..N-3 on device: host_blocks is 2)
            out[f"the engine fails block {b}'s {tier} load by name (load_fail)"] = [
                *there,
                op("request", i=1, n=c.full, life=1),
                op("admit", i=1),
                op("act_step", b=b, k=0),
                op("act_step", b=b, k=FAIL),
                op("drain"),
                op("use", i=1),
                op("read", i=1),
                op("finish", i=1),
            ]
    windowed = [  # blocks 0 and 1 stored with their windows, one block's worth of pages
        op("request", i=0, n=L + 1, life=1),
        op("admit", i=0),
        op("use", i=0),
        op("finish", i=0),
        op("tick", t=lease_max),
        op("offload", n=N),
        op("drain"),
        op("request", i=1, n=2 * L + 1, life=1),
        op("admit", i=1),
        op("act_step", b=0, k=FAIL),
        op("drain"),
        op("use", i=1),
        op("finish", i=1),
    ]
    out["a host load short of SWA pages gives its device slot back with its claim"] = [
        op("swa_scarce", k=1),
        *windowed,
        op("tick", t=lease_max),
        op("offload", n=N),
        op("drain"),
        *hit,
    ]
    out["a queued disk load short of SWA pages when its turn comes"] = [
        op("scarce_io", k=1),
        *windowed,
        *c.to_disk[len(c.store) - 1 :],  # (to_disk after store: from its tick on)
        op("request", i=0, n=2 * L + 1, life=1),
        *hit[1:],
    ]
    off, sp = ACTMAINT.index("offload"), ACTMAINT.index("spill")
    out["an offload with every host slot held by a running load"] = [
        *c.store,
        op("offload", n=2),
        op("drain"),
        op("request", i=1, n=c.full, life=1),
        op("admit", i=1),
        op("abort", i=1),
        op("act_maint", a=off, b=0),
        op("drain"),
        *hit,
    ]
    out["a spill on a disk pool full of entries an admission pins"] = [
        op("pools", k=disk_short),
        *c.store,
        *[op("act_maint", a=off, b=b) for b in (0, 1)],
        op("drain"),
        *[op("act_maint", a=sp, b=b) for b in (0, 1)],
        *[op("act_maint", a=off, b=b) for b in (2, 3)],
        op("drain"),
        op("act_maint", a=sp, b=2),
        op("request", i=1, n=3 * L + 1, life=1),
        op("admit", i=1),
        op("spill", n=1),
        op("drain"),
        op("use", i=1),
        op("read", i=1),
        op("finish", i=1),
    ]
    out["windows not kept on disk: blocks 0, 1 restored from disk, 2, 3 from host, hit"] = [
        op("zero_swa", k=1),
        *c.store,
        *[op("act_maint", a=off, b=b) for b in (0, 1)],
        op("drain"),
        *[op("act_maint", a=sp, b=b) for b in (0, 1)],
        *[op("act_maint", a=off, b=b) for b in (2, 3)],
        op("drain"),
        *hit,
    ]
    table = default_table()
    act = [a.name for a in single_actions(table)].index
    # the store's actions (spec/api.py's STORE) before the one that writes the indexer page
    store = single_words(MACROS["STORE"])
    unindexed = store[: next(i for i, w in enumerate(store) if "iver" in table.action(w).modifies)]
    out["a resident block sealed without its indexer: the admission rebuilds it"] = [
        *[op("act", a=act(a), k=0, on=1) for a in unindexed],
        op("request", i=0, n=L + 1, life=1),
        op("admit", i=0),
        op("drain"),
        op("use", i=0),
        op("read", i=0),
        op("finish", i=0),
    ]
    out["a durable cache: a chain spilled, named by name_stem, restored and hit"] = [
        op("durable", k=1),
        *c.to_disk,
        op("entry_names"),
        op("request", i=1, n=c.full, life=1),
        op("admit", i=1),
        op("drain"),
        op("use", i=1),
        op("read", i=1),
        op("finish", i=1),
    ]
    return out


DECLS = (
    OpDecl("durable", do_durable, "read", rule=False),
    OpDecl("zero_swa", do_zero_swa, "read", rule=False),
    OpDecl("scarce_io", do_scarce_io, "read", rule=False),
    OpDecl("entry_names", do_entry_names, "read", rule=False),
)
