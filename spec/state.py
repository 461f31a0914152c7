"""The concrete state mapping that the table's callables read.

Values are immutable: ints and bools for global variables, tuples over blocks for per-block
variables, tuples over requests (of tuples over blocks) for per-request ones.  The same object
shape is what the implementation's ``observe()`` produces, so the model, the conformance
harness and the implementation's own hit search all evaluate the table's callables on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from .errors import SpecError
from .parts import Scope


class ReqView:
    """Attribute access to one request's variables.

    On a :class:`ConcreteState` the first read copies the request's values into the instance
    dictionary (later reads run at C speed: the model evaluates tens of guards per state);
    ``__getattr__`` then only answers names that are not there, with the error that says why.
    """

    __slots__ = ("_s", "_r", "__dict__")

    def __init__(self, s: ConcreteState, r: int) -> None:
        self._s = s
        self._r = r

    def __getattr__(self, name: str) -> Any:
        s = self._s
        try:
            v = s._v[name]
        except KeyError:
            raise AttributeError(f"unknown request variable {name!r}") from None
        if name not in s._req_names:
            raise AttributeError(f"{name!r} is not a per-request variable")
        if s._direct:  # the first read fills the dictionary: later reads never come here
            d = self.__dict__
            for n in s._req_names:
                if n in s._v:
                    d[n] = s._v[n][self._r]
        return v[self._r]


class ConcreteState:
    """A read-only state mapping with the quantifier hooks :mod:`kvstate.spec.expr` needs."""

    __slots__ = ("_v", "N", "k", "_req_names", "_reqs", "_kept", "__dict__")

    #: Whether variables are copied into the instance dictionary at the first read, so that
    #: later reads of ``s.ckv`` are plain attribute reads instead of ``__getattr__`` calls.  The probe states below keep every read
    #: going through ``__getattr__``: that is how they see what a callable reads.
    _direct = True

    def __init__(
        self, values: Mapping[str, Any], N: int, k: Any, req_names: frozenset[str]
    ) -> None:
        self._v = dict(values)
        self.N = N
        self.k = k
        self._req_names = req_names
        self._reqs: list[ReqView | None] = [None] * k.R
        # (machine, what it keeps about this state's value): see model/concrete.py KeptMachine
        self._kept: tuple[Any, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            v = self._v[name]
        except KeyError:
            raise AttributeError(f"unknown state variable {name!r}") from None
        if name in self._req_names:
            raise AttributeError(f"{name!r} is per-request: read it as s.req(r).{name}")
        if self._direct:  # the first read fills the dictionary (names cannot shadow methods:
            d = self.__dict__  # spec/validate reserves them); a state never read costs nothing
            for n, x in self._v.items():
                if n not in self._req_names:
                    d[n] = x
        return v

    def req(self, r: int) -> ReqView:
        try:
            view = self._reqs[r] if r >= 0 and type(r) is int else None
        except (IndexError, TypeError):
            view = None
        if view is None:
            if not isinstance(r, int) or not 0 <= r < self.k.R:
                raise SpecError(f"request index {r!r} out of range 0..{self.k.R - 1}")
            view = self._reqs[r] = ReqView(self, r)
        return view

    @property
    def values(self) -> dict[str, Any]:
        return dict(self._v)

    @property
    def mapping(self) -> Mapping[str, Any]:
        """The values, read-only and not copied (a search reads thousands of states)."""
        return MappingProxyType(self._v)

    def forall_blocks(self, lo: Any, hi: Any, body: Callable[[Any], Any]) -> Any:
        for b in range(max(lo, 0), min(hi, self.N)):
            v = body(b)
            if not isinstance(v, bool):
                raise TypeError(f"a per-block condition returned {type(v).__name__}, not bool")
            if not v:
                return False
        return True

    def array(self, body: Callable[[Any], Any]) -> Any:
        return tuple(body(b) for b in range(self.N))

    def store(self, arr: Any, index: Any, value: Any) -> Any:
        if not 0 <= index < len(arr):
            raise IndexError(f"block {index} out of range 0..{len(arr) - 1}")
        return arr[:index] + (value,) + arr[index + 1 :]

    def key(self) -> tuple[Any, ...]:
        """Hashable identity, for exhaustive exploration."""
        return tuple(sorted(self._v.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConcreteState) and self._v == other._v and self.N == other.N

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        return f"ConcreteState(N={self.N}, {self._v})"


class ProbeState(ConcreteState):
    """Evaluates every per-block body (even over empty ranges) so validation sees every name."""

    __slots__ = ()
    _direct = False

    def forall_blocks(self, lo: Any, hi: Any, body: Callable[[Any], Any]) -> Any:
        results = [body(b) for b in range(self.N)]
        for v in results:
            if not isinstance(v, bool):
                raise TypeError(f"a per-block condition returned {type(v).__name__}, not bool")
        return super().forall_blocks(lo, hi, body)


_INITIAL: dict[tuple[int, int], tuple[Any, dict[str, Any], frozenset[str]]] = {}


def _initial(table: Any, N: int) -> tuple[dict[str, Any], frozenset[str]]:
    """The initial values and the per-request names of ``table`` over ``N`` blocks, computed
    once per (table, N): a fuzz run builds a model and a cache (whose projection and graph
    registry start from the same state) for every example.  Every value is immutable (ints,
    tuples), so callers get a shallow copy of the mapping."""
    hit = _INITIAL.get((id(table), N))
    if hit is not None and hit[0] is table:
        return hit[1], hit[2]
    k = table.consts
    out: dict[str, Any] = {}
    for v in table.vars:
        if v.scope is Scope.GLOBAL:
            out[v.name] = v.init(k, N, None)
        elif v.scope is Scope.BLOCK:
            out[v.name] = tuple(v.init(k, N, b) for b in range(N))
        elif v.scope is Scope.REQ:
            out[v.name] = tuple(v.init(k, N, None) for _ in range(k.R))
        else:
            out[v.name] = tuple(tuple(v.init(k, N, b) for b in range(N)) for _ in range(k.R))
    names = frozenset(v.name for v in table.vars if v.scope in (Scope.REQ, Scope.REQ_BLOCK))
    if len(_INITIAL) >= 64:
        _INITIAL.clear()
    _INITIAL[id(table), N] = (table, out, names)
    return out, names


def initial_values(table: Any, N: int) -> dict[str, Any]:
    """The initial state of ``table`` for a pool of ``N`` blocks (every var's ``init``)."""
    return dict(_initial(table, N)[0])


def req_var_names(table: Any) -> frozenset[str]:
    return frozenset(v.name for v in table.vars if v.scope in (Scope.REQ, Scope.REQ_BLOCK))


def initial_state(table: Any, N: int, cls: type[ConcreteState] = ConcreteState) -> ConcreteState:
    values, names = _initial(table, N)
    return cls(values, N, table.consts, names)  # the state copies the mapping


class _RecordingReq(ReqView):
    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        self._s._reads.add(name)  # type: ignore[attr-defined]
        return super().__getattr__(name)


class RecordingState(ProbeState):
    """A probe state that records which variables a callable reads (its read set)."""

    __slots__ = ("_reads",)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._reads: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        if name in self._v:
            self._reads.add(name)
        return super().__getattr__(name)

    def req(self, r: int) -> ReqView:
        if not isinstance(r, int) or not 0 <= r < self.k.R:
            raise SpecError(f"request index {r!r} out of range 0..{self.k.R - 1}")
        return _RecordingReq(self, r)
