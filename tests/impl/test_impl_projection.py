"""The recovery projection applies the table's own transitions (``spec.apply``); two fast or
older forms are its test oracles here, on random metadata including corrupt, moving and stale
blocks: the shortcut ``nothing_to_recover`` (the projection is empty exactly when it says so)
and the hand-written effects the projection used to restate (same resulting columns)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.impl.guards import Guards
from kvstate.impl.meta import BlockMeta, RecordState
from kvstate.impl.projection import Projector
from kvstate.spec import default_table
from kvstate.spec.geometry import small
from kvstate.spec.phases import CKV, Fmt, Indexer, Pipe, Swa

TABLES = {
    drops: default_table(replace(small(), swa_disk_policy="zero" if drops else "full"))
    for drops in (False, True)
}


# the oracle's own phase set (a test restates on purpose: it is the second opinion)
MOVING = (CKV.HOST, CKV.DISK, CKV.LOADING, CKV.OFFLOADING)


class _Core:
    """The scalars a record-indexed state reads from its core (none of the recovery
    guards reads one once the deferred I/O cap is aside)."""

    now = 0
    io_inflight = 0
    vk = None


def projector(table: object, m: BlockMeta) -> Projector:
    return Projector(table, Guards(table, table.consts), RecordState(m, _Core()))  # type: ignore[arg-type, attr-defined]


def hand_projection(
    meta: BlockMeta, rids: list[int], disk_drops_swa: bool
) -> dict[str, dict[int, int]]:
    """The effects of load_done and rebuild_done as the library used to write them by hand."""
    out: dict[str, dict[int, int]] = {
        n: {} for n in ("ckv", "prog", "ldpipe", "fmt", "idx", "iver", "swa")
    }
    for i in rids:
        c = meta.ckv[i]
        if meta.corrupt[i]:
            continue
        ready = c == CKV.READY
        if c in MOVING:
            ready = True
            out["ckv"][i], out["prog"][i], out["ldpipe"][i] = (
                int(CKV.READY),
                meta.load_steps,
                int(Pipe.NONE),
            )
            if c == CKV.DISK or (c == CKV.LOADING and meta.ldpipe[i] == Pipe.IO):
                out["fmt"][i] = meta.disk_fmt[i]
                if disk_drops_swa:
                    out["swa"][i] = int(Swa.NULL)
                out["idx"][i], out["iver"][i] = int(Indexer.PRESENT), meta.ver[i]
        if ready and not (meta.idx[i] == Indexer.PRESENT and meta.iver[i] == meta.ver[i]):
            out["idx"][i], out["iver"][i] = int(Indexer.PRESENT), meta.ver[i]
    return out


def applied(meta: BlockMeta, proj: dict[str, dict[int, int]], name: str) -> list[int]:
    col = list(getattr(meta, name))
    for i, v in proj.get(name, {}).items():
        col[i] = v
    return col


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 6), drops=st.booleans())
def test_projection_agrees_with_its_oracles(data: st.DataObject, n: int, drops: bool) -> None:
    table = TABLES[drops]
    m = BlockMeta(table.consts.load_steps)
    rids = [m.new(bytes([i]), None, 0) for i in range(n)]
    for i in rids:
        c = data.draw(st.sampled_from(list(CKV)))
        m.ckv[i] = int(c)
        m.idx[i] = int(data.draw(st.sampled_from(list(Indexer))))
        m.ver[i] = data.draw(st.integers(0, 2))
        m.iver[i] = data.draw(st.integers(0, 2))
        m.swa[i] = int(data.draw(st.sampled_from(list(Swa))))
        m.fmt[i] = int(data.draw(st.sampled_from(list(Fmt))))
        m.disk_fmt[i] = int(data.draw(st.sampled_from(list(Fmt))))
        m.corrupt[i] = data.draw(st.booleans())
        # the phases the table lets coexist: a load in flight in its pipeline, partly landed
        if c == CKV.LOADING:
            m.ldpipe[i] = int(data.draw(st.sampled_from([Pipe.IO, Pipe.DMA])))
            m.prog[i] = data.draw(st.integers(0, table.consts.load_steps))
        elif c == CKV.OFFLOADING:
            m.ldpipe[i] = int(Pipe.DMA)
        if m.idx[i] == Indexer.REBUILDING:  # a rebuild starts only on a resident block
            m.ckv[i] = int(CKV.READY)
            m.ixpipe[i] = int(Pipe.CPU)
    proj = projector(table, m)
    assert proj._enabled is not None  # the shortcut compiled (else it is always False)
    full = proj.project(m, rids, shortcut=False)
    assert (not any(full.values())) == proj.idle(m, rids)
    assert proj.project(m, rids) == (full if any(full.values()) else {})
    hand = hand_projection(m, rids, drops)
    for name in ("ckv", "prog", "ldpipe", "fmt", "idx", "iver", "swa"):
        assert applied(m, full, name) == applied(m, hand, name), name


def block_by_block(table: object, m: BlockMeta, rids: list[int]) -> tuple[dict, dict]:
    """The projection without a shared memo: every block projected alone, by a projector of
    its own (its memo holds that block's state only)."""
    out: dict[str, dict[int, int]] = {}
    trace: dict[int, list] = {}
    for i in rids:
        t: dict[int, list] = {}
        for name, col in projector(table, m).project(m, [i], shortcut=False, trace=t).items():
            out.setdefault(name, {}).update(col)
        trace.update(t)
    return out, trace


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n=st.integers(1, 8), drops=st.booleans())
def test_the_memo_leaves_the_projection_as_it_was(data: st.DataObject, n: int, drops: bool) -> None:
    """Blocks that differ only in their address share one memo entry (the address passed
    through unread); each still gets its own address back, and the trace and changes are
    those of projecting every block on its own, on a projector asked many times."""
    table = TABLES[drops]
    m = BlockMeta(table.consts.load_steps)
    rids = [m.new(bytes([i]), None, 0) for i in range(n)]
    for i in rids:
        m.ckv[i] = int(data.draw(st.sampled_from([CKV.DISK, CKV.HOST, CKV.READY])))
        m.idx[i] = int(data.draw(st.sampled_from([Indexer.ABSENT, Indexer.PRESENT])))
        m.ver[i] = data.draw(st.integers(0, 1))
        m.iver[i] = data.draw(st.integers(0, 1))
        m.addr[i] = data.draw(st.integers(0, 40))
        m.gaddr[i] = data.draw(st.sampled_from([-1, m.addr[i], 41]))
    proj = projector(table, m)
    for _ in range(2):  # the second call answers from the memo
        trace: dict[int, list] = {}
        got = proj.project(m, rids, shortcut=False, trace=trace)
        assert (got, trace) == block_by_block(table, m, rids)
