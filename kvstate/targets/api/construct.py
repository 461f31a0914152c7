"""The constructor's other forms: the table it builds from its arguments, and what it leaves.

The harness opens every cache with its table and a directory of its own, so the constructor's
other forms were never run: a cache from a geometry alone (the default table derived for it),
a table with another geometry (the table derived for that one), no directory (a temporary one,
deleted at ``close``), and a memory limit that holds the tiers but not the CUDA-graph block
table (refused with ``LayoutError``).  ``construct(k)`` builds the ``k``-th form beside the
example's cache and checks it against the spec's own derivation:

* the cache's table is the one ``spec/`` derives: ``default_table(geometry)``, or
  ``table.with_geometry(geometry)`` (its name, geometry and actions);
* a temporary directory exists while the cache is open and is gone after ``close``;
* a refused construction raises its documented error and leaves nothing: the directory it was
  given is not locked (a cache opens it at once) and holds no file;
* a ``Run`` of a cache closed since refuses every read with ``CacheClosed``, and so does an
  action fired by name through its ``test_hooks()``;
* without a directory, a temporary one that cannot be made is a ``StorageError``, and one made
  for an open refused later is deleted.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kvstate.targets.api.declare import OpDecl
from kvstate.targets.api.geometry import other_geometry

FORMS = (
    "geometry alone, no directory",
    "over the memory limit, then a table and a geometry",
    "a run read after close",
    "no directory: the temporary one refused, then given back by a refused open",
)
_SMALL = dict(executors="manual", device_blocks=2, host_blocks=1, max_requests=1)


def _fail(h: Any, o: Any, what: str, detail: str) -> Exception:
    return h.fail("construct", [what], f"{o.render()}: {detail}")


def _same_table(h: Any, o: Any, form: str, got: Any, want: Any) -> None:
    """The cache's table is ``want`` (its name, geometry and actions: spec/'s derivation)."""
    if (got.name, got.geometry, [a.name for a in got.actions]) != (
        want.name,
        want.geometry,
        [a.name for a in want.actions],
    ):
        raise _fail(
            h,
            o,
            form,
            f"the cache's table {got.name} on {got.geometry.name} is not the one "
            f"spec/ derives ({want.name} on {want.geometry.name})",
        )


def do_construct(h: Any, o: Any) -> int | None:
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.errors import LayoutError
    from kvstate.impl.tiers import planned_bytes
    from kvstate.spec import default_table

    g = other_geometry(h.table.geometry)
    k = o.arg("k") % len(FORMS)
    form = FORMS[k]
    if g is None or h.threads:
        return None
    if k == 0:
        c = HeterogeneousKVCache(g, **_SMALL)
        try:
            _same_table(h, o, form, c.inspect().table, default_table(g))
            root = Path(c.inspect().disk.new_path(b"\0" * 8)).parent
            if not root.is_dir():
                raise _fail(h, o, form, f"the temporary cache directory {root} is missing")
        finally:
            c.close()
        if root.exists():
            raise _fail(h, o, form, f"the temporary cache directory {root} outlived close()")
    elif k == 2:
        _closed_run(h, o, form)
    elif k == 3:
        _temporary(h, o, form, g)
    else:
        dev_b, host_b = planned_bytes(g, _SMALL["device_blocks"], _SMALL["host_blocks"], 1, None)
        with tempfile.TemporaryDirectory(prefix="kvstate-construct-") as d:
            try:
                c = HeterogeneousKVCache(g, cache_dir=d, memory_limit=dev_b + host_b, **_SMALL)
            except LayoutError:
                pass
            else:
                c.close()
                raise _fail(
                    h,
                    o,
                    form,
                    f"memory_limit {dev_b + host_b} holds the tiers alone, yet the "
                    "cache was built (its CUDA-graph block table counts in the limit)",
                )
            # the refused one left the directory unlocked: a cache opens it at once
            c = HeterogeneousKVCache(g, table=h.table, cache_dir=d, **_SMALL)
            try:
                _same_table(h, o, form, c.inspect().table, h.table.with_geometry(g))
            finally:
                c.close()
            left = [n for n in os.listdir(d) if n.endswith((".kvb", ".tmp"))]
            if left:
                raise _fail(h, o, form, f"the constructions left files: {left}")
    h.cov.add(f"check: constructor form ({form})")
    return None


def _closed_run(h: Any, o: Any, form: str) -> None:
    """A run of a cache closed meanwhile: every reader raises ``CacheClosed`` (docs/library.md),
    the diagnostic ``verify_pins`` too."""
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.errors import CacheClosed
    from kvstate.impl.testdata import DeterministicWriter

    c = HeterogeneousKVCache(table=h.table, writer=DeterministicWriter(), **_SMALL)
    hooks = c.test_hooks()
    tokens = np.array(h.tokens[: 2 * h.L], dtype=np.int64)
    try:
        for _ in range(2):  # the second request hits the blocks the first stored
            req = c.request(tokens)
            c.admit(req)
            ctx = c.use(req)
            run = ctx.__enter__()
            if _ == 0:
                ctx.__exit__(None, None, None)  # (stores the blocks and releases the request)
    finally:
        c.close()
    readers = {
        "read_compressed": lambda: run.read_compressed("csa", 0),
        "read_window": lambda: run.read_window(0),
        "read_tail": lambda: run.read_tail(0),
        "verify_pins": run.verify_pins,
        "act": lambda: hooks.act("tick", 1),  # (the table's clock, by name)
    }
    for name, read in readers.items():
        try:
            read()
        except CacheClosed:
            continue
        except Exception as exc:
            raise _fail(h, o, form, f"{name} raised {type(exc).__name__}: {exc}") from exc
        raise _fail(h, o, form, f"{name} read a run of a closed cache (CacheClosed)")


def _temporary(h: Any, o: Any, form: str, g: Any) -> None:
    """No ``cache_dir``: where no temporary directory can be made (the temporary root a file),
    ``StorageError``; where one is made and the open is refused after it (a short disk key),
    the documented refusal, and the temporary directory is gone (the temporary root, this
    check's own, is left empty).  ``tempfile.tempdir`` is set for the two calls only."""
    from kvstate.impl import HeterogeneousKVCache
    from kvstate.impl.errors import InvalidArgument, StorageError

    saved = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="kvstate-tmproot-") as root:
        not_a_dir = os.path.join(root, "a-file")
        Path(not_a_dir).write_bytes(b"")
        private = os.path.join(root, "tmp")
        os.mkdir(private)
        for where, kw, want in (
            (not_a_dir, {}, StorageError),
            (private, {"disk_key": b"k" * 8}, InvalidArgument),
        ):
            tempfile.tempdir = where
            try:
                c = HeterogeneousKVCache(g, **kw, **_SMALL)
            except want:
                # while the caller holds the error (its traceback keeps the half-built cache
                # alive): the temporary directory is gone already, not left to a finalizer
                left = os.listdir(private)
                if left:
                    raise _fail(
                        h, o, form, f"a refused open left its temporary directory: {left}"
                    ) from None
            except Exception as exc:
                raise _fail(
                    h,
                    o,
                    form,
                    f"temporary root {where}: {type(exc).__name__}: {exc}, not {want.__name__}",
                ) from exc
            else:
                c.close()
                raise _fail(h, o, form, f"temporary root {where}: built, not {want.__name__}")
            finally:
                tempfile.tempdir = saved


def walks(N: int, L: int, lease_max: int) -> dict[str, list[Any]]:
    from kvstate.targets.api.base import op

    return {"the constructor's other forms": [op("construct", k=k) for k in range(len(FORMS))]}


# scripted only (the walk above): the declarations' form is kvstate/targets/api/declare.py's
DECLS: tuple[OpDecl, ...] = (
    OpDecl(
        "construct",
        do_construct,
        "read",
        lambda s: {"k": st.integers(0, len(FORMS) - 1)},
        rule=False,
    ),
)
