"""kvstate.kernels: data paths of KV-cache recovery as Numba CUDA kernels with torch references.

Call everything through ``kvstate.kernels.dispatch`` (re-exported here); it chooses the backend
(real GPU, the Numba CUDA simulator in tests, or the torch reference on CPU), says why, and
never falls back silently.  One module per kernel (``paged``, ``dequant``, ``splice``), the forms they serve (layer L2's
declaration) in ``forms``, the torch specification in ``reference``, Hopper PTX compilation
checks in ``ptx`` (``python -m kvstate.kernels.ptx``).
"""

from .dispatch import (
    ENV_VAR,
    Backend,
    BackendChoice,
    EntryLayout,
    LaunchConfig,
    SpliceResult,
    active_backend,
    dequantize_entries,
    gather_blocks,
    launch_override,
    quantize_entries,
    scatter_blocks,
    select_backend,
    splice_tail,
)
from .errors import (
    BackendUnavailableError,
    BlockTableError,
    KernelError,
    KernelInputError,
    TailDiscontinuityError,
)

__all__ = [
    "ENV_VAR",
    "Backend",
    "BackendChoice",
    "BackendUnavailableError",
    "BlockTableError",
    "EntryLayout",
    "KernelError",
    "KernelInputError",
    "LaunchConfig",
    "SpliceResult",
    "TailDiscontinuityError",
    "active_backend",
    "dequantize_entries",
    "gather_blocks",
    "launch_override",
    "quantize_entries",
    "scatter_blocks",
    "select_backend",
    "splice_tail",
]
