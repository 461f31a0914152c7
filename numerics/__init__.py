"""kvstate.numerics: a tiny DeepSeek-V4-like hybrid-attention model for checking cache restores.

The allocator proves which state a hit restores; this package checks that the restored state
is *numerically* the right one: resuming from it must reproduce a full prefill bit for bit, and
breaking any of the five states must visibly change the logits.  See ``model`` (the model),
``state`` (the five states, export/restore, structural checks), ``corrupt`` (negative tests),
``disk`` (the three SWA disk policies) and ``scenario`` (the demo's cases;
``python -m kvstate.numerics``).  ``kvbridge`` (the model's states stored in and restored from
the kvstate library) and ``e2e`` (the end-to-end cases) import the library and are not
re-exported here.
"""

from .corrupt import (
    BROKEN_STATE,
    CORRUPTIONS,
    Corruption,
    drop_compressed_block,
    drop_tail,
    offset_window,
    partial_load,
    stale_indexer,
)
from .disk import (
    checkpoint_boundary,
    disk_copy,
    merge,
    restore_from_disk,
    swa_snapshot,
    zero_min_exact_tokens,
    zero_recompute_start,
)
from .model import HybridModel, ModelConfig
from .scenario import TOL, CaseResult, Scenario, default_scenario, max_diff, run_cases
from .state import (
    CompressedState,
    HybridState,
    IndexerState,
    LayerPieces,
    LayerState,
    StateError,
    StatePieces,
    TailState,
    WindowState,
    build_state,
    check_state,
    export_pieces,
    pieces_equal,
    state_problems,
    visible_entries,
)

__all__ = [
    "BROKEN_STATE",
    "CORRUPTIONS",
    "TOL",
    "CaseResult",
    "CompressedState",
    "Corruption",
    "HybridModel",
    "HybridState",
    "IndexerState",
    "LayerPieces",
    "LayerState",
    "ModelConfig",
    "Scenario",
    "StateError",
    "StatePieces",
    "TailState",
    "WindowState",
    "build_state",
    "check_state",
    "checkpoint_boundary",
    "default_scenario",
    "disk_copy",
    "drop_compressed_block",
    "drop_tail",
    "export_pieces",
    "max_diff",
    "merge",
    "offset_window",
    "partial_load",
    "pieces_equal",
    "restore_from_disk",
    "run_cases",
    "stale_indexer",
    "state_problems",
    "swa_snapshot",
    "visible_entries",
    "zero_min_exact_tokens",
    "zero_recompute_start",
]
