"""Runs operations on vLLM's ``Scheduler`` (through :class:`standalone.Engine`), checks after each.

An operation is the toolkit's :class:`~kvstate.harness.trace.TraceStep`; a request argument
(``abort``'s ``req``) is an index into the live requests, taken modulo their number, so any sequence of operations is valid and a failing one can be cut down by
deleting steps.  As it runs, each operation is *resolved* (the request it acted on is named) and
written as a line of the reproducer's program.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvstate.harness.finding import Nonconformance
from kvstate.harness.trace import TraceStep

from . import imports
from .configs import Config

# name -> its parameters, in the order ``standalone.Engine``'s method of that name takes them
OPS: dict[str, tuple[str, ...]] = {
    "arrive": ("family", "shared", "tail", "extra", "max_tokens", "priority", "ext_tokens", "mode"),
    "step": ("seed",),
    "abort": ("req",),
    "reset": (),
}
NAMES = tuple(OPS)
MODES = ("sync", "async", "fail", "syncfail")


@dataclass
class Stats:
    ops: Counter[str] = field(default_factory=Counter)
    paths: Counter[str] = field(default_factory=Counter)
    checks: Counter[str] = field(default_factory=Counter)
    configs: Counter[str] = field(default_factory=Counter)
    per_config: dict[str, Counter[str]] = field(default_factory=dict)
    steps: int = 0


def op(name: str, *values: Any) -> TraceStep:
    """``name`` with its parameters given positionally, in :data:`OPS` order."""
    return TraceStep(name, dict(zip(OPS[name], values, strict=True)))


def draw_op(rng: random.Random, block: int, connector: bool) -> TraceStep:
    """One operation with traffic-like weights: arrivals and steps dominate."""
    u = rng.random()
    if u < 0.30:
        shared = rng.randrange(4) * block + rng.randrange(block // 2 + 1)
        ext = rng.randrange(4) * block if connector and rng.random() < 0.6 else 0
        return op(
            "arrive",
            rng.randrange(3),  # family of the shared prefix
            shared,
            rng.randrange(3, 8),  # family of the tail
            rng.randrange(1, 2 * block + 8),  # tokens after the shared prefix
            rng.randrange(1, 24),  # max_tokens
            rng.randrange(3),  # priority
            ext,
            MODES[rng.randrange(len(MODES))],
        )
    if u < 0.88:
        return op("step", rng.randrange(1 << 16))
    if u < 0.97:
        return op("abort", rng.randrange(64))
    return op("reset")


class Driver:
    """One scheduler built for ``config``, and the program that rebuilds what it did."""

    def __init__(self, config: Config, stats: Stats | None = None) -> None:
        sa = imports.standalone()
        self.sa = sa
        self.config = config
        ns: dict[str, Any] = {"__name__": "kvstate_vllm_layout"}
        exec(compile(config.layout_source, f"<vllm layout {config.layout}>", "exec"), ns)  # noqa: S102
        self.layout = sa.layout_of(ns["make_manager"])
        sched = sa.make_scheduler(self.layout, config.num_blocks, **config.kwargs())
        self.engine = sa.Engine(sched, self.layout["hash_block"])
        self.block = self.layout["sched_block"]
        self.stats = stats or Stats()
        self.trace: list[TraceStep] = []  # the operations run so far, resolved
        self.code: list[str] = [
            "layout = layout_of(make_manager)",
            f"sched = make_scheduler(layout, {config.num_blocks}, **{config.kwargs()!r})",
            'engine = Engine(sched, layout["hash_block"])',
        ]

    def live(self) -> list[str]:
        return [r for r in self.engine.sched.requests if r not in self.engine.gone]

    def run_op(self, i: int, op: TraceStep) -> None:
        """Perform ``op``, then every check; raise a :class:`Nonconformance` on a finding."""
        e = self.engine
        name = op.action
        self.stats.ops[name] += 1
        self.stats.steps += 1
        per = self.stats.per_config.setdefault(self.config.label, Counter())
        per["op:" + name] += 1
        before = dict(e.paths)
        try:
            resolved = self._apply(op)
        except self.sa.StubGap:
            raise
        except Exception as exc:  # noqa: BLE001 - vLLM raising out of a scheduler call
            self.trace.append(op)
            f = Nonconformance(
                "crash",
                (type(exc).__name__,),
                f"step {i} {op.call()}: {type(exc).__name__}: {exc}",
            )
            f.trace = []
            raise f from exc
        self.trace.append(resolved)
        for k, v in e.paths.items():
            if v != before.get(k, 0):
                self.stats.paths[k] += v - before.get(k, 0)
                per["path:" + k] += v - before.get(k, 0)
        found = []
        for check, fn in self.sa.CHECKS.items():
            self.stats.checks[check] += 1
            found += [(check, m) for m in fn(e)]
        if found:
            kinds = tuple(dict.fromkeys(c for c, _ in found))
            raise Nonconformance(
                kinds[0],
                kinds,
                f"step {i} {resolved.call()}: " + "; ".join(f"[{c}] {m}" for c, m in found),
            )

    def _apply(self, op: TraceStep) -> TraceStep:
        e = self.engine
        name, args = op.action, tuple(op.inputs.values())
        if name == "arrive":
            rid = e.arrive(*args)
            self.code.append(f"engine.arrive{args!r}  # {rid}")
            return op
        if name == "step":
            self.code.append(f"engine.step({args[0]})")
            e.step(args[0])
            return op
        if name == "abort":
            live = self.live()
            if not live:
                return TraceStep("abort", {"req": ""})
            req = args[0]
            rid = req if isinstance(req, str) else live[req % len(live)]
            self.code.append(f"engine.abort({rid!r})")
            e.abort(rid)
            return TraceStep("abort", {"req": rid})
        if name == "reset":
            self.code.append("engine.reset()")
            e.reset()
            return op
        raise ValueError(f"unknown operation {op!r}")
