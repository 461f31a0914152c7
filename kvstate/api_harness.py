"""Lockstep conformance at the library's public API, with bytes, faults and threads.

``kvstate fuzz --target kvstate-api`` drives :class:`~kvstate.impl.cache.HeterogeneousKVCache`
the way an engine does -- ``request / admit / use / finish / abort / append / tick / evict /
offload / spill / drop``, reads through :class:`~kvstate.impl.cache.Run`, pipelines stepped job
by job -- together with the faults the world throws at it (a process crash and restart over the
same cache directory, a truncated or bit-flipped disk entry, a disk read error, a stalled read,
a full disk, an abort from another thread inside ``use``, a caller reusing its token buffer).

After every operation:

* **refinement**: the state the library shows (the table's variables over the harness chain)
  must be explained by a sequence of the table's actions that ``spec/api.py`` allows for the
  call, from the model's state before it (:mod:`kvstate.model.apimap`); a refused call (a
  documented ``KVStateError``) must change nothing; anything else raised is a finding;
* **bytes**: every read of a running request is compared byte for byte with the content the
  test writer derives from the request's *own* tokens (a copy the harness keeps); a read after
  the request's pins are gone must raise a documented error;
* **accounting**: free device slots, host slots and SWA pages plus what the blocks hold equal
  each pool's capacity; pinned blocks equal the sum of the reference counts; disk entries equal
  the published files, and no temporary file survives a call;
* at the end of every example the cache is brought to quiescence through the API (abort, drain,
  let the leases run out, evict, drop): every pool must be free again.

Pools are small (the chain's ``N`` blocks plus two device slots) so a leaked slot shows within a
few operations.  Findings are minimized by delta debugging over fresh replays and printed as
replayable operation traces.
"""

from __future__ import annotations

import errno
import operator
import os
import re
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine

from kvstate.api_args import CASES as ARG_CASES
from kvstate.api_args import NP_OPS, do_refuse_arg
from kvstate.api_damage import PARTS, do_damage
from kvstate.api_exhaust import do_spill_fills
from kvstate.api_graphs import do_capture, do_recapture, do_replay
from kvstate.api_inputs import CASES, do_bad_input
from kvstate.api_pools import do_pools
from kvstate.api_prefix import do_variant, read_outside_chain
from kvstate.api_stored import FORGERIES, REFUSALS, at_restart, do_forge
from kvstate.calls import parse_calls
from kvstate.examples_db import run_machine, saved, with_database
from kvstate.harness.finding import Nonconformance
from kvstate.model.apimap import Explainer, after_restart, state_diff
from kvstate.model.concrete import KeptMachine, Machine
from kvstate.spec.api import API, RESTART_KEEPS
from kvstate.spec.phases import CKV, Graph, Indexer, Pipe, Req, Swa
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Scope, Table
from kvstate.testing.adapter import observe_reader

NAMESPACE = "kvstate-api-harness"
OTHER_NAMESPACE = "kvstate-api-other"
FAULT_KINDS = (
    "crash",
    "truncate",
    "bitflip",
    "header",
    "read_error",
    "stall",
    "disk_full",
    "abort_in_use",
    "token_reuse",
    "read_after_release",
    "forge",
    "disk_fills",
)


# ---- operations --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Op:
    """One harness operation: a public call (or a fault) with its integer arguments."""

    name: str
    args: tuple[tuple[str, int], ...] = ()

    def arg(self, k: str) -> int:
        return dict(self.args)[k]

    def render(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.args)})"


def op(name: str, **args: int) -> Op:
    return Op(name, tuple(args.items()))


def parse_ops(text: str) -> list[Op]:
    """``'request(i=0, n=49, life=2); admit(i=0)'`` (or one per line, as reports print them;
    read by :func:`kvstate.calls.parse_calls`)."""
    out = []
    for name, args in parse_calls(text):
        if name not in OPS:
            raise ValueError(f"cannot parse API operation {name!r} (known: {', '.join(OPS)})")
        out.append(Op(name, tuple(args)))
    return out


# ---- the harness ------------------------------------------------------------------------------
@dataclass
class Live:
    """A request the harness (the "engine") holds."""

    req: Any
    want: np.ndarray  # the tokens the caller meant: a private copy
    buf: np.ndarray  # the caller's own buffer (the request got a view of it)
    ctx: Any = None
    run: Any = None


@dataclass
class Coverage:
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, k: str, n: int = 1) -> None:
        self.counts[k] += n


