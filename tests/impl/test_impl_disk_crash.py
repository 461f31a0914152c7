"""Crash consistency of the disk tier: a writer process is killed with SIGKILL at a random
moment while it spills, then a cache is opened over the same directory.  No torn entry may be
served (every block served has exactly its prompt's bytes) and nothing may be left over (no
temporary, no entry file the new cache did not adopt).

The default run makes a few trials (seconds); ``KVSTATE_CRASH_TRIALS=100`` (or the Hypothesis
``dev``/``nightly`` profile) makes 100.  The counts are printed (``-s``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from cache_checks import check_compressed, make
from test_impl_disk import files

from kvstate.impl.testdata import harness_tokens
from kvstate.spec import small

G = small()
L = G.lcm_tokens
BLOCKS = 3  # blocks per prompt

WRITER = f"""
import sys
from kvstate.impl import HeterogeneousKVCache
from kvstate.impl.testdata import harness_tokens
from kvstate.impl.testdata import DeterministicWriter
from kvstate.spec import small
G = small()
L = G.lcm_tokens
c = HeterogeneousKVCache(
    G, cache_dir=sys.argv[1], executors="manual", disk_blocks=4096, writer=DeterministicWriter()
)
print("ready", flush=True)
i = int(sys.argv[2])
while True:
    print(i, flush=True)  # prompt i may be (partly) on disk from here on
    a = c.admit(c.request(harness_tokens({BLOCKS} * L + 1, seed=i)))
    with c.use(a):
        pass
    c.tick(10)
    c.offload(100)
    c.pipelines.drain()
    c.spill(100)
    print("spilled", flush=True)
    i += 1
"""


def trials() -> int:
    env = os.environ.get("KVSTATE_CRASH_TRIALS")
    if env:
        return int(env)
    return 100 if os.environ.get("HYPOTHESIS_PROFILE") in ("dev", "nightly") else 2


def one_trial(d: Path, rng: random.Random, first: int) -> dict[str, int]:
    """Run the writer, kill it at a random moment, reopen; the trial's counts."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(d), str(first)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    # the kill lands at a random moment after the first spill: a loaded machine can take longer
    # than the whole sleep for one prompt, and a trial that killed nothing on disk checks nothing
    lines = [proc.stdout.readline().strip(), proc.stdout.readline().strip()]
    assert lines == [str(first), "spilled"], lines
    time.sleep(rng.uniform(0.0, 1.2))
    proc.send_signal(signal.SIGKILL)
    out = [w for w in proc.stdout.read().split() if w != "spilled"]
    proc.wait()
    last = int(out[-1]) if out else first
    kvb_before = len(files(d))
    tmp_before = len([p for p in d.iterdir() if p.name.endswith(".tmp")])
    c = make(cache_dir=d, disk_blocks=4096)
    counts = {"served": 0, "torn": 0, "files": kvb_before, "killed_mid_write": tmp_before}
    try:
        counts["leftovers"] = len([p for p in d.iterdir() if p.name.endswith(".tmp")])
        counts["unadopted"] = len(files(d)) - c.stats()["disk_entries"]
        for seed in range(first, last + 1):
            toks = harness_tokens(BLOCKS * L + 1, seed=seed)
            a = c.admit(c.request(toks))
            c.pipelines.drain()
            with c.use(a, store=False) as run:
                counts["served"] += run.blocks
                try:
                    if run.blocks:
                        check_compressed(run, toks)
                except AssertionError:
                    counts["torn"] += 1
    finally:
        c.close()
    return counts


def test_sigkill_during_spills_serves_no_torn_entry(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("KVSTATE_CRASH_SEED", "11")))
    n = trials()
    total = dict.fromkeys(
        ("served", "torn", "leftovers", "unadopted", "files", "killed_mid_write"), 0
    )
    first = 0
    for t in range(n):
        d = tmp_path / f"t{t}"
        counts = one_trial(d, rng, first)
        first += 1000  # fresh prompts each trial
        for k, v in counts.items():
            total[k] += v
    print(
        f"crash consistency: {n} SIGKILL trials ({total['killed_mid_write']} temporaries of "
        f"killed writes found), {total['files']} entry files found, "
        f"{total['served']} blocks served, {total['torn']} torn served, "
        f"{total['leftovers']} temporaries left, {total['unadopted']} entries not adopted"
    )
    assert total["torn"] == 0
    assert total["leftovers"] == 0 and total["unadopted"] == 0
    assert total["served"] > 0  # the trials did reach the disk
