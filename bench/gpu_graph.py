"""Section 4 of the GPU check (``bench/gpu_check.py``): a CUDA graph captured over an attention
step replayed across a recovery (:func:`check_cuda_graph_replay`)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

# the sibling modules of this script (``bench/`` is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import Checks, same_bits  # noqa: E402

from kvstate.impl import EventKind, HeterogeneousKVCache, Refused  # noqa: E402
from kvstate.impl.testdata import DeterministicWriter, harness_tokens  # noqa: E402
from kvstate.spec.geometry import small  # noqa: E402
from kvstate.spec.phases import CKV, Graph  # noqa: E402

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
        writer=DeterministicWriter(),  # the content the "writer's bytes" checks recompute
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
