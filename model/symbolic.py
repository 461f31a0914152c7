"""The table read symbolically: Z3 terms for states, guards, transitions and invariants.

The same callables the concrete interpreter runs are called here with Z3 terms.  Per-block
variables are Z3 arrays over a block index; the pool size ``N`` is either a symbolic integer
(parametric proofs: any pool size) or a Python int (bounded model checking).

Quantification over blocks (``forall_blocks`` in guards) has three modes:

* ``expand``: a conjunction over the concrete indices ``0..N-1`` (BMC; exact, quantifier-free);
* ``inst``: instantiate at a finite set of terms (the Skolem block of the goal and the action's
  block parameter).  Only used where the quantifier is a hypothesis, where weakening it is
  sound: an UNSAT answer is a proof;
* ``forall``: a real ``ForAll`` (the fallback when instantiation gives a SAT answer).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import z3

from kvstate.spec.expr import AND
from kvstate.spec.phases import Fmt
from kvstate.spec.table import Action, Consts, Invariant, ParamKind, Scope, Table

_counter = itertools.count()


class Vec:
    """A per-block array over a concrete pool, as N scalar terms (keeps BMC quantifier-free)."""

    __slots__ = ("items",)

    def __init__(self, items: Sequence[Any]) -> None:
        self.items = list(items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            return self.items[index]
        if z3.is_int_value(index):
            return self.items[index.as_long()]
        term = self.items[-1]
        for i in range(len(self.items) - 2, -1, -1):
            term = z3.If(index == i, self.items[i], term)
        return term

    def __len__(self) -> int:
        return len(self.items)

    def store(self, index: Any, value: Any) -> Vec:
        if isinstance(index, int) or z3.is_int_value(index):
            i = index if isinstance(index, int) else index.as_long()
            out = list(self.items)
            out[i] = _lift(value)
            return Vec(out)
        return Vec([z3.If(index == i, value, x) for i, x in enumerate(self.items)])

    def eq(self, other: Vec) -> Any:
        return z3.And(
            *[a == b for a, b in zip(self.items, other.items, strict=True)], z3.BoolVal(True)
        )

    def ite(self, cond: Any, other: Vec) -> Vec:
        """``If(cond, self, other)`` elementwise."""
        return Vec([z3.If(cond, a, b) for a, b in zip(self.items, other.items, strict=True)])


class _ReqView:
    def __init__(self, s: SymState, r: int) -> None:
        self._s = s
        self._r = r

    def __getattr__(self, name: str) -> Any:
        v = self._s._req.get(name)
        if v is None:
            raise AttributeError(f"unknown request variable {name!r}")
        return v[self._r]


@dataclass
class SymState:
    """A symbolic state mapping; attribute names are the table's variable names."""

    table: Table
    N: Any
    mode: str = "expand"  # expand | inst | forall
    nmax: int | None = None
    inst_terms: list[Any] = field(default_factory=list)
    _v: dict[str, Any] = field(default_factory=dict)
    _req: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def k(self) -> Consts:
        return self.table.consts

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("table", "N", "mode", "nmax", "inst_terms"):
            raise AttributeError(name)
        try:
            return self._v[name]
        except KeyError:
            if name in self._req:
                raise AttributeError(
                    f"{name!r} is per-request: read it as s.req(r).{name}"
                ) from None
            raise AttributeError(f"unknown state variable {name!r}") from None

    def req(self, r: int) -> _ReqView:
        if not isinstance(r, int) or not 0 <= r < self.k.R:
            raise ValueError(f"request index {r!r} out of range")
        return _ReqView(self, r)

    def get(self, name: str) -> Any:
        return self._v[name] if name in self._v else self._req[name]

    # ---- quantifier hooks ---------------------------------------------------------------
    def forall_blocks(self, lo: Any, hi: Any, body: Callable[[Any], Any]) -> Any:
        def within(i: Any) -> Any:
            return AND(lo <= i, i < hi, i >= 0, i < self.N)

        if self.mode == "expand":
            bound = self.N if isinstance(self.N, int) else self.nmax
            assert bound is not None, "expand mode needs a concrete or bounded pool"
            return z3.And(
                *[z3.Implies(within(i), body(z3.IntVal(i))) for i in range(bound)], z3.BoolVal(True)
            )
        if self.mode == "goal":
            raise TypeError("an invariant may not quantify over blocks: use its per_block part")
        if self.mode == "inst":
            return z3.And(
                *[z3.Implies(within(t), body(t)) for t in self.inst_terms], z3.BoolVal(True)
            )
        x = z3.Int(f"q!{next(_counter)}")
        return z3.ForAll([x], z3.Implies(within(x), body(x)))

    def array(self, body: Callable[[Any], Any]) -> Any:
        if isinstance(self.N, int):
            return Vec([_lift(body(z3.IntVal(i))) for i in range(self.N)])
        x = z3.Int(f"l!{next(_counter)}")
        return z3.Lambda([x], body(x))

    def store(self, arr: Any, index: Any, value: Any) -> Any:
        if isinstance(arr, Vec):
            return arr.store(index, value)
        return z3.Store(arr, index, value)