class ApiHarness:
    """One example: a fresh cache over a fresh directory, the model, and the harness's requests."""

    def __init__(
        self,
        table: Table,
        N: int = 4,
        *,
        threads: bool = False,
        coverage: Coverage | None = None,
        cache_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        from kvstate.impl.testdata import harness_tokens

        self.table = table
        self.N = N
        self.k = table.consts
        self.L = self.k.L
        self.R = self.k.R
        self.machine = _machine(table, N)
        self.explainer = _explainer(self.machine)
        self.model = self.machine.init()
        self.tokens = harness_tokens(N * self.L + self.L)  # one block past the pool: appends
        self.cov = coverage if coverage is not None else Coverage()
        self.threads = threads
        self.cache_kwargs = dict(cache_kwargs or {})
        self.dir = tempfile.mkdtemp(prefix="kvstate-api-")
        self.live: list[Live | None] = [None] * self.R
        self.released: list[Any] = [None] * self.R  # (run, want) of the last released use
        # the request that ended last at each index, kept for ``admit`` to admit again (the
        # same Request object: its earlier runs must stay dead while it is in use again)
        self.done: list[Live | None] = [None] * self.R
        self.corrupt: dict[int, str] = {}  # block -> kind of a corrupt published entry
        self.read_error: set[int] = set()  # blocks whose running load was told to fail
        # blocks whose host copy of the compressor state ``host_tail`` flipped: the library's
        # splice check marks the record, and no hit ends at its boundary again (the model
        # does not see the bytes, so the longest hit it validates may end there)
        self.tail_damaged: set[int] = set()
        # the documented refusal the current call raised, and its table call (api_refusals)
        self.refusal: BaseException | None = None
        self.refusal_call = ""
        self.disk_full = False
        self.foreign_stored: set[int] = set()  # other namespaces that stored blocks
        self.variants_stored: set[int] = set()  # kvstate/api_prefix.py: edits that stored
        self.bad_input_left: list[str] = []  # kvstate/api_inputs.py
        self.published: dict[int, dict[str, int]] = {}  # block -> its disk entry's header
        self.ended: Live | None = None  # the request the current call finished
        self.foreign_slot: int | None = None
        self.restored: set[int] = set()  # blocks loaded back since they were last written
        # the chain's block events the current call emitted: (kind, block, tier)
        self.call_events: list[tuple[str, int, str]] = []
        # files kvstate did not write, planted in its directory: name -> content (left alone)
        self.foreign_files: dict[str, bytes] = {}
        self.steps: list[Op] = []
        self.call_override: str | None = None
        # what the library shows after each job step of the current drain (manual pipelines)
        self.drained: list[dict[str, Any]] | None = None
        self.cache: Any = None
        self.returned: Any = None  # what the current maintenance call returned
        self._open()
        from kvstate.api_checks import make_checks

        self.checks = make_checks(self)  # kvstate/api_checks.py: orders, prefixes, pools

    # -- lifecycle --------------------------------------------------------------------------
    def open_kwargs(self) -> dict[str, Any]:
        """The cache's constructor arguments (kvstate/api_stored.py opens it refused, too)."""
        kw = dict(
            table=self.table,
            executors="threads" if self.threads else "manual",
            max_requests=self.R,
            device_blocks=self.N + 2,
            # fewer blocks' SWA pages than slots: taking pages slides the LRU window
            # (BlockStore.take_swa), so the calls' ROOM steps are exercised
            swa_blocks=self.N,
            host_blocks=2,
            disk_blocks=self.N,
            cache_dir=self.dir,
            # the longest request the harness makes: every request, append and foreign request
            # is cut from ``tokens``.  The CUDA-graph block table is sized by it (a row holds
            # any request's pins whole): N + 1 blocks a row instead of the default 2**20
            # tokens' 65,536, which cost each example's cache 1.5 MB allocated and filled
            max_model_len=len(self.tokens),
        )
        kw.update(self.cache_kwargs)
        return kw

    def _open(self) -> None:
        from kvstate.impl.cache import HeterogeneousKVCache

        self.cache = HeterogeneousKVCache(**self.open_kwargs())
        self.view = self.cache.inspect()  # read-only, live: the checks read the cache here
        self.hooks = self.cache.test_hooks()  # and inject faults here
        self.chain = self.cache.chain(self.tokens[: self.N * self.L], NAMESPACE)
        self.rids = self.cache.register(self.chain)
        self._blocks = {k: b for b, k in enumerate(self.chain.keys)}
        # observe(): each shown variable where the library keeps it, request rows padded to N
        # (kvstate/testing/adapter.py generates the reader from the table once)
        # one C call gathers a column over the chain, as kvstate/testing/adapter.py does
        pick = operator.itemgetter(*self.rids)
        self._gather = pick if len(self.rids) > 1 else (lambda col: (pick(col),))
        self._read = observe_reader(self.table, self.N, pad=True)
        self.cache.events.subscribe(self._event)
        self._real_write = self.hooks.replace_disk_write(None)  # (None: the tier's own)
        self._real_read = self.hooks.replace_disk_read(None)
        if self.disk_full:
            self._arm_disk_full()

    def _event(self, ev: Any) -> None:
        """What the library did, counted from its own events (a load that failed and left its
        block where it was has no net effect the model could count)."""
        from kvstate.impl.events import EventKind

        b = self._blocks.get(ev.key)
        if b is not None:
            self.call_events.append((ev.kind.value, b, ev.tier))
        if ev.kind is EventKind.LOADED:
            self.cov.add(f"{ev.tier} restores completed")
            b = self._blocks.get(ev.key)
            if b is not None:
                self.restored.add(b)
        elif ev.kind is EventKind.LOAD_FAILED:
            self.cov.add("loads failed")

    def close(self) -> None:
        try:
            if self.cache is not None:
                self.cache.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- observation ------------------------------------------------------------------------
    def observe(self) -> dict[str, Any]:
        view = self.view
        with view.lock:
            return self._read(view, view.meta, self._gather, view.slots[: self.R])

    def accounting(self) -> list[str]:
        """Pool counters against what the blocks hold (a leak or a double free shows here)."""
        core = self.view
        out = []
        with core.lock:
            m = core.meta
            t = core.tiers
            live = list(core.index.values())
            jobs = [j for _, j in core.jobs()]
            loads = [j for j in jobs if getattr(j, "kind", "") == "load"]
            held = sum(1 for r in live if m.slot[r] >= 0) + len(loads)
            if t.slots.free + held != t.slots.n:
                out.append(f"device slots: {t.slots.free} free + {held} held != {t.slots.n}")
            hheld = sum(1 for r in live if m.hslot[r] >= 0)
            if t.host_slots.free + hheld != t.host_slots.n:
                out.append(
                    f"host slots: {t.host_slots.free} free + {hheld} held != {t.host_slots.n}"
                )
            sw = sum(len(m.swa_pages[r]) for r in live) + sum(len(j.swa_pages) for j in loads)
            if t.swa_pool.free + sw != t.swa_pool.n - t.swa_pool.first:
                out.append(
                    f"SWA pages: {t.swa_pool.free} free + {sw} held != {t.swa_pool.n - t.swa_pool.first}"
                )
            # each block's phase says which pools it holds (the table's phases, read as data)
            dev_phases = {int(CKV.WRITING), int(CKV.READY), int(CKV.OFFLOADING), int(CKV.EVICTING)}
            load_dma = {j.rid for j in loads if j.pipe is Pipe.DMA}
            load_io = {j.rid for j in loads if j.pipe is Pipe.IO}
            for r in live:
                ck = m.ckv[r]
                if (m.slot[r] >= 0) != (ck in dev_phases):
                    out.append(f"record {r}: phase {CKV(ck).name} but device slot {m.slot[r]}")
                in_host = ck in (CKV.OFFLOADING, CKV.HOST) or r in load_dma
                if (m.hslot[r] >= 0) != in_host:
                    out.append(f"record {r}: phase {CKV(ck).name} but host slot {m.hslot[r]}")
                on_disk = ck == CKV.DISK or r in load_io
                if (r in core.disk_entries) != on_disk:
                    out.append(
                        f"record {r}: phase {CKV(ck).name}, disk entry {r in core.disk_entries}"
                    )
                # SWA pages: a device block holds them exactly while its window is VALID (a
                # slid window gave them back; a load's are its job's until it lands)
                if bool(m.swa_pages[r]) != (ck in dev_phases and m.swa[r] == Swa.VALID):
                    out.append(
                        f"record {r}: phase {CKV(ck).name}, window {Swa(m.swa[r]).name}, "
                        f"{len(m.swa_pages[r])} SWA pages"
                    )
                # a phase a job drives has its job (one whose job is gone stays there for good)
                if ck == CKV.OFFLOADING and core.job("dma", r) is None:
                    out.append(f"record {r}: phase OFFLOADING, no offload job")
                if m.idx[r] == Indexer.REBUILDING and core.job("cpu", r) is None:
                    out.append(f"record {r}: indexer REBUILDING, no rebuild job")
                if (ck == CKV.LOADING) != (r in load_dma or r in load_io):
                    out.append(
                        f"record {r}: phase {CKV(ck).name}, load job {r in load_dma or r in load_io}"
                    )
            # a FREE record of the index is reclaimable only from the tombstones: one off them
            # is never purged (leaked); a tombstone that is not FREE would purge a live block
            tombstones = set(core.tombstones)
            idx = set(live)
            for r in live:
                if (m.ckv[r] == CKV.FREE) != (r in tombstones):
                    out.append(
                        f"record {r}: phase {CKV(m.ckv[r]).name}, "
                        f"on the tombstones {r in tombstones}"
                    )
            gone = [r for r in core.tombstones if r not in idx]
            if gone:
                out.append(f"tombstones {gone} are not records of the index")
            refs = sum(m.ref[r] for r in live)
            pins = sum(len(s.rids) for s in core.slots)
            if not refs == pins == core.pinned_blocks:
                out.append(
                    f"pins: sum of reference counts {refs}, slots pin {pins}, "
                    f"pinned_blocks {core.pinned_blocks}"
                )
            names = [p.name for p in os.scandir(self.dir)]  # one listing: entries and leftovers
            for name, data in self.foreign_files.items():  # never deleted, never rewritten
                path = os.path.join(self.dir, name)
                if not os.path.isfile(path):
                    out.append(f"disk: a file kvstate did not write is gone: {name}")
                elif open(path, "rb").read() != data:
                    out.append(f"disk: a file kvstate did not write was changed: {name}")
            names = [n for n in names if n not in self.foreign_files]
            files = sorted(n for n in names if n.endswith(".kvb"))
            entries = sorted(e.path.name for e in core.disk_entries.values())
            if files != entries:
                out.append(f"disk: files {files} != entries {entries}")
            tmps = [n for n in names if n.endswith(".tmp")]
            if tmps:
                out.append(f"disk: temporary files left behind: {tmps}")
        return out

    def drained_idle(self) -> list[str]:
        """After a drain of manual pipelines nothing runs, so nothing may wait on something
        running: no job left, no disk load held back by the I/O cap, no follow-up (rebuild,
        tail check) waiting on a load (each would leave an admission pending for good)."""
        core = rec = self.view
        out = []
        with core.lock:
            if core.busy():
                out.append(f"drained, yet jobs are left: {list(core.pending().values())}")
            if core.io_inflight:
                out.append(f"drained, yet io_inflight is {core.io_inflight}")
            if rec.io_waiting:
                out.append(f"drained, yet loads wait for the I/O cap: {list(rec.io_waiting)}")
            if rec.want_rebuild or rec.want_tail_check:
                out.append(
                    f"drained, yet follow-ups wait on loads: rebuild {sorted(rec.want_rebuild)}, "
                    f"tail check {sorted(rec.want_tail_check)}"
                )
        return out

    def _check_events(
        self, o: Op, before: ConcreteState, steps: Sequence[tuple[str, dict[str, int]]]
    ) -> None:
        """The chain's block events of a call are those its explanation's actions emit (a
        block stored, evicted, loaded, failed to load or removed), each once, in its tier."""
        want: Counter[tuple[str, int, str]] = Counter()
        s = before
        for name, p in steps:
            b = p.get("b")
            if b is not None:
                v = s.values
                tier = "disk" if v["ldpipe"][b] == Pipe.IO else "host"
                for ev in _EVENTS_OF.get(name, ()):
                    if ev[1] == "load":
                        want[(ev[0], b, tier)] += 1
                    elif ev[1] == "drop":
                        want[(ev[0], b, "host" if v["ckv"][b] == CKV.HOST else "disk")] += 1
                    else:
                        want[(ev[0], b, ev[1])] += 1
            nxt = self.machine.step(s, name, p)
            if b is not None and nxt.values["graph"] != s.values["graph"] == Graph.CAPTURED:
                want[("stale_graph", b, "device")] += 1  # its move staled the graph
            s = nxt
        got = Counter(self.call_events)
        if got != want:
            raise self.fail(
                "events",
                [o.name],
                f"{o.render()}: the events {sorted(got.items())} are not those of the actions "
                f"{[n for n, _ in steps]} ({sorted(want.items())})",
            )
        if got:
            self.cov.add("events matched")

    # -- findings ---------------------------------------------------------------------------
    def fail(self, kind: str, detail: Sequence[str], message: str) -> Nonconformance:
        exc = Nonconformance(kind, detail, message)
        exc.api_trace = list(self.steps)  # type: ignore[attr-defined]
        return exc

    # -- bytes ------------------------------------------------------------------------------
    def check_bytes(self, run: Any, want: np.ndarray, who: str) -> None:
        from kvstate.testing.datacheck import verify_run

        problems = verify_run(run, want)
        n = run.hit_tokens
        if n:
            g = self.view.geometry
            per_tok = sum(len(g.layers) * g.entry_bytes for _ in (0,))
            self.cov.add(
                "bytes compared", int(n * per_tok + g.n_win * g.entry_bytes * len(g.layers))
            )
            if any(b in self.restored for b in range(run.blocks)):
                self.cov.add("reads over restored blocks")
        self.cov.add("reads checked")
        if problems:
            raise self.fail(
                "data",
                [re.sub(r":.*", "", p) for p in problems][:1],
                f"{who} reads wrong bytes:\n  " + "\n  ".join(problems),
            )

    def read_released(self, i: int) -> None:
        from kvstate.impl.errors import KVStateError

        got = self.released[i]
        if got is None:
            return
        run, want = got
        if run.hit_tokens == 0:
            return  # a run without a hit reads no pages: nothing to serve after release
        self.cov.add("fault read_after_release")
        L = self.view.geometry.lcm_tokens
        # every reader a Run has: each must refuse with a documented error (one that still
        # answers serves a block table, pages or a view of blocks that may be someone else's)
        readers: list[tuple[str, Callable[[], Any]]] = [
            ("read_compressed", lambda: run.read_compressed("csa", 0)),
            ("read_window", lambda: run.read_window(0)),
            ("read_tail", lambda: run.read_tail(0)),
            ("block_table", run.block_table),
            ("prefix", lambda: run.prefix(L)),
        ]
        for name, read in readers:
            try:
                got = read()
            except KVStateError:
                continue  # documented: the pins are gone
            except Exception as exc:  # noqa: BLE001 - an undocumented error is a finding too
                raise self.fail(
                    "read-after-release",
                    [type(exc).__name__],
                    f"{name} after release raised {type(exc).__name__}: {exc} (not a KVStateError)",
                ) from exc
            from kvstate.testing.datacheck import verify_run

            wrong = verify_run(run, want) if name == "read_compressed" else []
            shape = tuple(got.shape) if hasattr(got, "shape") else type(got).__name__
            raise self.fail(
                "read-after-release",
                ["served"],
                f"a Run whose pins were released still answers {name} ({shape}"
                + (f"; wrong bytes: {wrong[0]}" if wrong else "")
                + "): it must raise a documented error",
            )

    # -- one operation ----------------------------------------------------------------------
    def apply(self, o: Op) -> None:
        """Perform ``o`` on the library and check it against the model (raises on a finding)."""
        from kvstate.impl.errors import KVStateError

        self.steps.append(o)
        before = self.model
        obs0 = self.observe()
        req = None
        self.call_override: str | None = None
        self.foreign_slot: int | None = None
        self.ended: Live | None = None
        self.drained = None
        self.call_events = []
        raised: BaseException | None = None
        forbid = self._forbid(o)
        for c in self.checks:
            c.before(self, o)
        try:
            req = OPS[o.name](self, o)
        except Nonconformance:
            raise
        except KVStateError as exc:
            raised = exc
        except Exception as exc:  # noqa: BLE001 - a public call may only raise KVStateError
            raise self.fail(
                "undocumented-error",
                [f"{o.name}:{type(exc).__name__}"],
                f"{o.render()} raised {type(exc).__name__}: {exc} (not a documented KVStateError)",
            ) from exc
        call = self.call_override or MAPPING[o.name]
        if o.name == "restart":
            self._restart_model()
            for c in self.checks:
                c.restart(self)
            obs = self.observe()
            d = state_diff(self.model.values, obs, self.table)
            if d:
                raise self.fail(
                    "restart",
                    [x.split(":")[0] for x in d],
                    "after a crash and restart:\n  " + "\n  ".join(d),
                )
        else:
            obs = self.observe()
            if raised is not None:
                d = state_diff(obs0, obs, self.table)
                if d:
                    raise self.fail(
                        "refusal-changed-state",
                        [o.name],
                        f"{o.render()} raised {type(raised).__name__}: {raised}, yet changed "
                        "state:\n  " + "\n  ".join(d),
                    )
                if self.call_events:
                    raise self.fail(
                        "refusal-changed-state",
                        [o.name],
                        f"{o.render()} raised {type(raised).__name__}: {raised}, yet emitted "
                        f"events {self.call_events}",
                    )
                self.cov.add(f"refused {o.name}:{type(raised).__name__}")
                self.refusal, self.refusal_call = raised, call  # (kvstate/api_refusals.py)
                for c in self.checks:
                    c.refused(self, o)
            else:
                foreign = self.foreign_slot
                ign = self._unkept()
                if foreign is not None:  # that slot's deadline and snapshot are another chain's
                    ign += [("deadline", foreign)]
                    ign += [(v, (foreign, b)) for v in ("pgen", "paddr") for b in range(self.N)]
                if self.drained is not None and call == "drain":
                    steps, end = self._explain_drain(o, before, obs, forbid, ign)
                else:
                    ex = self.explainer.explain(
                        call,
                        before,
                        obs,
                        req=req,
                        forbid=forbid,
                        ignore=ign,
                        ticks=self._ticks(call, o),
                        fmts=self._fmts(before),
                    )
                    if ex.steps is None:
                        raise self._unexplained(o, call, ex, before, obs)
                    steps = ex.steps
                    self._after_steps(before, steps, call)
                    end = self._with_model_addr(steps, before)
                if call in ("use", "admit") and any(n == "abort" for n, _ in steps):
                    self.cov.add("hits truncated to the valid prefix")
                if foreign is not None:
                    vals = end.values
                    for name in ("deadline", "pgen", "paddr"):
                        row = list(vals[name])
                        row[foreign] = obs[name][foreign]
                        vals[name] = tuple(row)
                    end = self.machine.state(vals)
                if o.name != "restart":
                    self._check_events(o, before, steps)
                # (the model's own successor object: what the machine keeps about its value,
                # the invariants' answers among them, is found without hashing it again)
                self.model = end
                for c in self.checks:
                    c.after(self, o, before, steps, end)
                self.cov.add(f"call {o.name}")
                if o.name == "admit" and req is not None:
                    self._check_longest(before, steps, req)
        bad = self.accounting()
        if o.name == "drain" and not self.threads and raised is None:
            bad += self.drained_idle()
        if bad:
            raise self.fail(
                "accounting",
                [b.split(":")[0] for b in bad],
                f"after {o.render()}: " + "; ".join(bad),
            )
        viol = self.machine.violations(self.model)
        if viol:
            raise self.fail(
                "model-invariant",
                [v.invariant for v in viol][:1],
                f"model invariant broken: {', '.join(map(str, viol))}",
            )
        for i, lv in enumerate(self.live):
            if lv is not None and lv.run is not None and o.name in ("use", "append", "read"):
                if o.arg("i") == i:
                    self.check_bytes(lv.run, lv.want[: len(lv.req.tokens)], f"request {i}")

    def _unexplained(
        self,
        o: Op,
        call: str,
        ex: Any,
        before: ConcreteState,
        obs: Mapping[str, Any],
        where: str = "",
    ) -> Nonconformance:
        return self.fail(
            "unexplained",
            [o.name],
            f"{o.render()}{where}: no sequence of table actions allowed for {call!r} "
            f"({'search bound hit' if ex.exhausted else 'search complete'}, "
            f"{ex.searched} states) explains the change:\n  "
            + "\n  ".join(state_diff(before.values, obs, self.table)),
        )

    def _explain_drain(
        self,
        o: Op,
        before: ConcreteState,
        obs: Mapping[str, Any],
        forbid: set[tuple[str, int]],
        ign: list[tuple[str, Any]],
    ) -> tuple[list[tuple[str, dict[str, int]]], ConcreteState]:
        """A drain the harness ran job step by job step (manual pipelines), explained the same
        way: each job step's change by ``drain``'s patterns, from the model's state after the
        previous one.  Every state in between is the library's too, so this checks more than
        one search over the whole drain, and one search per job step is far smaller than one
        over all interleavings of the jobs.  (``drain``'s patterns, not ``step``'s: one job step
        may end a load and start another the I/O cap held back, two jobs of ``JOB*``.)  The
        parts' concatenation must be a word of ``drain``'s patterns too (checked here)."""
        assert self.drained is not None
        shown = self.drained
        if not shown or shown[-1] != obs:  # (the last job step's view is the call's)
            shown = [*shown, dict(obs)]
        cur = before
        steps: list[tuple[str, dict[str, int]]] = []
        for k, seen in enumerate(shown):
            ex = self.explainer.explain(
                "drain", cur, seen, forbid=forbid, ignore=ign, fmts=self._fmts(cur)
            )
            if ex.steps is None:
                raise self._unexplained(
                    o, "drain", ex, cur, seen, f" (job step {k + 1} of {len(shown)})"
                )
            self._after_steps(cur, ex.steps, "drain")
            for name, p in ex.steps:
                cur = self.machine.step(cur, name, p)
            steps += ex.steps
        if not self.explainer.accepts("drain", [n for n, _ in steps]):
            raise self.fail(
                "unexplained",
                [o.name],
                f"{o.render()}: the job steps' sequence {[n for n, _ in steps]} is not one "
                "spec/api.py allows for 'drain'",
            )
        return steps, cur

    def _fmts(self, before: ConcreteState) -> dict[tuple[str, int], int]:
        """The stored form each output parameter must report: the writer's for an allocation,
        the file's for a load from disk (the world knows both; the library may not choose)."""
        w = int(getattr(self.view.writer, "fmt", 0))
        out = {("allocate", b): w for b in range(self.N)}
        for b, pub in self.published.items():
            out[("load_done", b)] = pub["fmt"]
        for b in range(self.N):  # a host load brings back the form the block had
            if before.values["ldpipe"][b] == Pipe.DMA and before.values["ckv"][b] == CKV.LOADING:
                out[("load_done", b)] = before.values["fmt"][b]
        return out

    def _ticks(self, call: str, o: Op) -> int | None:
        """The binding of the call's ticks parameters (``ApiCall.ticks`` in spec/api.py)."""
        kind = API[call].ticks
        if kind == "arg":
            return o.arg("t")
        if kind == "lifetime" and "i" in dict(o.args):
            lv = self.live[o.arg("i")] or self.ended
            if lv is not None:
                return min(lv.req.lifetime, self.k.lease_max)
        return None

    def _unkept(self) -> list[tuple[str, Any]]:
        """``state_data_ptrs`` cells past each request's own chain (the library keeps none)."""
        out: list[tuple[str, Any]] = []
        for r, s in enumerate(self.view.slots[: self.R]):
            for b in range(len(s.pgen), self.N):
                out += [("pgen", (r, b)), ("paddr", (r, b))]
        return out

    def _with_model_addr(
        self, steps: list[tuple[str, dict[str, int]]], before: ConcreteState
    ) -> ConcreteState:
        s = before
        for name, p in steps:
            s = self.machine.step(s, name, p)
        return s

    def _after_steps(
        self, before: ConcreteState, steps: list[tuple[str, dict[str, int]]], call: str = ""
    ) -> None:
        s = before
        loading_any = any(x == CKV.LOADING for x in s.values["ckv"])
        committed: set[int] = set()
        for name, p in steps:
            b = p.get("b")
            if name == "commit" and b is not None:
                committed.add(b)
            elif name == "slide" and b not in committed and call != "append":
                # not the store's own window policy, nor a decode's window moving: an empty
                # SWA pool slid the least recently used window (spec/api.py ROOM)
                self.cov.add("windows slid to make room")
            if name == "rebuild_done":
                self.cov.add("indexer rebuilds")
            elif name == "allocate" and b is not None:
                self.restored.discard(b)
            if name == "spill" and b is not None:
                self.published[b] = {v: s.values[v][b] for v in RESTART_KEEPS}
            elif name in ("drop", "load_done", "allocate") and b is not None:
                self.published.pop(b, None)
            elif name == "slide" and loading_any:
                self.cov.add("slides during a load")
            elif name == "use":
                r = p["r"]
                pinned = s.values["pinned"][r]
                if any(b2 in self.restored for b2 in range(-(-pinned // self.L))):
                    self.cov.add("hits used over restored blocks")
                if pinned:
                    self.cov.add("hits used")
            self.cov.add(f"action {name}")
            s = self.machine.step(s, name, p)
        for b in list(self.corrupt):
            ck = s.values["ckv"][b]
            if ck not in (CKV.DISK, CKV.LOADING):
                del self.corrupt[b]
        for b in list(self.read_error):
            if s.values["ckv"][b] != CKV.LOADING:
                self.read_error.discard(b)

    def _forbid(self, o: Op) -> set[tuple[str, int]]:
        """What the world rules out: a sound entry's load does not fail, a corrupt one's never
        completes, nothing is spilled to a full disk."""
        out: set[tuple[str, int]] = set()
        for b in range(self.N):
            if b in self.corrupt and self.corrupt[b] != "header" or b in self.read_error:
                out.add(("load_done", b))
            elif b not in self.read_error and b not in self.corrupt:
                out.add(("load_fail", b))
            if self.disk_full:
                out.add(("spill", b))
        return out

    def _check_longest(
        self, before: ConcreteState, steps: list[tuple[str, dict[str, int]]], r: int
    ) -> None:
        """An admission validated at once took the longest hit the model validates."""
        names = [n for n, _ in steps]
        if "validate" not in names or any(
            n in names for n in ("load_start", "abort", "rebuild_start", "offload_cancel")
        ):
            return
        s = before
        for name, p in steps:
            if name == "match":
                break
            s = self.machine.step(s, name, p)
        chosen = next(p["h"] for n, p in steps if n == "match")
        lv = self.live[
            next(
                i
                for i, x in enumerate(self.live)
                if x is not None and x.req.slot is not None and x.req.slot.index == r
            )
        ]
        h_max = max(len(lv.req.tokens) - 1, 0)
        for h in range(h_max - h_max % self.L, chosen, -self.L):
            if h // self.L - 1 in self.tail_damaged:
                continue  # the world rules this boundary out: its tail's bytes are damaged
            t = s
            try:
                for name, p in (
                    ("match", {"r": r, "h": h}),
                    ("pin", {"r": r}),
                    ("validate", {"r": r}),
                ):
                    t = self.machine.step(t, name, p)
            except Exception:  # noqa: BLE001 - the model refuses this length
                continue
            raise self.fail(
                "short-hit",
                ["admit"],
                f"admit chose a hit of {chosen} tokens, but the model validates {h}",
            )

    def _restart_model(self) -> None:
        s = after_restart(self.machine, self.model, self.published)
        vals = s.values
        init = self.machine.init().values
        for b, kind in list(self.corrupt.items()):
            if kind in ("header", "truncate"):  # rejected by the directory scan (the MAC,
                # or the file's size against its header's)
                for name, v in init.items():
                    if self.machine._scope[name] is Scope.BLOCK:
                        col = list(vals[name])
                        col[b] = v[b]
                        vals[name] = tuple(col)
                vals["nfree"] = vals["nfree"] + 1
                del self.corrupt[b]
        self.model = self.machine.state(vals)
        self.read_error.clear()
        self.restored.clear()

    def _arm_disk_full(self) -> None:
        real = self._real_write

        def full(key: bytes, **kw: Any) -> Any:
            # the world: the disk is full; the temporary's first write fails (prepare's own
            # cleanup of its temporary runs: the accounting sees a temporary left behind)
            _FULL.on = True
            try:
                return real(key, **kw)
            finally:
                _FULL.on = False

        _install_full_disk()

        self.hooks.replace_disk_write(full if self.disk_full else None)

    # -- quiescence ---------------------------------------------------------------------------
    def quiesce(self) -> None:
        """Bring the cache to rest through the API; then every pool must be free again."""
        for i, lv in enumerate(self.live):
            if lv is not None and lv.req.slot is not None:
                self.apply(op("abort", i=i))
        if self.disk_full:
            self.apply(op("disk_full", on=0))
        self.apply(op("drain"))
        self.apply(op("tick", t=self.k.lease_max))
        self.apply(op("drain"))
        big = 4 * self.N + 8
        self.apply(op("evict", n=big))
        self.apply(op("drop", n=big))
        t = self.view.tiers
        leaks = []
        if t.slots.free != t.slots.n:
            leaks.append(f"{t.slots.n - t.slots.free} device slots")
        if t.host_slots.free != t.host_slots.n:
            leaks.append(f"{t.host_slots.n - t.host_slots.free} host slots")
        if t.swa_pool.free != t.swa_pool.n - t.swa_pool.first:
            leaks.append(f"{t.swa_pool.n - t.swa_pool.first - t.swa_pool.free} SWA pages")
        if self.view.disk_entries:
            leaks.append(f"{len(self.view.disk_entries)} disk entries")
        if self.view.pinned_blocks:
            leaks.append(f"{self.view.pinned_blocks} pinned blocks")
        if leaks:
            stuck = Counter(CKV(x).name for x in self.observe()["ckv"])
            raise self.fail(
                "leak",
                ["quiescence"],
                f"at quiescence not free: {', '.join(leaks)} (block phases {dict(stuck)})",
            )
        self.cov.add("quiescence checks")


_HARNESS = ApiHarness  # what build_machine's class body names ``ApiHarness`` by default

# the chain's block events each action emits: (kind, tier), the tier "load" (the load's
# pipeline's: disk or host) or "drop" (where the dropped copy was)
_EVENTS_OF: dict[str, tuple[tuple[str, str], ...]] = {
    "commit": (("stored", "device"),),
    "evict_done": (("evicted", "device"),),
    "offload_done": (("evicted", "device"), ("stored", "host")),
    "spill": (("stored", "disk"),),
    "load_done": (("loaded", "load"),),
    "load_fail": (("load_failed", "load"),),
    "drop": (("removed", "drop"),),
}

_FULL = threading.local()  # on: this thread's disk writes fail (the disk is full)


class _FailingFile:
    """A file whose writes fail as on a full disk, after the first few bytes land."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.written = 0

    def write(self, data: Any) -> int:
        if self.written:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        self.written = self.f.write(bytes(memoryview(data)[:5]))
        return self.written

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> _FailingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


class _FullDiskOs:
    """``os`` as the disk tier sees it: ``fdopen`` hands out failing files while this
    thread's disk is full (``_FULL.on``); everything else is ``os`` itself."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def fdopen(self, fd: int, *a: Any, **k: Any) -> Any:
        f = self._real.fdopen(fd, *a, **k)
        return _FailingFile(f) if getattr(_FULL, "on", False) else f


def _install_full_disk() -> None:
    from kvstate.impl import disk

    if not isinstance(disk.os, _FullDiskOs):
        disk.os = _FullDiskOs(disk.os)  # type: ignore[assignment]


_EXPLAINERS: dict[int, Explainer] = {}
_MACHINES: dict[tuple[int, int], tuple[Table, KeptMachine]] = {}


def _machine(table: Table, N: int) -> KeptMachine:
    """One model machine per (table, pool size), shared by the examples of a run: it keeps its
    answers per state value (guards, successors, invariants: pure functions of the state), and
    the explainer's searches and the checks after every call meet the same states again and
    again.  Nothing else is kept: each example starts from its own ``init()``."""
    key = (id(table), N)
    hit = _MACHINES.get(key)
    if hit is None or hit[0] is not table:
        if len(_MACHINES) >= 8:
            _MACHINES.clear()
        hit = _MACHINES[key] = (table, KeptMachine(table, N, memo=True))
    return hit[1]


def _explainer(m: Machine) -> Explainer:
    key = id(m.table) * 1000 + m.N
    if key not in _EXPLAINERS:
        _EXPLAINERS[key] = Explainer(m)
    else:
        _EXPLAINERS[key].m = m
    return _EXPLAINERS[key]


# ---- the operations ---------------------------------------------------------------------------
def _slot_of(h: ApiHarness, i: int) -> int | None:
    lv = h.live[i]
    return lv.req.slot.index if lv is not None and lv.req.slot is not None else None


def _do_request(h: ApiHarness, o: Op) -> int | None:
    i, n, life = o.arg("i"), o.arg("n"), o.arg("life")
    if h.live[i] is not None:
        return None  # the mapping of request() changes nothing either way
    h.done[i] = None
    buf = np.array(h.tokens, dtype=np.int64)  # the caller's reusable buffer
    want = np.array(h.tokens[:n], dtype=np.int64)
    req = h.cache.request(buf[:n], namespace=NAMESPACE, lifetime=life)
    h.live[i] = Live(req, want, buf)
    return None


def _do_admit(h: ApiHarness, o: Op) -> int | None:
    i = o.arg("i")
    lv = h.live[i]
    back = h.done[i]
    if lv is None and back is not None:  # the request that ended here, admitted again
        back.ctx = back.run = None
        lv = h.live[i] = back
        h.done[i] = None
        h.cov.add("admissions again")
    if lv is None or lv.req.slot is not None:
        h.call_override = "read"
        return None
    adm = h.cache.admit(lv.req)
    h.cov.add(f"admissions {adm.state}")
    return _slot_of(h, o.arg("i"))


def _do_use(h: ApiHarness, o: Op) -> int | None:
    from kvstate.impl.errors import NotReady

    lv = h.live[o.arg("i")]
    if lv is None or lv.ctx is not None:
        h.call_override = "read"
        return None
    r = _slot_of(h, o.arg("i"))
    try:
        # a pending admission is waited for through its own ``wait`` first (the same
        # finalization ``use`` runs; it must leave the admission ready), then used
        adm = lv.req.admission
        if adm is not None and not adm.ready:
            adm.wait(timeout=0.5 if h.threads else 30.0)
            if not adm.ready:
                raise h.fail("api", ["wait"], "Admission.wait() returned while still pending")
        ctx = h.cache.use(lv.req, timeout=0.5 if h.threads else 30.0)
        run = ctx.__enter__()
    except NotReady:
        h.cov.add("fault stall")  # the recovery is still running: the Run waits / times out
        raise
    lv.ctx, lv.run = ctx, run
    return r


def _end(h: ApiHarness, i: int, finish: bool) -> int | None:
    lv = h.live[i]
    if lv is None:
        h.call_override = "read"
        return None
    r = _slot_of(h, i)
    if lv.ctx is not None and lv.req.slot is not None and lv.req.slot.phase == Req.USING:
        if finish:
            lv.ctx.__exit__(None, None, None)
        else:
            h.cache.abort(lv.req)
    elif lv.req.slot is not None:
        h.call_override = "abort"
        h.cache.abort(lv.req)
    else:
        h.call_override = "read"
    if lv.run is not None:
        h.released[i] = (lv.run, lv.want[: len(lv.req.tokens)].copy())
    h.live[i] = None
    h.done[i] = lv
    h.ended = lv
    return r


def _do_finish(h: ApiHarness, o: Op) -> int | None:
    return _end(h, o.arg("i"), True)


def _do_abort(h: ApiHarness, o: Op) -> int | None:
    return _end(h, o.arg("i"), False)


def _do_append(h: ApiHarness, o: Op) -> int | None:
    lv = h.live[o.arg("i")]
    n0 = len(lv.req.tokens) if lv is not None else 0
    n1 = min(n0 + o.arg("k"), len(h.tokens))
    if lv is None or lv.run is None or lv.req.slot is None or n1 == n0:
        h.call_override = "read"
        return None
    lv.want = np.array(h.tokens[:n1], dtype=np.int64)
    lv.run.append(h.tokens[n0:n1])
    return _slot_of(h, o.arg("i"))


def _do_read(h: ApiHarness, o: Op) -> int | None:
    return None  # the bytes check after the call does the reading


def _do_read_released(h: ApiHarness, o: Op) -> int | None:
    h.read_released(o.arg("i"))
    return None


def _do_mutate(h: ApiHarness, o: Op) -> int | None:
    lv = h.live[o.arg("i")]
    if lv is None:
        return None
    from kvstate.impl.testdata import harness_tokens

    h.cov.add("fault token_reuse")
    lv.buf.flags.writeable = True
    lv.buf[:] = harness_tokens(len(lv.buf), seed=7)  # the engine reuses its buffer
    return None


def _do_abort_in_use(h: ApiHarness, o: Op) -> int | None:
    i = o.arg("i")
    lv = h.live[i]
    if lv is None or lv.ctx is None or lv.req.slot is None:
        h.call_override = "read"
        return None
    r = _slot_of(h, i)
    errs: list[BaseException] = []

    def other() -> None:
        try:
            h.cache.abort(lv.req)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errs.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    if errs:
        raise errs[0]
    h.cov.add("fault abort_in_use")
    lv.ctx.__exit__(None, None, None)  # the with block ends after the abort: nothing more
    h.released[i] = (lv.run, lv.want[: len(lv.req.tokens)].copy())
    h.live[i] = None
    h.done[i] = lv
    return r


def _do_foreign(h: ApiHarness, o: Op) -> int | None:
    """A whole request over the same tokens in another namespace: no hit (namespaces share no
    block), its own bytes right, its blocks stored next to the chain's (evicting some)."""
    n, ns = o.arg("n"), o.arg("ns")
    want = np.array(h.tokens[:n], dtype=np.int64)
    req = h.cache.request(want.copy(), namespace=f"{OTHER_NAMESPACE}-{ns}", lifetime=1)
    adm = h.cache.admit(req)
    assert req.slot is not None
    h.foreign_slot = req.slot.index
    h.cov.add("foreign requests")
    if adm.hit_tokens:
        h.cov.add("foreign hits")
        if ns not in h.foreign_stored:
            raise h.fail(
                "namespace",
                ["hit"],
                f"a request in namespace {ns}, where nothing was stored, hit {adm.hit_tokens} "
                "tokens (namespaces share no block)",
            )
    if read_outside_chain(h, req, want, "foreign request"):
        h.foreign_stored.add(ns)
    return None


def _do_tick(h: ApiHarness, o: Op) -> int | None:
    h.cache.tick(o.arg("t"))
    return None


def _maint(name: str) -> Callable[[ApiHarness, Op], int | None]:
    def do(h: ApiHarness, o: Op) -> int | None:
        h.returned = getattr(h.cache, name)(o.arg("n"))  # (kvstate/api_exhaust.py)
        return None

    return do


def _jobs(h: ApiHarness) -> list[tuple[Any, Any]]:
    return h.view.jobs()


class _InjectedJobError(RuntimeError):
    """A job step's failure the harness injected (``read_error`` on an offloading block)."""


def _step_job(h: ApiHarness, e: Any, job: Any) -> None:
    from kvstate.impl.errors import KVStateError

    try:
        h.hooks.step_job(e, job)
    except Exception as exc:
        # as a worker thread and ``Pipelines.drain`` do: the job was abandoned (its record
        # back to a consistent phase: a load fails, an offload is cancelled) and dropped
        if not isinstance(exc, (KVStateError, _InjectedJobError)):
            raise  # (a bug in a job: an undocumented error of the call that ran it)


def _do_step(h: ApiHarness, o: Op) -> int | None:
    jobs = _jobs(h)
    if jobs:
        e, j = jobs[o.arg("k") % len(jobs)]
        _step_job(h, e, j)
    return None


def _do_drain(h: ApiHarness, o: Op) -> int | None:
    if h.threads:
        return None
    h.drained = []  # what the library shows after each job step: each is explained
    for _ in range(10_000):
        jobs = _jobs(h)
        if not jobs:
            break
        for e, j in jobs:
            _step_job(h, e, j)
            h.drained.append(h.observe())
    return None


def _entry_path(h: ApiHarness, b: int) -> Any:
    e = h.view.disk_entries.get(h.rids[b])
    return e


def _do_corrupt(h: ApiHarness, o: Op) -> int | None:
    b, kind = o.arg("b"), ("truncate", "bitflip", "header")[o.arg("kind") % 3]
    e = _entry_path(h, b)
    if e is None or b in h.corrupt:
        return None
    data = bytearray(e.path.read_bytes())
    if kind == "truncate":
        data = data[: max(e.payload_offset + 1, len(data) - 7)]
    elif kind == "bitflip":
        pos = e.payload_offset + (len(data) - e.payload_offset) // 2
        data[pos] ^= 0x10
    else:
        data[20] ^= 0x01  # inside the JSON header: its CRC no longer matches
    e.path.write_bytes(bytes(data))
    h.corrupt[b] = kind
    h.cov.add(f"fault {kind}")
    return None


def _do_host_tail(h: ApiHarness, o: Op) -> int | None:
    """A bit flip in the host copy of a block's compressor state (host memory has no checksum):
    the restored tail no longer splices at that boundary, so a hit ending there must be cut by
    one block (the tail check), never served."""
    b = o.arg("b")
    rid = h.rids[b]
    m = h.view.meta
    if m.ckv[rid] != CKV.HOST or m.hslot[rid] < 0:
        return None
    grp = h.view.tiers.compressor
    v = h.hooks.host_copy("compressor", rid)  # writable: host memory has no checksum
    h_end = (b + 1) * h.L  # the boundary this state belongs to; its last position's ring slot
    v[..., grp.state_bytes + 8 * ((h_end - 1) % grp.ring)] ^= 0x01  # the splice check must fail
    h.tail_damaged.add(b)
    h.cov.add("fault host_tail")
    return None


def _do_read_error(h: ApiHarness, o: Op) -> int | None:
    """The next step of the block's job fails: a load's read (an I/O error), an offload's copy
    (the job raises: the library abandons it, which cancels the offload)."""
    b = o.arg("b")
    rid = h.rids[b]
    ck = h.view.meta.ckv[rid]
    if ck == CKV.OFFLOADING and not h.threads:
        job = h.view.job("dma", rid)
        if job is not None:

            def broken() -> bool:
                raise _InjectedJobError(f"injected copy error in the offload of record {rid}")

            job.step = broken
            h.cov.add("fault offload job raises")
        return None
    if ck != CKV.LOADING:
        return None
    h.hooks.inject_load_fault(rid)
    h.read_error.add(b)
    h.cov.add("fault read_error")
    return None


def _do_disk_full(h: ApiHarness, o: Op) -> int | None:
    on = bool(o.arg("on"))
    if on == h.disk_full:
        return None
    h.disk_full = on
    h._arm_disk_full()
    if on:
        h.cov.add("fault disk_full")
    return None


def _do_restart(h: ApiHarness, o: Op) -> int | None:
    h.cov.add("fault crash")
    try:
        h.hooks.crash()  # the process dies, the kernel drops its lock on the directory
    finally:
        h.live = [None] * h.R
        h.released = [None] * h.R
        h.done = [None] * h.R
        _plant_files(h, len(h.steps))
        at_restart(h, len(h.steps))  # kvstate/api_stored.py: a refused open, our leftovers
        h._open()
    return None


def _plant_files(h: ApiHarness, n: int) -> None:
    """What a crash and other programs leave in the directory: a temporary of a writer killed
    after its first bytes (kvstate's: the scan deletes it), and files kvstate did not write
    under names like its own (an entry's, a temporary's: left alone, never read as entries)."""
    tag = f"{n:04x}{len(h.foreign_files):04x}"
    killed = f".{'ab' * 8}{tag}.kvb.killed{tag}.tmp"
    with open(os.path.join(h.dir, killed), "wb") as f:
        f.write(b"KVSTA")  # the start of the magic
    from kvstate.impl.disk import MAGIC

    for name, data in (
        (f"{'cd' * 8}{tag}.kvb", b"not kvstate's: an entry's name, another program's bytes"),
        (f".{'ef' * 8}{tag}.kvb.other.tmp", b"not kvstate's: a temporary's name"),
        # kvstate's magic under a name it never gives an entry (an odd number of hex digits):
        # not an entry, so never read as one, nor deleted as a damaged one
        (f"{'cd' * 8}{tag}0.kvb", MAGIC + b"\x00\x00\x00\x00 not kvstate's: odd-length name"),
    ):
        with open(os.path.join(h.dir, name), "wb") as f:
            f.write(data)
        h.foreign_files[name] = data
    h.cov.add("files planted")


OPS: dict[str, Callable[[ApiHarness, Op], int | None]] = {
    "request": _do_request,
    "admit": _do_admit,
    "use": _do_use,
    "finish": _do_finish,
    "abort": _do_abort,
    "append": _do_append,
    "read": _do_read,
    "read_released": _do_read_released,
    "mutate_tokens": _do_mutate,
    "abort_in_use": _do_abort_in_use,
    "foreign": _do_foreign,
    "tick": _do_tick,
    "evict": _maint("evict"),
    "offload": _maint("offload"),
    "spill": _maint("spill"),
    "drop": _maint("drop"),
    "step": _do_step,
    "drain": _do_drain,
    "corrupt": _do_corrupt,
    "read_error": _do_read_error,
    "host_tail": _do_host_tail,
    "disk_full": _do_disk_full,
    "restart": _do_restart,
    "variant": do_variant,
    "bad_input": do_bad_input,
    "refuse_arg": do_refuse_arg,  # kvstate/api_args.py
    **{k: do for k, (do, _) in NP_OPS.items()},
    "pools": do_pools,
    "damage": do_damage,
    "capture": do_capture,
    "replay": do_replay,
    "recapture": do_recapture,
    "forge": do_forge,
    "spill_fills": do_spill_fills,
}
# which spec/api.py entry explains each operation
MAPPING: dict[str, str] = {
    "foreign": "foreign",
    "spill_fills": "spill",  # the disk full after one write (kvstate/api_exhaust.py)
    "forge": "corrupt",  # an authentic header not of this layout (kvstate/api_stored.py)
    "damage": "corrupt",  # one section of an entry (kvstate/api_damage.py)
    "pools": "read",  # a fresh cache resized (kvstate/api_pools.py)
    "bad_input": "read",  # refused, nothing changes (kvstate/api_inputs.py)
    "refuse_arg": "read",  # refused, or a read answered alike (kvstate/api_args.py)
    **{k: call for k, (_, call) in NP_OPS.items()},
    "variant": "foreign",  # a prompt sharing no block with the chain (kvstate/api_prefix.py)
    **{
        k: k
        for k in (
            "request",
            "admit",
            "use",
            "finish",
            "abort",
            "append",
            "tick",
            "evict",
            "offload",
            "spill",
            "drop",
            "step",
            "drain",
            "read",
            "capture",
            "replay",
            "recapture",
        )
    },
    "read_released": "read",
    "mutate_tokens": "mutate_tokens",
    "abort_in_use": "abort",
    "corrupt": "corrupt",
    "read_error": "fault",
    "host_tail": "corrupt",
    "disk_full": "fault",
    "restart": "fault",
}
FAULT_OPS = {
    "crash": ("restart",),
    "corrupt": ("corrupt",),
    "read_error": ("read_error",),
    "host_tail": ("host_tail",),
    "disk_full": ("disk_full",),
    "abort_in_use": ("abort_in_use",),
    "token_reuse": ("mutate_tokens",),
    "read_after_release": ("read_released",),
    "forge": ("forge",),
    "disk_fills": ("spill_fills",),
}


# ---- witnesses: deterministic walks that combine steps -------------------------------------------
def witnesses(N: int, L: int, lease_max: int) -> dict[str, list[Op]]:
    """Scripted walks that reach what random choice rarely does (run before Hypothesis)."""
    full = N * L + 1  # the whole chain plus one token: every block can be hit
    store = [
        op("request", i=0, n=full, life=1),
        op("admit", i=0),
        op("use", i=0),
        op("finish", i=0),
        op("tick", t=lease_max),
    ]
    to_host = [*store, op("offload", n=N), op("drain")]
    # the host tier holds two blocks: spill them, then offload the rest (every block on disk)
    to_disk = [*to_host, op("spill", n=N), op("offload", n=N), op("drain"), op("spill", n=N)]
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
    return {
        # kvstate/api_graphs.py: captured over a running request's row, staled by the disk
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
        # (kvstate/api_window.py), then the prefix hits up to its kept windows
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
        # used (kvstate/api_orders.py); then the held-back disk loads start in queue order
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
        # every public entry point sent a bad argument (kvstate/api_inputs.py), a Run live
        "bad input at every entry point": [
            op("request", i=0, n=full, life=1),
            op("admit", i=0),
            op("use", i=0),
            *[op("bad_input", k=k) for k in range(len(CASES))],
            op("finish", i=0),
        ],
        # each entry point's documented refusals, a released request and a hit run live
        # (kvstate/api_args.py); then NumPy integers to the maintenance calls
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
        # each stored form of an entry damaged (kvstate/api_damage.py): the hit stops before
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
        # authentic headers not of this layout (kvstate/api_stored.py): a restart drops them
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
        # the disk fills after one entry of a spill (kvstate/api_exhaust.py): one block spilled
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
        "an offload job raises: the library abandons it (the offload is cancelled)": [
            *store,
            op("offload", n=1),
            *[op("read_error", b=b) for b in range(N)],
            op("drain"),
            *hit,
        ],
    }


# ---- the Hypothesis state machine -----------------------------------------------------------
def build_machine(
    table: Table,
    N: int,
    *,
    ops: frozenset[str] | None = None,
    coverage: Coverage | None = None,
    stats: Counter[str] | None = None,
    seeds: Sequence[Sequence[Op]] = (),
    threads: bool = False,
    harness: Callable[..., Any] | None = None,
) -> type[RuleBasedStateMachine]:
    """A state machine whose rules are the harness operations (``kvstate/api_machine.py``)."""
    from kvstate.api_machine import build_machine as build

    return build(
        table,
        N,
        ops=ops,
        coverage=coverage,
        stats=stats,
        seeds=seeds,
        threads=threads,
        harness=harness,
    )


# ---- replay and minimization ------------------------------------------------------------------
def replay(
    table: Table,
    N: int,
    ops: Sequence[Op],
    *,
    coverage: Coverage | None = None,
    quiesce: bool = True,
) -> Nonconformance | None:
    """Replay ``ops`` on a fresh cache and model (then quiesce); the finding, or None."""
    h = ApiHarness(table, N, coverage=coverage)
    try:
        for o in ops:
            h.apply(o)
        if quiesce:
            h.quiesce()
    except Nonconformance as exc:
        return exc
    finally:
        h.close()
    return None


def _same(a: Nonconformance, b: Nonconformance) -> bool:
    return a.kind == b.kind and (not b.detail or b.detail[0] in a.detail)


def minimize_ops(
    table: Table, N: int, failure: Nonconformance, *, max_seconds: float = 60.0
) -> tuple[list[Op], Nonconformance, int]:
    """Delta debugging over operations (fresh replays; kept only if it fails the same way),
    then smaller arguments; the same algorithm as :func:`kvstate.targets.block.replay.minimize`."""
    cur: list[Op] = list(getattr(failure, "api_trace", []))
    best = failure
    started = time.monotonic()
    replays = 0

    def check(cand: list[Op]) -> Nonconformance | None:
        nonlocal replays
        replays += 1
        got = replay(table, N, cand)
        return got if got is not None and _same(got, failure) else None

    def over() -> bool:
        return time.monotonic() - started > max_seconds

    n = 2
    while len(cur) >= 1 and not over():
        size = -(-len(cur) // n)
        for k in range(0, len(cur), size):
            cand = cur[:k] + cur[k + size :]
            got = check(cand)
            if got is not None:
                cur, best = list(getattr(got, "api_trace", cand))[: len(cand)] or cand, got
                cur = cand[: len(getattr(got, "api_trace", cand))]
                n = max(n - 1, 2)
                break
            if over():
                break
        else:
            if size == 1:
                break
            n = min(2 * n, len(cur))
    # smaller arguments
    j = 0
    while j < len(cur) and not over():
        o = cur[j]
        for idx, (k, v) in enumerate(o.args):
            for smaller in range(0, v):
                args = list(o.args)
                args[idx] = (k, smaller)
                cand = [*cur[:j], Op(o.name, tuple(args)), *cur[j + 1 :]]
                got = check(cand)
                if got is not None:
                    cur, best, o = cand, got, cand[j]
                    break
        j += 1
    return cur, best, replays


# ---- the run: coverage pass, Hypothesis, summary, report -----------------------------------------
PROFILES: dict[str, dict[str, Any]] = {
    # bounded and derandomized: the same examples every run (CI, in the default pytest run)
    "ci": {"derandomize": True, "max_examples": 20, "stateful_step_count": 25},
    "dev": {"derandomize": False, "max_examples": 150, "stateful_step_count": 40},
    "nightly": {"derandomize": False, "max_examples": 2000, "stateful_step_count": 80},
}
_BLOB = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


@dataclass
class RunResult:
    finding: Nonconformance | None
    coverage: Coverage
    stats: Counter[str]
    seconds: float
    origin: str = ""
    minimized: list[Op] | None = None
    replays: int = 0
    blob: str | None = None
    seed: int | None = None
    found_len: int = 0
    shared: bool = False  # the examples were shared with a forked process (_run_beside)

    @property
    def steps(self) -> int:
        return self.stats["(steps)"]


def run_api(
    table: Table,
    N: int = 4,
    *,
    profile: str = "ci",
    examples: int | None = None,
    steps: int | None = None,
    seed: int | None = None,
    ops: frozenset[str] | None = None,
    coverage_pass: bool = True,
    minimize: bool = True,
    reproduce: str | None = None,
    minimize_seconds: float = 60.0,
    beside: bool = True,
    out: Callable[[str], None] = lambda s: None,
    database: Any = None,
    key: bytes = b"",
) -> RunResult:
    """The scripted witnesses, then Hypothesis; the first finding minimized.

    ``beside``: where the walk is deterministic (derandomized, or a seed) and a second CPU and
    ``os.fork`` exist, the same work is shared by two processes (:func:`_run_beside`): the
    checks, the counts and the report are those of the run in place.  ``database`` (not in
    ``ci``): Hypothesis' example database, examples filed under ``key``
    (:mod:`kvstate.examples_db`); a run with one is not shared (the dry run would judge the
    saved failures passed and delete them)."""
    # What the examples import on first use, imported before the clock starts: the block
    # target's clock, too, starts after Python's start and imports (kvstate/fuzz_cli.py).
    import kvstate.impl.cache
    import kvstate.testing.datacheck  # noqa: F401

    cov, stats = Coverage(), Counter[str]()
    started = time.monotonic()
    allowed = frozenset(OPS) if ops is None else ops
    wit = {
        name: w
        for name, w in witnesses(N, table.consts.L, table.consts.lease_max).items()
        if all(o.name in allowed for o in w)
    }
    prof = with_database(explore_settings(profile, examples, steps, seed), database)
    stats["(saved examples)"] = saved(prof, key)

    def machine_cls(
        cov: Coverage, stats: Counter[str], harness: Callable[..., Any] | None = None
    ) -> Any:
        cls: Any = build_machine(
            table,
            N,
            ops=allowed,
            coverage=cov,
            stats=stats,
            seeds=list(wit.values()),
            harness=harness,
        )
        if seed is not None:
            cls._hypothesis_internal_use_seed = seed
        if reproduce is not None:
            import hypothesis

            cls._hypothesis_internal_use_reproduce_failure = (
                hypothesis.__version__,
                reproduce.encode(),
            )
        return cls

    def explore(passed: int = 0) -> tuple[Nonconformance | None, str, str | None]:
        """Hypothesis in this process: its first finding, where it was found, its blob.
        ``passed``: its first examples already ran and passed (beside, with their counts
        added): those are drawn again, not run again (:class:`_Recorder`)."""
        made = 0

        def harness(*a: Any, **k: Any) -> Any:
            nonlocal made
            made += 1
            return _Recorder([]) if made <= passed else ApiHarness(*a, **k)

        found, stdout = _hypothesis(machine_cls(cov, stats, harness if passed else None), prof, key)
        if found is None:
            return None, "", None
        m = _BLOB.search(stdout + "".join(getattr(found, "__notes__", [])))
        at = stats["(examples)"] + 1
        where = ", a saved example of the example database" * (at <= stats["(saved examples)"])
        return found, f"Hypothesis, example {at}{where}", m.group(2) if m else None

    found: Nonconformance | None = None
    origin = ""
    blob = None
    deterministic = reproduce is None and (seed is not None or bool(prof.derandomize))
    shared = beside and coverage_pass and deterministic and prof.database is None
    shared = shared and _second_cpu()
    if shared:
        found, origin, blob = _run_beside(
            table,
            N,
            wit,
            lambda h: machine_cls(Coverage(), Counter(), h),
            prof,
            cov,
            stats,
            explore,
            out,
        )
    else:
        if coverage_pass and reproduce is None:
            found, origin = _coverage_pass(table, N, wit, cov, stats)
            if found is None:
                out(f"  coverage pass: {len(wit)} witnesses replayed in lockstep")
        if found is None:
            found, origin, blob = explore()
    res = RunResult(
        found,
        cov,
        stats,
        time.monotonic() - started,
        origin,
        blob=blob,
        seed=seed,
        found_len=len(getattr(found, "api_trace", [])),
        shared=shared,
    )
    if found is None and coverage_pass and reproduce is None:
        res.finding = _vacuity(table, N, cov)
        res.origin = "" if res.finding is None else "the run's own counters, at its end"
    if found is not None and minimize:
        out(f"  minimizing the {len(found.api_trace)}-operation failing trace (fresh replays)...")  # type: ignore[attr-defined]
        res.minimized, res.finding, res.replays = minimize_ops(
            table, N, found, max_seconds=minimize_seconds
        )
    return res


def _vacuity(table: Table, N: int, cov: Coverage) -> Nonconformance | None:
    """A run that found nothing but never reached what it checks (kvstate/api_refusals.py)
    is a failed run: its counters say so."""
    from kvstate.api_refusals import vacuous

    ex = _explainer(_machine(table, N))
    empty = {c for c, (nfa, s, a) in ex.nfas.items() if a in nfa.closure([s])}
    gaps = vacuous(cov.counts, MAPPING, empty)
    if not gaps:
        return None
    f = Nonconformance(
        "vacuous",
        [gaps[0].split(" (")[0]],
        "the run checked nothing on its essential paths: " + "; ".join(gaps),
    )
    f.api_trace = []  # type: ignore[attr-defined]
    return f


def explore_settings(
    profile: str, examples: int | None = None, steps: int | None = None, seed: int | None = None
) -> settings:
    """Hypothesis' settings for a run of ``profile`` (no shrinking: findings are minimized by
    fresh replays)."""
    from hypothesis import HealthCheck, Phase

    kw = dict(PROFILES[profile])
    if examples is not None:
        kw["max_examples"] = examples
    if steps is not None:
        kw["stateful_step_count"] = steps
    if seed is not None:
        kw["derandomize"] = False
    return settings(
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
        phases=tuple(p for p in Phase if p is not Phase.shrink),
        **kw,
    )


def _hypothesis(cls: Any, prof: settings, key: bytes = b"") -> tuple[Nonconformance | None, str]:
    """``cls`` run by Hypothesis under ``prof`` (examples filed under ``key`` in its database):
    its finding (or None) and what it printed."""
    import contextlib
    import io

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            run_machine(cls, prof, key or b"kvstate-api")
    except Nonconformance as exc:
        return exc, buf.getvalue()
    return None, buf.getvalue()


def _coverage_pass(
    table: Table,
    N: int,
    wit: Mapping[str, Sequence[Op]],
    cov: Coverage,
    stats: Counter[str],
    lo: int = 0,
    hi: int | None = None,
) -> tuple[Nonconformance | None, str]:
    """Every witness (``lo`` to ``hi``: some) replayed on a fresh cache, then quiesced: the
    first finding, and where."""
    for idx, (name, w) in list(enumerate(wit.items()))[lo:hi]:
        h = ApiHarness(table, N, coverage=cov)
        try:
            for o in w:
                stats["(steps)"] += 1
                h.apply(o)
            h.quiesce()
        except Nonconformance as exc:
            return exc, f"coverage pass (witness {idx + 1} of {len(wit)}: {name})"
        finally:
            h.close()
    return None, ""


def _example(table: Table, N: int, ops: Sequence[Op], cov: Coverage, stats: Counter[str]) -> None:
    """One recorded Hypothesis example, run as the state machine runs it: a fresh cache, each
    operation counted and applied, quiescence, the example counted, the cache closed."""
    h = ApiHarness(table, N, coverage=cov)
    try:
        for o in ops:
            stats["(steps)"] += 1
            h.apply(o)
        h.quiesce()
    finally:
        stats["(examples)"] += 1
        h.close()


class _Recorder:
    """Stands in for :class:`ApiHarness` in the exploration's dry run: it keeps the operations
    each example applies and checks nothing (the rules draw their arguments from strategies
    alone, with no precondition or bundle, so what Hypothesis draws does not depend on what the
    harness does; an example that passes leaves the walk where a dry one does)."""

    def __init__(self, sink: list[list[Op]]) -> None:
        self.ops: list[Op] = []
        sink.append(self.ops)

    def apply(self, o: Op) -> None:
        self.ops.append(o)

    def quiesce(self) -> None:
        pass

    def close(self) -> None:
        pass


def _second_cpu() -> bool:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return hasattr(os, "fork") and cpus >= 2


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _take(fd: int) -> int | None:
    """The next example number from the queue both processes read (None: no more).  The queue
    is written once, in one write, two bytes a number, so a two-byte read takes one whole."""
    rec = os.read(fd, 2)
    return int.from_bytes(rec, "little") if rec else None


def _work_queue(
    table: Table,
    N: int,
    exs: Sequence[Sequence[Op]],
    q: int,
    done: dict[int, tuple[dict[str, int], dict[str, int]]],
    stop: Callable[[], bool] = lambda: False,
) -> tuple[int, str] | None:
    """Examples taken from the queue ``q`` and run until it is empty (or ``stop()``), the
    counts of each that passed put in ``done``: None, or the first one that failed and how
    (the queue is then emptied: the other process stops)."""
    while not stop():
        k = _take(q)
        if k is None:
            return None
        cov, stats = Coverage(), Counter[str]()
        try:
            _example(table, N, exs[k], cov, stats)
            done[k] = (dict(cov.counts), dict(stats))
        except Exception as exc:  # noqa: BLE001 - reported from the run in place
            while _take(q) is not None:
                pass
            return k, f"{type(exc).__name__}: {exc}"[:2000]
    return None


_BEFORE_FORK = 2  # witnesses run before the fork (see _run_beside)


def _run_beside(
    table: Table,
    N: int,
    wit: Mapping[str, Sequence[Op]],
    dry_cls: Callable[[Callable[..., Any]], Any],
    prof: settings,
    cov: Coverage,
    stats: Counter[str],
    explore: Callable[[int], tuple[Nonconformance | None, str, str | None]],
    out: Callable[[str], None],
) -> tuple[Nonconformance | None, str, str | None]:
    """The run's work shared by this process and a forked one, reported as the run in place.

    This process runs the coverage pass (the witnesses) exactly as in place, and reports its
    finding exactly as before.  Meanwhile the child runs Hypothesis' exploration dry
    (:class:`_Recorder`: the same examples, drawn without running them) and puts the recorded
    examples on a queue both processes then take from; each is run exactly as the state machine
    runs it (:func:`_example`).  Every witness and every example still runs on a fresh cache and
    model, every operation is explained and every read byte-checked; the two processes share
    nothing but caches kept per pure input (the model's answers per state value), so the split
    changes no check and no count (the child's counts are added here).

    An example that fails (here or there) is not reported from the split: Hypothesis then runs
    here for real, the coverage pass's counts kept, and reports its finding, example number and
    blob as before.  The examples before the first that failed, which passed in the split, are
    drawn again but not run again (their counts are added), so the finding costs little more
    than in place.  A recorded example that fails there but not in Hypothesis' run is an
    error, never a pass.  A child that crashes leaves the rest of the exploration to run here.
    """
    import contextlib
    import gc
    import pickle
    import select
    import signal
    import sys

    # The first witnesses run before the fork: the guards are compiled once, for both, and
    # the model's answers and the test rows about the states every witness starts with (a
    # whole chain stored, offloaded, spilled) are kept once, for both; a finding there is
    # reported at once, as in place.
    found, origin = _coverage_pass(table, N, wit, cov, stats, 0, _BEFORE_FORK)
    if found is not None:
        return found, origin, None
    r_res, w_res = os.pipe()  # child -> parent: its outcome, once
    r_ex, w_ex = os.pipe()  # child -> parent: the recorded examples, once
    r_q, w_q = os.pipe()  # the queue of example numbers both take from
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: the dry run, then examples from the queue; its exit handlers
        code = 1  # (the parent's scratch folder, open files) are not run
        try:
            os.close(r_res)
            os.close(r_ex)
            # GNU OpenMP (torch's CPU pool) is not fork-safe: one thread never enters it
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)
            # what the parent made stays out of this process's collections: a collection that
            # walked it would write to (and so copy) every page the two processes share
            gc.freeze()
            msg: dict[str, Any] = {}
            exs: list[list[Op]] = []
            dry_found, _ = _hypothesis(dry_cls(lambda *a, **k: _Recorder(exs)), prof)
            if dry_found is not None:  # a recorder checks nothing: this cannot happen
                raise dry_found
            data = pickle.dumps(exs)

            def send(fd: int) -> None:
                with contextlib.suppress(OSError), os.fdopen(fd, "wb") as fh:
                    fh.write(data)  # the parent reads it after the witnesses

            writer = threading.Thread(target=send, args=(w_ex,), daemon=True)
            writer.start()
            os.write(w_q, b"".join(k.to_bytes(2, "little") for k in range(len(exs))))
            os.close(w_q)
            done: dict[int, tuple[dict[str, int], dict[str, int]]] = {}
            msg["example"] = _work_queue(table, N, exs, r_q, done)
            msg["done"] = done
            writer.join()
            with os.fdopen(w_res, "wb") as fh:
                fh.write(pickle.dumps(msg))
            code = 0
        finally:
            os._exit(code)
    os.close(w_res)
    os.close(w_ex)
    os.close(w_q)
    child: dict[str, Any] | None = None
    failed_here: tuple[int, str] | None = None
    done: dict[int, tuple[dict[str, int], dict[str, int]]] = {}
    exs = None
    try:
        found, origin = _coverage_pass(table, N, wit, cov, stats, _BEFORE_FORK)
        if found is not None:  # found here, as in place: the child's work is not needed
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            return found, origin, None
        out(f"  coverage pass: {len(wit)} witnesses replayed in lockstep")
        try:
            exs: list[list[Op]] | None = pickle.loads(_read_all(r_ex))
        except Exception:  # noqa: BLE001 - the child crashed before it sent them all
            exs = None
        if exs is not None:

            def child_failed() -> bool:
                nonlocal child
                if child is None and select.select([r_res], [], [], 0)[0]:
                    child = _child_outcome(r_res, pid)
                return child is not None and child.get("example") is not None

            failed_here = _work_queue(table, N, exs, r_q, done, stop=child_failed)
        if child is None:
            child = _child_outcome(r_res, pid)
    except BaseException:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    finally:
        for fd in (r_res, r_ex, r_q):
            with contextlib.suppress(OSError):
                os.close(fd)
    done.update(child.get("done", {}))
    failed = failed_here or child.get("example")
    if failed is None and exs is not None and len(done) == len(exs):
        for c, st_ in done.values():
            cov.counts.update(c)
            stats.update(st_)
        return None, "", None
    # An example failed (here or there), or the child crashed: Hypothesis runs here and reports
    # what it finds as before.  The examples before the first that did not pass (all taken from
    # the queue in order, and all passed) are drawn again without being run: their counts are
    # added here (the steps and examples the state machine counts itself).
    passed = 0
    while passed in done:
        cov.counts.update(done[passed][0])
        passed += 1
    found, origin, blob = explore(passed)
    if found is None and failed is not None:
        raise RuntimeError(
            f"a recorded example failed beside the exploration ({failed}), not in Hypothesis' run"
        )
    return found, origin, blob


def _child_outcome(fd: int, pid: int) -> dict[str, Any]:
    """What the child sent (it writes once, then leaves), with its exit status."""
    import pickle

    data = _read_all(fd)
    _, status = os.waitpid(pid, 0)
    try:
        msg: dict[str, Any] = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a crashed child sends nothing
        return {"why": f"the process ended with status {status} and sent nothing"}
    if status != 0:
        return {"why": f"the process ended with status {status}"}
    return msg


def summary_lines(res: RunResult) -> list[str]:
    c = res.coverage.counts
    rate = res.steps / res.seconds if res.seconds else 0.0
    faults = {k[6:]: v for k, v in sorted(c.items()) if k.startswith("fault ")}
    lines = [
        f"  {res.steps} API operations in {res.stats['(examples)']} Hypothesis examples + the "
        f"witnesses, {res.seconds:.1f} s ({rate:.1f} operations/s)",
        f"  paths: disk restores completed {c['disk restores completed']}, host restores "
        f"{c['host restores completed']}, indexer rebuilds {c['indexer rebuilds']}, hits used "
        f"{c['hits used']} (over restored blocks {c['hits used over restored blocks']}), slides "
        f"during a load {c['slides during a load']}, windows slid to make room "
        f"{c['windows slid to make room']}, loads failed {c['loads failed']}",
        f"  bytes: {c['reads checked']} reads checked, {c['bytes compared']} bytes compared, "
        f"{c['reads over restored blocks']} reads over restored blocks; quiescence checks "
        f"{c['quiescence checks']}",
        "  faults injected: " + (", ".join(f"{k} {v}" for k, v in faults.items()) or "none"),
    ]
    checks = {k[7:]: v for k, v in sorted(c.items()) if k.startswith("check: ")}
    if checks:  # kvstate/api_checks.py
        lines.append("  checked: " + ", ".join(f"{k} {v}" for k, v in checks.items()))
    calls = {k[5:]: v for k, v in sorted(c.items()) if k.startswith("call ")}
    lines.append("  calls: " + ", ".join(f"{k} {v}" for k, v in calls.items()))
    refused = {k[8:]: v for k, v in sorted(c.items()) if k.startswith("refused ")}
    if refused:
        lines.append(
            "  refused (documented, nothing changed): "
            + ", ".join(f"{k} {v}" for k, v in refused.items())
        )
    return lines


def run_api_cli(args: Any, table: Table) -> int:
    """``kvstate fuzz --target kvstate-api``."""
    import shlex
    import sys

    N = args.pool or 4
    ops = frozenset(OPS)
    for name in getattr(args, "skip_op", None) or []:
        if name not in OPS:
            print(
                f"kvstate fuzz: error: unknown API operation {name!r} ({', '.join(OPS)})",
                file=sys.stderr,
            )
            return 2
        ops -= {name}
    if args.bug:
        print(
            "kvstate fuzz: error: --bug plants seeded bugs in --target kvstate only; the API "
            "harness's planted bugs are source mutants (python -m kvstate.api_mutants)",
            file=sys.stderr,
        )
        return 2
    base = ["kvstate", "fuzz", "--target", "kvstate-api", "--pool", str(N)]
    for name in sorted(frozenset(OPS) - ops):
        base += ["--skip-op", name]
    if args.replay is not None:
        text = args.replay[1:] if args.replay.startswith("@") else None
        try:
            trace = parse_ops(open(text).read() if text else args.replay)
        except (OSError, ValueError) as exc:
            print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
            return 2
        print(
            f"kvstate fuzz: target kvstate-api vs table {table.name}, pool N={N}: replaying "
            f"{len(trace)} operations"
        )
        cov = Coverage()
        found = replay(table, N, trace, coverage=cov)
        if found is None:
            print(f"kvstate fuzz: ok, the trace conforms ({len(trace)} operations + quiescence)")
            return 0
        print(
            f"kvstate fuzz: FAILED\n  failure:   {found.signature}\n             "
            + str(found).replace("\n", "\n             ")
        )
        return 1
    seed = args.seed
    if getattr(args, "threads", False):
        from kvstate.api_threads import run_threads

        runs = {"ci": 3, "dev": 20, "nightly": 200}[args.profile]
        first = seed if seed is not None else 0
        print(
            f"kvstate fuzz: target kvstate-api --threads vs table {table.name}, pool N={N}, "
            f"{runs} threaded runs, seeds {first}..{first + runs - 1}",
            flush=True,
        )
        total: Counter[str] = Counter()
        for sd in range(first, first + runs):
            r = run_threads(table, N, seed=sd)
            total.update(r.counts)
            if r.problems:
                print(f"kvstate fuzz: FAILED (threads, seed {sd}, {r.seconds:.1f} s)")
                for p in r.problems:
                    print(f"  {p}")
                print(f"  rerun:     kvstate fuzz --target kvstate-api --threads --seed {sd}")
                return 1
        print(
            f"kvstate fuzz: ok, {runs} threaded runs: {total['sections checked']} critical "
            f"sections explained in lock order, {total['reads checked']} reads byte-checked, "
            f"{total['fault stall']} stalled disk reads, {total['fault abort_in_use']} aborts "
            "inside use, nothing leaked"
        )
        return 0
    if seed is None and args.profile != "ci":
        import random

        seed = random.randrange(2**32)
    prof = PROFILES[args.profile]
    from kvstate.examples_db import database_key, database_spec, open_database
    from kvstate.fuzz_report import api_outcome, emit

    try:
        db = open_database(database_spec(getattr(args, "example_db", None)))
    except ValueError as exc:  # SpecError: a bad --example-db
        print(f"kvstate fuzz: error: {exc}", file=sys.stderr)
        return 2
    key = database_key("kvstate-api", table.name, table.geometry.name, N, (), frozenset(OPS) - ops)
    print(
        f"kvstate fuzz: target kvstate-api (the public API, bytes, faults) vs table "
        f"{table.name}, pool N={N}, profile {args.profile} "
        f"({args.examples or prof['max_examples']} examples x "
        f"{args.steps or prof['stateful_step_count']} operations), seed "
        f"{'derandomized' if seed is None else seed}",
        flush=True,
    )
    res = run_api(
        table,
        N,
        profile=args.profile,
        examples=args.examples,
        steps=args.steps,
        seed=seed,
        ops=ops,
        coverage_pass=not args.no_coverage,
        reproduce=args.reproduce,
        beside=not getattr(args, "code_coverage", False),  # --coverage traces this process
        out=lambda s: print(s, flush=True),
        database=db,
        key=key,
    )
    if res.finding is None:
        from kvstate.api_schedule import run_profile  # the threaded mode's schedules

        failed, threads = run_profile(table, N, args.profile, seed)
        if failed:
            print("\n".join(threads))
            return 1
        print("kvstate fuzz: ok, no nonconformance")
        print("\n".join(summary_lines(res) + threads))
        emit(args, api_outcome(args, table, N, res, {}))
        return 0
    f = res.finding
    trace = res.minimized or list(getattr(f, "api_trace", []))
    before = res.found_len
    print(f"\nkvstate fuzz: FAILED after {res.seconds:.1f} s")
    print(
        f"  found by:  {res.origin}; minimized {before} -> {len(trace)} operations "
        f"({res.replays} fresh replays)"
    )
    print(f"  failure:   {f.signature}")
    print("             " + str(f).replace("\n", "\n             "))
    print("  trace (from a fresh cache, one operation per line; replayable with --replay):")
    for k, o in enumerate(trace, 1):
        print(f"    {k:>3}. {o.render()}")
    print(
        f"  seed:      {'derandomized (profile ci: the same examples every run)' if res.seed is None else res.seed}"
    )
    print(
        f"  blob:      {res.blob or 'none (the deterministic coverage pass found it)' if 'coverage' in res.origin else res.blob or 'none'}"
    )
    rerun = [*base, "--profile", args.profile] + (
        [] if res.seed is None else ["--seed", str(res.seed)]
    )
    if args.no_coverage:
        rerun.append("--no-coverage")
    if getattr(args, "example_db", None) is not None:
        rerun += ["--example-db", args.example_db]
    print(f"  rerun:     {shlex.join(rerun)}")
    if res.blob:
        print(f"  reproduce: {shlex.join([*rerun, '--reproduce', res.blob])}")
    commands = {"rerun": shlex.join(rerun)}
    if res.blob:
        commands["reproduce"] = shlex.join([*rerun, "--reproduce", res.blob])
    commands["replay"] = shlex.join([*base, "--replay", "; ".join(o.render() for o in trace)])
    print(f"  replay:    {commands['replay']}")
    print("\n".join(summary_lines(res)))
    emit(args, api_outcome(args, table, N, res, commands))
    return 1
