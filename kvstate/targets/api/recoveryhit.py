"""Which hit an admission that starts a recovery picks: the longest its recovery can serve.

The table explains an admission by ``admit touch* match pin (validate | RECOVER* FINALIZE?)``
(``spec/api.py``) with *any* hit the guards allow, so refinement alone accepts an admission
whose recovery aims short (a projection that forgets a pipeline's last block, a search that
stops a block early) or long (a hit the recovery can never validate: it is cut at ``use``,
which the table explains too).  ``ApiHarness._check_longest`` checks an admission validated at
once against the model's longest hit valid without recovery; this check holds both branches,
an admission that pinned a hit and started recovery steps and one validated at once, to the
longest hit a recovery serves.

The model is run on from the state just before ``match`` with a hit ``h``: ``match``, ``pin``,
then the recovery's and the pipelines' actions (``spec/api.py``'s ``RECOVER`` and ``JOB``
macros, read here, never restated) as the world allows them (a sound entry's load completes, a
corrupt one's fails: the harness's ``_forbid``), room made only where nothing else can run;
``h`` is *served* if ``validate`` then holds.

* **too short**: a whole-block hit longer than the one chosen (up to the request's longest) is
  served, and no block of it is one whose stored bytes the harness damaged (the library cannot
  know the damage before it reads it; the model does not see it);
* an admission **validated at once** (no recovery started) is held to the same: no longer hit
  a recovery would serve (the library's projection may not stop short of a stored block);
* **too long**: where the world broke nothing (no damage, no armed fault, no damaged tail), the
  chosen hit itself is served.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvstate.spec.api import MACROS
from kvstate.spec.phases import Req
from kvstate.spec.state import ConcreteState
from kvstate.targets.api.base import CallCheck

Step = tuple[str, dict[str, int]]


def _expand(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
    """The action names a ``spec/api.py`` macro stands for (its macros expanded)."""
    out: set[str] = set()
    for t in MACROS[name].replace("(", " ").replace(")", " ").replace("|", " ").split():
        t = t.rstrip("*?+")
        if t.isupper() and t in MACROS and t not in seen:
            out |= _expand(t, seen | {name})
        elif t.isidentifier() and not t.isupper():
            out.add(t)
    return out


ROOM = frozenset(_expand("ROOM"))
# what may run between an admission's pin and its finalization: its recovery steps and the
# pipelines' job steps (their follow-ups included)
RECOVERY = frozenset(_expand("RECOVER") | _expand("JOB")) - ROOM


def served(
    m: Any, s: ConcreteState, r: int, forbid: set[tuple[str, Any]], trail: list[Step] | None = None
) -> bool:
    """Whether ``validate`` of request ``r`` holds once the recovery and the pipelines have run
    on from ``s`` (room made only where nothing else is enabled); the actions run go to
    ``trail``."""
    for _ in range(300):
        if m.is_enabled(s, "validate", {"r": r}):
            return True
        nxt = None
        for n, p in m.enabled(s):
            if (n, p.get("b")) in forbid:
                continue
            if n in RECOVERY:
                nxt = (n, p)
                break
            if nxt is None and n in ROOM:
                nxt = (n, p)
        if nxt is None:
            return False
        s = m.step(s, *nxt)
        if trail is not None:
            trail.append(nxt)
    return False


Plan = list[tuple[int, str, bool, int, str]]


def model_plan(m: Any, table: Any, s: ConcreteState, trail: Sequence[Step], blocks: int) -> Plan:
    """The recovery plan of the first ``blocks`` blocks as the model's run ``trail`` from ``s``
    (the state the admission pinned its hit in) carries it out: each recovery transition the
    recovery fires itself (``Table.recovery.fired``), on the pipeline it starts, and for each
    job already running at ``s``, the transition that ends it (a wait); each with the cache
    state its pipeline restores.  Sorted: the blocks' plans interleave in a run."""
    rec = table.recovery
    if rec is None:
        return []
    out: Plan = []
    running = {(b, k): s.values[v][b] != 0 for b in range(blocks) for k, v in enumerate(rec.pipes)}
    for n, p in trail:
        nxt = m.step(s, n, p)
        b = p.get("b")
        if n in rec.transitions and b is not None and b < blocks:
            for k, v in enumerate(rec.pipes):
                old, new = s.values[v][b], nxt.values[v][b]
                if old == new:
                    continue
                pipe = new if new != 0 else old
                if n in rec.fired:
                    out.append((b, n, False, int(pipe), rec.restores[pipe]))
                elif new == 0 and running[(b, k)]:
                    out.append((b, n, True, int(old), rec.restores[old]))
                running[(b, k)] = False
        s = nxt
    return sorted(out)