def _sort(table: Table, name: str) -> z3.SortRef:
    v = table.var(name)
    return z3.BoolSort() if v.is_bool else z3.IntSort()


def fresh_state(table: Table, prefix: str, N: Any, **kw: Any) -> SymState:
    s = SymState(table, N, **kw)
    R = table.consts.R
    for v in table.vars:
        srt = _sort(table, v.name)
        if v.scope is Scope.GLOBAL:
            s._v[v.name] = z3.Const(f"{prefix}{v.name}", srt)
        elif v.scope is Scope.BLOCK:
            s._v[v.name] = _fresh_array(f"{prefix}{v.name}", srt, N)
        elif v.scope is Scope.REQ:
            s._req[v.name] = [z3.Const(f"{prefix}{v.name}[{r}]", srt) for r in range(R)]
        else:
            s._req[v.name] = [_fresh_array(f"{prefix}{v.name}[{r}]", srt, N) for r in range(R)]
    return s


def _fresh_array(name: str, srt: z3.SortRef, N: Any) -> Any:
    if isinstance(N, int):
        return Vec([z3.Const(f"{name}.{i}", srt) for i in range(N)])
    return z3.Array(name, z3.IntSort(), srt)


def init_state(table: Table, N: Any, **kw: Any) -> SymState:
    """Init as terms (no fresh constants), so Init is exact for any pool size."""
    s = SymState(table, N, **kw)
    k = table.consts
    x = z3.Int("init!b")
    for v in table.vars:
        if v.scope is Scope.GLOBAL:
            s._v[v.name] = _lift(v.init(k, N, None))
        elif v.scope is Scope.BLOCK:
            s._v[v.name] = _const_array(v.init, k, N, x)
        elif v.scope is Scope.REQ:
            s._req[v.name] = [_lift(v.init(k, N, None)) for _ in range(k.R)]
        else:
            s._req[v.name] = [_const_array(v.init, k, N, x) for _ in range(k.R)]
    return s


def _lift(x: Any) -> Any:
    if isinstance(x, (z3.ExprRef, Vec)):
        return x
    if isinstance(x, bool):
        return z3.BoolVal(x)
    return z3.IntVal(int(x))


def _const_array(init: Callable[..., Any], k: Consts, N: Any, x: Any) -> Any:
    if isinstance(N, int):
        return Vec([_lift(init(k, N, z3.IntVal(i))) for i in range(N)])
    probe = init(k, N, x)
    if isinstance(probe, z3.ExprRef):
        return z3.Lambda([x], probe)
    return z3.K(z3.IntSort(), _lift(probe))


@dataclass
class Params:
    """Fresh symbolic parameters for one step (shared by all action instances of the step)."""

    values: dict[ParamKind, Any]
    domain: list[Any]


def fresh_params(table: Table, prefix: str, N: Any) -> Params:
    k = table.consts
    v = {
        ParamKind.BLOCK: z3.Int(f"{prefix}b"),
        ParamKind.TOKENS: z3.Int(f"{prefix}h"),
        ParamKind.ADDR: z3.Int(f"{prefix}a"),
        ParamKind.TICKS: z3.Int(f"{prefix}t"),
        ParamKind.FMT: z3.Int(f"{prefix}f"),
    }
    dom = [
        v[ParamKind.BLOCK] >= 0,
        v[ParamKind.BLOCK] < N,
        v[ParamKind.TOKENS] >= 0,
        v[ParamKind.TOKENS] <= N * k.L,
        v[ParamKind.ADDR] >= 0,
        v[ParamKind.TICKS] >= 1,
        v[ParamKind.TICKS] <= k.lease_max,
        v[ParamKind.FMT] >= min(Fmt),
        v[ParamKind.FMT] <= max(Fmt),
    ]
    if isinstance(N, int):
        dom.append(v[ParamKind.ADDR] < 4 * N)
    return Params(v, dom)


@dataclass(frozen=True)
class Instance:
    """One action with its request parameter fixed (requests are expanded)."""

    action: Action
    r: int | None

    @property
    def label(self) -> str:
        return self.action.name if self.r is None else f"{self.action.name}[r={self.r}]"


def instances(table: Table, actions: Iterable[Action] | None = None) -> list[Instance]:
    out: list[Instance] = []
    for a in actions if actions is not None else table.actions:
        if a.request_scoped:
            out.extend(Instance(a, r) for r in range(table.consts.R))
        else:
            out.append(Instance(a, None))
    return out


def bind(inst: Instance, params: Params) -> SimpleNamespace:
    ns = SimpleNamespace()
    for p in inst.action.params:
        setattr(ns, p.name, inst.r if p.kind is ParamKind.REQ else params.values[p.kind])
    return ns


