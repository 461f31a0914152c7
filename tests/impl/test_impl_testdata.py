"""The deterministic test content is computed once per exact input and handed out as copies."""

from __future__ import annotations

import torch

from kvstate.impl import testdata


def test_kept_rows_equal_fresh_rows_and_are_private_copies() -> None:
    layers, pos = torch.tensor([0, 2]), torch.arange(5, 9)
    tok = torch.tensor([11, 12, 13, 14])
    want = testdata._expected_rows("csa", layers, pos, tok, 16)
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
    state = testdata._expected_state("compressor", layers, pos, tok, 6)
    assert torch.equal(testdata.expected_state_rows(layers, pos, tok, 6), state)
