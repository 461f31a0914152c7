"""The coverage summary every target prints: how often each operation ran, and which never did."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def summary(title: str, counts: Mapping[str, int], names: Iterable[str]) -> list[str]:
    """``title:`` then one line per operation in ``names`` (declaration order) with its count,
    then ``never fired: ...`` when some have none (a target that never reached an operation
    checked nothing about it)."""
    names = list(names)
    out = [f"{title}:", *(f"  {n:<16} {counts.get(n, 0):>7}" for n in names)]
    never = [n for n in names if not counts.get(n, 0)]
    if never:
        out.append(f"never fired: {', '.join(never)}")
    return out