def guard(s: SymState, inst: Instance, p: SimpleNamespace, skip: Sequence[str] = ()) -> Any:
    return z3.And(
        *[_as_bool(c.fn(s, p)) for c in inst.action.guard if c.name not in skip], z3.BoolVal(True)
    )


def _as_bool(x: Any) -> Any:
    if isinstance(x, bool):
        return z3.BoolVal(x)
    if not z3.is_bool(x):
        raise TypeError(f"guard is not boolean: {x}")
    return x


def post(s: SymState, inst: Instance, p: SimpleNamespace) -> dict[str, Any]:
    """Updated terms for the variables the action modifies (request vars: the whole list)."""
    out: dict[str, Any] = {}
    for name, fn in inst.action.updates.items():
        val = _lift(fn(s, p))
        if name in s._req:
            row = list(s._req[name])
            assert inst.r is not None
            row[inst.r] = val
            out[name] = row
        else:
            out[name] = val
    return out


def successor(s: SymState, inst: Instance, p: SimpleNamespace) -> SymState:
    """The post-state as terms (frame: everything not updated is unchanged)."""
    nxt = SymState(
        s.table,
        s.N,
        s.mode,
        s.nmax,
        s.inst_terms,
        dict(s._v),
        {k: list(v) for k, v in s._req.items()},
    )
    for name, val in post(s, inst, p).items():
        if name in nxt._req:
            nxt._req[name] = val
        else:
            nxt._v[name] = val
    return nxt


# ---- invariants -------------------------------------------------------------------------
def inv_holds(s: SymState, inv: Invariant, terms: Sequence[Any]) -> Any:
    """Invariant as a hypothesis: scalar part, per-block part at the given terms (or ForAll)."""
    parts = []
    for r in range(s.k.R) if inv.per_request else [None]:
        args: tuple[Any, ...] = (s,) if r is None else (s, r)
        if inv.scalar is not None:
            parts.append(_as_bool(inv.scalar(*args)))
        if inv.per_block is not None:
            if s.mode == "forall":
                x = z3.Int(f"h!{next(_counter)}")
                parts.append(
                    z3.ForAll(
                        [x], z3.Implies(z3.And(x >= 0, x < s.N), _as_bool(inv.per_block(*args, x)))
                    )
                )
            elif s.mode == "expand":
                bound = s.N if isinstance(s.N, int) else s.nmax
                assert bound is not None
                parts.extend(
                    z3.Implies(z3.IntVal(i) < s.N, _as_bool(inv.per_block(*args, z3.IntVal(i))))
                    for i in range(bound)
                )
            else:
                parts.extend(
                    z3.Implies(z3.And(t >= 0, t < s.N), _as_bool(inv.per_block(*args, t)))
                    for t in terms
                )
    return z3.And(*parts, z3.BoolVal(True))


def inv_violated(
    s: SymState, inv: Invariant, skolem: Any
) -> tuple[Any, list[tuple[Any, int | None]]]:
    """Negated invariant with the per-block part at a Skolem block; also per-request labels."""
    disj = []
    labels: list[tuple[Any, int | None]] = []
    in_pool = z3.And(skolem >= 0, skolem < s.N)
    for r in range(s.k.R) if inv.per_request else [None]:
        args: tuple[Any, ...] = (s,) if r is None else (s, r)
        parts = []
        if inv.scalar is not None:
            parts.append(z3.Not(_as_bool(inv.scalar(*args))))
        if inv.per_block is not None:
            parts.append(z3.And(in_pool, z3.Not(_as_bool(inv.per_block(*args, skolem)))))
        term = z3.Or(*parts)
        disj.append(term)
        labels.append((term, r))
    return z3.Or(*disj), labels


def block_in_pool(x: Any, N: Any) -> Any:
    return z3.And(x >= 0, x < N)


@dataclass
class StepQuery:
    """One parametric step: invariants (at the Skolem block and the action's block) and the
    guard hold in ``pre``; ``post`` is the successor.  Shared by induction and phase graphs."""

    hypotheses: list[Any]
    pre: SymState
    post: SymState
    skolem: Any


def step_query(
    table: Table, inst: Instance, invariants: Sequence[Invariant], mode: str
) -> StepQuery:
    N = z3.Int("N")
    s = fresh_state(table, "pre.", N, mode=mode)
    pp = fresh_params(table, "p.", N)
    p = bind(inst, pp)
    sk = z3.Int("sk")
    terms = [sk]
    if any(q.kind is ParamKind.BLOCK for q in inst.action.params):
        terms.append(pp.values[ParamKind.BLOCK])
    s.inst_terms = terms
    hyps = [N >= 1, *pp.domain, block_in_pool(sk, N)]
    hyps += [inv_holds(s, other, terms) for other in invariants]
    hyps.append(guard(s, inst, p))
    return StepQuery(hyps, s, successor(s, inst, p), sk)
