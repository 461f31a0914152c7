"""Connectives that work on Python values and on Z3 terms alike.

Guards, effects and invariants in the table are written once, as Python callables over a state
mapping.  The concrete interpreter calls them with ints, bools and tuples; the Z3 encoder calls
them with Z3 terms.  Python's ``and``/``or``/``not``/``if`` cannot be overloaded, so the table uses
these helpers instead; on Z3 terms Python's own ``and`` raises (Z3 refuses ``bool()`` of a
symbolic term), so misuse fails loudly rather than silently picking one branch.

Quantification over blocks goes through :func:`forall_blocks`, which asks the state object how to
quantify: a concrete state loops over the range, a symbolic state either expands the range (small
bounded pools) or instantiates at the terms the prover cares about (parametric proofs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import z3

Term = Any  # a Python bool/int/tuple or a z3.ExprRef


def is_symbolic(*xs: Term) -> bool:
    return any(isinstance(x, z3.ExprRef) for x in xs)


def _bool(x: Term) -> Term:
    if isinstance(x, z3.ExprRef):
        return x
    if isinstance(x, bool):
        return x
    raise TypeError(f"expected a boolean, got {type(x).__name__} {x!r}")


def AND(*xs: Term) -> Term:
    # Fast path for the implementation's hot loop: plain bools only (a loop, not a generator).
    for x in xs:
        if x.__class__ is not bool:
            break
    else:
        return False not in xs
    if is_symbolic(*xs):
        return z3.And(*[z3.BoolVal(x) if isinstance(x, bool) else x for x in xs])
    return all(_bool(x) for x in xs)


def OR(*xs: Term) -> Term:
    for x in xs:
        if x.__class__ is not bool:
            break
    else:
        return True in xs
    if is_symbolic(*xs):
        return z3.Or(*[z3.BoolVal(x) if isinstance(x, bool) else x for x in xs])
    return any(_bool(x) for x in xs)


def NOT(x: Term) -> Term:
    if x.__class__ is bool:
        return not x
    if is_symbolic(x):
        return z3.Not(x)
    return not _bool(x)


def IMPLIES(a: Term, b: Term) -> Term:
    if a.__class__ is bool and b.__class__ is bool:
        return (not a) or b
    if is_symbolic(a, b):
        return z3.Implies(a, b)
    return (not _bool(a)) or _bool(b)


def ITE(c: Term, a: Term, b: Term) -> Term:
    if c.__class__ is bool and not isinstance(a, z3.ExprRef) and not isinstance(b, z3.ExprRef):
        return a if c else b
    if is_symbolic(c, a, b):
        return z3.If(c, a, b)
    return a if _bool(c) else b


def MAX(a: Term, b: Term) -> Term:
    return ITE(a >= b, a, b)


def IN(x: Term, options: Sequence[int]) -> Term:
    """Membership in a finite set of enum values."""
    if x.__class__ is int:
        return x in options
    return OR(*[x == int(o) for o in options]) if options else False


def CDIV(a: Term, k: int) -> Term:
    """Ceiling division by a positive constant (linear for Z3)."""
    if a.__class__ is int:
        return -(-a // k)
    if is_symbolic(a):
        return (a + (k - 1)) / k
    return -(-a // k)


def FDIV(a: Term, k: int) -> Term:
    """Floor division by a positive constant, for non-negative ``a`` (linear for Z3)."""
    if a.__class__ is int:
        return a // k
    if is_symbolic(a):
        return a / k
    return a // k


def MOD(a: Term, k: int) -> Term:
    return a % k


def B2I(c: Term) -> Term:
    return ITE(c, 1, 0)


class Quantifier(Protocol):
    """What a state must provide for :func:`forall_blocks` and array construction."""

    def forall_blocks(self, lo: Term, hi: Term, body: Callable[[Term], Term]) -> Term: ...

    def array(self, body: Callable[[Term], Term]) -> Term: ...

    def store(self, arr: Term, index: Term, value: Term) -> Term: ...


def forall_blocks(s: Quantifier, lo: Term, hi: Term, body: Callable[[Term], Term]) -> Term:
    """``body(b)`` for every pool block ``b`` with ``lo <= b < hi``."""
    return s.forall_blocks(lo, hi, body)


def array(s: Quantifier, body: Callable[[Term], Term]) -> Term:
    """A whole per-block array, ``b -> body(b)`` (a tuple concretely, a Z3 lambda symbolically)."""
    return s.array(body)


def store(s: Quantifier, arr: Term, index: Term, value: Term) -> Term:
    """``arr`` with one block replaced."""
    return s.store(arr, index, value)
