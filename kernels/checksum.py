"""Block checksum for disk-tier verification (an Adler-style sum modulo 2**32).

A block read back from disk or object storage must be checked before it is used; a load failure
must be answered with recompute, never with corrupted tokens (vLLM 52234).  The checksum has to
be computable in parallel on the GPU and reproduced exactly by the CPU reference, so it is made of
two plain sums that are associative and carry no floating point:

    A = (1 + sum_i b_i)              mod 2**32
    B = (N + sum_i (i + 1) * b_i)    mod 2**32        (i = 0..N-1, N = block length in bytes)
    checksum = B * 2**32 + A, stored as int64 (two's complement of that 64-bit value)

Strength (what it guarantees, for blocks of N < 2**24 bytes = 16 MiB):

* every single-byte change is detected (A moves by a nonzero amount of magnitude < 256);
* every swap of two different bytes at distance d is detected (A is unchanged but B moves by
  d * (b_i - b_j), nonzero with magnitude < 2**32);
* a change of length is detected (N enters B; a zero block does not checksum to 0).
It is NOT a cryptographic hash: compensating multi-byte edits (e.g. +1 at i and i+2, -2 at i+1)
cancel in both sums.  Use it against accidental corruption (torn or stale reads, bit rot), and a
cryptographic digest on the host where an adversary can write the storage.

Kernel form: rows are viewed as little-endian uint32 words (the dispatcher zero-pads a ragged
last word; zero bytes add nothing, and N is passed separately).  One block per row; each thread
sums its words with every partial sum kept below 2**41 by masking, then a shared-memory tree
reduction (threads per block must be a power of two) and thread 0 writes the row's value.
"""

from __future__ import annotations

from typing import Any, no_type_check

from numba import cuda, int64

from ._launch import MAX_THREADS, LaunchConfig

MASK32 = 0xFFFFFFFF
TWO32 = 4294967296
TWO31 = 2147483648


@no_type_check  # device code: Numba types it, not mypy
def _checksum(words: Any, nbytes: int, out: Any) -> None:
    sa = cuda.shared.array(MAX_THREADS, int64)
    sb = cuda.shared.array(MAX_THREADS, int64)
    t = cuda.threadIdx.x
    nt = cuda.blockDim.x
    nw = words.shape[1]
    for r in range(cuda.blockIdx.x, words.shape[0], cuda.gridDim.x):
        a = int64(0)
        b = int64(0)
        for k in range(t, nw, nt):
            w = int64(words[r, k])
            weight = int64(4 * k + 1)
            for j in range(4):
                byte = (w >> (8 * j)) & 255
                a = a + byte
                b = (b + ((weight + j) & MASK32) * byte) & MASK32
            a = a & MASK32
        sa[t] = a
        sb[t] = b
        cuda.syncthreads()
        s = nt // 2
        while s > 0:
            if t < s:
                sa[t] = (sa[t] + sa[t + s]) & MASK32
                sb[t] = (sb[t] + sb[t + s]) & MASK32
            cuda.syncthreads()
            s = s // 2
        if t == 0:
            lo = (sa[0] + 1) & MASK32
            hi = (sb[0] + nbytes) & MASK32
            if hi >= TWO31:
                hi = hi - TWO32
            out[r] = hi * TWO32 + lo
        cuda.syncthreads()


checksum_kernel = cuda.jit(_checksum)


def launch_checksum(words: Any, nbytes: int, out: Any, cfg: LaunchConfig, stream: Any = 0) -> None:
    """Launch over the rows of ``words`` (uint32 ``[n, cdiv(nbytes, 4)]``) into ``out`` int64 ``[n]``."""
    if words.shape[0] == 0:
        return
    checksum_kernel[cfg.blocks(words.shape[0]), cfg.threads, stream](words, nbytes, out)
