"""The standard numerics scenario: one prompt, its full-prefill logits, states at boundaries, and
every resume case (intact, broken, disk-restored) compared against the full recompute.

Shared by the demo (``python -m kvstate.numerics``) and the tests, so both report the same
numbers.  Default sizes: 160 tokens, boundary ``h = 144`` (a multiple of the small geometry's
LCM block of 16; the last checkpoint is at 128, and the zero policy recomputes from 32).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch import Tensor

from .corrupt import BROKEN_STATE, CORRUPTIONS, apply
from .disk import checkpoint_boundary, disk_copy, restore_from_disk, swa_snapshot
from .model import HybridModel, ModelConfig
from .state import StateError, StatePieces, build_state, export_pieces, state_problems

#: Logits that differ by more than this count as "changed".  Intact paths are compared for
#: bit equality (max |diff| == 0.0), so any tolerance above float32 noise works here.
TOL = 1e-4


def max_diff(a: Tensor, b: Tensor) -> float:
    """max |a - b| over all entries (inf when shapes differ)."""
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) if a.numel() else 0.0


@dataclass
class Scenario:
    """A prompt, its single-prefill logits, and exported states at the boundaries cases need."""

    model: HybridModel
    tokens: list[int]
    h: int
    reference: Tensor  # [len(tokens), vocab] from one full prefill
    pieces: dict[int, StatePieces] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        model: HybridModel | None = None,
        *,
        n_tokens: int = 160,
        h: int = 144,
        seed: int = 0,
    ) -> Scenario:
        model = model if model is not None else HybridModel()
        g = model.geometry
        if h % g.lcm_tokens or not 0 < h < n_tokens:
            raise ValueError(f"h={h} must be a positive multiple of {g.lcm_tokens} below n_tokens")
        gen = torch.Generator().manual_seed(1000 + seed)
        tokens = torch.randint(0, model.config.vocab, (n_tokens,), generator=gen).tolist()
        reference, _ = model.prefill(tokens)
        sc = cls(model, tokens, h, reference)
        bounds = {h, h - g.swa_block_tokens, h - g.lcm_tokens}
        bounds.add(checkpoint_boundary(h, g.swa_checkpoint_tokens))
        sc.capture(sorted(b for b in bounds if b >= 0))
        return sc

    def capture(self, boundaries: list[int]) -> None:
        """Export the state at each boundary with one chunked prefill split at the boundaries."""
        state, at = None, 0
        for b in boundaries:
            _, state = self.model.prefill(self.tokens[at:b], state)
            self.pieces[b] = export_pieces(state)
            at = b

    def state_at(self, b: int) -> StatePieces:
        if b not in self.pieces:
            self.capture([b])
        return self.pieces[b]

    def resume_diff(self, pieces: StatePieces | None = None) -> float:
        """max |logit diff| of resuming at ``h`` (unchecked) vs the full prefill."""
        p = self.state_at(self.h) if pieces is None else pieces
        logits, _ = self.model.resume(p, self.tokens[p.length :], check=False)
        return max_diff(logits, self.reference[p.length :])


@dataclass(frozen=True)
class CaseResult:
    """One row of the demo table."""

    case: str
    broken: str
    check: str  # what check_state says about the resumed-from state
    max_diff: float
    expect_changed: bool

    @property
    def changed(self) -> bool:
        return self.max_diff > TOL

    @property
    def as_expected(self) -> bool:
        if self.expect_changed:
            return self.changed
        return self.max_diff == 0.0  # intact paths must be bit-exact


def _check_of(pieces: StatePieces) -> str:
    problems = state_problems(build_state(pieces))
    return "ok" if not problems else f"caught ({len(problems)})"


def run_cases(sc: Scenario) -> list[CaseResult]:
    """Every case of the demo, in order."""
    m, g, h, toks, ref = sc.model, sc.model.geometry, sc.h, sc.tokens, sc.reference
    out: list[CaseResult] = []

    # Intact paths: each must equal the single full prefill bit for bit.
    rng = random.Random(7)
    state, parts, at = None, [], 0
    while at < len(toks):
        k = rng.randint(1, 23)
        lo, state = m.prefill(toks[at : at + k], state)
        parts.append(lo)
        at += k
    out.append(
        CaseResult("chunked prefill (1..23)", "-", "-", max_diff(torch.cat(parts), ref), False)
    )
    state, steps = m.empty_state(), []
    for t in toks:
        lo, state = m.decode(state, t)
        steps.append(lo)
    out.append(
        CaseResult("token-by-token decode", "-", "-", max_diff(torch.stack(steps), ref), False)
    )
    live = build_state(sc.state_at(h))
    lo, _ = m.resume(live, toks[h:])
    out.append(CaseResult(f"resume live state @{h}", "-", "ok", max_diff(lo, ref[h:]), False))
    out.append(CaseResult(f"resume from pieces @{h}", "-", "ok", sc.resume_diff(), False))

    # One broken state at a time.
    for kind in CORRUPTIONS:
        bad = apply(kind, sc.state_at(h), sc.state_at)
        out.append(CaseResult(kind, BROKEN_STATE[kind], _check_of(bad), sc.resume_diff(bad), True))

    # Disk-restored prefix under each SWA policy.
    disk = disk_copy(sc.state_at(h))
    c = checkpoint_boundary(h, g.swa_checkpoint_tokens)
    policies: list[tuple[str, str, Callable[[], object], bool]] = [
        (
            "disk: full",
            "-",
            lambda: restore_from_disk(m, disk, toks[:h], "full", swa=swa_snapshot(sc.state_at(h))),
            False,
        ),
        (
            f"disk: checkpoint (p={g.swa_checkpoint_tokens}, from {c})",
            "-",
            lambda: restore_from_disk(
                m, disk, toks[:h], "checkpoint", swa=swa_snapshot(sc.state_at(c))
            ),
            False,
        ),
        (
            f"disk: zero (recompute {g.zero_swa_recompute_tokens})",
            "-",
            lambda: restore_from_disk(m, disk, toks[:h], "zero"),
            False,
        ),
        (
            f"disk: zero, recompute only {g.n_win}",
            "(3) window recomputed too short",
            lambda: restore_from_disk(m, disk, toks[:h], "zero", recompute_tokens=g.n_win),
            True,
        ),
    ]
    for name, broken, restore, expect in policies:
        try:
            st = restore()
            check = "ok"
        except StateError as exc:  # pragma: no cover - reported in the table
            out.append(CaseResult(name, broken, f"error: {exc}", float("inf"), expect))
            continue
        lo, _ = m.resume(st, toks[h:], check=False)  # type: ignore[arg-type]
        out.append(CaseResult(name, broken, check, max_diff(lo, ref[h:]), expect))
    return out


def format_table(results: list[CaseResult]) -> str:
    """Plain-text table: case, state broken, check, max |logit diff|, changed, verdict."""
    head = ("case", "state broken", "check", "max |logit diff|", "changed", "as expected")
    rows = [
        (
            r.case,
            r.broken,
            r.check,
            f"{r.max_diff:.3e}" if r.max_diff else "0 (bit-exact)",
            "yes" if r.changed else "no",
            "yes" if r.as_expected else "NO",
        )
        for r in results
    ]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(len(head))]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), sep, *(line(r) for r in rows)])


@lru_cache(maxsize=4)
def default_scenario(seed: int = 0) -> Scenario:
    """The scenario with default sizes (cached: the tests share one per seed)."""
    return Scenario.build(HybridModel(config=ModelConfig(seed=seed)), seed=seed)