# an admission's public ``state`` for each request phase the model ends an ``admit`` in
_STATE = {Req.PINNED: "pending", Req.VALIDATED: "validated", Req.RECOMPUTE: "downgraded"}


def check_admission(
    h: Any,
    o: Any,
    r: int,
    lv: Any,
    end: ConcreteState,
    before: ConcreteState | None = None,
    steps: Sequence[Step] = (),
) -> None:
    """The public fields of the request's admission (and, in use, of its run) against the
    model's request after the call: the hit it holds, and the phase its ``state`` names."""
    adm = lv.req.admission
    if adm is None:
        return
    phase, hit = Req(end.values["phase"][r]), end.values["hit"][r]
    want = _STATE.get(phase) if o.name == "admit" else None
    bad = []
    if want is not None and adm.state != want:
        bad.append(f"state {adm.state!r} where the model's request is {phase.name}")
    if phase != Req.RECOMPUTE and adm.state != "downgraded" and adm.hit_tokens != hit:
        bad.append(f"hit_tokens {adm.hit_tokens} where the model's hit is {hit}")
    if adm.state == "downgraded" and (adm.hit_tokens != 0 or hit != 0):
        bad.append(
            f"a downgraded admission (hit_tokens {adm.hit_tokens}) where the model's hit is {hit}"
        )
    if o.name == "use" and adm.state == "pending":
        bad.append("still pending once in use")
    run = lv.run if o.name == "use" else None
    if run is not None and run.hit_tokens != (0 if phase == Req.RECOMPUTE else hit):
        bad.append(f"the run's hit_tokens {run.hit_tokens} where the model's hit is {hit}")
    h.cov.add("check: an admission's public fields against the model")
    if o.name == "admit" and steps and [n for n, _ in steps][-1] == "downgrade":
        # given up at the cap: its rejection names the conjuncts of ``pin`` the model finds
        # false at the hit it tried (the explanation's longest search: the model's own
        # explanation may match any length before ``downgrade``)
        e = adm.explanation
        tried = max(e.immediate.hit, e.after_recovery.hit if e.after_recovery else 0)
        t = before
        for n, p in steps:
            if n == "match":
                break
            t = h.machine.step(t, n, p)
        if not h.machine.is_enabled(t, "match", {"r": r, "h": tried}):
            bad.append(f"a hit of {tried} tokens tried, which the model cannot match")
            failed: list[str] = []
        else:
            t = h.machine.step(t, "match", {"r": r, "h": tried})
            failed = h.machine.failed_conjuncts(t, "pin", {"r": r})
        why = adm.explanation.rejection or ""
        named = (
            why.split(" refused: guard ", 1)[1].split(" false", 1)[0]
            if " refused: guard " in why
            else ""
        )
        if sorted(x.strip() for x in named.split(",") if x.strip()) != sorted(failed):
            bad.append(f"rejection {why!r} where the model's pin fails {failed}")
        h.cov.add("check: an admission given up at the cap names the model's conjuncts")
    if bad:
        raise h.fail("admission-fields", [o.name], f"{o.render()}: " + "; ".join(bad))


