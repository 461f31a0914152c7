"""The parts a table is made of: variables, parameters, guard conjuncts, actions, invariants,
the declarations its checks and tools read (read safety, locality, coverage, completeness) and
the constants its callables read as ``s.k``.

They are declared apart from :class:`kvstate.spec.table.Table`, which validates itself when it is
built (:mod:`kvstate.spec.validate`): validation reads these parts, so they must not sit in the
module that calls it.  ``kvstate.spec.table`` re-exports every one of them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import SpecError
from .geometry import Geometry
from .layers import supported_formats

Fn = Callable[..., Any]


class Scope(enum.Enum):
    """Where a variable lives: one value, one per pool block, one per request, or both."""

    GLOBAL = "global"
    BLOCK = "block"
    REQ = "request"
    REQ_BLOCK = "request x block"


class ParamKind(enum.Enum):
    """Typed action parameters; the interpreters know each kind's domain."""

    BLOCK = "block"  # 0 <= b < N
    REQ = "request"  # 0 <= r < R (expanded per request by the encoder)
    TOKENS = "tokens"  # 0 <= h <= N * L
    ADDR = "address"  # a buffer address, >= 0
    TICKS = "ticks"  # 1 <= t <= lease_max
    FMT = "format"  # a Fmt value


@dataclass(frozen=True)
class Var:
    """A state variable.  ``domain`` (an IntEnum) makes it an enumerated phase variable."""

    name: str
    scope: Scope
    init: Fn  # init(k, b) for block-scoped vars, init(k) otherwise; k = Consts
    domain: type[enum.IntEnum] | None = None
    is_bool: bool = False
    nonneg: bool = False
    ghost: bool = False
    doc: str = ""
    # an address (a buffer's location): its values are names, not quantities; a target chooses
    # its own, so a fuzzer compares them up to renaming and translates the model's ghost ones
    address: bool = False


@dataclass(frozen=True)
class Param:
    name: str
    kind: ParamKind


@dataclass(frozen=True)
class Conjunct:
    """One named conjunct of a guard, so that it can be dropped, reported and cited."""

    name: str
    fn: Fn  # fn(s, p) -> bool
    doc: str = ""


@dataclass(frozen=True)
class Action:
    """A transition: typed parameters, a guard of named conjuncts, updates within a frame."""

    name: str
    params: tuple[Param, ...]
    guard: tuple[Conjunct, ...]
    updates: Mapping[str, Fn]  # var name -> fn(s, p); request-scoped vars are those of p.r
    modifies: frozenset[str]
    component: str
    doc: str = ""

    def conjunct(self, name: str) -> Conjunct:
        for c in self.guard:
            if c.name == name:
                return c
        raise SpecError(f"action {self.name!r} has no guard conjunct {name!r}")

    @property
    def request_scoped(self) -> bool:
        return any(p.kind is ParamKind.REQ for p in self.params)


@dataclass(frozen=True)
class Invariant:
    """``forall b. per_block(s, [r,] b)`` and ``scalar(s, [r])``; per-request ones for every r.

    ``kind`` is "safeguard" (the seed's four), "safety" (basic properties) or "aux" (strengthening
    needed for induction).  ``protected_by`` lists the guard conjuncts whose removal must break
    it (anti-vacuity).  ``bounded`` marks a property that relates a ghost counter to a count over
    blocks: it is checked by BMC and by the concrete interpreter, not proved for any pool size.
    """

    name: str
    doc: str
    kind: str
    per_block: Fn | None = None
    scalar: Fn | None = None
    per_request: bool = False
    protected_by: tuple[tuple[str, str], ...] = ()
    bounded: bool = False
    # (action, conjunct) pairs that refuse *only* what would break this invariant: with the
    # action's other conjuncts holding and this one failing, firing it anyway breaks the
    # invariant (a cap that is exactly the capacity, not one less).  Proved as ``tight``
    # obligations; a stricter conjunct (an off-by-one that refuses one step too many) fails.
    tight: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ReadSafety:
    """What an action reads (or promises not to take away), and the property that makes it safe.

    Proved as an *action-level* obligation: in every state satisfying the invariants where the
    action's guard holds, ``per_block(s, p, b)`` holds at every block (and ``scalar(s, p)``).
    An action that changes no state (``replay``) is invisible to state invariants; this ties its
    guard to the safety it provides.  ``protected_by`` lists guard conjuncts whose removal must
    break it (anti-vacuity: a reachable state where the weakened guard allows an unsafe read).
    """

    action: str
    name: str
    doc: str
    per_block: Fn | None = None  # per_block(s, p, b)
    scalar: Fn | None = None  # scalar(s, p)
    protected_by: tuple[str, ...] = ()
    tight: tuple[str, ...] = ()  # the action's conjuncts that refuse only where this fails


