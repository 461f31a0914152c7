"""Launch geometry shared by every kernel.

Every kernel in this package is written as *grid-stride over rows, block-stride over columns*:
CUDA block ``b`` handles rows ``b, b + gridDim.x, ...`` and the threads of that block split the
row's columns.  The same source then runs well in two very different places:

* on a GPU, 128-256 threads per block make each row's loads and stores coalesced;
* under the Numba CUDA simulator (one Python thread per CUDA thread), one thread per block and a
  handful of blocks make a single Python thread loop over whole rows, which is ~35x faster there.

Only the launch configuration differs, never the kernel source.
"""

from __future__ import annotations

from dataclasses import dataclass

# Upper bound of threads per block; also the size of the shared-memory reduction buffers.
MAX_THREADS = 1024


@dataclass(frozen=True)
class LaunchConfig:
    """Threads per block and the cap on the grid size (rows beyond it are grid-strided)."""

    threads: int
    max_blocks: int

    def __post_init__(self) -> None:
        if not 1 <= self.threads <= MAX_THREADS or self.threads & (self.threads - 1):
            raise ValueError(
                f"threads per block must be a power of two in [1, {MAX_THREADS}], got {self.threads}"
            )
        if self.max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {self.max_blocks}")

    def blocks(self, rows: int) -> int:
        """Grid size for ``rows`` rows (at least one block; callers skip launches with no work)."""
        return max(1, min(rows, self.max_blocks))


GPU_LAUNCH = LaunchConfig(threads=256, max_blocks=65535)
SIMULATOR_LAUNCH = LaunchConfig(threads=1, max_blocks=4)
