"""Witnesses: deterministic walks that combine operations to reach what random choice rarely
does (a restart over a half-written entry, a drain of loads, ...), run before Hypothesis in
every run and replayed in lockstep by the coverage pass.
"""

from __future__ import annotations

from kvstate.harness.trace import TraceStep
from kvstate.targets.api import (
    remote,
    remoteargs,
    remotecalls,
    remotefull,
    remoteheaders,
    remotesteps,
    remotewire,
    twonode,
)
from kvstate.targets.api.actmaint import walks as actmaint_walks
from kvstate.targets.api.args import CASES as ARG_CASES
from kvstate.targets.api.base import chain, op
from kvstate.targets.api.construct import walks as construct_walks
from kvstate.targets.api.constvals import walks as constvals_walks
from kvstate.targets.api.corruptmarks import walks as corruptmarks_walks
from kvstate.targets.api.covreach import walks as covreach_walks
from kvstate.targets.api.damage import PARTS
from kvstate.targets.api.directio import walks as directio_walks
from kvstate.targets.api.evictrun import walks as evictrun_walks
from kvstate.targets.api.facade import walks as facade_walks
from kvstate.targets.api.geometry import walks as geometry_walks
from kvstate.targets.api.handed import walks as handed_walks
from kvstate.targets.api.inputs import CASES
from kvstate.targets.api.interpreted import walks as interpreted_walks
from kvstate.targets.api.jobfaults import walks as job_fault_walks
from kvstate.targets.api.libdrive import walks as libdrive_walks
from kvstate.targets.api.mixedload import walks as mixed_walks
from kvstate.targets.api.notinuse import walks as notinuse_walks
from kvstate.targets.api.pincap import walks as pincap_walks
from kvstate.targets.api.records import walks as records_walks
from kvstate.targets.api.refusedjobs import walks as refusedjobs_walks
from kvstate.targets.api.refusedwrites import WAYS
from kvstate.targets.api.registered import walks as registered_walks
from kvstate.targets.api.registry import DECLARED
from kvstate.targets.api.rowmemo import walks as rowmemo_walks
from kvstate.targets.api.shortreads import walks as shortreads_walks
from kvstate.targets.api.single import limit_walks as single_limit_walks
from kvstate.targets.api.single import walks as single_walks
from kvstate.targets.api.slotorder import walks as slotorder_walks
from kvstate.targets.api.slotsfull import walks as slotsfull_walks
from kvstate.targets.api.stated import walks as stated_walks
from kvstate.targets.api.stepwise import READS
from kvstate.targets.api.stored import FORGERIES, REFUSALS
from kvstate.targets.api.storerun import walks as storerun_walks
from kvstate.targets.api.strays import walks as strays_walks
from kvstate.targets.api.swaout import walks as swaout_walks
from kvstate.targets.api.unlinks import walks as unlink_walks
from kvstate.targets.api.unservable import walks as unservable_walks
from kvstate.targets.api.viewcontract import walks as viewcontract_walks
from kvstate.targets.api.whyrefused import walks as whyrefused_walks
from kvstate.targets.api.writerfails import walks as writer_fails_walks

# walks run in the coverage pass only, not Hypothesis's seeds (an example's first operations):
# the pinned walk's examples start as they did before these walks were written
COVERAGE_ONLY = "coverage only: "


