"""Generated mutants of ``impl/``, killed (or not) by the API fuzz alone.

``python -m kvstate.impl_mutants run`` enumerates cosmic-ray's mutations of every module of
``impl/`` (``impl/_aot.py`` is generated and left out), takes a uniform random sample of them
(``--sample N``; all of them without it), and runs the API fuzz (``kvstate fuzz --target
kvstate-api --profile ci``; ``--profile dev`` for the longer walk) against each one, on the pure
sources, in a forked child (:mod:`kvstate.mutant_runner`); a mutant on a line the remote tier's
walk runs (``--remote``) gets that walk too, on a ``redis-server`` the run starts itself
(:mod:`kvstate.impl_mutants.walks`).  ``report`` prints the kill rate, the median time to catch
and every survivor with its diff.  Needs the ``mutants`` extra (``pip install -e ".[mutants]"``);
docs/generated-mutants.md has the figures and the triage.

One module per job: ``mutants`` (the operators, the mutants and their keys, the sample),
``store`` (cosmic-ray's ``WorkDB`` and the digests a result depends on), ``killer`` (the
walks, run in the child), ``walks`` (which walks a mutant gets; the servers), ``reach`` (the
traced baselines), ``run``, ``report``, ``triage`` (the triage file and its migration), ``cli``.

The result store is cosmic-ray's own (a ``WorkDB``: ``cr-report`` and ``cr-html`` read it), in
``.kvstate-mutants/`` by default.  A mutant's id names its file, line, operator and occurrence,
and its job id adds the digest of the file it mutates; its result records the digest of what the
verdict depends on (``impl/``, ``kvstate/``, ``spec/``, ``model/``, ``kernels/``; and whether the
remote walk ran).  A result is reused only while both digests still hold, so an interrupted run
resumes where it stopped and an edit anywhere the verdict depends on runs the mutants again.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstate.impl_mutants.mutants import (
    OPERATORS,
    Mutant,
    enumerate_mutants,
    mutated_source,
    sample,
)
from kvstate.impl_mutants.triage import load_triage, migrate

__all__ = [
    "OPERATORS",
    "Mutant",
    "enumerate_mutants",
    "load_triage",
    "main",
    "migrate",
    "mutated_source",
    "sample",
]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kvstate.impl_mutants`` (:mod:`kvstate.impl_mutants.cli`)."""
    from kvstate.impl_mutants.cli import main as cli_main

    return cli_main(argv)
