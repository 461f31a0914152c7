"""A spill the remote store refuses: the server out of memory with no eviction allowed.

The remote tier's faults (kvstate/targets/api/remote.py) act on entries already written; a
write the server refuses was never met, so the store's and the tier's handling of a refused
``SET`` (``RedisStore.put`` turning the client's error into ``StoreUnavailable``,
``RemoteTier.publish`` into ``DiskWriteError``) ran in no walk.  ``remote_full(n)`` sets the
server's ``maxmemory`` below what it uses with ``maxmemory-policy noeviction`` (every write is
refused with ``OOM``, reads still answer), calls ``spill(n)``, and puts both settings back.  The
contract is the full disk's (README; kvstate/targets/api/refusedwrites.py): ``spill`` raises
``DiskWriteError`` where the table lets a block spill, and changes nothing (the harness's
refusal check: the model's state, the events, the remote table's lockstep state).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl


def do_remote_full(h: Any, o: Any) -> int | None:
    """``remote_full(n)``: ``spill(n)`` while the server refuses every write."""
    from kvstate.impl.errors import DiskWriteError, KVStateError
    from kvstate.targets.api.remote import WORLD, remote_of

    if remote_of(h) is None or WORLD is None or h.threads:
        return None
    r = WORLD.admin()
    limit = r.config_get("maxmemory")["maxmemory"]
    policy = r.config_get("maxmemory-policy")["maxmemory-policy"]
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", "1")
    try:
        h.returned = h.cache.spill(o.arg("n"))
    except DiskWriteError:
        h.cov.add("fault remote_full")
        raise  # (the harness checks that nothing changed)
    except KVStateError as exc:  # documented, but not the refused write's error
        raise h.fail(
            "refused-write",
            ["remote_full"],
            f"{o.render()}: the server refused every write and spill raised "
            f"{type(exc).__name__}: {exc} (a refused write raises DiskWriteError)",
        ) from exc
    finally:
        r.config_set("maxmemory", limit)
        r.config_set("maxmemory-policy", policy)
    m = h.machine
    can = [b for b in range(h.N) if m.is_enabled(h.model, "spill", {"b": b})]
    if can and o.arg("n") > 0:
        raise h.fail(
            "refused-write",
            ["remote_full"],
            f"{o.render()}: the server refused every write and spill returned {h.returned} "
            f"without DiskWriteError, though the table lets blocks {can} spill",
        )
    return None


# the operations of this module, each declared once (kvstate/targets/api/declare.py); drawn only
# when the run has a remote tier (registry.REMOTE_ONLY)
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "remote_full",
        do_remote_full,
        "spill",
        lambda s: {"n": st.integers(0, s.N)},
        faults=("remote_full",),
    ),
)


def walks(N: int, to_disk: list[Any], hit: list[Any]) -> dict[str, list[Any]]:
    """Scripted (kvstate/targets/api/witnesses.py, in a run with a remote tier): the blocks on
    the host spilled while the server refuses writes, then the walk to the store (its last four
    steps: spill, offload, drain, spill) and a hit as usual."""
    from kvstate.targets.api.base import op

    to_host, rest = to_disk[:-4], to_disk[-4:]
    walk = [*to_host, op("remote_full", n=N), *rest, *hit, op("finish", i=1)]
    return {"remote: a spill the server refuses": walk}
