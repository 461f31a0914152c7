"""kvstate.impl: the heterogeneous KV-cache allocator users import.

Built from a geometry (and the transition table of :mod:`kvstate.spec`), it keeps one cache
group per kind of state (CSA and HCA compressed KV, indexer keys, SWA window, compressor state)
over device, host and disk tiers, and admits prefix hits only when the spec's four validation
layers hold, evaluated as data on its own metadata.  Start with :class:`HeterogeneousKVCache`.
"""

from .bugs import BUGS, planted
from .cache import Admission, Explanation, HeterogeneousKVCache, Pin, Request, Run, UseContext
from .coordinator import HitSearch, RecoveryPlan, RecoveryStep, Shortening
from .errors import (
    AlreadyReleased,
    CorruptEntry,
    InternalError,
    InvalidArgument,
    KVStateError,
    LayoutError,
    NotReady,
    OutOfCapacity,
    Refused,
    UnknownRequest,
)
from .events import Event, EventKind, EventLog
from .testdata import DeterministicWriter, Writer

__all__ = [
    "BUGS", "Admission", "AlreadyReleased", "CorruptEntry", "DeterministicWriter", "Event",
    "EventKind", "EventLog", "Explanation", "HeterogeneousKVCache", "HitSearch", "InternalError",
    "InvalidArgument", "KVStateError", "LayoutError", "NotReady", "OutOfCapacity", "Pin",
    "RecoveryPlan", "RecoveryStep", "Refused", "Request", "Run", "Shortening", "UnknownRequest",
    "UseContext", "Writer", "planted",
]  # fmt: skip
