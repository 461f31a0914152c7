"""The form every operation and fault of the API target is declared in: one :class:`OpDecl`.

An operation (a public call the harness makes, or a fault it throws at the cache) is written
once, as a declaration beside its handler, in the module that owns it::

    def do_short_read(h: Harness, o: TraceStep) -> int | None:
        ...  # drive the cache (or break something); the request concerned, or None

    DECLS = (
        OpDecl(
            "short_read",                       # the name: TraceStep.name, rule op_short_read, traces
            do_short_read,                      # the handler
            "fault",                            # the spec/api.py API entry that explains it
            lambda s: {"b": s.block},           # the rule's argument strategies (Sizes)
            faults=("short_read",),             # fault kinds it injects ("fault KIND" counters)
            like="read_error",                  # its witnesses: read_error's, with it in place
        ),
    )

Each module of operations exports its ``DECLS``; :mod:`kvstate.targets.api.registry` lists the
modules once and derives everything else from the declarations: the handlers (``OPS``), the
explanations (``MAPPING``), the faults (``FAULT_KINDS``, ``FAULT_OPS``), the state machine's
rules (:mod:`kvstate.targets.api.machine`: one rule ``op_NAME`` per declaration with
``rule=True``, its arguments drawn from ``args(sizes)``) and, with ``like``, scripted walks
(:mod:`kvstate.targets.api.witnesses`).  A new operation in a module already
listed there is that one declaration and its handler; a new module adds itself to the list.

The state machine's rules are collected by name, so the order of declarations does not move
the derandomized ci walk; their names and strategies do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from kvstate.harness.trace import TraceStep
from kvstate.targets.api.base import Harness

Handler = Callable[[Harness, TraceStep], int | None]


@dataclass(frozen=True)
class Sizes:
    """What an operation's argument strategies may depend on: the block size ``L``, the
    chain's blocks ``N``, the request slots ``R`` and the longest lease ``lease_max``."""

    L: int
    N: int
    R: int
    lease_max: int

    @classmethod
    def of(cls, table: Any, N: int) -> Sizes:
        c = table.consts
        return cls(c.L, N, c.R, c.lease_max)

    @property
    def slot(self) -> Any:
        """A harness request slot ``i``."""
        return st.integers(0, self.R - 1)

    @property
    def block(self) -> Any:
        """A block ``b`` of the chain."""
        return st.integers(0, self.N - 1)


def no_args(s: Sizes) -> Mapping[str, Any]:
    """An operation without arguments."""
    return {}


@dataclass(frozen=True)
class OpDecl:
    """One operation: its ``name``, its ``handler`` (``(h, o) -> request slot or None``), the
    ``call`` of ``spec/api.py``'s ``API`` that explains it, its argument strategies (``args``:
    :class:`Sizes` -> {argument: Hypothesis strategy}), the fault kinds it injects, and whether
    the state machine draws it as a rule (``rule=False``: only scripted, e.g. by the
    machine's initializer), ``like``: the operation whose witnesses it joins, and ``disk_only``:
    it acts on the disk tier's files (not drawn over a remote tier)."""

    name: str
    handler: Handler
    call: str
    args: Callable[[Sizes], Mapping[str, Any]] = no_args
    faults: tuple[str, ...] = ()
    rule: bool = True
    # an operation of the same arguments whose scripted walks (kvstate/targets/api/witnesses.py)
    # reach this one's moment too: each is run again with this operation in its place (a fault
    # the random walk rarely meets, such as one of a running disk load, is then injected by
    # every ci run)
    like: str = ""
    # the operation acts on the disk tier's files: not drawn over a remote tier
    disk_only: bool = False


def handlers(decls: Iterable[OpDecl]) -> dict[str, Handler]:
    """``OPS``: name -> handler (a dict the harness looks up at every call: tests may swap one)."""
    out: dict[str, Handler] = {}
    for d in decls:
        if d.name in out:
            raise ValueError(f"API operation {d.name!r} is declared twice")
        out[d.name] = d.handler
    return out


def mapping(decls: Iterable[OpDecl]) -> dict[str, str]:
    """``MAPPING``: name -> the spec/api.py call that explains it."""
    return {d.name: d.call for d in decls}


def fault_kinds(decls: Iterable[OpDecl]) -> tuple[str, ...]:
    """``FAULT_KINDS``: every fault kind some operation injects, in declaration order."""
    return tuple(dict.fromkeys(k for d in decls for k in d.faults))


def fault_ops(decls: Iterable[OpDecl]) -> dict[str, tuple[str, ...]]:
    """``FAULT_OPS``: fault kind -> the operations that inject it."""
    decls = list(decls)
    return {k: tuple(d.name for d in decls if k in d.faults) for k in fault_kinds(decls)}
