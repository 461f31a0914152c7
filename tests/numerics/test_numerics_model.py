"""The tiny hybrid model: every way of computing a prompt gives the single-prefill logits bit
for bit, the cache state is the same whatever the chunking, and compression follows the V4
schedule (fire at ``(pos + 1) % ratio == 0``, visibility ``j < (i + 1) // ratio``)."""

from __future__ import annotations

from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstate.numerics import (
    HybridModel,
    ModelConfig,
    StateError,
    build_state,
    check_state,
    export_pieces,
    pieces_equal,
    state_problems,
    visible_entries,
)
from kvstate.numerics.state import expected_tail_positions, expected_window_positions
from kvstate.spec.geometry import small

N = 32  # long enough for 8 CSA entries (> top_k), 2 HCA entries and a full window
FAST = settings(max_examples=6, deadline=None, derandomize=True)


@lru_cache(maxsize=1)
def _model() -> HybridModel:
    return HybridModel()


@lru_cache(maxsize=1)
def _prompt() -> tuple[tuple[int, ...], torch.Tensor, object]:
    """Tokens, their full-prefill logits and final state (computed once)."""
    gen = torch.Generator().manual_seed(5)
    toks = tuple(torch.randint(0, 64, (N,), generator=gen).tolist())
    logits, state = _model().prefill(list(toks))
    return toks, logits, state


def test_shapes_and_seeded_weights() -> None:
    toks, ref, state = _prompt()
    assert ref.shape == (N, 64) and ref.dtype == torch.float32
    assert torch.isfinite(ref).all()
    again, _ = HybridModel().prefill(list(toks[:8]))
    assert torch.equal(again, ref[:8])  # same seed, same weights
    other, _ = HybridModel(config=ModelConfig(seed=1)).prefill(list(toks[:8]))
    assert not torch.equal(other, ref[:8])
    check_state(state)  # type: ignore[arg-type]


@FAST
@given(st.lists(st.integers(1, 13), min_size=1, max_size=12))
def test_chunked_prefill_is_bit_exact(sizes: list[int]) -> None:
    toks, ref, full_state = _prompt()
    m, state, parts, at, i = _model(), None, [], 0, 0
    while at < N:
        k = sizes[i % len(sizes)]
        lo, state = m.prefill(list(toks[at : at + k]), state)
        parts.append(lo)
        at, i = at + k, i + 1
    assert torch.equal(torch.cat(parts), ref)
    assert state is not None
    assert pieces_equal(export_pieces(state), export_pieces(full_state))  # type: ignore[arg-type]


def test_token_decode_is_bit_exact() -> None:
    toks, ref, _ = _prompt()
    m = _model()
    lo, state = m.prefill(list(toks[:5]))
    outs = [lo]
    for t in toks[5:]:
        step, state = m.decode(state, t)
        assert step.shape == (64,)
        outs.append(step[None])
    assert torch.equal(torch.cat(outs), ref)


@FAST
@given(st.integers(0, N - 1))
def test_resume_from_pieces_at_any_boundary_is_bit_exact(h: int) -> None:
    toks, ref, _ = _prompt()
    m = _model()
    _, state = m.prefill(list(toks[:h]))
    pieces = export_pieces(state)
    logits, end = m.resume(pieces, list(toks[h:]))
    assert torch.equal(logits, ref[h:])
    assert end.length == N
    # the input state is untouched (resume is pure)
    assert pieces_equal(export_pieces(state), pieces)


def test_export_build_round_trip_is_exact() -> None:
    _, _, state = _prompt()
    pieces = export_pieces(state)  # type: ignore[arg-type]
    assert pieces_equal(export_pieces(build_state(pieces)), pieces)
    g = small()
    for lp, kind in zip(pieces.layers, g.layers, strict=True):
        assert lp.kind == kind
        assert lp.window_kv.shape == (g.n_win, g.head_dim)
        if kind == "swa":
            assert lp.compressed is None and lp.tail_kv is None and lp.indexer_keys is None
            continue
        assert lp.compressed is not None
        assert lp.compressed_block(g, 0).shape[0] == g.entries_per_block(
            g.csa_ratio if kind == "csa" else g.hca_ratio
        )
        if kind == "csa":
            assert lp.indexer_keys is not None
            assert lp.indexer_keys.shape == (lp.compressed.shape[0], g.indexer_dim)
            assert lp.indexer_version == lp.compressed_version
        else:
            assert lp.indexer_keys is None


