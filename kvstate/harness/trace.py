"""One operation of a trace: what a run did, replayable, printable as a call.

Every target records its walk in :class:`TraceStep`: the block target's table actions, the API
target's public calls and faults, the engine targets' operations.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Step = tuple[str, dict[str, int]]  # (operation, its input parameters): one replayable step


@dataclass
class TraceStep:
    """One step a run took: an operation it performed, or one whose refusal it checked.

    ``outputs`` are the values the target chose (an address, a format); a replay gives the
    inputs only and lets the target choose again.
    """

    action: str
    inputs: dict[str, int]  # an engine's resolved step may name a request by its id (a str)
    refused: bool = False  # the model's guard was false: the target had to refuse it
    failed: tuple[str, ...] = ()  # the false guard conjuncts (refused steps)
    outputs: dict[str, int] = field(default_factory=dict)  # parameters the target chose

    @property
    def name(self) -> str:
        """The operation's name (``action``): an API target's call or fault."""
        return self.action

    def arg(self, k: str) -> int:
        return self.inputs[k]

    @property
    def step(self) -> Step:
        return (self.action, dict(self.inputs))

    def call(self) -> str:
        args = (f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in self.inputs.items())
        return f"{self.action}({', '.join(args)})"

    def render(self) -> str:
        if self.refused:
            note = f"guard false ({', '.join(self.failed)}): the target must refuse it"
        elif self.outputs:
            note = "target chose " + ", ".join(f"{k}={v}" for k, v in self.outputs.items())
        else:
            return self.call()
        return f"{self.call():<24}  # {note}"
