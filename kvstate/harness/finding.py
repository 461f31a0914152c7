"""The one finding type: a classified nonconformance carrying the trace that led to it."""

from __future__ import annotations

from collections.abc import Sequence

from .trace import TraceStep


class Nonconformance(AssertionError):
    """A finding, classified so that a minimized trace can be checked to fail *the same way*.

    ``kind`` is one of ``model-invariant``, ``observe`` (``detail``: the fields of ``observe()``
    that differ from the model), ``observed-invariant`` (the invariants the observed state
    breaks), ``data`` (the states whose bytes are wrong), ``accepted-disabled`` (the target
    performed an action whose guard is false; ``detail``: ``action[conjuncts]``),
    ``refusal-changed-state``, ``refusal-error`` (raised something other than ``ActionRefused``),
    ``target-error`` (failed an allowed action), ``missing-output``, ``incomplete``; an engine
    target's own check names (``crash``, ``soundness``, ...).  ``trace`` holds the steps of the
    run up to and including the failing one; ``origin`` says who found it.
    """

    def __init__(self, kind: str, detail: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = tuple(detail)
        self.trace: list[TraceStep] = []
        self.origin = ""

    @property
    def signature(self) -> str:
        return f"{self.kind}: {', '.join(self.detail)}"

    def same_as(self, original: Nonconformance) -> bool:
        """Same kind, and ``original``'s primary detail among ours: the same refused action and
        conjuncts, the same first mismatched field (table order), the same first invariant."""
        return self.kind == original.kind and (
            not original.detail or original.detail[0] in self.detail
        )


def find_in(exc: BaseException) -> Nonconformance | None:
    """The finding ``exc`` is or holds (Hypothesis may raise it inside an exception group)."""
    if isinstance(exc, Nonconformance):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = find_in(sub)
            if found is not None:
                return found
    return None