def test_compression_schedule_and_bookkeeping() -> None:
    """Entries appear exactly at (pos+1) % ratio == 0; tails and windows hold the live rows."""
    toks, _, _ = _prompt()
    m, g = _model(), small()
    state = m.empty_state()
    for pos, t in enumerate(toks):
        _, state = m.decode(state, t)
        assert state.length == pos + 1
        assert not state_problems(state)
        for ls in state.layers:
            assert sorted(p for p in ls.window.pos.tolist() if p >= 0) == (
                expected_window_positions(g, pos + 1)
            )
            if ls.kind == "swa":
                continue
            ratio = g.csa_ratio if ls.kind == "csa" else g.hca_ratio
            assert ls.compressed is not None and ls.tail is not None
            assert ls.compressed.n == visible_entries(pos, ratio)
            live = sorted(p for p in ls.tail.pos.tolist() if p >= 0)
            assert live == expected_tail_positions(g, ls.kind, pos + 1)
            assert len(live) <= (g.csa_tail_rows if ls.kind == "csa" else g.hca_tail_rows)


def test_visibility_rule() -> None:
    assert [visible_entries(i, 4) for i in range(9)] == [0, 0, 0, 1, 1, 1, 1, 2, 2]
    # causality: later tokens never change earlier logits
    toks, ref, _ = _prompt()
    other = list(toks[:20]) + [(t + 1) % 64 for t in toks[20:]]
    lo, _ = _model().prefill(other)
    assert torch.equal(lo[:20], ref[:20])
    assert not torch.equal(lo[20:], ref[20:])


def test_other_geometry_is_bit_exact() -> None:
    g = small().with_changes(top_k=2, n_win=8, name="small-k2")
    m = HybridModel(g)
    toks = list(range(0, 64, 2))
    ref, _ = m.prefill(toks)
    lo1, s = m.prefill(toks[:13])
    lo2, _ = m.resume(export_pieces(s), toks[13:])
    assert torch.equal(torch.cat([lo1, lo2]), ref)


def test_resume_rejects_foreign_geometry_and_bad_tokens() -> None:
    _, _, state = _prompt()
    other = HybridModel(small().with_changes(top_k=2, name="k2"))
    with pytest.raises(StateError):
        other.resume(export_pieces(state), [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _model().prefill([64])


def test_csa_entry_pools_the_overlapping_window() -> None:
    """CSA entry j is the per-channel softmax pool of the 2m compressor rows of tokens
    [m*j - m, m*j + m - 1]: the previous block through the rows' second half, block j through
    the first half (entry 0 has no previous block).  Rebuilt here from saved tails."""
    toks, _, final = _prompt()
    m, g = _model(), small()
    r, hd = g.csa_ratio, g.head_dim
    li = g.layers.index("csa")
    bias = m.layers[li].c_bias
    assert bias is not None

    def block_rows(j: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Compressor rows of block j, from the state right after block j was seen."""
        _, s = m.prefill(list(toks[: r * (j + 1)]))
        lp = export_pieces(s).layers[li]
        assert lp.tail_pos is not None and lp.tail_kv is not None and lp.tail_score is not None
        keep = [i for i, p in enumerate(lp.tail_pos.tolist()) if r * j <= p < r * (j + 1)]
        assert len(keep) == r
        return lp.tail_kv[keep], lp.tail_score[keep]

    entries = final.layers[li].compressed  # type: ignore[attr-defined]
    for j in (0, 1, 5):
        kv, sc = block_rows(j)
        v, s = kv[:, :hd], sc[:, :hd] + bias[r:]
        if j > 0:
            pkv, psc = block_rows(j - 1)
            v = torch.cat([pkv[:, hd:], v])
            s = torch.cat([psc[:, hd:] + bias[:r], s])
        want = (torch.softmax(s, dim=0) * v).sum(dim=0)
        assert torch.allclose(entries.entries[j], want, rtol=1e-5, atol=1e-6), j
