"""Every operation of the API target, and the tables derived from their declarations.

Each module of operations declares its own (``DECLS``, in the form of
:mod:`kvstate.targets.api.declare`); :data:`MODULES` lists those modules once, and everything
else is derived here: the handlers (``OPS``), the ``spec/api.py`` call that explains each
(``MAPPING``), the fault kinds (``FAULT_KINDS``) and the operations that inject each
(``FAULT_OPS``).  The state machine's rules are derived from the same list
(:mod:`kvstate.targets.api.machine`).  A module of new operations adds itself to
:data:`MODULES`; nothing else names its operations.
"""

from __future__ import annotations

from kvstate.calls import parse_calls
from kvstate.harness.trace import TraceStep
from kvstate.spec.api import API
from kvstate.targets.api import (
    actmaint,
    args,
    construct,
    constvals,
    covreach,
    damage,
    directio,
    exhaust,
    facade,
    forms,
    geometry,
    graphs,
    handed,
    inputs,
    interpreted,
    jobfaults,
    libdrive,
    mixedload,
    notinuse,
    ops,
    pincap,
    pools,
    prefix,
    refusedjobs,
    refusedwrites,
    registered,
    remote,
    remoteargs,
    remotecalls,
    remotefull,
    remoteheaders,
    remotesteps,
    remotewire,
    rowmemo,
    shortreads,
    single,
    slotforms,
    slotsfull,
    stated,
    stepwise,
    stored,
    storerun,
    strays,
    swaout,
    twonode,
    unlinks,
    unservable,
    viewcontract,
    writerfails,
)
from kvstate.targets.api.declare import OpDecl, fault_kinds, fault_ops, handlers, mapping

# the modules of operations, in the order their operations are listed (reports, errors)
MODULES = (
    ops,
    prefix,
    inputs,
    args,
    pools,
    damage,
    graphs,
    stored,
    exhaust,
    geometry,
    stepwise,
    refusedwrites,
    single,
    mixedload,
    jobfaults,
    facade,
    handed,
    remote,
    remoteargs,
    remotecalls,
    remotefull,
    remoteheaders,
    remotesteps,
    remotewire,
    twonode,
    writerfails,
    pincap,
    interpreted,
    forms,
    swaout,
    directio,
    unlinks,
    registered,
    libdrive,
    construct,
    actmaint,
    slotsfull,
    notinuse,
    slotforms,
    storerun,
    viewcontract,
    unservable,
    rowmemo,
    refusedjobs,
    covreach,
    stated,
    shortreads,
    strays,
    constvals,
)

DECLARED: tuple[OpDecl, ...] = tuple(d for m in MODULES for d in m.DECLS)
OPS = handlers(DECLARED)  # name -> handler (the harness looks it up at every call)
MAPPING = mapping(DECLARED)  # name -> the spec/api.py call that explains it
FAULT_KINDS = fault_kinds(DECLARED)  # the fault kinds injected ("fault KIND" counters)
FAULT_OPS = fault_ops(DECLARED)  # fault kind -> the operations that inject it
# drawn only by a run with a remote tier (kvstate/targets/api/remote.py); the others by default
REMOTE_ONLY = frozenset(
    d.name
    for m in (
        remote,
        remoteargs,
        remotecalls,
        remotefull,
        remoteheaders,
        remotesteps,
        remotewire,
        twonode,
    )
    for d in m.DECLS
)
DEFAULT_OPS = frozenset(OPS) - REMOTE_ONLY


def drawn_ops() -> frozenset[str]:
    """The operations a run draws: the default ones; in a run with a remote tier
    (``remote.WORLD``), the core operations but those on the disk tier's files, the variants,
    and the remote ones (node B's drawn one with ``--nodes 2``: kvstate/targets/api/twonode.py)."""
    if remote.WORLD is None:
        return DEFAULT_OPS
    core = frozenset(d.name for m in (ops, prefix) for d in m.DECLS if not d.disk_only)
    return core | (REMOTE_ONLY - (frozenset() if remote.WORLD.nodes > 1 else twonode.FUZZ))


_UNKNOWN = {d.name: d.call for d in DECLARED if d.call not in API}
if _UNKNOWN:
    raise ValueError(f"API operations explained by calls spec/api.py does not have: {_UNKNOWN}")


def parse_ops(text: str) -> list[TraceStep]:
    """``'request(i=0, n=49, life=2); admit(i=0)'`` (or one per line, as reports print them;
    read by :func:`kvstate.calls.parse_calls`)."""
    out = []
    for name, a in parse_calls(text):
        if name not in OPS:
            raise ValueError(f"cannot parse API operation {name!r} (known: {', '.join(OPS)})")
        out.append(TraceStep(name, dict(a)))
    return out
