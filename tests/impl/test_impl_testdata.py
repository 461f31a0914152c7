"""The deterministic test content is computed once per exact input and handed out as copies."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from kvstate.impl import testdata


def test_kept_rows_equal_fresh_rows_and_are_private_copies() -> None:
    layers, pos = torch.tensor([0, 2]), torch.arange(5, 9)
    tok = torch.tensor([11, 12, 13, 14])
    want = testdata.compute_rows("csa", layers, pos, tok, 16)
    first = testdata.expected_rows("csa", layers, pos, tok, 16)
    assert torch.equal(first, want)
    first.zero_()  # a caller writing into its rows never reaches a later answer
    assert torch.equal(testdata.expected_rows("csa", layers, pos, tok, 16), want)
    # another group, width, token or dtype is another question
    assert not torch.equal(testdata.expected_rows("hca", layers, pos, tok, 16), want)
    assert testdata.expected_rows("csa", layers, pos, tok, 8).shape[-1] == 8
    other = tok.clone()
    other[0] += 1
    assert not torch.equal(testdata.expected_rows("csa", layers, pos, other, 16), want)
    as32 = testdata.expected_rows("csa", layers, pos.to(torch.int32), tok, 16)
    assert torch.equal(as32, want)  # same values in another dtype: the same rows
    state = testdata.compute_state_rows("compressor", layers, pos, tok, 6)
    assert torch.equal(testdata.expected_state_rows(layers, pos, tok, 6), state)


def test_kept_rows_are_bounded_in_bytes(monkeypatch: Any) -> None:
    """The memo keeps at most ``_KEPT_BYTES`` of rows, whatever their count: a DeepSeek-V4-Flash
    block's window rows are 6.1 MiB, and 4096 kept blocks (a 1M-token prefix's writes) held
    25 GiB.  What it forgets is recomputed, the same."""
    monkeypatch.setattr(testdata, "_KEPT", OrderedDict())
    monkeypatch.setattr(testdata, "_kept_bytes", 0)
    monkeypatch.setattr(testdata, "_KEPT_BYTES", 4 * 2**20)
    layers, tok = torch.arange(8), torch.arange(64)
    first = testdata.expected_rows("swa", layers, torch.arange(64), tok, 512)  # 256 KiB
    for start in range(64, 64 * 40, 64):
        testdata.expected_rows("swa", layers, torch.arange(start, start + 64), tok, 512)
        n, counted, held = testdata.memo_stats()
        assert held == counted <= 4 * 2**20
    assert testdata.memo_stats()[0] == 16  # (at most 4 MiB of 256 KiB answers)
    assert torch.equal(testdata.expected_rows("swa", layers, torch.arange(64), tok, 512), first)
    big = testdata.expected_rows("swa", layers, torch.arange(64), tok, 8192)  # 4 MiB: not kept
    assert (
        big.shape[-1] == 8192
        and testdata.memo_stats()[1] <= 4 * 2**20
        and testdata.memo_stats()[0] == 16
    )
