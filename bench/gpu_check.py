"""Real-GPU check of kvstate.kernels and of CUDA-graph replay across a recovery (one H200).

What it does, in order (``--sections`` picks a subset):

1. selects the CUDA backend explicitly; with no usable CUDA device it says so and exits 3
   (nothing was checked);
2. ``edge``: every dispatch function on small, awkward inputs (empty tables, all -1, ragged
   last block, strided and unaligned tiers, bf16, discontinuities), CUDA result vs the torch
   reference on the same GPU, bit for bit;
3. ``bandwidth``: each kernel at DeepSeek-V4-Flash sizes (hundreds of MiB per call, times
   ``--scale``), timed with CUDA events and reported as a fraction of a plain device-to-device
   copy measured the same way, with its output compared to the torch reference;
4. ``graph`` (:func:`check_cuda_graph_replay`): a ``HeterogeneousKVCache`` with its tiers on the
   GPU; a ``torch.cuda.CUDAGraph`` is captured (through the cache's graph registry,
   ``impl/graphs.py``) over an attention step that reads only persistent buffers; the prefix is
   offloaded to host and disk, its device slots are overwritten, a request is admitted and
   recovered (loads back into the device slots, block table refilled in place), the graph is
   replayed, and three checks print PASS/FAIL: (1) outputs equal an eager recompute and the
   writer's bytes, (2) every persistent address is unchanged and no recapture was forced,
   (3) a recovery that moves blocks is flagged STALE and replay is refused until recaptured.

Exit status: 0 every check of the sections run passed; 1 a check failed or a section raised
(the traceback is printed); 2 bad command line; 3 no usable CUDA device (torch or numba sees
none, or ``NUMBA_ENABLE_CUDASIM=1`` is set): nothing was checked.

Usage::

    python bench/gpu_check.py [--quick] [--scale 0.25] [--iters 10] [--sections edge,graph]
    python bench/gpu_check.py --cpu-dry-run   # no GPU: section 4's protocol on CPU, no capture

Budget: well under 5 minutes on one H200 at the default sizes; ``--quick`` (bandwidth at 5 %
size, 3 timed iterations) should take 1-2 minutes, most of it Numba compiling the kernels on
first launch and torch/CUDA start-up; the graph section is tiny (small geometry, a few seconds).
These are estimates: the script has not yet run on a GPU.

With the ``device`` tool (15 minutes of device time per task, 10 minutes per command): its
image's ``python3`` (3.12) has torch, numba and numba-cuda but not z3-solver, which
``kvstate.spec`` imports.  Once, here (no device time), fetch its wheel into an ignored folder::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 -d .whl z3-solver

then one ``run`` with ``carry=[".whl"]`` and ``timeout_s=480`` (the checkout need not be
installed: the script maps ``kvstate.*`` onto the repository's folders itself)::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 python3 bench/gpu_check.py --quick

(``--sections graph`` runs only section 4, in well under a minute.)
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch


def _ensure_importable() -> None:
    """Make ``import kvstate.<sub>`` work from an uninstalled checkout (the device machine).

    ``kvstate/`` holds only the CLI; its subpackages are the repository's top-level folders
    (pyproject's ``package-dir``), which an install maps.  Without one, the repository root is
    added to ``sys.path`` and to ``kvstate.__path__`` (where ``kvstate.spec`` is ``spec/``)."""
    try:
        import kvstate.kernels  # noqa: F401
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("kvstate"):
            raise  # a missing dependency (numba, z3 ...), not the package layout
        root = str(Path(__file__).resolve().parents[1])
        if root not in sys.path:
            sys.path.insert(0, root)
        import kvstate

        if root not in kvstate.__path__:
            kvstate.__path__.append(root)


_ensure_importable()

from kvstate.impl import EventKind, HeterogeneousKVCache, Refused  # noqa: E402
from kvstate.impl.testdata import harness_tokens  # noqa: E402
from kvstate.kernels import (  # noqa: E402
    Backend,
    BackendUnavailableError,
    BlockTableError,
    EntryLayout,
    TailDiscontinuityError,
    dequantize_entries,
    gather_blocks,
    quantize_entries,
    scatter_blocks,
    select_backend,
    splice_tail,
)
from kvstate.kernels import paged as paged_kernels  # noqa: E402
from kvstate.kernels._launch import GPU_LAUNCH  # noqa: E402
from kvstate.spec.geometry import deepseek_v4_flash, small  # noqa: E402
from kvstate.spec.phases import CKV, Graph  # noqa: E402

CUDA, REF = Backend.CUDA, Backend.TORCH


# ---- helpers --------------------------------------------------------------------------------
def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN matches NaN: payloads are unspecified)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        na, nb = torch.isnan(a), torch.isnan(b)
        if not torch.equal(na, nb):
            return False
        a, b = a[~na], b[~nb]
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def timed(fn: Callable[[], object], iters: int, warmup: int = 2) -> float:
    """Mean seconds per call, measured with CUDA events around ``iters`` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


@dataclass
class Row:
    name: str
    bytes_moved: int
    seconds: float
    correct: bool
    note: str = ""


class Checks:
    """Collects pass/fail lines of a section (edge cases, graph replay)."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.count = 0
        self.verdicts: dict[str, bool] = {}  # title of a numbered check -> passed

    @contextlib.contextmanager
    def check(self, title: str) -> Iterator[None]:
        """A numbered check made of the ``expect`` lines inside it: prints ``PASS``/``FAIL``."""
        before = len(self.failed)
        print(f"{title}:")
        try:
            yield
        except BaseException:
            self.verdicts[title] = False
            print(f"FAIL {title} (raised, see below)")
            raise
        ok = len(self.failed) == before
        self.verdicts[title] = ok
        print(f"{'PASS' if ok else 'FAIL'} {title}")

    def expect(self, name: str, ok: bool) -> None:
        self.count += 1
        print(f"  {'ok  ' if ok else 'FAIL'} {name}")
        if not ok:
            self.failed.append(name)

    def raises(self, name: str, exc: type[BaseException], fn: Callable[[], object]) -> None:
        try:
            fn()
        except exc:
            self.expect(name, True)
            return
        except Exception as other:  # wrong error type is a failure, reported
            print(f"       got {type(other).__name__}: {other}")
        self.expect(name, False)


# ---- 2. edge cases --------------------------------------------------------------------------
def check_edge_cases(dev: torch.device) -> Checks:
    c = Checks()
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if dtype == torch.uint8:
            return torch.randint(0, 256, shape, generator=g, device=dev, dtype=torch.uint8)
        return torch.randn(shape, generator=g, device=dev).to(dtype)

    print("edge cases (CUDA vs torch reference on the same GPU):")
    cases = [
        ((8, 40), torch.uint8, [3, -1, 0, 7], None),
        ((8, 40), torch.uint8, [3, 5, 1], 97),
        ((6, 4, 3, 2), torch.bfloat16, [2, -1, 5], 9),
        ((5, 8, 16), torch.float32, [4], None),
        ((4, 6), torch.int64, [-1, -1, -1], None),
        ((4, 6), torch.int64, [], None),
    ]
    for shape, dtype, table, length in cases:
        tier = rnd(shape, dtype)
        for idx in (torch.int32, torch.int64):
            t = torch.tensor(table, dtype=idx, device=dev)
            got = gather_blocks(tier, t, length=length, backend=CUDA)
            want = gather_blocks(tier, t, length=length, backend=REF)
            c.expect(
                f"gather {dtype} {shape} table={table} length={length} {idx}", same_bits(got, want)
            )
        n_units = length if length is not None else len(table) * shape[1]
        src = rnd((n_units, *shape[2:]), dtype)
        t = torch.tensor(table, dtype=torch.int32, device=dev)
        a, b = tier.clone(), tier.clone()
        scatter_blocks(src, t, a, length=length, backend=CUDA)
        scatter_blocks(src, t, b, length=length, backend=REF)
        c.expect(f"scatter {dtype} {shape} table={table} length={length}", same_bits(a, b))
    base = rnd((6, 41), torch.uint8)
    t = torch.tensor([5, 0, -1], device=dev)
    c.expect(
        "gather from an unaligned strided tier",
        same_bits(
            gather_blocks(base[:, 1:], t, backend=CUDA), gather_blocks(base[:, 1:], t, backend=REF)
        ),
    )
    c.raises(
        "bad slot raises BlockTableError",
        BlockTableError,
        lambda: gather_blocks(rnd((4, 8)), torch.tensor([0, 9], device=dev), backend=CUDA),
    )
    # the kernel's own guard (dispatcher validation bypassed): no fault, flag set, nothing read
    tier = rnd((4, 8), torch.int64)
    buf = torch.zeros(16, dtype=torch.int64, device=dev)
    err = torch.full((1,), 2, dtype=torch.int64, device=dev)
    bad_table = torch.tensor([7, -5], dtype=torch.int64, device=dev)
    from numba import cuda

    paged_kernels.launch_gather(
        cuda.as_cuda_array(tier),
        cuda.as_cuda_array(bad_table),
        cuda.as_cuda_array(buf),
        16,
        cuda.as_cuda_array(err),
        GPU_LAUNCH,
        cuda.external_stream(torch.cuda.current_stream().cuda_stream),
    )
    c.expect(
        "kernel flags out-of-range slots without touching memory",
        int(err[0]) == 0 and not bool(buf.any()),
    )

    lay = EntryLayout.from_geometry(deepseek_v4_flash())
    x = rnd((33, lay.head_dim)) * torch.logspace(-4, 4, 33, device=dev).unsqueeze(1)
    packed = quantize_entries(x, lay)
    c.expect(
        "dequant flash entries bit-exact",
        same_bits(
            dequantize_entries(packed, lay, backend=CUDA),
            dequantize_entries(packed, lay, backend=REF),
        ),
    )
    every = torch.zeros(8, 272, dtype=torch.uint8, device=dev)
    every[:, :256] = torch.arange(256, device=dev, dtype=torch.uint8)
    every[:, 256:264] = torch.tensor(
        [0, 1, 100, 127, 130, 200, 254, 255], device=dev, dtype=torch.uint8
    ).unsqueeze(1)
    every[:, 264:272] = torch.tensor(
        [0x01, 0x00, 0x80, 0x7F, 0x80, 0x7F, 0xC0, 0xFF], device=dev, dtype=torch.uint8
    )
    lay2 = EntryLayout(fp8_dims=256, scale_group=32, rope_dims=4, entry_bytes=272)
    c.expect(
        "dequant every fp8 code x extreme scales, bf16 specials",
        same_bits(
            dequantize_entries(every, lay2, backend=CUDA),
            dequantize_entries(every, lay2, backend=REF),
        ),
    )

    def layer(ratio: int, ring: int, num_tokens: int):
        n_c = num_tokens // ratio
        entries = rnd((n_c, 64))
        state = rnd((ring, 128))
        pos = torch.full((ring,), -1, dtype=torch.int64, device=dev)
        for q in range(num_tokens):
            pos[q % ring] = q
        return entries, state, pos

    for ratio, rows in ((4, 8), (16, 16)):
        for p in (0, 3, 4, 5, 16, 19, 40):
            e, s, pos = layer(ratio, rows, p)
            a = splice_tail(e, s, pos, ratio=ratio, num_tokens=p, backend=CUDA)
            b = splice_tail(e, s, pos, ratio=ratio, num_tokens=p, backend=REF)
            c.expect(
                f"splice m={ratio} S={rows} P={p}",
                same_bits(a.kv, b.kv) and same_bits(a.state, b.state),
            )
    e, s, pos = layer(4, 8, 14)
    pos[13 % 8] = 5
    c.raises(
        "stale tail row raises TailDiscontinuityError",
        TailDiscontinuityError,
        lambda: splice_tail(e, s, pos, ratio=4, num_tokens=14, backend=CUDA),
    )

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # kernels must follow torch's current stream
        t = torch.tensor([3, 1], device=dev)
        tier = rnd((4, 1 << 16))
        out = gather_blocks(tier, t, check=False, backend=CUDA)
    side.synchronize()
    c.expect("gather on a side stream", torch.equal(out, tier[[3, 1]]))
    return c


# ---- 3. bandwidth ---------------------------------------------------------------------------
def _copy_bandwidth(dev: torch.device, scale: float, iters: int) -> float:
    nbytes = max(1 << 20, int((1 << 30) * scale))
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return 2 * nbytes / timed(lambda: dst.copy_(src), iters)


def _bw_paged(
    dev: torch.device, g: torch.Generator, scale: float, iters: int, page: int
) -> list[Row]:
    nb = max(64, int(16384 * scale))
    n = nb // 2
    tier = torch.randint(0, 256, (nb, 1, page), generator=g, device=dev, dtype=torch.uint8)
    table = torch.randperm(nb, generator=g, device=dev)[:n].to(torch.int32)
    table[::97] = -1
    out = torch.zeros(n, 1, page, dtype=torch.uint8, device=dev)
    t_gather = timed(lambda: gather_blocks(tier, table, out, check=False, backend=CUDA), iters)
    ok_gather = same_bits(out, gather_blocks(tier, table, backend=REF))
    written = tier.clone()
    t_scatter = timed(lambda: scatter_blocks(out, table, written, check=False, backend=CUDA), iters)
    ok_scatter = same_bits(written, scatter_blocks(out, table, tier.clone(), backend=REF))
    note = f"{n} x {page} B"
    return [
        Row("gather pages", 2 * n * page, t_gather, ok_gather, note),
        Row("scatter pages", 2 * n * page, t_scatter, ok_scatter, note),
    ]


def _bw_dequant(
    dev: torch.device, g: torch.Generator, scale: float, iters: int, lay: EntryLayout
) -> Row:
    ne = max(256, int((1 << 19) * scale))
    packed = quantize_entries(torch.randn(ne, lay.head_dim, generator=g, device=dev), lay)
    deq = torch.empty(ne, lay.head_dim, device=dev)
    t = timed(lambda: dequantize_entries(packed, lay, deq, backend=CUDA), iters)
    ok = same_bits(deq, dequantize_entries(packed, lay, backend=REF))
    moved = ne * (lay.entry_bytes + 4 * lay.head_dim)
    return Row("dequant entries", moved, t, ok, f"{ne} x {lay.entry_bytes} B -> fp32")


def _bw_splice(dev: torch.device, g: torch.Generator, scale: float, iters: int, dim: int) -> Row:
    n_c = max(64, int((1 << 18) * scale))  # a CSA layer at ~1M tokens: 262144 fp32 entries
    tokens = 4 * n_c + 3
    entries = torch.randn(n_c, dim, generator=g, device=dev)
    state = torch.randn(8, 2 * dim, generator=g, device=dev)
    pos = torch.full((8,), -1, dtype=torch.int64, device=dev)
    live = torch.arange(tokens - 7, tokens, device=dev)  # overlap (4) + tail (3) positions
    pos[live % 8] = live
    kv = torch.empty(n_c + 3, dim, device=dev)
    st = torch.empty(8, 2 * dim, device=dev)

    def run() -> object:
        return splice_tail(
            entries,
            state,
            pos,
            ratio=4,
            num_tokens=tokens,
            out_kv=kv,
            out_state=st,
            check=False,
            backend=CUDA,
        )

    t = timed(run, iters)
    ref = splice_tail(entries, state, pos, ratio=4, num_tokens=tokens, backend=REF)
    ok = same_bits(kv, ref.kv) and same_bits(st, ref.state)
    return Row("splice tail", 2 * kv.numel() * 4, t, ok, f"{n_c} entries x {dim} fp32")


def bandwidth(dev: torch.device, scale: float, iters: int) -> tuple[float, list[Row]]:
    """(copy bandwidth in B/s, one row per kernel) at DeepSeek-V4-Flash sizes times ``scale``."""
    geom = deepseek_v4_flash()
    lay = EntryLayout.from_geometry(geom)
    page = geom.page_bytes(geom.csa_ratio)  # 37440 B: 64 CSA entries, padded to 576
    g = torch.Generator(device=dev).manual_seed(1)
    copy_bw = _copy_bandwidth(dev, scale, iters)
    rows = _bw_paged(dev, g, scale, iters, page)
    rows.append(_bw_dequant(dev, g, scale, iters, lay))
    rows.append(_bw_splice(dev, g, scale, iters, lay.head_dim))
    return copy_bw, rows


# ---- 4. CUDA graphs -------------------------------------------------------------------------
# The attention output is compared with a tolerance: the captured kernels and the eager ones are
# the same torch ops on the same shapes and normally agree bit for bit (the script prints whether
# they did), but cuBLAS may pick another reduction order on another stream (the capture stream).
# The gathered pages and the boundary state are pure copies and must match bit for bit.
GRAPH_RTOL = 1e-5
GRAPH_ATOL = 1e-6
GRAPH_EXIT_NO_CUDA = 3  # also main()'s "no usable CUDA device" status

CAPTURED_OPS = (
    "clamp, comparisons, arange, index_select (paged gather by the block table), masked_fill, "
    "sum, gather (state pointer of the last block), view(dtype), cat, bmm, softmax, copy_ "
    "into static outputs. No Numba kernel is captured: stream capture would record a Numba "
    "launch on torch's stream only if the launch did nothing capture-illegal (first-launch "
    "module loading, Numba-side allocations or copies), which is not established here; the "
    "kernels are checked eagerly in sections 2 and 3"
)


@dataclass(frozen=True)
class StepLayout:
    """Shapes of the captured attention step, taken from the cache's tiers."""

    rows: int  # request rows of the persistent buffers (the decode batch)
    cols: int  # block-table columns the graph reads (its bucket: most blocks per request)
    ppl: int  # CSA pages per LCM block
    page_bytes: int
    entries_per_page: int
    entry_bytes: int
    dim: int  # feature width of one KV row
    cppl: int  # compressor pages per block (one page: the state at the block's end boundary)
    state_bytes: int
    ring: int
    width: int  # compressor row width: kv | score
    heads: int  # query rows per request


def attention_step(
    bt: torch.Tensor,
    sp: torch.Tensor,
    csa: torch.Tensor,
    comp: torch.Tensor,
    q: torch.Tensor,
    lay: StepLayout,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode attention step over the paged device tier, in capturable torch ops only.

    ``bt`` ``[R, K]`` int32 block table (-1 pads and is never used as an index: vLLM 43810),
    ``sp`` ``[R, K]`` int64 state pointers (the device slot each block's state lives at),
    ``csa`` ``[pages, page_bytes]`` uint8 (one layer of the CSA device tier), ``comp``
    ``[slots * cppl, page]`` uint8 (one layer of the compressor tier), ``q`` ``[R, H, D]``.

    Returns the gathered pages ``[R, K * ppl, page_bytes]`` (padding zeroed), the compressor
    state page at the boundary of each row's last block ``[R, page]`` (zero for an empty row)
    found through the state pointers, and the attention output ``[R, H, D]`` of ``q`` over the
    gathered entries (bytes read as features in [-0.5, 0.5)) followed by the state's live rows.
    No host sync, no data-dependent shape, no tensor built from Python data, and indices are
    clamped into range (an out-of-range slot is treated as padding, never read)."""
    R, K = bt.shape
    ppl, epp = lay.ppl, lay.entries_per_page
    n_pages = csa.shape[0] // ppl
    n_states = comp.shape[0] // lay.cppl
    valid = (bt >= 0) & (bt < n_pages)  # [R, K]
    slots = bt.clamp(0, n_pages - 1).to(torch.int64)
    page_off = torch.arange(ppl, dtype=torch.int64, device=bt.device)
    pages = (slots.unsqueeze(-1) * ppl + page_off).reshape(R * K * ppl)
    pvalid = valid.unsqueeze(-1).expand(R, K, ppl).reshape(R, K * ppl)
    raw = csa.index_select(0, pages).view(R, K * ppl, lay.page_bytes)
    gathered = raw.masked_fill(~pvalid.unsqueeze(-1), 0)
    n_ent = K * ppl * epp
    ent = gathered[..., : epp * lay.entry_bytes].reshape(R, n_ent, lay.entry_bytes)
    kv_c = ent[..., : lay.dim].to(torch.float32) / 255.0 - 0.5
    evalid = pvalid.unsqueeze(-1).expand(R, K * ppl, epp).reshape(R, n_ent)

    n = valid.sum(dim=1)  # blocks per row (a prefix: padding only at the end)
    last = (n - 1).clamp(min=0).unsqueeze(1)
    sslot = sp.gather(1, last).squeeze(1).clamp(0, n_states - 1)
    tail = comp.index_select(0, sslot * lay.cppl).masked_fill((n == 0).unsqueeze(1), 0)
    state = tail[:, : lay.state_bytes].contiguous().view(torch.float32)
    kv_t = state.view(R, lay.ring, lay.width)[..., : lay.dim]
    pos = tail[:, lay.state_bytes : lay.state_bytes + 8 * lay.ring].contiguous().view(torch.int64)
    tvalid = (pos >= 0) & (n > 0).unsqueeze(1)

    kv = torch.cat([kv_c, kv_t], dim=1)
    kvalid = torch.cat([evalid, tvalid], dim=1)
    kv = kv.masked_fill(~kvalid.unsqueeze(-1), 0.0)
    scores = torch.bmm(q, kv.transpose(1, 2)) * (1.0 / math.sqrt(lay.dim))
    scores = scores.masked_fill(~kvalid.unsqueeze(1), -1e30)  # finite: an empty row gives 0
    out = torch.bmm(torch.softmax(scores, dim=-1), kv)
    return gathered, tail, out


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _padded(values: list[int], cols: int, pad: int) -> list[int]:
    return (list(values) + [pad] * cols)[:cols]


def check_cuda_graph_replay(device: str | torch.device = "cuda", *, blocks: int = 4) -> Checks:
    """Capture an attention step over the persistent buffers, recover, replay, compare.

    A :class:`HeterogeneousKVCache` (small geometry, tiers on ``device``, manual pipelines,
    exactly ``blocks`` device slots) stores a ``blocks``-block prefix.  The step
    (:func:`attention_step`) reads only persistent buffers: the graph registry's block table and
    state pointers (``impl/graphs.py``, refilled in place by ``cache.use``), one layer of the CSA
    and compressor device tiers, a static query; it writes static outputs.  It is captured
    through ``cache.test_hooks().act("capture")`` (the registry wraps it in a ``torch.cuda.CUDAGraph`` after
    a warm-up on a side stream), with every request row empty.  Then:

    * recovery: the prefix is offloaded to host (chain order), half of it spilled to disk, the
      freed device slots are overwritten with 0xA5, and the same prompt is admitted: its blocks
      load back from host and disk (each into the slot it left: the slot pool hands a load the
      oldest freed slot), the tail check and indexer rebuilds run, ``use`` refills the row;
    * check 1: the replayed outputs equal an eager recompute of the same step from tables built
      from ``run.block_table()`` and the blocks' addresses (not from the persistent buffers),
      and the gathered pages / boundary state equal the deterministic writer's bytes;
    * check 2: every persistent buffer's ``data_ptr()`` (registry tables, tier tensors, static
      query and outputs) and every block's device address (the pins' data pointers) is what the
      capture recorded; the registry stayed CAPTURED with one capture, no STALE_GRAPH event;
    * check 3 (negative): the prefix is offloaded in reverse order, so its loads land in each
      other's slots; the registry must flag the graph STALE (event emitted), the address it
      recorded for the boundary state must now hold another block's state, ``replay`` must be
      refused (nothing launched) until ``recapture``, after which the outputs are right again
      and the persistent buffers are still where they were.

    On CPU (``device="cpu"``) nothing is captured: the registry replays the step eagerly; the
    recovery, the refill, the addresses and the registry's protocol are checked all the same.
    Returns the :class:`Checks`; ``verdicts`` maps each numbered check's title to pass/fail.
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("check_cuda_graph_replay: no CUDA device (use device='cpu')")
    if blocks < 2:
        raise ValueError("blocks must be >= 2 (the negative check swaps slots)")
    c = Checks()
    geom = small()
    L = geom.lcm_tokens
    rows = 2
    cache = HeterogeneousKVCache(
        geom,
        device=dev,
        executors="manual",  # no worker threads: nothing else touches CUDA during capture
        device_blocks=blocks,  # every slot claimed by the prefix: loads reuse freed slots
        host_blocks=2 * blocks,
        disk_blocks=2 * blocks,
        max_requests=rows,
        kernel_backend="torch",  # the cache's own checks; Numba kernels: sections 2 and 3
    )
    try:
        _graph_scenario(cache, c, dev, blocks, L, rows)
    finally:
        cache.close()
    return c


def _graph_scenario(
    cache: HeterogeneousKVCache, c: Checks, dev: torch.device, blocks: int, L: int, rows: int
) -> None:
    core = cache.core
    m = core.meta
    reg = core.graph
    tiers = core.tiers
    csa, comp = tiers.csa, tiers.compressor
    writer = core.writer
    capture = dev.type == "cuda"
    print(
        f"graph replay on {dev}: "
        + ("torch.cuda.CUDAGraph capture" if capture else "no capture on CPU (eager replay)")
        + f"; captured ops: {CAPTURED_OPS}"
    )

    # ---- a stored prefix --------------------------------------------------------------------
    toks = harness_tokens(blocks * L + 1)
    first = cache.admit(cache.request(toks))
    with cache.use(first):
        pass
    rids = cache.inspect().resolve(cache.chain(toks))
    home = [m.addr[r] for r in rids]
    if sorted(home) != list(range(blocks)) or any(m.ckv[r] != CKV.READY for r in rids):
        raise RuntimeError(f"prefix not stored as expected: slots {home}")

    lay = StepLayout(
        rows=rows,
        cols=blocks + 2,  # two padding columns: -1 must be skipped, never read
        ppl=csa.pages_per_block,
        page_bytes=csa.page_bytes,
        entries_per_page=csa.entries_per_page,
        entry_bytes=csa.entry_bytes,
        dim=min(csa.entry_bytes, comp.width // 2),
        cppl=comp.pages_per_block,
        state_bytes=comp.state_bytes,
        ring=comp.ring,
        width=comp.width,
        heads=4,
    )
    K = lay.cols
    gen = torch.Generator(device=dev).manual_seed(7)
    q = torch.randn(rows, lay.heads, lay.dim, generator=gen, device=dev)
    out_pages = torch.zeros(rows, K * lay.ppl, lay.page_bytes, dtype=torch.uint8, device=dev)
    out_tail = torch.zeros(rows, comp.page_bytes, dtype=torch.uint8, device=dev)
    out_attn = torch.zeros(rows, lay.heads, lay.dim, device=dev)
    out_recorded = torch.zeros(comp.page_bytes, dtype=torch.uint8, device=dev)
    bt_view, sp_view = reg.block_tables[:, :K], reg.state_ptrs[:, :K]
    csa0, comp0 = csa.device_data[0], comp.device_data[0]
    # The boundary state of the prefix's last block, also read through the address as it was at
    # capture: a replay bakes that address into the copy, as a kernel bakes state_data_ptrs.
    recorded = {"slot": home[-1]}

    def step() -> None:
        pages, tail, attn = attention_step(bt_view, sp_view, csa0, comp0, q, lay)
        out_pages.copy_(pages)
        out_tail.copy_(tail)
        out_attn.copy_(attn)
        out_recorded.copy_(comp0[recorded["slot"] * lay.cppl])

    def addresses() -> dict[str, int]:
        ptrs = {
            "registry block_tables": reg.block_tables.data_ptr(),
            "registry state_ptrs": reg.state_ptrs.data_ptr(),
            "static query": q.data_ptr(),
            "static out pages": out_pages.data_ptr(),
            "static out tail": out_tail.data_ptr(),
            "static out attention": out_attn.data_ptr(),
            "static out recorded state": out_recorded.data_ptr(),
        }
        for grp in tiers.groups:
            ptrs[f"{grp.name} device tier"] = grp.device_data.data_ptr()
        return ptrs

    def block_ptrs(slots: list[int]) -> list[dict[str, int]]:
        return [{name: base + s * stride for name, base, stride in tiers.slot_bases} for s in slots]

    def expected(nb: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The writer's bytes: CSA layer-0 pages of blocks 0..nb-1 (padding zero), and the
        compressor state at the end of block nb-1."""
        pages = torch.zeros(K * lay.ppl, lay.page_bytes, dtype=torch.uint8)
        for b in range(nb):
            pages[b * lay.ppl : (b + 1) * lay.ppl] = csa.make_pages(
                b * L, toks[b * L : (b + 1) * L], writer
            )[0]
        tail = comp.make_pages((nb - 1) * L, toks[(nb - 1) * L : nb * L], writer)[0, 0]
        return pages, tail

    def eager(row: int, table: list[int], addrs: list[int]) -> tuple[torch.Tensor, ...]:
        """The same step from tables built from the run's block table and the blocks' current
        addresses (other rows: copies of the persistent ones, so the shapes are identical)."""
        bt = bt_view.clone()
        sp = sp_view.clone()
        bt[row] = torch.tensor(_padded(table, K, -1), dtype=bt.dtype, device=dev)
        sp[row] = torch.tensor(_padded(addrs, K, 0), dtype=sp.dtype, device=dev)
        return attention_step(bt, sp, csa0, comp0, q, lay)

    def compare(row: int, table: list[int], addrs: list[int], tag: str) -> None:
        _sync(dev)
        e_pages, e_tail, e_attn = eager(row, table, addrs)
        want_pages, want_tail = expected(blocks)
        c.expect(
            f"{tag}: gathered pages == eager recompute (bit-exact)", same_bits(out_pages, e_pages)
        )
        c.expect(
            f"{tag}: gathered pages == the writer's bytes of the {blocks} blocks, padding zero",
            same_bits(out_pages[row].cpu(), want_pages),
        )
        c.expect(
            f"{tag}: boundary state via the state pointers == eager and the writer's bytes",
            same_bits(out_tail, e_tail) and same_bits(out_tail[row].cpu(), want_tail),
        )
        c.expect(
            f"{tag}: boundary state via the address recorded at capture == the writer's bytes",
            same_bits(out_recorded.cpu(), want_tail),
        )
        diff = (out_attn - e_attn).abs().max().item()
        exact = same_bits(out_attn, e_attn)
        c.expect(
            f"{tag}: attention output == eager recompute (max |diff| {diff:.1e}, "
            f"bit-exact: {'yes' if exact else 'no'})",
            bool(torch.allclose(out_attn, e_attn, rtol=GRAPH_RTOL, atol=GRAPH_ATOL)),
        )

    def replay(tag: str) -> bool:
        try:
            cache.test_hooks().act("replay")
        except Refused as exc:
            print(f"       {tag}: replay refused: {exc}")
            return False
        _sync(dev)
        return True

    # ---- capture, every request row empty -----------------------------------------------
    for row in range(rows):
        reg.refill(row, [], [])
    reg.set_function(step)
    if capture:  # warm-up on a side stream (lazy cuBLAS / allocator set-up), as torch advises
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream(dev).wait_stream(side)
        _sync(dev)
    cache.test_hooks().act("capture")
    captured = addresses()
    captured_ptrs = block_ptrs([m.gaddr[r] for r in rids])
    if not replay("before recovery"):
        raise RuntimeError("the freshly captured graph refused to replay")
    before = out_attn.clone()
    print(f"captured (captures={reg.captures}); prefix blocks at device slots {home}")

    # ---- recovery 1: host + disk, back into the same slots -----------------------------
    cache.tick(10)  # leases expire: the prefix may leave the device
    for r in rids:
        cache.test_hooks().act("offload", r)
    cache.pipelines.drain()
    for r in rids[blocks // 2 :]:
        cache.test_hooks().act("spill", r)
    for s in home:  # the freed slots are reused by someone else in the meantime
        for grp in tiers.slot_groups:
            grp.device_data[:, grp.dev_index(s)].fill_(0xA5)
    print(f"prefix offloaded: {[CKV(m.ckv[r]).name for r in rids]}; device slots overwritten")
    adm = cache.admit(cache.request(toks))
    cache.pipelines.drain()
    with cache.use(adm) as run:
        row = run.request.slot.index
        table = run.block_table()
        addrs = [m.addr[r] for r in run.rids]
        print(f"recovered: {run.hit_tokens} tokens, row {row}, slots {table}")
        replays = reg.replays
        ok_replay = replay("after recovery")
        with c.check("check 1: replay after the recovery == eager recompute"):
            c.expect(
                f"hit restored from host and disk: {run.hit_tokens} tokens = {blocks} blocks",
                run.hit_tokens == blocks * L,
            )
            c.expect(
                "persistent block-table row refilled in place: the run's slots, -1 padding",
                reg.block_tables[row, :K].tolist() == _padded(table, K, -1),
            )
            c.expect(
                "persistent state-pointer row refilled in place: the blocks' addresses, 0 padding",
                reg.state_ptrs[row, :K].tolist() == _padded(addrs, K, 0),
            )
            compare(row, table, addrs, "recovered")
            c.expect(
                "the replay changed the row's output (it read the refilled table)",
                not torch.equal(before[row], out_attn[row]) and bool(out_attn[row].any()),
            )
        with c.check("check 2: persistent addresses unchanged, no recapture forced"):
            now = addresses()
            for name, ptr in captured.items():
                c.expect(f"{name} data_ptr unchanged ({ptr:#x})", now[name] == ptr)
            c.expect(
                "registry buffer_ptrs == its tables' data_ptr()",
                reg.buffer_ptrs == (reg.block_tables.data_ptr(), reg.state_ptrs.data_ptr()),
            )
            c.expect(
                f"every block back at the slot the graph recorded: {addrs}",
                [m.addr[r] for r in rids] == [m.gaddr[r] for r in rids] == home,
            )
            c.expect(
                "the pins' data pointers == the device addresses recorded at capture",
                [p.data_ptrs for p in adm.pins] == captured_ptrs,
            )
            c.expect(
                f"replay accepted (replays {replays} -> {reg.replays})",
                ok_replay and reg.replays == replays + 1,
            )
            c.expect(
                f"registry CAPTURED after one capture (phase {Graph(reg.phase).name}, "
                f"captures {reg.captures})",
                reg.phase == Graph.CAPTURED and reg.captures == 1,
            )
            c.expect("no STALE_GRAPH event", not cache.events_of(EventKind.STALE_GRAPH))

    # ---- recovery 2 (negative): the loads land in each other's slots -------------------
    stale_events = len(cache.events_of(EventKind.STALE_GRAPH))
    cache.tick(10)
    for r in reversed(rids):  # slots freed in reverse: the oldest free slot is the last block's
        cache.test_hooks().act("offload", r)
    cache.pipelines.drain()
    adm2 = cache.admit(cache.request(toks))
    cache.pipelines.drain()
    _, want_tail = expected(blocks)
    with c.check("check 3: a recovery that moves a block forces a recapture before replay"):
        moved = [(b, home[b], m.addr[r]) for b, r in enumerate(rids) if m.addr[r] != home[b]]
        c.expect(f"the recovery moved blocks (block, slot at capture, now): {moved}", bool(moved))
        c.expect(f"registry phase STALE (is {Graph(reg.phase).name})", reg.phase == Graph.STALE)
        c.expect(
            "a STALE_GRAPH event was emitted",
            len(cache.events_of(EventKind.STALE_GRAPH)) > stale_events,
        )
        c.expect(
            "the address recorded at capture now holds another block's boundary state",
            not same_bits(comp0[recorded["slot"] * lay.cppl].cpu(), want_tail),
        )
        with cache.use(adm2) as run:
            row = run.request.slot.index
            table = run.block_table()
            addrs = [m.addr[r] for r in run.rids]
            c.expect(
                "the pins' data pointers differ from those recorded at capture",
                [p.data_ptrs for p in adm2.pins] != captured_ptrs,
            )
            replays, snapshot = reg.replays, out_attn.clone()
            refused = not replay("stale graph")
            c.expect(
                "replay refused while STALE, nothing ran",
                refused and reg.replays == replays and torch.equal(out_attn, snapshot),
            )
            recorded["slot"] = m.addr[rids[-1]]
            try:
                cache.test_hooks().act("recapture")
                recaptured = True
            except Refused as exc:
                print(f"       recapture refused: {exc}")
                recaptured = False
            c.expect(
                f"recaptured: phase {Graph(reg.phase).name}, captures {reg.captures}, "
                "recorded addresses == current",
                recaptured
                and reg.phase == Graph.CAPTURED
                and reg.captures == 2
                and [m.gaddr[r] for r in rids] == [m.addr[r] for r in rids],
            )
            c.expect("replay accepted after the recapture", replay("after recapture"))
            compare(row, table, addrs, "recaptured")
            c.expect(
                "persistent buffers still at their captured addresses", addresses() == captured
            )


# ---- main -----------------------------------------------------------------------------------
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_CUDA = 0, 1, 2, GRAPH_EXIT_NO_CUDA
SECTIONS = ("edge", "bandwidth", "graph")


def _sections(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in SECTIONS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"sections: comma-separated of {', '.join(SECTIONS)}")
    return names


def _cuda_unavailable(kernels: bool) -> str | None:
    """Why there is no usable CUDA device for the sections asked for, or None.  The Numba
    backend is needed only by the kernel sections (``kernels``); the graph section is torch."""
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    if kernels:
        try:
            select_backend(Backend.CUDA)
        except BackendUnavailableError as exc:
            return f"{exc} (the graph section alone may still run: --sections graph)"
    return None


def _run_graph(device: str) -> list[str]:
    """Section 4; the names of the failed checks (a raised exception is one, traceback shown)."""
    print("\n== cuda-graph replay across a recovery ==")
    try:
        checks = check_cuda_graph_replay(device)
    except Exception:
        traceback.print_exc()
        return ["cuda-graph replay raised"]
    print(f"cuda-graph replay: {checks.count - len(checks.failed)}/{checks.count} passed")
    return [f"graph: {name}" for name in checks.failed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="kvstate real-GPU check: kernels vs torch references, bandwidth vs a copy, "
        "CUDA-graph replay across a recovery",
        epilog="exit status: 0 all passed, 1 a check failed or a section raised, 2 bad command "
        "line, 3 no usable CUDA device (nothing checked)",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink the bandwidth sizes (0 < s <= 1)"
    )
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per kernel")
    parser.add_argument(
        "--quick", action="store_true", help="bandwidth at --scale 0.05 with --iters 3"
    )
    parser.add_argument(
        "--sections",
        type=_sections,
        default=SECTIONS,
        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="no GPU needed: run only the graph section on CPU (eager replay, no capture)",
    )
    args = parser.parse_args(argv)
    wall = time.perf_counter()
    if args.cpu_dry_run:
        failed = _run_graph("cpu")
        print(f"total {time.perf_counter() - wall:.1f} s")
        print(f"FAILED: {failed}" if failed else "cpu dry run: every check passed")
        return EXIT_FAILED if failed else EXIT_OK

    kernels = "edge" in args.sections or "bandwidth" in args.sections
    why = _cuda_unavailable(kernels)
    if why is not None:
        print(f"NO CUDA DEVICE: {why}; nothing was checked (exit {EXIT_NO_CUDA}).")
        print("Run it where a GPU is lent, or use --cpu-dry-run for the graph protocol on CPU.")
        return EXIT_NO_CUDA
    scale, iters = (0.05, 3) if args.quick else (args.scale, args.iters)
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    if kernels:
        choice = select_backend(Backend.CUDA)
        print(f"backend: {choice.backend.value} ({choice.reason})")
        print(f"launch: {GPU_LAUNCH.threads} threads/block, grid <= {GPU_LAUNCH.max_blocks}")
    failed: list[str] = []

    if "edge" in args.sections:
        try:
            checks = check_edge_cases(dev)
            print(f"edge cases: {checks.count - len(checks.failed)}/{checks.count} passed")
            failed += checks.failed
        except Exception:
            traceback.print_exc()
            failed.append("edge cases raised")

    if "bandwidth" in args.sections:
        try:
            copy_bw, rows = bandwidth(dev, min(max(scale, 1e-3), 1.0), max(iters, 1))
            print(f"\ndevice-to-device copy: {copy_bw / 1e9:8.1f} GB/s (read + write)")
            print(
                f"{'kernel':<18} {'MiB moved':>10} {'time us':>10} {'GB/s':>8} {'% copy':>7}  ok    note"
            )
            for r in rows:
                bw = r.bytes_moved / r.seconds
                print(
                    f"{r.name:<18} {r.bytes_moved / 2**20:10.1f} {r.seconds * 1e6:10.1f} "
                    f"{bw / 1e9:8.1f} {100 * bw / copy_bw:6.1f}%  {'yes' if r.correct else 'NO '}"
                    f"   {r.note}"
                )
            failed += [r.name for r in rows if not r.correct]
        except Exception:
            traceback.print_exc()
            failed.append("bandwidth raised")

    if "graph" in args.sections:
        failed += _run_graph("cuda")

    print(f"\ntotal {time.perf_counter() - wall:.1f} s")
    if failed:
        print(f"FAILED: {failed}")
        return EXIT_FAILED
    print("every check passed")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