class RecoveryHit(CallCheck):
    def __init__(self) -> None:
        self.forbid: set[tuple[str, Any]] = set()

    def before(self, h: Any, o: Any) -> None:
        self.forbid = h._forbid(o) if o.name == "admit" else set()

    def after(
        self, h: Any, o: Any, before: ConcreteState, steps: Sequence[Step], end: ConcreteState
    ) -> None:
        if o.name == "use" and h.live[o.arg("i")] is not None:
            lv = h.live[o.arg("i")]
            if lv.req.slot is not None:
                check_admission(h, o, lv.req.slot.index, lv, end)
        names = [n for n, _ in steps]
        if o.name == "admit" and "match" in names:
            r = next(p["r"] for n, p in steps if n == "match")
            lv = next(
                (
                    x
                    for x in h.live
                    if x is not None and x.req.slot is not None and x.req.slot.index == r
                ),
                None,
            )
            if lv is not None:
                check_admission(h, o, r, lv, end, before, steps)
        if o.name != "admit" or "match" not in names or "pin" not in names:
            return
        # validated at once: no recovery started, so none may serve a longer hit either (the
        # admission asked for one: ``admit``'s ``recover`` defaults to True)
        at_once = "validate" in names
        m, L = h.machine, h.L
        s = before
        for n, p in steps:
            if n == "match":
                break
            s = m.step(s, n, p)
        r, chosen = next((p["r"], p["h"]) for n, p in steps if n == "match")
        lv = next(
            (
                x
                for x in h.live
                if x is not None and x.req.slot is not None and x.req.slot.index == r
            ),
            None,
        )
        if lv is None:
            return
        h_max = max(len(lv.req.tokens) - 1, 0)
        # (and the records the library marked corrupt: a failed load's mark is checked at the
        # failure, kvstate/targets/api/corruptmarks.py; a tail's, by the tail damage here)
        marked = {b for b in range(h.N) if h.view.meta.corrupt[h.rids[b]]}
        broken = set(h.corrupt) | h.read_error | h.tail_damaged | marked

        def serves(hit: int) -> bool:
            t = s
            for n, p in (("match", {"r": r, "h": hit}), ("pin", {"r": r})):
                if not m.is_enabled(t, n, p):
                    return False
                t = m.step(t, n, p)
            return served(m, t, r, self.forbid)

        for hit in range(h_max - h_max % L, chosen, -L):
            if broken & set(range(hit // L)):
                continue
            if serves(hit):
                raise h.fail(
                    "short-hit",
                    ["admit-recovery"],
                    f"{o.render()} chose a hit of {chosen} tokens and "
                    + ("validated it at once" if at_once else "started its recovery")
                    + f", but the model's recovery serves {hit}",
                )
        if at_once:
            h.cov.add("check: an admission validated at once against the longest recovery serves")
            return
        h.cov.add("check: a recovering admission's hit against the longest served")
        if broken:
            return
        if chosen and not serves(chosen):
            raise h.fail(
                "long-hit",
                ["admit-recovery"],
                f"{o.render()} chose a hit of {chosen} tokens that no run of its recovery "
                "validates (nothing was damaged)",
            )
        # the plan the admission shows (``Admission.recovery``) against the model's run of it
        at = next(i for i, (n, _) in enumerate(steps) if n == "pin") + 1
        t = before
        for n, p in steps[:at]:
            t = m.step(t, n, p)
        trail = list(steps[at:])
        if not served(m, end, r, self.forbid, trail):
            return
        adm = lv.req.admission
        if adm is None:
            return
        got = sorted(
            (x.block, x.action, bool(x.wait), int(x.pipeline), x.state) for x in adm.recovery.steps
        )
        self.started(h, o, steps, adm)
        want = model_plan(m, h.table, t, trail, -(-chosen // L))
        h.cov.add("check: a recovery plan against the model's run of it")
        groups = {
            k: sorted((x.block, x.action) for x in v) for k, v in adm.recovery.by_state().items()
        }
        states = {x[4] for x in want}
        if got == want and groups != {
            k: sorted((b, a) for b, a, _, _, s in want if s == k) for k in states
        }:
            raise h.fail(
                "recovery-plan",
                ["admit-recovery"],
                f"{o.render()}: the plan's steps by the state they restore {groups} are not "
                "its steps' own states",
            )
        if got != want:
            raise h.fail(
                "recovery-plan",
                ["admit-recovery"],
                f"{o.render()}: the admission's recovery plan {got} is not the model's run of "
                f"it {want}",
            )

    def started(self, h: Any, o: Any, steps: Sequence[Step], adm: Any) -> None:
        """Each step of the plan the recovery fires itself was fired by the admission (its
        explanation holds it), or waits where the library documents it waits: a load past
        the I/O cap queued, a rebuild until its block's load lands; a load that found no
        device room ends the plan (the admission is truncated at use)."""
        rec = h.table.recovery
        fired = {(p.get("b"), n) for n, p in steps if n in rec.fired}
        queued, rebuild = set(h.view.io_waiting), set(h.view.want_rebuild)
        for x in adm.recovery.steps:
            if x.wait or (x.block, x.action) in fired:
                continue
            if x.action == "load_start":
                if x.rid in queued:
                    continue
                break  # no device room: the rest of the plan is not started
            if x.action == "rebuild_start" and x.rid in rebuild:
                continue
            raise h.fail(
                "recovery-plan",
                ["admit-recovery"],
                f"{o.render()}: the plan's {x.action} of block {x.block} was neither fired nor "
                "left waiting",
            )
        h.cov.add("check: a recovery plan's steps started")
