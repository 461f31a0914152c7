"""The lockstep toolkit every fuzz target uses (``kvstate fuzz --target NAME``).

One operation/trace type (:mod:`.trace`), one finding type with its classes (:mod:`.finding`),
one minimizer (delta debugging over operations, :mod:`.ddmin`), one set of profiles with
explicitly pinned seeds (:mod:`.profiles`) and one coverage summary (:mod:`.coverage`).  A
target (a package under ``kvstate/targets/``) brings its operations, its projection of the
table, its driver and its configurations; it imports this package, never another target.
This package imports nothing of kvstate but the table's errors, so any target can sit on it.
"""
