"""Threads racing against pinned use: an evictor, an offloader/spiller/dropper and a clock run
against requests that hold pins; a pinned block's generation, address, phase and bytes must not
change while it is in use.  With ``evict_ignores_pins`` planted the same race must be caught.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import torch

from kvstate.impl import EventKind, KVStateError, NotReady
from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small
from kvstate.testing import seeded

G = small()
L = G.lcm_tokens


def stress(
    bugs: tuple[str, ...], seconds: float, stop_on_violation: bool = False
) -> dict[str, Any]:
    c = seeded.cache(
        G, bugs=bugs, executors="threads", device_blocks=24, host_blocks=12, disk_blocks=40
    )
    # prompts sharing prefixes, so requests hit each other's blocks
    base = harness_tokens(8 * L, seed=11)
    prompts = [base[: k * L + 1] for k in (2, 3, 5, 8)] + [
        harness_tokens(4 * L + 1, seed=s) for s in range(12)
    ]
    stop = threading.Event()
    out: dict[str, Any] = {
        "violations": [],
        "errors": [],
        "uses": 0,
        "hits": 0,
        "evicted": 0,
        "offloaded": 0,
    }
    lock = threading.Lock()

    def note(key: str, value: Any = 1) -> None:
        with lock:
            if isinstance(out[key], list):
                out[key].append(value)
            else:
                out[key] += value

    def guarded(fn: Any) -> Any:
        def run() -> None:
            try:
                while not stop.is_set():
                    fn()
            except Exception as exc:  # noqa: BLE001 - reported by the test
                note("errors", f"{fn.__name__}: {type(exc).__name__}: {exc}")
                stop.set()

        return run

    def ticker() -> None:
        c.tick(1)
        time.sleep(0.002)

    def evictor() -> None:
        c.evict(3)
        time.sleep(0.001)

    def offloader() -> None:
        c.offload(2)
        c.spill(1)
        c.drop(1)
        time.sleep(0.002)

    def user() -> None:
        rng = random.Random(threading.get_ident())
        toks = rng.choice(prompts)
        req = c.request(toks, lifetime=rng.randint(1, 2))
        try:
            adm = c.admit(req)
            ctx = c.use(adm, timeout=5)
        except (NotReady, KVStateError):
            if req.slot is not None:
                c.abort(req)
            c.forget(req)
            return
        with ctx as run:
            core = c.inspect()
            with core.lock:
                slots = [(core.meta.slot[p.rid], core.meta.swa_pages[p.rid]) for p in run.pins]
            before = [core.tiers.device_block(s, sw) for s, sw in slots]
            note("uses")
            note("hits", run.hit_tokens // L)
            for _ in range(3):  # hold the pins while the others race
                time.sleep(rng.random() * 0.004)
                bad = run.verify_pins()
                after = [core.tiers.device_block(s, sw) for s, sw in slots]
                changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True))
                           if not all(torch.equal(a, b) for a, b in zip(x, y, strict=True))]  # fmt: skip
                if bad or changed:
                    note("violations", (bad, changed))
                    if stop_on_violation:
                        stop.set()
                    break
        c.forget(req)
        time.sleep(rng.random() * 0.002)  # arrivals, not a busy loop: the maintainers get turns

    def covered() -> bool:
        with c.inspect().lock:  # the event log is appended under the cache's lock
            return bool(c.events.of(EventKind.LOADED)) and any(
                e.tier == "host" for e in c.events.of(EventKind.STORED)
            )

    threads = [
        threading.Thread(target=guarded(f), daemon=True)
        for f in (ticker, evictor, offloader, user, user, user)
    ]
    for t in threads:
        t.start()
    # run ``seconds``, and on (up to 3x that) until the race has offloaded and loaded blocks: how
    # fast each thread loops depends on the machine, the coverage the test asserts should not
    start = time.time()
    while not stop.is_set() and (
        time.time() < start + seconds or (time.time() < start + 3 * seconds and not covered())
    ):
        time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    out["hung"] = [t.name for t in threads if t.is_alive()]
    out["evicted"] = len(c.events.of(EventKind.EVICTED))  # by the evictor and by allocation
    out["offloaded"] = sum(1 for e in c.events.of(EventKind.STORED) if e.tier == "host")
    out["loaded"] = len(c.events.of(EventKind.LOADED))
    out["pipeline_errors"] = c.pipelines.errors()
    out["pinned_after"] = c.inspect().pinned_blocks
    c.close()
    return out


def test_no_pin_violations_under_racing_threads() -> None:
    r = stress((), seconds=3.0)
    assert r["hung"] == [] and r["errors"] == [] and r["pipeline_errors"] == []
    assert (
        r["uses"] > 20
        and r["hits"] > 0
        and r["evicted"] > 0
        and r["offloaded"] > 0
        and r["loaded"] > 0
    )
    assert r["violations"] == []
    assert r["pinned_after"] == 0


@pytest.mark.parametrize("attempt", range(1))
def test_evict_ignores_pins_is_detected(attempt: int) -> None:
    r = stress(("evict_ignores_pins",), seconds=6.0, stop_on_violation=True)
    assert r["hung"] == []
    assert r["violations"], r
