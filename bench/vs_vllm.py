"""Side by side: kvstate's request path against vLLM's ``KVCacheManager``, in one run.

Both run the trace of ``bench/impl_bench.py``: families of 5 requests over one prefix of ``N``
tokens, each request the prefix plus its own 64-token suffix; the first request of a family is a
miss that stores the prefix, the other four hit all of it.  What is timed is the allocator's
request path only:

* kvstate: ``admit`` + ``use`` (enter and exit: the block is stored at exit) + ``finish``, i.e.
  one ``impl_bench`` cycle (DeepSeek-V4-Flash geometry, 256-token LCM blocks, 5 groups, no KV
  content written);
* vLLM: ``get_computed_blocks`` + ``allocate_slots`` (caches the prompt's full blocks) +
  ``free`` on a ``KVCacheManager`` with prefix caching on.

Building the request (hashing the prompt into block keys: ``cache.request`` here,
``vllm.v1.request.Request`` with vLLM's block hasher there) is timed separately and reported,
and counted in a second ratio (request + cycle).

vLLM layouts (rows), each built from vLLM's own spec classes:

* ``equal``: 5 groups at 256-token blocks mirroring kvstate's groups (CSA, HCA and the indexer as
  full-attention groups; the SWA window, 128 tokens, and the compressor state, 8 tokens, as
  sliding-window groups): equal granularity, the apples-to-apples row.
* ``dsv4``: vLLM's own DeepSeek-V4 layout, as its model code declares it and its planner groups
  it: two sliding-window MLA groups (block 64, window 128), one compressed-attention MLA group
  (block 256, one state per 4 tokens), the compressor-state groups (block 4, window 8; block 8,
  window 128); scheduler block 256, prompts hashed every 4 tokens.

Cycles are timed by this thread's CPU time by default (``--clock cpu``): on a shared 2-core
machine a process descheduled in the middle of a cycle accrues no CPU time, where wall time
also counts every other job (``--clock wall`` times wall time).  Each round runs ``--families`` families of each side back to back, the order rotating between
rounds, and a round's ratio is kvstate's cycles/s over vLLM's from that round alone (paired:
both saw the same machine load).  Printed: min / median / max over rounds.  The pools hold one
family plus a margin on both sides, so each family's miss evicts the previous family.

vLLM is optional: without it the bench prints why and exits 0.  Install (CPU only, no CUDA
stack): ``pip install torch==2.13.0``, ``pip install --no-deps vllm==0.33.0``, its pure-Python
imports and ``pip install --no-deps xgrammar``: ``tools/install_vllm.sh`` does all of it.

    .venv/bin/python bench/vs_vllm.py [--lengths 1K 4K 16K 64K] [--rounds 7] [--layouts equal dsv4]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("KVSTATE_KERNEL_BACKEND", "torch")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import argparse  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import impl_bench as B  # noqa: E402
import side_by_side as S  # noqa: E402  (takes the repository root off sys.path)
import torch  # noqa: E402

from kvstate.impl import native_modules  # noqa: E402

# the shared part, under the names this module has always offered (bench/impl_instructions.py)
CLOCK, Side, Tokens, KVSide, Result = S.CLOCK, S.Side, S.Tokens, S.KVSide, S.Result
ROOT = S.ROOT

LAYOUTS = ("equal", "dsv4")


def import_vllm() -> dict[str, Any] | str:
    """vLLM's manager, spec classes and hasher, or why they are not available."""
    try:
        import vllm
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MLAAttentionSpec,
            SlidingWindowMLASpec,
            SlidingWindowSpec,
        )
        from vllm.v1.request import Request
    except Exception as exc:  # noqa: BLE001 - any import failure means "no usable vLLM"
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    kernels = sys.modules.get("kernels")
    if (
        kernels is not None
        and Path(getattr(kernels, "__file__", "") or "").parent == ROOT / "kernels"
    ):
        return "the project's kernels/ shadows vLLM's `kernels` package (run from another folder)"
    init_none_hash(sha256)
    return {
        "version": vllm.__version__,
        "KVCacheManager": KVCacheManager,
        "KVCacheConfig": KVCacheConfig,
        "KVCacheGroupSpec": KVCacheGroupSpec,
        "FullAttentionSpec": FullAttentionSpec,
        "SlidingWindowSpec": SlidingWindowSpec,
        "MLAAttentionSpec": MLAAttentionSpec,
        "SlidingWindowMLASpec": SlidingWindowMLASpec,
        "Request": Request,
        "SamplingParams": SamplingParams,
        "hasher": lambda size: get_request_block_hasher(size, sha256),
    }


def vllm_layout(v: dict[str, Any], layout: str) -> tuple[list[Any], int, int]:
    """(group specs, scheduler block, hash block) of a layout, from vLLM's spec classes."""
    u8, bf16 = torch.uint8, torch.bfloat16
    if layout == "equal":
        full = v["FullAttentionSpec"](block_size=256, num_kv_heads=1, head_size=512, dtype=bf16)

        def swa(window: int) -> Any:
            return v["SlidingWindowSpec"](
                block_size=256, num_kv_heads=1, head_size=512, dtype=bf16, sliding_window=window
            )

        # CSA, HCA, indexer: full history; SWA: the 128-token window; compressor: its state
        return [full, full, full, swa(128), swa(8)], 256, 256
    if layout == "dsv4":
        mla_swa = dict(num_kv_heads=1, head_size=512, dtype=u8, alignment=512)

        def window(block: int, w: int, v4: bool = True) -> Any:
            kw: dict[str, Any] = dict(mla_swa, block_size=block, sliding_window=w)
            if v4:
                kw["model_version"] = "deepseek_v4"
            return v["SlidingWindowMLASpec"](**kw)

        compressed = v["MLAAttentionSpec"](
            block_size=256,
            num_kv_heads=1,
            head_size=512,
            dtype=u8,
            tokens_per_state=4,
            alignment=512,
            model_version="deepseek_v4",
        )
        # models/deepseek_v4: sparse SWA (sparse_swa.py), the compressed MLA cache
        # (attention.py), the compressor state ring (compressor.py: C4 block 4 window 8,
        # C128 block 8 window 128)
        return [window(64, 128), window(64, 128), compressed, window(4, 8, False),
                window(8, 128, False)], 256, 4  # fmt: skip
    raise ValueError(layout)


