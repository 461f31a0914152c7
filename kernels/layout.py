"""The byte layout of one compressed entry (FP8 e4m3 values, UE8M0 scales, BF16 RoPE dims).

Kept apart from the kernel (``dequant.py``) so the torch reference and the library can describe
entries without importing numba."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EntryLayout:
    """Byte layout of one compressed entry; build it from a geometry with ``from_geometry``."""

    fp8_dims: int
    scale_group: int
    rope_dims: int
    entry_bytes: int

    def __post_init__(self) -> None:
        if self.fp8_dims <= 0 or self.scale_group <= 0 or self.rope_dims < 0:
            raise ValueError(f"bad entry layout {self}")
        if self.fp8_dims % self.scale_group:
            raise ValueError(f"scale_group {self.scale_group} must divide fp8_dims {self.fp8_dims}")
        if self.rope_off + 2 * self.rope_dims > self.entry_bytes:
            raise ValueError(
                f"entry_bytes {self.entry_bytes} < {self.rope_off + 2 * self.rope_dims} bytes of payload"
            )

    @classmethod
    def from_geometry(cls, geom: Any) -> EntryLayout:
        """Layout of ``kvstate.spec.geometry.Geometry`` (duck-typed: reads four fields)."""
        return cls(geom.fp8_dims, geom.scale_group, geom.rope_dims, geom.entry_bytes)

    @property
    def n_scales(self) -> int:
        return self.fp8_dims // self.scale_group

    @property
    def scale_off(self) -> int:
        return self.fp8_dims

    @property
    def rope_off(self) -> int:
        return self.fp8_dims + self.n_scales

    @property
    def head_dim(self) -> int:
        return self.fp8_dims + self.rope_dims
