"""The block metadata's columns are written out for speed in ``impl/meta.py``; they are bound to
the table at construction, so a table whose block variables or initial phases differ is refused
with a documented error instead of running on a silent copy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvstate.impl import HeterogeneousKVCache, InvalidArgument
from kvstate.impl.meta import BlockMeta
from kvstate.impl.testdata import DeterministicWriter
from kvstate.spec import default_table
from kvstate.spec.phases import CKV


def test_the_default_table_binds() -> None:
    BlockMeta(2).check_columns(default_table())


def test_a_different_initial_phase_is_refused() -> None:
    t = default_table()
    vars_ = tuple(
        replace(v, init=lambda *a: int(CKV.READY)) if v.name == "ckv" else v for v in t.vars
    )
    with pytest.raises(InvalidArgument, match="ckv starts at READY"):
        BlockMeta(2).check_columns(replace(t, vars=vars_))


def test_a_missing_block_variable_is_refused_at_construction() -> None:
    t = default_table()
    bad = replace(t, vars=tuple(v for v in t.vars if v.name != "ixpipe"))
    with pytest.raises(InvalidArgument, match="ixpipe"):
        HeterogeneousKVCache(
            table=bad,
            executors="manual",
            device_blocks=8,
            host_blocks=4,
            writer=DeterministicWriter(),
        )


def test_a_table_without_an_action_is_refused_before_the_directory_is_touched(
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """The action map is bound before the cache directory is opened: the refusal leaves the
    directory as it was (no key file made for a cache that never existed)."""
    t = default_table()
    bad = t.derive(remove_action=[t.actions[-1].name])
    with pytest.raises(InvalidArgument, match=t.actions[-1].name):
        HeterogeneousKVCache(table=bad, cache_dir=tmp_path, executors="manual", device_blocks=2)
    assert list(tmp_path.iterdir()) == []
