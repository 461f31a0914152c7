"""Hypothesis example databases for ``kvstate fuzz``: failures kept, and replayed first.

A fuzz run of the ``dev`` or ``nightly`` profile keeps what Hypothesis found in an example
database and replays it first on the next run (Hypothesis' ``reuse`` phase).  Which database:

* ``--example-db`` (or ``KVSTATE_EXAMPLE_DB``): a directory (default ``.kvstate/examples``,
  Hypothesis' :class:`~hypothesis.database.DirectoryBasedExampleDatabase`), ``none``, or a Redis
  server, ``redis://host:port/db`` or ``unix:///path/to/redis.sock`` (Hypothesis'
  :class:`~hypothesis.extra.redis.RedisExampleDatabase`; ``pip install 'kvstate[redis]'``):
  shared by the workers of a campaign across processes and machines, so a failure one worker
  found is the first example every other worker runs.
* The ``ci`` profile runs without one: it is derandomized (the same examples every run, which
  Hypothesis allows only with ``database=None``), so a CI verdict never depends on what an
  earlier run left behind.

Each run's examples are filed under an explicit key (:func:`database_key`: target, table,
geometry, pool, planted bugs, operations left out), never under Hypothesis' default key, a
digest of the generated state machine's source: that is the same whatever the target or the
bug (examples found with one bug would be replayed against another) and changes with any edit
of the class (found failures would be lost).  The key is readable text, so a shared server's
keys say whose examples they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from kvstate.spec.errors import SpecError

ENV = "KVSTATE_EXAMPLE_DB"
DEFAULT = ".kvstate/examples"
KEY_VERSION = 1  # bumped when what a key's examples mean changes (the state machines' rules)
REDIS_PREFIX = b"kvstate-example:"
REDIS_EXPIRY = timedelta(days=30)  # a key no run has touched for this long is dropped


def database_spec(given: str | None) -> str:
    """The database a run asked for: ``--example-db``, else ``KVSTATE_EXAMPLE_DB``, else the
    default directory."""
    if given is not None:
        return given
    return os.environ.get(ENV) or DEFAULT


def open_database(spec: str) -> ExampleDatabase | None:
    """``spec`` (see the module's doc) as a Hypothesis example database; ``none``: None.

    A Redis URL is checked with one ``PING``, so an unreachable server is a usage error at
    start, not a failure after the run.  Raises :class:`SpecError` (exit 2) on a bad spec."""
    if spec.strip().lower() in ("", "none", "off"):
        return None
    if spec.startswith(("redis://", "rediss://", "unix://")):
        try:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase
        except ModuleNotFoundError as exc:
            raise SpecError(
                f"--example-db {spec}: needs the redis client: pip install 'kvstate[redis]'"
            ) from exc
        try:
            client = redis.Redis.from_url(spec)
            client.ping()
        except (redis.RedisError, ValueError) as exc:
            raise SpecError(f"--example-db {spec}: cannot reach the server: {exc}") from exc
        return RedisExampleDatabase(client, expire_after=REDIS_EXPIRY, key_prefix=REDIS_PREFIX)
    if "://" in spec:
        raise SpecError(
            f"--example-db {spec!r}: expected a directory, 'none', redis://HOST:PORT/DB "
            "or unix:///PATH"
        )
    if os.path.exists(spec) and not os.path.isdir(spec):
        raise SpecError(f"--example-db {spec!r}: not a directory")
    return DirectoryBasedExampleDatabase(spec)


def database_key(
    target: str,
    table: str,
    geometry: str,
    pool: int,
    bugs: Iterable[str] = (),
    skipped: Iterable[str] = (),
) -> bytes:
    """The explicit, stable key a run's examples are filed under (see the module's doc)."""
    parts = [
        f"kvstate-fuzz/v{KEY_VERSION}",
        f"target={target}",
        f"table={table}",
        f"geometry={geometry}",
        f"pool={pool}",
        f"bugs={','.join(sorted(bugs))}",
        f"skip={','.join(sorted(skipped))}",
    ]
    return ";".join(parts).encode()


def with_database(prof: settings, db: ExampleDatabase | None) -> settings:
    """``prof`` with ``db``: a derandomized profile keeps ``database=None`` (Hypothesis
    refuses both), so ``ci`` stays deterministic."""
    if prof.derandomize or db is None:
        return settings(prof, database=None)
    return settings(prof, database=db)


def saved(prof: settings, key: bytes) -> int:
    """How many examples the run's database holds under ``key`` (0 without a database)."""
    db = prof.database
    if db is None:
        return 0
    return sum(1 for _ in db.fetch(key))


def machine_test(cls: Any, prof: settings, key: bytes) -> Any:
    """Hypothesis' test function for the state machine ``cls`` (what
    :func:`hypothesis.stateful.run_state_machine_as_test` calls; HypoFuzz calls it too), with
    its examples filed under ``key``."""
    from hypothesis.stateful import get_state_machine_test

    test = get_state_machine_test(cls, settings=prof)
    # The key Hypothesis' engine reads before digesting the function's source (what ``find``
    # sets too): examples are filed, and replayed first, under this key.
    test._hypothesis_internal_database_key = key  # type: ignore[attr-defined]
    return seeded(test)


def seeded(test: Any) -> Any:
    """``test`` run with Hypothesis' draws following the seed alone
    (:func:`kvstate.harness.profiles.seed_only`), Hypothesis' attributes kept."""
    import functools

    from kvstate.harness.profiles import seed_only

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> Any:
        with seed_only():
            return test(*args, **kwargs)

    return run


def run_machine(cls: Any, prof: settings, key: bytes) -> None:
    """Run the state machine ``cls`` under ``prof`` as a test, its examples under ``key``."""
    machine_test(cls, prof, key)()
