"""Side by side: kvstate's request path against SGLang's DeepSeek-V4 cache stack, in one run.

Both run the trace of ``bench/impl_bench.py`` (as ``bench/vs_vllm.py`` does): families of 5
requests over one prefix of ``N`` tokens, each request the prefix plus its own 64-token suffix;
the first request of a family is a miss that stores the prefix, the other four hit all of it.
What is timed is the request path only:

* kvstate: ``admit`` + ``use`` + ``finish`` (one ``impl_bench`` cycle, DeepSeek-V4-Flash geometry);
* SGLang: the ``--target sglang`` operations on its DeepSeek-V4 stack
  (``DeepSeekV4TokenToKVPool``, fp8, ratios 4/128, page 256, window 128, under
  ``UnifiedRadixCache``), one row per tree core (``python``, ``rust``): ``admit`` (match, lock,
  ``prepare_for_extend``: slots, ``evict_for_alloc``, ``alloc_extend``, then
  ``checkpoint_kv_cache``) + ``finish`` (``release_kv_cache(checkpoint=True)``).  The forward's
  marker writes of the fuzz target are switched off here.

Building the request (kvstate: ``cache.request``; SGLang: a ``Req``) is timed apart and counted
in the second ratio.  Each round runs ``--families`` families of each side back to back, the
order rotating; a round's ratio is kvstate's cycles/s over the other side's from that round
alone (paired under the same machine load).  Printed: median (min-max) over rounds.  Both
pools hold one family plus a margin, so each family's miss evicts the previous family.

SGLang is optional: without it the bench prints why and exits 0 (``tools/install_sglang.sh``).

    .venv/bin/python bench/vs_sglang.py [--lengths 1K 4K 16K 64K] [--rounds 7]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import impl_bench as B  # noqa: E402
import side_by_side as V  # noqa: E402  (takes the repository root off sys.path)
import torch  # noqa: E402

from kvstate.impl import native_modules  # noqa: E402

CORES = ("python", "rust")


class SGSide:
    """SGLang's DeepSeek-V4 stack, driven by the fuzz target's own operations."""

    def __init__(self, core: str, n: int, clock: str) -> None:
        from kvstate.targets.sglang.configs import Config
        from kvstate.targets.sglang.ops import SOURCE

        self.name = f"SGLang {core}"
        self.n = n
        pool = n + 12 * 256  # one family (prefix + 5 suffixes, page-rounded) and a margin
        cfg = Config("deepseek-v4", core, 256, 128, pool, n + 1024)
        self.ns: dict[str, Any] = {"__name__": "vs_sglang_stack"}
        exec(compile(cfg.source + SOURCE, f"<sglang {cfg.label}>", "exec"), self.ns)  # noqa: S102
        self.st = self.ns["Stack"]()
        self.st.write_markers = lambda req, lo, hi: None  # no forward: nothing to write
        self.tokens = V.Tokens(n)
        self.clock = V.CLOCK[clock]

    def family(self, side: V.Side | None) -> None:
        ns, st, clock = self.ns, self.st, self.clock
        for r in range(B.FAMILY):
            prompt = self.tokens.next(r).tolist()
            t0 = clock()
            ns["arrive"](st, 0, 0, prompt)
            t1 = clock()
            got = ns["admit"](st, 0, 1 << 30)
            ns["finish"](st, 0)
            t2 = clock()
            want = 0 if r == 0 else self.n
            if got is None or got[1][0] != want:
                raise RuntimeError(f"request {r} of a family hit {got and got[1][0]}, not {want}")
            if side is not None:
                side.add(t1 - t0, t2 - t1, miss=r == 0)
        st.finished.clear()

    def close(self) -> None:
        self.ns["close"](self.st)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", default=["1K", "4K", "16K", "64K"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--families", type=int, default=0, help="per side per round (0: 256/blocks)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed families per side")
    ap.add_argument("--cores", nargs="+", choices=CORES, default=list(CORES))
    ap.add_argument("--memory-gib", type=float, default=4.0)
    ap.add_argument("--clock", choices=sorted(V.CLOCK), default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from kvstate.targets.sglang import imports as sglang_import

    try:
        sglang_import.load()
    except sglang_import.SGLangUnavailable as e:
        print(f"SKIPPED: {e}; tools/install_sglang.sh installs it")
        return
    logging.getLogger("sglang").setLevel(logging.ERROR)
    compiled = native_modules()
    print(
        f"machine load (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"SGLang {sglang_import.version()}, torch {torch.__version__}; kvstate request path: "
        + ("compiled by mypyc" if "cache" in compiled else "pure Python")
    )
    print(
        f"trace: families of {B.FAMILY} (1 miss + {B.FAMILY - 1} full-prefix hits), "
        f"{B.SUFFIX}-token suffix; {args.rounds} rounds, sides rotating; clock {args.clock}"
    )
    t0 = time.perf_counter()
    results = []
    for s in args.lengths:
        n = B.parse_length(s)
        results.append(
            V.run_length(n, lambda m: [SGSide(core, m, args.clock) for core in args.cores], args)
        )
        print(f"  [{s}: done, {time.perf_counter() - t0:.0f} s so far]", flush=True)
    V.report(results, [f"SGLang {c}" for c in args.cores], "SGLang")
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
