"""Tail splice: entries + compressor-state ring -> attention input and resumable state."""

import pytest
import torch

from kvstate.kernels import (
    Backend,
    KernelInputError,
    LaunchConfig,
    TailDiscontinuityError,
    launch_override,
    splice_tail,
)

SIM, REF = Backend.SIMULATOR, Backend.TORCH
DIM = 6


def _row(pos: int, width: int) -> torch.Tensor:
    """A recognisable row for token ``pos``."""
    return pos * 100.0 + torch.arange(width, dtype=torch.float32)


def _layer(ratio: int, ring: int, num_tokens: int, dtype: torch.dtype = torch.float32):
    """What a compressor of ratio m and S state rows holds after ``num_tokens`` tokens: entries
    written at (pos + 1) % m == 0 and a ring whose slot q % S was last written by token q."""
    n_c = num_tokens // ratio
    entries = torch.stack([-_row(j, DIM) for j in range(n_c)]) if n_c else torch.zeros(0, DIM)
    state = torch.full((ring, 2 * DIM), -7.0)
    state_pos = torch.full((ring,), -1, dtype=torch.int64)
    for q in range(num_tokens):  # sequential writes: later tokens overwrite earlier slots
        state[q % ring] = _row(q, 2 * DIM)
        state_pos[q % ring] = q
    return entries.to(dtype), state.to(dtype), state_pos


def _splice_both(entries, state, state_pos, ratio, num_tokens, cfg=None, check=True):
    if cfg is None:
        got = splice_tail(
            entries, state, state_pos, ratio=ratio, num_tokens=num_tokens, check=check, backend=SIM
        )
    else:
        with launch_override(cfg):
            got = splice_tail(
                entries,
                state,
                state_pos,
                ratio=ratio,
                num_tokens=num_tokens,
                check=check,
                backend=SIM,
            )
    want = splice_tail(
        entries, state, state_pos, ratio=ratio, num_tokens=num_tokens, check=check, backend=REF
    )
    assert torch.equal(got.kv, want.kv) and torch.equal(got.state, want.state)
    assert torch.equal(got.first_bad, want.first_bad) and got.first_bad.dtype == torch.int64
    return got


@pytest.mark.parametrize("num_tokens", [0, 1, 3, 4, 5, 7, 8, 11, 16, 19])
@pytest.mark.parametrize("cfg", [None, LaunchConfig(threads=4, max_blocks=3)])
def test_csa_splice_semantics(num_tokens: int, cfg) -> None:
    m, ring = 4, 8  # CSA: 2m state rows, overlap m
    entries, state, state_pos = _layer(m, ring, num_tokens)
    out = _splice_both(entries, state, state_pos, m, num_tokens, cfg)
    assert out.first_bad.tolist() == [-1]
    n_c, tail = num_tokens // m, num_tokens % m
    assert out.kv.shape == (n_c + tail, DIM) and out.state.shape == (ring, 2 * DIM)
    assert torch.equal(out.kv[:n_c], entries)
    for i in range(tail):  # tail starts right after the last entry's coverage (token 4*n_c)
        assert torch.equal(out.kv[n_c + i], _row(m * n_c + i, DIM))
    for s in range(ring):  # state = window of the next entry n_c: [4*n_c - 4, 4*n_c + 3]
        q = m * n_c - m + s
        want = _row(q, 2 * DIM) if 0 <= q < num_tokens else torch.zeros(2 * DIM)
        assert torch.equal(out.state[s], want)


@pytest.mark.parametrize("num_tokens", [0, 15, 16, 17, 40])
def test_hca_splice_has_no_overlap(num_tokens: int) -> None:
    m = 16  # HCA: m' rows, no overlap
    entries, state, state_pos = _layer(m, m, num_tokens)
    out = _splice_both(entries, state, state_pos, m, num_tokens)
    n_c = num_tokens // m
    for s in range(m):
        q = m * n_c + s
        want = _row(q, 2 * DIM) if q < num_tokens else torch.zeros(2 * DIM)
        assert torch.equal(out.state[s], want)


def test_bf16_rows_splice_bitwise() -> None:
    entries, state, state_pos = _layer(4, 8, 13, torch.bfloat16)
    out = _splice_both(entries, state, state_pos, 4, 13)
    assert out.kv.dtype == torch.bfloat16 and torch.equal(out.kv[-1], state[12 % 8, :DIM])


