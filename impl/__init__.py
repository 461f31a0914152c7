"""kvstate.impl: the heterogeneous KV-cache allocator users import.

Built from a geometry (and the transition table of :mod:`kvstate.spec`), it keeps one cache
group per kind of state (CSA and HCA compressed KV, indexer keys, SWA window, compressor state)
over device, host and disk tiers, and admits prefix hits only when the spec's four validation
layers hold, evaluated as data on its own metadata.  Start with :class:`HeterogeneousKVCache`.

The request path (``core``, ``cache``) may run compiled by mypyc: see :mod:`.native`.
"""

from .native import install_guard, native_modules

install_guard()  # before the compiled modules are imported: a stale build runs its sources

from . import _aot  # noqa: E402
from .cache import Admission, Explanation, HeterogeneousKVCache, Pin, Request, Run, UseContext  # noqa: E402
from .coordinator import HitSearch, Shortening  # noqa: E402
from .errors import (  # noqa: E402
    AlreadyReleased,
    CorruptEntry,
    DirectoryInUse,
    DiskWriteError,
    InternalError,
    InvalidArgument,
    KVStateError,
    LayoutError,
    NotReady,
    OutOfCapacity,
    Refused,
    StorageError,
    UnknownRequest,
)
from .events import Event, EventKind, EventLog  # noqa: E402
from .projection import RecoveryPlan, RecoveryStep  # noqa: E402
from .remote import RemoteConfig  # noqa: E402
from .testdata import DeterministicWriter  # noqa: E402
from .twins import register_twins  # noqa: E402
from .writer import HandedRows, RowsNotHanded, Writer  # noqa: E402

# the compiled twins of the generated guards and search (kvstate/buildtools/aotgen.py): used for exactly the
# sources they were made from, and only when compiled (interpreted they would gain nothing)
if "_aot" in native_modules():  # pragma: no cover: compiled build only (coverage runs pure)
    register_twins(_aot.TWINS)

__all__ = [
    "Admission", "AlreadyReleased", "CorruptEntry", "DirectoryInUse", "DiskWriteError", "DeterministicWriter", "Event",
    "EventKind", "EventLog", "Explanation", "HandedRows", "HeterogeneousKVCache", "HitSearch", "InternalError",
    "InvalidArgument", "KVStateError", "LayoutError", "NotReady", "OutOfCapacity", "Pin",
    "RecoveryPlan", "RecoveryStep", "Refused", "RemoteConfig", "Request", "RowsNotHanded", "Run", "Shortening", "StorageError",
    "UnknownRequest",
    "UseContext", "Writer", "native_modules",
]  # fmt: skip

# the public classes' signatures with their declared types (the compiled classes keep none)
from . import handles  # noqa: E402
from .signatures import attach  # noqa: E402

# (and the cache's base, whose ``append``, ``finish`` and ``abort`` the cache inherits)
attach([*(globals()[name] for name in __all__), handles.RequestPath])
del attach
