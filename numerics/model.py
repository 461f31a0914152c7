"""A tiny DeepSeek-V4-like hybrid-attention model whose cache state can be saved and resumed.

Why it exists: the kvstate allocator claims that a restored state lets a request continue
*exactly* where it stopped.  This model makes that claim checkable numerically: its logits
after resuming from a (restored) state must equal the logits of one full prefill, bit for bit.

Architecture (sizes from a :class:`~kvstate.spec.geometry.Geometry`, the small preset by
default; ``m = csa_ratio``, ``m' = hca_ratio``):

* embedding -> ``len(geometry.layers)`` blocks -> RMSNorm -> vocabulary projection.
* Every block: RMSNorm, attention, residual; RMSNorm, SiLU MLP, residual.
* Attention: ``n_heads`` query heads against one shared K=V head of ``head_dim``.  The kv row
  ``c`` is the value; the key is ``c`` with RoPE applied to its last ``rope_dims`` dims at the
  row's position (compressed entry ``j`` is placed at the last position of its own block,
  ``ratio * j + ratio - 1``).  One joint softmax over [selected compressed entries, window rows].
* SWA branch (every layer): the last ``n_win`` kv rows, including the current token.
* CSA layers (ratio m): per token the compressor emits a kv row and a score row of
  ``2 * head_dim`` (one half for its own block, one for serving as the *previous* block).
  Compression fires at ``(pos + 1) % m == 0`` and writes entry ``j = pos // m`` as the per-channel
  softmax-weighted sum of the ``2m`` rows of tokens ``[m*j - m, m*j + m - 1]`` (scores plus a
  learned per-row bias; rows before position 0 are masked).  Query ``i`` sees entry ``j`` only if
  ``j < (i + 1) // m``.  The lightning indexer keeps one key ``entry @ W_ik`` per entry; a query
  scores visible entries as ``sum_h w_h * relu(q_h . k_j)`` (``indexer_heads`` x
  ``indexer_dim``), and attends to the ``top_k`` best (stable sort: ties go to the older entry),
  in entry order, plus its window.
* HCA layers (ratio m'): non-overlapping windows of m' tokens pooled the same way (one half),
  dense attention over every visible entry plus the window.

Bit-exactness: every (layer, position) is computed by :meth:`HybridModel._layer_step` on fresh
1-row tensors, with shapes that depend only on the position (never on the chunk), the same ops
in the same order, and RoPE tables built per position in double precision.  So full prefill,
chunked prefill, token decode and resume execute the *identical* float32 operations per row and
agree bit for bit (on one machine and torch build; BLAS kernels may differ across CPUs).
A batched prefill (one GEMM over the chunk) would not have this property: MKL picks different
kernels, hence different summation orders, for different row counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from kvstate.spec.geometry import Geometry, small

from .state import (
    DTYPE,
    CompressedState,
    HybridState,
    IndexerState,
    LayerState,
    StateError,
    StatePieces,
    build_state,
    check_state,
    ratio_of,
    tail_row_dim,
    visible_entries,
)

Tokens = Sequence[int] | Tensor


@dataclass(frozen=True)
class ModelConfig:
    """Sizes the geometry does not fix, and the weight seed."""

    vocab: int = 64
    d_model: int = 64
    n_heads: int = 2
    mlp_dim: int = 128
    seed: int = 0
    rope_base: float = 10000.0
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class LayerWeights:
    """Fixed random weights of one block; compressor/indexer tensors only where the kind has them."""

    attn_norm: Tensor
    wq: Tensor  # [d, H * head_dim]
    wkv: Tensor  # [d, head_dim]
    wo: Tensor  # [H * head_dim, d]
    mlp_norm: Tensor
    w1: Tensor  # [d, mlp]
    w2: Tensor  # [mlp, d]
    c_kv: Tensor | None = None  # [d, tail_row_dim]
    c_score: Tensor | None = None  # [d, tail_row_dim]
    c_bias: Tensor | None = None  # [2m or m', head_dim] positional score bias
    i_key: Tensor | None = None  # [head_dim, indexer_dim]
    i_query: Tensor | None = None  # [d, indexer_heads * indexer_dim]
    i_weight: Tensor | None = None  # [d, indexer_heads]


def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt((x * x).mean() + eps) * w


class HybridModel:
    """The tiny hybrid model; all methods are pure with respect to the state passed in."""

    def __init__(self, geometry: Geometry | None = None, config: ModelConfig | None = None):
        self.geometry = geometry if geometry is not None else small()
        self.config = config if config is not None else ModelConfig()
        g, c = self.geometry, self.config
        if g.rope_dims % 2:
            raise ValueError("rope_dims must be even")
        gen = torch.Generator().manual_seed(c.seed)

        def rnd(*shape: int, std: float) -> Tensor:
            return (torch.randn(*shape, generator=gen, dtype=DTYPE) * std).contiguous()

        def norm_w(n: int) -> Tensor:
            return 1.0 + rnd(n, std=0.1)

        d, hd = c.d_model, g.head_dim
        self.embed = rnd(c.vocab, d, std=1.0)
        self.final_norm = norm_w(d)
        self.w_out = rnd(d, c.vocab, std=1.0 / math.sqrt(d))
        self.layers: list[LayerWeights] = []
        for kind in g.layers:
            extra: dict[str, Tensor] = {}
            if kind != "swa":
                rdim = tail_row_dim(g, kind)
                rows = g.csa_tail_rows if kind == "csa" else g.hca_tail_rows
                extra |= {
                    "c_kv": rnd(d, rdim, std=1.0 / math.sqrt(d)),
                    "c_score": rnd(d, rdim, std=1.0 / math.sqrt(d)),
                    "c_bias": rnd(rows, hd, std=0.5),
                }
            if kind == "csa":
                extra |= {
                    "i_key": rnd(hd, g.indexer_dim, std=1.0 / math.sqrt(hd)),
                    "i_query": rnd(d, g.indexer_heads * g.indexer_dim, std=1.0 / math.sqrt(d)),
                    "i_weight": rnd(d, g.indexer_heads, std=1.0 / math.sqrt(d)),
                }
            self.layers.append(
                LayerWeights(
                    attn_norm=norm_w(d),
                    wq=rnd(d, c.n_heads * hd, std=1.0 / math.sqrt(d)),
                    wkv=rnd(d, hd, std=1.0 / math.sqrt(d)),
                    wo=rnd(c.n_heads * hd, d, std=1.0 / math.sqrt(c.n_heads * hd)),
                    mlp_norm=norm_w(d),
                    w1=rnd(d, c.mlp_dim, std=1.0 / math.sqrt(d)),
                    w2=rnd(c.mlp_dim, d, std=1.0 / math.sqrt(c.mlp_dim)),
                    **extra,
                )
            )
        half = g.rope_dims // 2
        self._inv_freq = [c.rope_base ** (-2.0 * i / max(1, g.rope_dims)) for i in range(half)]
        self._cos = torch.zeros(0, g.head_dim, dtype=DTYPE)
        self._sin = torch.zeros(0, g.head_dim, dtype=DTYPE)
        f8 = g.fp8_dims
        self._perm = torch.tensor(
            list(range(f8)) + list(range(f8 + half, f8 + 2 * half)) + list(range(f8, f8 + half)),
            dtype=torch.long,
        )

    # ---- public API ---------------------------------------------------------------------

    def empty_state(self) -> HybridState:
        """The state before any token."""
        return HybridState.empty(self.geometry)

    def prefill(
        self, tokens: Tokens, state: HybridState | None = None
    ) -> tuple[Tensor, HybridState]:
        """Run ``tokens`` from ``state`` (or from scratch); chunked prefill is repeated calls.

        Returns ``(logits [len(tokens), vocab], new_state)``; the input state is not modified.
        """
        st = state.clone() if state is not None else self.empty_state()
        return self._forward(st, self._tokens(tokens), replay=False), st

    def decode(self, state: HybridState, token: int) -> tuple[Tensor, HybridState]:
        """One decode step: ``(logits [vocab], new_state)``."""
        logits, st = self.prefill([int(token)], state)
        return logits[0], st

    def resume(
        self, state: HybridState | StatePieces, tokens: Tokens, *, check: bool = True
    ) -> tuple[Tensor, HybridState]:
        """Continue from a state saved (or restored) at a boundary, computing only ``tokens``.

        This is the hook for the kvstate restore path: build :class:`StatePieces` from what the
        cache restored and pass them here.  With ``check`` (default) a structurally broken
        state raises :class:`StateError` instead of computing garbage; ``check=False`` runs
        anyway, which the negative tests use to measure the numerical damage.
        """
        st = build_state(state) if isinstance(state, StatePieces) else state.clone()
        if st.geometry != self.geometry:
            raise StateError("state was built for a different geometry")
        if check:
            check_state(st)
        return self._forward(st, self._tokens(tokens), replay=False), st

    def replay(self, state: HybridState, tokens: Tokens) -> HybridState:
        """Recompute window and tail state over ``tokens`` while keeping restored compressed KV.

        ``state`` holds compressed entries and indexer keys that reach *past* ``state.length``
        (restored from disk) but a window/tail that is stale or empty.  Tokens are run as in
        prefill, except that an entry that already exists is kept, not rewritten: the restored
        entries are exact, whereas one recomputed from an incomplete tail would not be.  Logits
        are discarded.  Used by the checkpoint and zero SWA disk policies.
        """
        st = state.clone()
        self._forward(st, self._tokens(tokens), replay=True)
        return st

    # ---- internals ----------------------------------------------------------------------

    def _tokens(self, tokens: Tokens) -> list[int]:
        out = [int(t) for t in (tokens.tolist() if isinstance(tokens, Tensor) else tokens)]
        for t in out:
            if not 0 <= t < self.config.vocab:
                raise ValueError(f"token {t} outside vocabulary of {self.config.vocab}")
        return out

    def _forward(self, st: HybridState, tokens: list[int], *, replay: bool) -> Tensor:
        """Layer-major prefill of a chunk: each (layer, position) by :meth:`_layer_step`."""
        if not tokens:
            return torch.zeros(0, self.config.vocab, dtype=DTYPE)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny ops: threads only add overhead and contention
        try:
            with torch.no_grad():
                return self._forward_rows(st, tokens, replay=replay)
        finally:
            torch.set_num_threads(threads)

    def _forward_rows(self, st: HybridState, tokens: list[int], *, replay: bool) -> Tensor:
        start = st.length
        xs = [self.embed[t].clone() for t in tokens]
        for li, ls in enumerate(st.layers):
            for i in range(len(xs)):
                xs[i] = self._layer_step(li, ls, xs[i], start + i, replay)
        st.length = start + len(tokens)
        eps = self.config.norm_eps
        return torch.stack([_rms(x, self.final_norm, eps) @ self.w_out for x in xs])

    def _rope_table(self, positions: list[int]) -> tuple[Tensor, Tensor]:
        """Full-width multipliers ``(C, S)`` so that ``rope(x) = x * C + x[:, perm] * S``.

        ``C`` is 1 on the unrotated dims and ``cos`` on the RoPE dims; ``S`` is 0 / ``-sin, sin``.
        Each position's row is computed once, in double precision, then rounded to float32, so
        it never depends on which chunk or batch first asked for it; the unrotated dims come out
        exactly (``x * 1 + y * 0 == x``).
        """
        top = max(positions) + 1
        have = int(self._cos.shape[0])
        if top > have:
            g = self.geometry
            grow = max(top, 2 * have, 256)
            cos_rows, sin_rows = [], []
            for p in range(have, grow):
                cos = [math.cos(p * f) for f in self._inv_freq]
                sin = [math.sin(p * f) for f in self._inv_freq]
                cos_rows.append([1.0] * g.fp8_dims + cos + cos)
                sin_rows.append([0.0] * g.fp8_dims + [-v for v in sin] + sin)
            self._cos = torch.cat([self._cos, torch.tensor(cos_rows, dtype=DTYPE)])
            self._sin = torch.cat([self._sin, torch.tensor(sin_rows, dtype=DTYPE)])
        idx = torch.tensor(positions, dtype=torch.long)
        return self._cos.index_select(0, idx), self._sin.index_select(0, idx)

    def _rope(self, x: Tensor, positions: list[int]) -> Tensor:
        """Rotate the last ``rope_dims`` dims of rows ``x`` [N, head_dim] by their positions (a
        single position ``[p]`` broadcasts over all rows, e.g. query heads)."""
        if self.geometry.rope_dims == 0:
            return x
        cos, sin = self._rope_table(positions)
        return x * cos + x.index_select(1, self._perm) * sin

    def _layer_step(self, li: int, ls: LayerState, x: Tensor, p: int, replay: bool) -> Tensor:
        """One layer at one position: update this layer's five states with token ``p``, attend.

        Order matters and is fixed: write the window row, append compressor rows, fire
        compression if ``(p + 1) % ratio == 0``, then attend (so an entry fired at ``p`` is
        visible to ``p``, matching ``j < (p + 1) // ratio``).
        """
        g, c, w = self.geometry, self.config, self.layers[li]
        hd = g.head_dim
        h = _rms(x, w.attn_norm, c.norm_eps)
        kv = h @ w.wkv
        slot = p % g.n_win
        ls.window.kv[slot] = kv
        ls.window.pos[slot] = p
        q = self._rope((h @ w.wq).view(c.n_heads, hd), [p])

        comp = torch.zeros(0, hd, dtype=DTYPE)
        comp_pos: list[int] = []
        if ls.kind != "swa":
            ratio = ratio_of(g, ls.kind)
            self._compressor_step(ls, w, h, p, replay)
            n_vis = visible_entries(p, ratio)
            assert ls.compressed is not None
            if ls.compressed.n < n_vis:
                raise StateError(
                    f"layer {li}: position {p} needs {n_vis} entries, state has {ls.compressed.n}"
                )
            if n_vis > 0:
                sel = list(range(n_vis))
                if ls.kind == "csa" and n_vis > g.top_k:
                    sel = self._indexer_select(ls, w, h, n_vis)
                comp = ls.compressed.entries.index_select(0, torch.tensor(sel))
                comp_pos = [ratio * j + ratio - 1 for j in sel]

        # Window rows in position order, read from their ring slots; a slot whose label is not
        # the expected position (never written / dropped) is skipped.
        labels = ls.window.pos.tolist()
        win_pos = [q for q in range(max(0, p - g.n_win + 1), p + 1) if labels[q % g.n_win] == q]
        slots = torch.tensor([q % g.n_win for q in win_pos], dtype=torch.long)
        win = ls.window.kv.index_select(0, slots)
        vals = torch.cat([comp, win], dim=0)
        keys = self._rope(vals, comp_pos + win_pos)
        att = torch.softmax((q @ keys.T) * (1.0 / math.sqrt(hd)), dim=-1)
        o = (att @ vals).reshape(-1) @ w.wo
        x = x + o
        u = _rms(x, w.mlp_norm, c.norm_eps) @ w.w1
        return x + torch.nn.functional.silu(u) @ w.w2

    def _indexer_select(self, ls: LayerState, w: LayerWeights, h: Tensor, n_vis: int) -> list[int]:
        """Top-k visible CSA entries by lightning-indexer score, returned in entry order."""
        g = self.geometry
        assert ls.indexer is not None and w.i_query is not None and w.i_weight is not None
        keys = ls.indexer.keys.index_select(0, torch.arange(n_vis))
        qi = (h @ w.i_query).view(g.indexer_heads, g.indexer_dim)
        wi = h @ w.i_weight
        score = (wi[:, None] * torch.relu(qi @ keys.T)).sum(dim=0)
        order = torch.sort(score, descending=True, stable=True).indices[: g.top_k]
        return sorted(order.tolist())

    def _compressor_step(
        self, ls: LayerState, w: LayerWeights, h: Tensor, p: int, replay: bool
    ) -> None:
        """Append token ``p``'s compressor rows to the tail; fold a window when it completes."""
        g = self.geometry
        tail, comp = ls.tail, ls.compressed
        assert tail is not None and comp is not None
        assert w.c_kv is not None and w.c_score is not None and w.c_bias is not None
        slot = p % tail.capacity
        tail.kv[slot] = h @ w.c_kv
        tail.score[slot] = h @ w.c_score
        tail.pos[slot] = p
        ratio = ratio_of(g, ls.kind)
        if (p + 1) % ratio:
            return
        j = p // ratio
        hd = g.head_dim
        if ls.kind == "csa":
            # Rows of the previous block use the second half, rows of block j the first half.
            positions = list(range(ratio * j - ratio, ratio * j + ratio))
            halves = [slice(hd, 2 * hd)] * ratio + [slice(0, hd)] * ratio
            done = positions[:ratio]
        else:
            positions = list(range(ratio * j, ratio * j + ratio))
            halves = [slice(0, hd)] * ratio
            done = positions
        slots = torch.tensor([q % tail.capacity for q in positions], dtype=torch.long)
        want = torch.tensor(positions, dtype=torch.long)
        # a row counts only if its slot holds exactly that position (never a position < 0)
        present = (tail.pos.index_select(0, slots) == want) & (want >= 0)
        rows_kv = tail.kv.index_select(0, slots)
        rows_sc = tail.score.index_select(0, slots)
        v = torch.stack([rows_kv[i, s] for i, s in enumerate(halves)])
        s = torch.stack([rows_sc[i, s] for i, s in enumerate(halves)]) + w.c_bias
        s = torch.where(present[:, None], s, torch.full_like(s, -math.inf))
        v = torch.where(present[:, None], v, torch.zeros_like(v))
        entry = (torch.softmax(s, dim=0) * v).sum(dim=0)
        for q in done:
            tail.clear(q)
        if j < comp.n and replay:
            return  # restored entry is authoritative; see replay()
        if j != comp.n:
            raise StateError(f"compression writes entry {j} but the chain has {comp.n} entries")
        ls.compressed = CompressedState(
            torch.cat([comp.entries, entry[None]]),
            torch.cat([comp.loaded, torch.ones(1, dtype=torch.bool)]),
            comp.version + 1,
        )
        if ls.indexer is not None:
            assert w.i_key is not None
            key = entry @ w.i_key
            ls.indexer = IndexerState(
                torch.cat([ls.indexer.keys, key[None]]), ls.indexer.version + 1
            )