@dataclass(frozen=True)
class Locality:
    """The guard of ``action`` reads the pool's blocks only where ``within(s, p, b)`` holds.

    A hit is judged by the hit's own blocks: a guard that also reads one block past its scope
    (an off-by-one in a range) refuses hits for reasons outside them.  Proved as a ``local``
    obligation: changing every block variable at one block outside the scope never changes
    the guard's verdict (any pool size).
    """

    action: str
    doc: str
    within: Fn  # within(s, p, b) -> bool


@dataclass(frozen=True)
class PinnedCoverage:
    """A coverage goal: each of ``actions`` (which give up a request's pins) fires while the
    request holds a pin on a block whose phase variable ``var`` is in each of ``phases``.

    Proved as ``reach`` obligations (a witness trace per action and phase, replayed
    concretely); the fuzzer replays the witnesses, so an action's effects on a pinned block in
    each of those phases are exercised."""

    actions: tuple[str, ...]
    var: str  # a block phase variable (one with a ``domain``)
    phases: tuple[int, ...]
    doc: str = ""


@dataclass(frozen=True)
class Completeness:
    """The write path enables the read path (a liveness rule, stated once for every reader).

    After the ``write_path`` actions stored, sealed and indexed the first ``n`` blocks of a
    prefix -- ``stored(s, n)``, stated over ghost truth -- and with none of the ``disturbing``
    actions in between, a new request for the same prefix is validated at the full LCM-aligned
    length: the ``read_path`` steps (:meth:`probe`) are all enabled.  The prover checks it by
    bounded model checking over traces of write-path actions; ``kvstate fuzz`` checks it on the
    block-level target whenever the model's state satisfies ``stored``; a vLLM target projects
    it through :meth:`expected_hit`.
    """

    doc: str
    write_path: tuple[str, ...]  # actions that store, seal, index a prefix (and keep it resident)
    disturbing: tuple[str, ...]  # actions after which the rule promises nothing (evict, fault...)
    read_path: tuple[str, ...]  # admit, match, pin, validate: a new request's steps
    stored: Fn  # stored(s, n) -> bool: blocks [0, n) stored, sealed and indexed (ghost truth)

    @staticmethod
    def expected_hit(stored_tokens: int, geometry: Geometry) -> int:
        """Tokens a new request for a stored prefix of ``stored_tokens`` must hit: every whole
        LCM block (the hit rule's L1 alignment), nothing of a partial last block."""
        if stored_tokens < 0:
            raise SpecError(f"stored_tokens must be >= 0, got {stored_tokens}")
        L = geometry.lcm_tokens
        return stored_tokens // L * L

    def probe(
        self, n_blocks: int, geometry: Geometry, r: int = 0
    ) -> list[tuple[str, dict[str, int]]]:
        """The read path for a new request ``r`` over ``n_blocks`` stored blocks, as steps."""
        h = self.expected_hit(n_blocks * geometry.lcm_tokens, geometry)
        params = {"admit": {"r": r, "t": 1}, "match": {"r": r, "h": h}}
        return [(a, params.get(a, {"r": r})) for a in self.read_path]


@dataclass(frozen=True)
class Consts:
    """Geometry-derived constants the callables read as ``s.k``."""

    L: int  # LCM block, tokens
    W: int  # SWA window, in LCM blocks
    R: int  # requests in the abstract model
    io_cap: int
    pin_cap: int  # blocks
    load_steps: int
    lease_max: int
    swa_restored_from_disk: bool
    supported_fmts: tuple[int, ...]
    align: int
    csa_ratio: int
    hca_ratio: int
    entry_bytes: int
    page_bytes: tuple[int, ...]
    block_tokens: int

    @staticmethod
    def from_geometry(g: Geometry) -> Consts:
        return Consts(
            L=g.lcm_tokens,
            W=g.window_lcm_blocks,
            R=g.model_requests,
            io_cap=g.io_cap,
            pin_cap=min(g.pin_cap_blocks, 10**9),
            load_steps=g.load_steps,
            lease_max=g.lease_max,
            swa_restored_from_disk=g.swa_disk_policy != "zero",
            supported_fmts=supported_formats(g),
            align=g.align_bytes,
            csa_ratio=g.csa_ratio,
            hca_ratio=g.hca_ratio,
            entry_bytes=g.entry_bytes,
            page_bytes=(g.page_bytes(g.csa_ratio), g.page_bytes(g.hca_ratio)),
            block_tokens=g.compressed_block_tokens,
        )
