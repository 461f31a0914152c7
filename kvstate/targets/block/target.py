"""The block-level target's targets: the adapter protocol, the model as a target, and the model
as the lockstep walk asks it (target-chosen outputs left out of its parameter spaces)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from kvstate.model.concrete import GuardError, KeptMachine, Machine
from kvstate.spec.errors import ActionRefused
from kvstate.spec.table import Action, ParamKind, Table

OUTPUT_KINDS = (ParamKind.ADDR, ParamKind.FMT)  # chosen by the target, fed to the model


class Target(Protocol):
    """The adapter protocol: one method per action (keyword params) plus ``observe()``.

    A method returns ``None``, or for actions with output parameters (address, format) a dict
    of the values the target chose.  A disabled action raises :class:`ActionRefused` and
    changes nothing.  Optionally, ``check_data() -> list[str]`` verifies the bytes running
    requests read; the harness calls it after every step and fails on any problem.
    """

    def observe(self) -> Mapping[str, Any]: ...


TargetFactory = Callable[[Table, int], Any]


class _ObservedTarget:
    """A target whose ``observe()`` is answered from its last observation while nothing but
    ``observe()`` has called it since (any other call, action or hook, drops it first).

    A refusal check observes before and after the refused call; the next check's "before" is
    then the previous "after", with no call to the target in between, so it is not asked again.
    The observation is returned as a read-only snapshot (a copy the target cannot edit).
    """

    __slots__ = ("_target", "_last", "_calls")

    def __init__(self, target: Any) -> None:
        self._target = target
        self._last: Mapping[str, Any] | None = None
        # name -> (the target's attribute, its wrapper): made once per name, and remade if the
        # target's attribute is another object now (its methods are bound anew at every read)
        self._calls: dict[str, tuple[Any, Callable[..., Any]]] = {}

    def observe(self) -> Mapping[str, Any]:
        if self._last is None:  # a private read-only copy: nobody can edit it behind our back
            self._last = MappingProxyType(dict(self._target.observe()))
        return self._last

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr
        kept = self._calls.get(name)
        if kept is not None and kept[0] == attr:  # the same method of the same target
            return kept[1]

        def call(*args: Any, **kwargs: Any) -> Any:
            self._last = None
            return attr(*args, **kwargs)

        self._calls[name] = (attr, call)
        return call


class ModelTarget:
    """The reference interpreter wrapped as a target (model-only fuzzing, and a self-check)."""

    def __init__(self, table: Table, N: int) -> None:
        self.m = Machine(table, N)
        self.s = self.m.init()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or name not in {a.name for a in self.m.table.actions}:
            raise AttributeError(name)
        action = self.m.table.action(name)

        def do(**params: int) -> dict[str, int] | None:
            outs = {}
            for q in action.params:
                if q.kind in OUTPUT_KINDS and q.name not in params:
                    # a fresh address each time: a buffer placed anew always moves
                    self._placed = getattr(self, "_placed", 0) + (q.kind is ParamKind.ADDR)
                    params[q.name] = outs[q.name] = (
                        0 if q.kind is ParamKind.FMT else 3 * self.m.N + self._placed
                    )
            try:
                self.s = self.m.step(self.s, action, params)
            except GuardError as exc:
                raise ActionRefused(str(exc)) from exc
            return outs or None

        return do

    def observe(self) -> dict[str, Any]:
        return self.s.values


class _LockstepMachine(KeptMachine):
    """The model as the lockstep machine walks it.

    The machine enumerates each action's inputs and skips every combination whose target-chosen
    outputs (an address, a format) are not 0: those are filled in from the target's answer.
    Leaving them out of the space here gives the same lists with a twelfth of the work for
    ``allocate`` (its address ranges over ``4N`` values).  Guard answers and successors are
    kept per state value (:class:`KeptMachine`): the ``ci`` run asks about 3227 state objects
    holding 317 distinct values.
    """

    def param_space(
        self, action: Action, *, tokens_step: int | None = None
    ) -> Iterator[dict[str, Any]]:
        key = ("lockstep:" + action.name, tokens_step)  # beside the full spaces
        space = self._spaces.get(key)
        if space is None:
            outs = [q.name for q in action.params if q.kind in OUTPUT_KINDS]
            space = self._spaces[key] = tuple(
                p
                for p in super().param_space(action, tokens_step=tokens_step)
                if not any(p[name] for name in outs)
            )
        for params in space:
            yield dict(params)


def _inputs(action: Action) -> list[Any]:
    return [q for q in action.params if q.kind not in OUTPUT_KINDS]