class VSide:
    def __init__(self, v: dict[str, Any], layout: str, n: int, clock: str) -> None:
        self.name = f"vLLM {layout}"
        self.clock = CLOCK[clock]
        specs, sched, hblock = vllm_layout(v, layout)
        groups = [v["KVCacheGroupSpec"]([f"{layout}.{i}"], s) for i, s in enumerate(specs)]
        per_req = sum(-(-(n + B.SUFFIX) // s.block_size) + 1 for s in specs)
        cfg = v["KVCacheConfig"](
            num_blocks=per_req + B.MARGIN_BLOCKS * len(specs),  # one family plus a margin
            kv_cache_tensors=[],
            kv_cache_groups=groups,
        )
        self.mgr = v["KVCacheManager"](
            cfg,
            max_model_len=n + 256,
            scheduler_block_size=sched,
            hash_block_size=hblock,
            enable_caching=True,
        )
        self.Request = v["Request"]
        self.params = v["SamplingParams"](max_tokens=1)
        self.hasher = v["hasher"](hblock)
        self.tokens = Tokens(n)
        self.n = n
        self.serial = 0

    def family(self, side: Side | None) -> None:
        clock = self.clock
        mgr = self.mgr
        for r in range(B.FAMILY):
            prompt = self.tokens.next(r).tolist()
            self.serial += 1
            t0 = clock()
            req = self.Request(
                str(self.serial), prompt, self.params, None, block_hasher=self.hasher
            )
            t1 = clock()
            blocks, hit, _ = mgr.get_computed_blocks(req)
            got = mgr.allocate_slots(req, len(prompt) - hit, hit, blocks)
            mgr.free(req)
            t2 = clock()
            self.check(r, hit, got)
            if side is not None:
                side.add(t1 - t0, t2 - t1, r == 0)

    def make_request(self, r: int) -> tuple[Any, list[int]]:
        """The family's ``r``-th request (untimed), and its prompt."""
        prompt = self.tokens.next(r).tolist()
        self.serial += 1
        req = self.Request(str(self.serial), prompt, self.params, None, block_hasher=self.hasher)
        return req, prompt

    def cycle(self, req: Any, prompt: list[int]) -> tuple[int, Any]:
        """One cycle, exactly as :meth:`family` times it: (hit tokens, allocated blocks)."""
        mgr = self.mgr
        blocks, hit, _ = mgr.get_computed_blocks(req)
        got = mgr.allocate_slots(req, len(prompt) - hit, hit, blocks)
        mgr.free(req)
        return hit, got

    def check(self, r: int, hit: int, got: Any) -> None:
        """Request ``r`` of a family hit what the trace says (0 for the miss, the prefix)."""
        want = 0 if r == 0 else self.n
        if got is None or hit != want:
            raise RuntimeError(f"{self.name}: request {r}: hit {hit}, expected {want}")

    def close(self) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", nargs="+", default=["1K", "4K", "16K", "64K"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--families",
        type=int,
        default=0,
        help="families per side per round (0: 256 / blocks, >= 4)",
    )
    ap.add_argument("--warmup", type=int, default=3, help="untimed families per side")
    ap.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    ap.add_argument("--memory-gib", type=float, default=4.0)
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCK),
        default="cpu",
        help="time cycles by thread CPU time or wall",
    )
    ap.add_argument(
        "--no-gc",
        dest="gc",
        action="store_false",
        help="pause the garbage collector while each side's families of a round run "
        "(as bench/impl_instructions.py counts): what the collector's passes cost",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    compiled = native_modules()
    print(
        f"machine load (1/5/15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"{os.cpu_count()} CPUs; python {sys.version.split()[0]}, torch {torch.__version__}"
    )
    print(
        "kvstate request path: "
        + (f"compiled by mypyc ({', '.join(compiled)})" if "cache" in compiled else "pure Python")
    )
    v = import_vllm()
    if isinstance(v, str):
        print(
            f"SKIPPED: vLLM is not importable here ({v}); see this file's docstring to install it"
        )
        return
    print(
        f"vLLM {v['version']} KVCacheManager (prefix caching on, CPU); layouts: {', '.join(args.layouts)}"
    )
    print(
        f"trace: families of {B.FAMILY} (1 miss + {B.FAMILY - 1} full-prefix hits), "
        f"{B.SUFFIX}-token unique suffix; {args.rounds} rounds, sides alternating; "
        f"clock: {'thread CPU time' if args.clock == 'cpu' else 'wall time'}"
        + ("" if args.gc else "; garbage collector paused during the rounds")
    )
    t0 = time.perf_counter()
    results = []
    for s in args.lengths:
        n = B.parse_length(s)
        results.append(
            S.run_length(n, lambda m: [VSide(v, lay, m, args.clock) for lay in args.layouts], args)
        )
        print(f"  [{s}: done, {time.perf_counter() - t0:.0f} s so far]", flush=True)
    S.report(results, [f"vLLM {lay}" for lay in args.layouts], "vLLM")
    print(
        f"\nmachine load at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"wall time {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