def witnesses(N: int, L: int, lease_max: int) -> dict[str, list[TraceStep]]:
    """Scripted walks that reach what random choice rarely does (run before Hypothesis)."""
    c = chain(N, L, lease_max)
    full, store, to_host, to_disk = c.full, c.store, c.to_host, c.to_disk
    hit = [
        op("request", i=1, n=full, life=1),
        op("admit", i=1),
        op("drain"),
        op("use", i=1),
        op("read", i=1),
    ]
    # N - 1 blocks stored: the device's window policy (Geometry.swa_kept_blocks) keeps every
    # window of so short a prefix, so each of them comes back from disk with its window
    short = [
        op("request", i=0, n=(N - 1) * L + 1, life=1),
        *store[1:],
        op("offload", n=N),
        op("drain"),
        *to_disk[len(to_host) :],
    ]
    walks = {
        # kvstate/targets/api/graphs.py: captured over a running request's row, staled by the disk
        # loads of another request (into other slots), refused, recaptured, replayed
        "a graph staled by a load": [
            op("capture"),
            *store[:3],
            op("replay"),
            *to_disk[3:],
            *hit,
            op("replay"),
            op("capture"),
            op("recapture"),
            op("replay"),
            op("append", i=1, k=L),
            op("finish", i=1),
            op("replay"),
        ],
        "hit after a host load": [*to_host, *hit, op("finish", i=1)],
        "hit after a disk load and an indexer rebuild": [*to_disk, *hit, op("finish", i=1)],
        "an admission cancels an offload in flight": [
            *store,
            op("offload", n=N),
            *hit,
            op("finish", i=1),
        ],
        "stalled disk load, other requests go on": [
            *to_disk,
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            op("use", i=1),
            op("request", i=0, n=L + 1, life=1),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
        ],
        # a decode block by block: the windows that leave it are slid except the policy's
        # (kvstate/targets/api/window.py), then the prefix hits up to its kept windows
        "a decode slides the windows that leave it": [
            op("request", i=0, n=L + 1, life=4),
            op("admit", i=0),
            op("use", i=0),
            op("append", i=0, k=L),
            op("append", i=0, k=(N - 2) * L),  # blocks 2..N-1 complete at once: 0 leaves
            op("finish", i=0),
            op("request", i=0, n=L + 1, life=4),
            op("admit", i=0),
            op("use", i=0),
            op("append", i=0, k=(N - 1) * L),
            op("finish", i=0),
            *hit,
        ],
        # a decode past the end the policy kept windows for (the end's and the boundary one
        # block earlier's, ``swa_kept_blocks``): both are slid once the prefix is longer
        "a decode past a stored end slides that end's windows": [
            op("request", i=0, n=L + 1, life=4),
            op("admit", i=0),
            op("use", i=0),
            op("append", i=0, k=2 * L),  # blocks 1, 2 complete: the end's windows kept
            op("append", i=0, k=L),  # block 3 completes: the first of them left
            op("finish", i=0),
            *hit,
        ],
        "slide during a load": [  # an aborted admission's loads run on while a decode slides
            *short,  # (the decode to N blocks slides block 0: outside the policy's windows)
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("step", k=0),
            op("abort", i=1),
            op("request", i=0, n=L, life=4),
            op("admit", i=0),
            op("use", i=0),
            op("append", i=0, k=3 * L),
            op("drain"),
            op("finish", i=0),
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
        ],
        "crash and restart, then a disk hit": [*to_disk, op("restart"), *hit],
        "corrupt entry: truncated to the valid prefix": [
            *to_disk,
            op("corrupt", b=N - 1, kind=1),
            *hit,
        ],
        "a host copy whose tail does not splice": [*to_host, op("host_tail", b=N - 1), *hit],
        "truncated entry": [*to_disk, op("corrupt", b=N - 2, kind=0), *hit],
        "header corruption, then a restart": [
            *to_disk,
            op("corrupt", b=N - 2, kind=2),
            op("restart"),
            *hit,
        ],
        "disk read error": [
            *to_disk,
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("read_error", b=0),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
        ],
        "abort from another thread inside use": [
            *store,
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("use", i=1),
            op("abort_in_use", i=1),
            op("read_released", i=1),
        ],
        "full disk": [*to_host, op("disk_full", on=1), op("spill", n=N)],
        "caller reuses its token buffer": [
            op("request", i=0, n=full, life=1),
            op("mutate_tokens", i=0),
            op("admit", i=0),
            op("use", i=0),
            op("finish", i=0),
            *hit,
        ],
        "read after release": [*store, *hit, op("finish", i=1), op("read_released", i=1)],
        # the same request admitted and in use again: its earlier run still must not read (a
        # run is told apart by its admission, not by the slot or the request it shares)
        "an older run of a request in use again": [
            *store,
            *hit,
            op("finish", i=1),
            op("admit", i=1),
            op("use", i=1),
            op("read_released", i=1),
        ],
        # the chain's stored windows and a foreign store's outgrow the N blocks' SWA pages:
        # the least recently used window (the chain's deepest) is slid, its blocks kept, and
        # the chain hits up to the last boundary whose window is still there
        "an empty SWA pool slides the LRU window": [
            *store,
            op("foreign", ns=0, n=2 * L + 1),
            *hit,
            op("finish", i=1),
        ],
        "chains sharing blocks, in three namespaces": [
            op("request", i=0, n=2 * L + 1, life=2),
            op("admit", i=0),
            op("use", i=0),
            op("foreign", ns=0, n=full),
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            op("use", i=1),
            op("finish", i=0),
            op("foreign", ns=1, n=2 * L + 1),
            op("foreign", ns=0, n=full),
            op("finish", i=1),
            *hit,
        ],
        "every running disk load fails: the held-back ones start": [
            *to_disk,
            op("request", i=1, n=full, life=1),
            op("admit", i=1),
            op("read_error", b=0),
            op("read_error", b=1),
            op("drain"),
            op("use", i=1),
            op("read", i=1),
        ],
        # two blocks on disk, two on host: a spill and a drop of one take the least recently
        # used (kvstate/targets/api/orders.py); then the held-back disk loads start in queue order
        # a hit's pins released deepest first: the deepest block is evicted first
        "the LRU order after unpinning a hit": [
            *store,
            *hit,
            op("finish", i=1),
            op("tick", t=lease_max),
            op("evict", n=1),
            op("evict", n=1),
        ],
        "the documented orders: spill, drop, queued loads": [
            *to_disk[:-1],
            op("spill", n=1),
            op("drop", n=1),
            *hit,
        ],
        # prompts that differ from the chain in block 0 only (its last token, its first):
        # neither may hit the chain, nor touch its blocks; then the chain hits as before
        "prompts that differ early and agree later": [
            *store,
            op("variant", p=1, n=full),
            op("variant", p=0, n=2 * L + 1),
            op("variant", p=1, n=full),
            *hit,
        ],
        # pools that run out partway through an operation: a store whose run finds the
        # device slots leased (the rest is left to recompute), a recovery whose loads find no
        # device room (the hit truncated), a spill that must drop the LRU disk entry first
        "the device runs out partway through a store": [
            op("pools", k=1),
            *store[:-1],
            op("request", i=1, n=full, life=lease_max),
            op("admit", i=1),
            op("use", i=1),
            op("foreign", ns=0, n=full),
            op("finish", i=1),
            op("foreign", ns=1, n=full),
            *hit,
        ],
        "the device runs out partway through a recovery": [
            op("pools", k=2),
            *to_disk,
            op("foreign", ns=0, n=full),
            *hit,
        ],
        "a spill to a full disk drops the LRU entry first": [
            op("pools", k=4),
            *to_disk,
            op("foreign", ns=0, n=2 * L + 1),
            op("tick", t=lease_max),
            op("offload", n=N),
            op("drain"),
            op("spill", n=N),
            *hit,
        ],
        # every public entry point sent a bad argument (kvstate/targets/api/inputs.py), a Run live
        "bad input at every entry point": [
            op("request", i=0, n=full, life=1),
            op("admit", i=0),
            op("use", i=0),
            *[op("bad_input", k=k) for k in range(len(CASES))],
            op("finish", i=0),
        ],
        # each entry point's documented refusals, a released request and a hit run live
        # (kvstate/targets/api/args.py); then NumPy integers to the maintenance calls
        "documented refusals of every entry point": [
            *store,
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            op("use", i=1),
            *[op("refuse_arg", k=k) for k in range(len(ARG_CASES))],
            op("finish", i=1),
            op("tick_np", t=lease_max),
            op("offload_np", n=1),
            op("drain"),
            op("spill_np", n=1),
            op("drop_np", n=1),
            op("evict_np", n=N),
            *store,
            op("tick_default", t=1),
            *[op(f"{m}_default") for m in ("offload", "evict", "drop")],
            op("drain"),
            op("spill_default"),
            op("drop_default"),
        ],
        # each stored form of an entry damaged (kvstate/targets/api/damage.py): the hit stops before
        **{
            f"damaged {part} section of a disk entry": [
                *to_disk,
                op("damage", b=N - 1, part=k),
                *hit,
            ]
            for k, part in enumerate(PARTS)
        },
        # readiness: a use tried after every single job step of a disk recovery (loads held
        # back by the I/O cap, indexer rebuilds, the tail check) is refused until the last
        # job it depends on has finished; likewise over a host recovery whose tail is damaged
        "use tried at every step of a recovery": [
            *to_disk,
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            *[x for j in range(30) for x in (op("step", k=j % 2), op("use", i=1))],
            op("drain"),
            op("use", i=1),
            op("read", i=1),
        ],
        "use tried at every step of a host recovery with a damaged tail": [
            *to_host,
            op("host_tail", b=1),
            op("request", i=1, n=full, life=2),
            op("admit", i=1),
            *[x for j in range(8) for x in (op("step", k=j % 2), op("use", i=1))],
            op("drain"),
            op("use", i=1),
            op("read", i=1),
        ],
        # a tail that failed its splice check is not served again (Recovery.check_tail marks
        # its record corrupt): a second request over the same prefix, its bytes read
        "a damaged host tail, then the prefix hit again": [
            *to_host,
            *[op("host_tail", b=b) for b in range(N)],
            *hit,
            op("finish", i=1),
            *hit,
            op("finish", i=1),
        ],
        # authentic headers not of this layout (kvstate/targets/api/stored.py): a restart drops them
        **{
            f"forged headers {k0}-{k0 + N - 1}, then a restart": [
                *to_disk,
                *[op("forge", b=b, k=k0 + b) for b in range(N)],
                op("restart"),
                *hit,
            ]
            for k0 in range(0, len(FORGERIES), N)
        },
        # one refused open of the directory at each restart (REFUSALS rotates with the step)
        # the disk fills after one entry of a spill (kvstate/targets/api/exhaust.py): one block spilled
        # (out of blocks or of inodes by the trace's length: one witness for each)
        **{
            f"the disk fills partway through a spill{' (inodes)' if pad else ''}": [
                *[op("tick", t=1)] * pad,
                *to_host,
                op("spill_fills", n=N),
                op("disk_full", on=1),
                op("spill", n=N),
                op("disk_full", on=0),
                *hit,
            ]
            for pad in (0, 1)
        },
        "refused opens at restarts": [*to_disk, *[op("restart") for _ in REFUSALS], *hit],
        # a spill's writes refused each way a file system refuses them
        # (kvstate/targets/api/refusedwrites.py), then a spill that writes, and a hit over it
        "a spill's writes refused each way": [
            *to_host,
            *[op("spill_refused", n=N, k=k) for k in range(len(WAYS))],
            op("spill", n=N),
            *hit,
        ],
        # a disk recovery driven one table action at a time (kvstate/targets/api/stepwise.py):
        # each chunk read unlocked by its own load_progress, the window before load_done; and
        # with reads that fail, each way, at a chunk's read (round 0) and the window's (round 2)
        **{
            f"a disk recovery action by action ({READS[k][0]}, round {r})": [
                *short,
                op("request", i=1, n=full, life=2),
                op("admit", i=1),
                *[op("act_step", b=j % N, k=k * (j // N == r)) for j in range(8 * N)],
                op("drain"),
                op("use", i=1),
                op("read", i=1),
                op("finish", i=1),
            ]
            for k in range(len(READS))
            for r in ((0,) if not k else (0, 2))
        },
        "an offload job raises: the library abandons it (the offload is cancelled)": [
            *store,
            op("offload", n=1),
            *[op("read_error", b=b) for b in range(N)],
            op("drain"),
            *hit,
        ],
        **single_walks(N, L, lease_max),  # kvstate/targets/api/single.py
        **geometry_walks(N, L, lease_max),  # kvstate/targets/api/geometry.py
        **mixed_walks(N, L, lease_max),  # kvstate/targets/api/mixedload.py
        **job_fault_walks(N, L, lease_max),  # kvstate/targets/api/jobfaults.py
        **evictrun_walks(N, L, lease_max),  # kvstate/targets/api/evictrun.py
        **facade_walks(N, L, lease_max),  # kvstate/targets/api/facade.py
        **handed_walks(N, L, lease_max),  # kvstate/targets/api/handed.py
        **records_walks(N, L, lease_max),  # kvstate/targets/api/records.py
        **writer_fails_walks(N, L, lease_max),  # kvstate/targets/api/writerfails.py
        **pincap_walks(N, L, lease_max),  # kvstate/targets/api/pincap.py
        **interpreted_walks(N, L, lease_max),  # kvstate/targets/api/interpreted.py
        **storerun_walks(N, L, lease_max),  # kvstate/targets/api/storerun.py
        **viewcontract_walks(N, L, lease_max),  # kvstate/targets/api/viewcontract.py
        **unservable_walks(N, L, lease_max),  # kvstate/targets/api/unservable.py
        **rowmemo_walks(N, L, lease_max),  # kvstate/targets/api/rowmemo.py
        **refusedjobs_walks(N, L, lease_max),  # kvstate/targets/api/refusedjobs.py
        **covreach_walks(N, L, lease_max),  # kvstate/targets/api/covreach.py
        **swaout_walks(N, L, lease_max),  # kvstate/targets/api/swaout.py
        **whyrefused_walks(N, L, lease_max),  # kvstate/targets/api/whyrefused.py
        **directio_walks(N, L, lease_max, to_disk, hit),  # kvstate/targets/api/directio.py
        **unlink_walks(to_disk, hit),  # kvstate/targets/api/unlinks.py
        **registered_walks(N, L, lease_max),  # kvstate/targets/api/registered.py
        **libdrive_walks(N, L, lease_max),  # kvstate/targets/api/libdrive.py
        **corruptmarks_walks(N, L, lease_max),  # kvstate/targets/api/corruptmarks.py
        **construct_walks(N, L, lease_max),  # kvstate/targets/api/construct.py
        **actmaint_walks(N, L, lease_max),  # kvstate/targets/api/actmaint.py
        **slotsfull_walks(N, L, lease_max),  # kvstate/targets/api/slotsfull.py
        **notinuse_walks(N, L, lease_max),  # kvstate/targets/api/notinuse.py
        **stated_walks(N, L, lease_max),  # kvstate/targets/api/stated.py
        **shortreads_walks(to_disk, hit),  # kvstate/targets/api/shortreads.py
        **strays_walks(to_disk, hit),  # kvstate/targets/api/strays.py
        **constvals_walks(N, L, lease_max),  # kvstate/targets/api/constvals.py
        # the block side's orders and cuts, in the coverage pass only
        **{
            f"{COVERAGE_ONLY}{name}": w
            for name, w in {
                **slotorder_walks(N, L, lease_max),  # kvstate/targets/api/slotorder.py
                **single_limit_walks(N, L),  # kvstate/targets/api/single.py
            }.items()
        },
    }
    if remote.WORLD is not None:  # a run with a remote tier meets the store's faults first
        walks = {
            **remote.walks(N, L, lease_max, to_disk, hit),
            **remoteargs.walks(),
            **remotefull.walks(N, to_disk, hit),
            **twonode.walks(N, to_host, to_disk, hit),
            **walks,
            **{
                f"{COVERAGE_ONLY}{name}": w
                for name, w in {
                    **remotewire.walks(),
                    **remotecalls.walks(to_disk),
                    **remotesteps.walks(N, full, short, to_disk, hit),
                    **remoteheaders.walks(to_disk),
                }.items()
            },
        }
    return _alike(walks)


def _alike(walks: dict[str, list[TraceStep]]) -> dict[str, list[TraceStep]]:
    """The walks, and for each declared operation ``like`` another (``OpDecl.like``), each walk
    of that other run again with it in its place."""
    out = dict(walks)
    for d in DECLARED:
        if d.like:
            for name, w in walks.items():
                if any(o.name == d.like for o in w):
                    out[f"{name}, {d.name} for {d.like}"] = [
                        TraceStep(d.name, dict(o.inputs)) if o.name == d.like else o for o in w
                    ]
    return out
