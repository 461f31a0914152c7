"""Dequantization of compressed KV entries (FP8 e4m3 + UE8M0 scales + BF16 RoPE).

A restored compressed entry is only usable once it is decoded exactly as the engine wrote it;
a decoder that is off by one ulp silently changes attention outputs after a cache hit, which is
why the kernel is checked bit-for-bit against torch's own ``float8_e4m3fn`` / ``bfloat16`` casts.

Entry layout (one row of ``entry_bytes`` bytes; DeepSeek-V4-Flash 584 = 448 + 7 + 128 + 1 pad,
small geometry 152 = 112 + 7 + 32 + 1 pad):

* bytes ``[0, fp8_dims)``: FP8 e4m3fn codes (1 sign, 4 exponent bits with bias 7, 3 mantissa
  bits, no infinities, ``S.1111.111`` is NaN);
* bytes ``[fp8_dims, fp8_dims + n_scales)``: UE8M0 scales, one per ``scale_group`` FP8 dims,
  value ``2 ** (byte - 127)``, byte 255 is NaN (OCP MX convention);
* then ``2 * rope_dims`` bytes: BF16 RoPE dims, little-endian;
* zero padding up to ``entry_bytes``.

Output row (float32, ``head_dim = fp8_dims + rope_dims``): the dequantized FP8 dims
``fp8(code) * scale`` followed by the RoPE dims widened to float32.

Every decode is integer bit-field extraction plus one ``ldexp`` of a small integer mantissa, so
each value is exact (or overflows to inf exactly where torch's float32 ``fp8 * scale`` does) and
matches torch bit for bit.  No lookup table and no host data are needed, and nothing depends on
flush-to-zero (Numba does not enable fast-math by default).  NaN payloads are not preserved:
every NaN code decodes to a NaN of unspecified sign and payload (compare NaN-ness, not bits).
"""

from __future__ import annotations

import math
from typing import Any, no_type_check

from numba import cuda, float32

from ._launch import LaunchConfig
from .layout import EntryLayout

_NAN = float("nan")
_INF = float("inf")


@no_type_check  # device code: Numba types it, not mypy
def _dequant(
    entries: Any,
    out: Any,
    fp8_dims: int,
    scale_group: int,
    rope_dims: int,
    scale_off: int,
    rope_off: int,
) -> None:
    # The decoders are written inline (no device functions): a Numba device function is compiled
    # for the *current* device, which would make PTX checks on a GPU-less machine impossible.
    head_dim = fp8_dims + rope_dims
    for r in range(cuda.blockIdx.x, entries.shape[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, head_dim, cuda.blockDim.x):
            if d < fp8_dims:
                # fp8 e4m3fn code times UE8M0 scale: +-(8 + m) * 2**(e - 10) * 2**(s - 127), or
                # +-m * 2**-9 * 2**(s - 127) for a subnormal code.  The integer mantissa has 4
                # bits, so ldexp is exact down to 2**-136 and overflows to inf exactly when the
                # float32 product fp8 * scale does.
                code = int(entries[r, d])
                sc = int(entries[r, scale_off + d // scale_group])
                e = (code >> 3) & 15
                m = code & 7
                if sc == 255 or (e == 15 and m == 7):
                    v = float32(_NAN)
                elif e == 0:
                    v = math.ldexp(float32(m), sc - 136)
                else:
                    v = math.ldexp(float32(8 + m), e + sc - 137)
                if code & 128:
                    v = -v
            else:
                # bf16 bits -> float32: +-(128 + m) * 2**(e - 134), subnormal m * 2**-133.
                j = rope_off + 2 * (d - fp8_dims)
                bits = int(entries[r, j]) | (int(entries[r, j + 1]) << 8)
                e = (bits >> 7) & 255
                m = bits & 127
                if e == 255:
                    v = float32(_INF) if m == 0 else float32(_NAN)
                elif e == 0:
                    v = math.ldexp(float32(m), -133)
                else:
                    v = math.ldexp(float32(128 + m), e - 134)
                if bits & 32768:
                    v = -v
            out[r, d] = v


dequant_kernel = cuda.jit(_dequant)


def launch_dequant(
    entries: Any, out: Any, layout: EntryLayout, cfg: LaunchConfig, stream: Any = 0
) -> None:
    """Launch the dequantizer: ``entries`` uint8 ``[n, >= entry payload]`` -> ``out`` float32
    ``[n, head_dim]``."""
    if entries.shape[0] == 0:
        return
    dequant_kernel[cfg.blocks(entries.shape[0]), cfg.threads, stream](
        entries,
        out,
        layout.fp8_dims,
        layout.scale_group,
        layout.rope_dims,
        layout.scale_off,
        layout.rope_off,
    )
