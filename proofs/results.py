"""What an obligation produces: a verdict, its scope (bounded or unbounded) and a trace.

Traces are lists of concrete steps that the reference interpreter has replayed, so a reported
counterexample is never an artefact of the encoding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Step:
    action: str
    params: dict[str, int]

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.action}({args})"


@dataclass(frozen=True)
class Trace:
    """A replayable trace: from Init (``start`` is None) or from a given pre-state."""

    steps: tuple[Step, ...]
    pool_size: int
    start: dict[str, Any] | None = None  # a counterexample-to-induction pre-state
    violated: tuple[str, ...] = ()  # invariant violations in the last state (replayed)
    replayed: bool = False

    def actions(self) -> list[str]:
        return [s.action for s in self.steps]

    def render(self) -> str:
        head = f"  pool size N={self.pool_size}"
        head += ", from Init" if self.start is None else ", from a state satisfying every invariant"
        lines = [head]
        if self.start is not None:
            lines.append("  pre-state: " + _short_state(self.start))
        for i, st in enumerate(self.steps, 1):
            lines.append(f"  {i:>2}. {st}")
        if self.violated:
            lines.append("  => violates " + "; ".join(self.violated))
        lines.append(
            "  (replayed in the concrete interpreter: " + ("yes" if self.replayed else "NO") + ")"
        )
        return "\n".join(lines)


def _short_state(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


@dataclass
class Result:
    obligation: str
    kind: str  # init | inductive | bmc | k-induction | reach | anti-vacuity | structure
    method: str
    scope: str  # "unbounded: ..." or "bounded: ..."
    status: str  # proved | holds | witness | violated | not-inductive | unknown | error
    ok: bool
    seconds: float
    invariant: str | None = None
    action: str | None = None
    detail: str = ""
    trace: Trace | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def unbounded(self) -> bool:
        return self.scope.startswith("unbounded")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["unbounded"] = self.unbounded
        return d
