"""The compiled twins of the generated guards and search (kvstate/buildtools/aotgen.py, impl/_aot.py).

* ``impl/_aot.py`` is what the generator writes from the current sources (else: the command that regenerates it).
* ``define`` returns a twin only for the exact source it was made from: one byte changed (a
  mutant, a custom table, another geometry) and the source runs as generated.
* The compiled build's caches of the preset geometries run the twins; another geometry's
  search runs its own generated source.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvstate.buildtools.aotgen import COMMAND, annotate
from kvstate.buildtools.aotgen import twins as aot_twins
from kvstate.impl import HeterogeneousKVCache, native_modules
from kvstate.impl import twins as T
from kvstate.spec import compile as C
from kvstate.spec.geometry import small


def test_the_twins_module_is_fresh() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvstate.buildtools.aotgen", "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"impl/_aot.py is stale: run `{COMMAND}`\n{out.stderr}"


def test_a_twin_is_used_only_for_its_exact_source() -> None:
    src = "def aot_probe(v, p):\n    return 1\n"
    twin = lambda v, p: 2  # noqa: E731
    key = T.source_key(src)
    T.register_twins({key: twin})
    try:
        assert C.define("aot_probe", src) is twin
        assert C.define("aot_probe", src.replace("1", "3"))(None, None) == 3
        assert C.define("aot_probe", src + " ")(None, None) == 1
    finally:
        del T._TWINS[key]


def test_annotations_are_read_off_the_table_and_layout_only() -> None:
    src = "def f(v, p, bs):\n    t_ckv = v.ckv\n    t_now = v.now\n    Q = v.q\n    return -1\n"
    out = annotate(src, {"t_ckv": "Sequence[int]", "t_now": "int"}, frozenset({"ckv"}))
    assert "bs: Sequence[int]" in out and "-> int" in out
    assert "t_ckv: Sequence[int] = v.ckv" in out and "t_now: int = v.now" in out
    assert "    Q = v.q" in out  # a name the table does not declare stays untyped


def _cycle(cache: HeterogeneousKVCache) -> None:
    import numpy as np

    toks = np.arange(4 * cache.L + 3, dtype=np.int64)
    for _ in range(2):  # a miss, then a hit
        adm = cache.admit(cache.request(toks, lifetime=1))
        with cache.use(adm):
            pass
        cache.tick()


@pytest.mark.skipif("_aot" not in native_modules(), reason="the twins are not compiled")
def test_the_preset_geometry_runs_the_twins_and_another_its_own_source() -> None:
    twins = set(map(id, aot_twins().values()))
    kw = dict(device="cpu", executors="manual", max_requests=4, writer=None)
    with HeterogeneousKVCache(small(), **kw) as preset:  # type: ignore[arg-type]
        _cycle(preset)
        assert id(preset.inspect().hit_search) in twins
    with HeterogeneousKVCache(small(32), **kw) as other:  # type: ignore[arg-type]
        _cycle(other)
        fn = other.inspect().hit_search
        assert id(fn) not in twins and hasattr(fn, "__code__")


def test_a_deployments_caps_and_pools_do_not_change_the_generated_sources() -> None:
    """A cache of a preset geometry sized for a deployment (its pools, its admission and I/O
    caps: what ``bench/vs_vllm.py`` and ``bench/impl_bench.py`` size per prefix length) asks
    for exactly the sources of the twins: the caps are read at run time from the state's
    constants (``spec/compile.py`` ``RUNTIME_CONSTS``), not folded into the source."""
    from kvstate.buildtools.aotgen import collect, twins
    from kvstate.spec.geometry import deepseek_v4_flash

    for pin_cap, io_cap in ((6, 3), (5, 1)):
        g = deepseek_v4_flash().with_changes(
            device_blocks=6, host_blocks=1, disk_blocks=4, pin_cap_blocks=pin_cap, io_cap=io_cap
        )
        asked = collect(g)
        assert asked, "nothing was generated: the sources were compiled before (memo)"
        missing = sorted(name for key, (name, _src, _env) in asked.items() if key not in twins())
        assert not missing, (
            f"sources without a twin at pin_cap={pin_cap}, io_cap={io_cap}: {missing}"
        )
        pin = [src for name, src, _env in asked.values() if name == "guard_pin_pin_cap"]
        assert pin and all("v.k.pin_cap" in s for s in pin)


def test_the_registry_asked_is_the_one_that_answers_after_a_build() -> None:
    """A table's functions built once are kept (``kvstate.spec.compile.memo``); a block of
    ``using_twins`` (the API fuzz's other form, ``suspend_twins`` in the generated sources'
    tests) must still get the form it asks for, not the one built before it."""
    from kvstate.spec import default_table

    table = default_table()
    shipped = T.shipped_twins()
    twin_fns = set(shipped.values())

    def twins_of(guards: C.CompiledGuards) -> set[bool]:
        return {fn in twin_fns for conj in guards.conjuncts.values() for _, fn in conj}

    with T.using_twins({}):
        assert twins_of(C.compile_guards(table, table.consts)) == {False}
    with T.using_twins(shipped):
        assert twins_of(C.compile_guards(table, table.consts)) == {True}
    with T.suspend_twins():
        assert twins_of(C.compile_guards(table, table.consts)) == {False}