@pytest.mark.parametrize("backend", [SIM, REF])
def test_stale_tail_row_is_a_discontinuity(backend: Backend) -> None:
    entries, state, state_pos = _layer(4, 8, 14)  # tail = tokens 12, 13
    state_pos[13 % 8] = 5  # slot of token 13 still holds token 5
    with pytest.raises(TailDiscontinuityError) as info:
        splice_tail(entries, state, state_pos, ratio=4, num_tokens=14, backend=backend)
    assert info.value.position == 13 and "expected 13" in str(info.value)


@pytest.mark.parametrize("backend", [SIM, REF])
def test_missing_overlap_row_is_a_discontinuity(backend: Backend) -> None:
    entries, state, state_pos = _layer(4, 8, 10)  # overlap rows = tokens 4..7
    state_pos[6] = -1
    with pytest.raises(TailDiscontinuityError) as info:
        splice_tail(entries, state, state_pos, ratio=4, num_tokens=10, backend=backend)
    assert info.value.position == 6


@pytest.mark.parametrize("n_c", [1, 3])
def test_entry_count_must_match_the_boundary(n_c: int) -> None:
    _, state, state_pos = _layer(4, 8, 9)  # boundary 9 needs exactly 2 entries
    with pytest.raises(TailDiscontinuityError, match="needs 2 entries"):
        splice_tail(torch.zeros(n_c, DIM), state, state_pos, ratio=4, num_tokens=9, backend=SIM)


def test_unchecked_splice_flags_and_zero_fills_stale_rows_on_both_backends() -> None:
    entries, state, state_pos = _layer(4, 8, 14)
    state_pos[12 % 8] = 99
    state_pos[9 % 8] = 1
    out = _splice_both(entries, state, state_pos, 4, 14, check=False)
    assert torch.equal(out.kv[3], torch.zeros(DIM)) and out.first_bad.tolist() == [9]


def test_argument_errors() -> None:
    entries, state, state_pos = _layer(4, 8, 9)
    with pytest.raises(KernelInputError, match="state must be"):
        splice_tail(entries, state[:, :DIM], state_pos, ratio=4, num_tokens=9, backend=SIM)
    with pytest.raises(KernelInputError, match="S >= ratio"):
        splice_tail(entries, state, state_pos, ratio=16, num_tokens=9, backend=SIM)
    with pytest.raises(KernelInputError, match="int32/int64"):
        splice_tail(entries, state, state_pos.float(), ratio=4, num_tokens=9, backend=SIM)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_cpu_host_path_is_the_reference(dtype: torch.dtype) -> None:
    """On CPU tensors the torch backend does the ring's bookkeeping in Python ints
    (``dispatch._splice_tail_cpu``): outputs, flag and error must be the reference's, on every
    boundary of rings of both shapes, sound and with stale or missing rows."""
    from kvstate.kernels import reference

    rng = __import__("random").Random(14)
    checked = raised = 0
    for ratio, ring in ((4, 8), (4, 4), (1, 2), (3, 6)):
        for num_tokens in range(0, 4 * ring + 3):
            entries, state, state_pos = _layer(ratio, ring, num_tokens)
            entries, state = entries.to(dtype), state.to(dtype)
            for trial in range(4):
                pos = state_pos.clone()
                for _ in range(trial):  # 0..3 slots made stale or empty
                    pos[rng.randrange(ring)] = rng.choice([-1, rng.randrange(-3, 3 * ring)])
                for check in (True, False):
                    try:
                        want = reference.splice_tail_ref(
                            entries, state, pos, ratio, num_tokens, check=check
                        )
                    except TailDiscontinuityError as exc:
                        with pytest.raises(TailDiscontinuityError) as info:
                            splice_tail(
                                entries, state, pos, ratio=ratio, num_tokens=num_tokens,
                                check=check, backend=REF,
                            )  # fmt: skip
                        assert str(info.value) == str(exc)
                        assert info.value.position == exc.position
                        raised += 1
                        continue
                    got = splice_tail(
                        entries, state, pos, ratio=ratio, num_tokens=num_tokens, check=check,
                        backend=REF,
                    )  # fmt: skip
                    assert torch.equal(got.kv, want[0]) and torch.equal(got.state, want[1])
                    assert torch.equal(got.first_bad, want[2])
                    assert got.first_bad.dtype == want[2].dtype == torch.int64
                    checked += 1
    assert checked > 400 and raised > 50
