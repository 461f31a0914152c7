"""Exceptions raised when a table or a geometry is malformed.

They are raised while a table loads, before anything runs on it, and always name the action,
invariant or field at fault, so a user editing a table sees what to fix.
"""


class SpecError(ValueError):
    """A transition table is malformed (unknown variable, update outside its frame, ...)."""


class GeometryError(SpecError):
    """A geometry cannot be laid out (non-positive size, ratio that does not divide, ...)."""


class ActionRefused(Exception):
    """Raised by a fuzz target when asked to perform an action its state does not allow.

    Part of the adapter protocol of ``kvstate fuzz``: a conforming allocator refuses exactly the
    actions whose guard is false in the model, and leaves its state unchanged when it does.
    """
