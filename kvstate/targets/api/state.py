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

import operator
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep
from kvstate.model.apimap import Explainer, after_restart, state_diff
from kvstate.model.concrete import KeptMachine, Machine
from kvstate.spec.api import API, RESTART_KEEPS
from kvstate.spec.phases import CKV, Pipe
from kvstate.spec.state import ConcreteState
from kvstate.spec.table import Scope, Table
from kvstate.targets.api.accounting import accounting, drained_idle
from kvstate.targets.api.base import _EVENTS_OF, NAMESPACE, Coverage, Live, op
from kvstate.targets.api.bytes import check_bytes, read_released
from kvstate.targets.api.faults import _FULL, _install_full_disk
from kvstate.targets.api.geometry import renewed
from kvstate.targets.api.graphs import StaleAt, staled
from kvstate.targets.api.registry import MAPPING, OPS
from kvstate.targets.api.remote import cache_kwargs as remote_kwargs
from kvstate.targets.api.remote import release as remote_release
from kvstate.targets.api.stepwise import fails as stepwise_fails
from kvstate.testing.adapter import observe_reader


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
        self.scale = 1  # token counts' factor: another geometry's block (targets/api/geometry.py)
        self.cov = coverage if coverage is not None else Coverage()
        self.threads = threads
        self.cache_kwargs = {**remote_kwargs(), **dict(cache_kwargs or {})}  # (remote.py)
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
        # the documented refusal the current call raised, and its table call (targets/api/refusals.py)
        self.refusal: BaseException | None = None
        self.refusal_call = ""
        self.disk_full = False
        self.foreign_stored: set[int] = set()  # other namespaces that stored blocks
        self.variants_stored: set[int] = set()  # kvstate/targets/api/prefix.py: edits that stored
        self.bad_input_left: list[str] = []  # kvstate/targets/api/inputs.py
        self.published: dict[int, dict[str, int]] = {}  # block -> its disk entry's header
        self.ended: Live | None = None  # the request the current call finished
        self.foreign_slot: int | None = None
        self.restored: set[int] = set()  # blocks loaded back since they were last written
        # the chain's block events the current call emitted: (kind, block, tier)
        self.call_events: list[tuple[str, int, str]] = []
        # files kvstate did not write, planted in its directory: name -> content (left alone)
        self.foreign_files: dict[str, bytes] = {}
        self.steps: list[TraceStep] = []
        self.call_override: str | None = None
        # what the library shows after each job step of the current drain (manual pipelines)
        self.drained: list[dict[str, Any]] | None = None
        self.cache: Any = None
        self.returned: Any = None  # what the current maintenance call returned
        self._open()
        from kvstate.targets.api.checks import make_checks

        self.checks = make_checks(self)  # kvstate/targets/api/checks.py: orders, prefixes, pools

    # -- lifecycle --------------------------------------------------------------------------
    def open_kwargs(self) -> dict[str, Any]:
        """The cache's constructor arguments (kvstate/targets/api/stored.py opens it refused, too)."""
        from kvstate.impl.testdata import DeterministicWriter

        kw = dict(
            table=self.table,
            writer=DeterministicWriter(),  # the content the byte checks recompute
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

    def renew(self, table: Table, **kw: Any) -> None:
        """This harness's own state anew on ``table`` (``geometry``: an example on another
        geometry); a subclass's own state, such as a test's log of the operations, is kept."""
        ApiHarness.__init__(self, table, self.N, **kw)

    def close(self) -> None:
        try:
            if self.cache is not None:
                self.cache.close()
            remote_release(self)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- observation ------------------------------------------------------------------------
    def observe(self) -> dict[str, Any]:
        view = self.view
        with view.lock:
            return self._read(view, view.meta, self._gather, view.slots[: self.R])

    def accounting(self) -> list[str]:
        """Pool counters against what the blocks hold (kvstate/targets/api/accounting.py)."""
        return accounting(self)

    def drained_idle(self) -> list[str]:
        """Nothing left waiting after a drain (kvstate/targets/api/accounting.py)."""
        return drained_idle(self)

    def _check_events(
        self, o: TraceStep, before: ConcreteState, steps: Sequence[tuple[str, dict[str, int]]]
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
            if b is not None and staled(s, nxt):
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
        exc.trace = list(self.steps)
        return exc

    # -- bytes (kvstate/targets/api/bytes.py) --------------------------------------------------------
    def check_bytes(self, run: Any, want: np.ndarray, who: str) -> None:
        check_bytes(self, run, want, who)

    def read_released(self, i: int) -> None:
        read_released(self, i)

    # -- one operation ----------------------------------------------------------------------
    def apply(self, o: TraceStep) -> None:
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
        renewing = raised is None and renewed(self, o, before)  # (targets/api/geometry.py)
        if not renewing and o.name == "restart":
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
        elif not renewing:
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
                self.refusal, self.refusal_call = raised, call  # (kvstate/targets/api/refusals.py)
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
                    ex = self._explain(
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
        if o.name in ("drain", "drain_mixed") and not self.threads and raised is None:
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

    def _explain(self, call: str, before: ConcreteState, obs: Mapping[str, Any], **kw: Any) -> Any:
        """The explainer's answer, consistent with the call's ``stale_graph`` events where one
        is: several orders of the same steps may explain the end state, and which block's
        move staled a captured graph tells them apart (:class:`StaleAt`).  Where none is
        consistent, the answer of the end state alone (the event check then reports it)."""
        stale = frozenset(b for k, b, _ in self.call_events if k == "stale_graph")
        if stale:
            ex = self.explainer.explain(call, before, obs, steer=StaleAt(stale), **kw)
            if ex.steps is not None:
                return ex
        return self.explainer.explain(call, before, obs, **kw)

    def _unexplained(
        self,
        o: TraceStep,
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
        o: TraceStep,
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
            ex = self._explain("drain", cur, seen, forbid=forbid, ignore=ign, fmts=self._fmts(cur))
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

    def _ticks(self, call: str, o: TraceStep) -> int | None:
        """The binding of the call's ticks parameters (``ApiCall.ticks`` in spec/api.py)."""
        entry = API.get(call)  # (an ``act``'s call is one action: kvstate/targets/api/single.py)
        kind = entry.ticks if entry is not None else None
        if kind == "arg":
            return o.arg("t")
        if kind == "lifetime" and "i" in o.inputs:
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

    def _forbid(self, o: TraceStep) -> set[tuple[str, int]]:
        """What the world rules out: a sound entry's load does not fail, a corrupt one's never
        completes, nothing is spilled to a full disk."""
        out: set[tuple[str, int]] = set()
        fails = stepwise_fails(self, o)  # kvstate/targets/api/stepwise.py: a read that fails
        for b in range(self.N):
            if b in self.corrupt and self.corrupt[b] != "header" or b in self.read_error | fails:
                out.add(("load_done", b))
            elif b not in self.read_error | fails and b not in self.corrupt:
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
        from kvstate.targets.api.single import settle

        settle(self)  # what single actions left half done (kvstate/targets/api/single.py)
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
