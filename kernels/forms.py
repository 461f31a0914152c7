"""The block forms the kernels serve: the declaration layer L2 (kernel ABI) is checked against.

The table's L2 conjunct admits a hit only in the forms the geometry lists as fused-kernel
signatures (``Geometry.kernel_combos``).  That list is a claim about *this* package: a geometry
naming a form no kernel here can read would let L2 pass blocks nothing can serve.  So the kernels
declare, per state, which dtypes they read and with which entry point, and the library refuses a
geometry that lists anything else (``kvstate.impl`` raises ``LayoutError`` when it opens a cache).
``tests/kernels/test_kernels_forms.py`` runs each declared entry point on a block of its form, so
the declaration cannot claim a form the kernels do not handle.

Kept free of numba and of ``kvstate.spec`` (kernels import nothing of the package): combos are
read duck-typed (``compressed_dtype``, ``tail_dtype``, ``window_dtype``, ``block_tokens``).
"""

from __future__ import annotations

from typing import Any

# compressed-KV page forms -> the entry point that reads them
COMPRESSED: dict[str, str] = {
    # FP8 e4m3 values x UE8M0 scales per group + BF16 RoPE dims (EntryLayout): decoded exactly
    "fp8_e4m3+ue8m0/bf16_rope": "dequantize_entries",
    # unquantised entries: moved as stored by the paged gather
    "bf16": "gather_blocks",
}
# compressor (uncompressed-tail) state forms -> the entry point that splices them
TAIL: dict[str, str] = {"fp32": "splice_tail"}
# sliding-window page forms -> the entry point that reads them
WINDOW: dict[str, str] = {"bf16": "gather_blocks"}


def unsupported(combo: Any) -> str | None:
    """Why no kernel here serves ``combo`` (a ``KernelCombo``), or None when one does."""
    for what, table, value in (
        ("compressed", COMPRESSED, combo.compressed_dtype),
        ("tail", TAIL, combo.tail_dtype),
        ("window", WINDOW, combo.window_dtype),
    ):
        if value not in table:
            known = ", ".join(sorted(table))
            return f"no kernel reads {what} form {value!r} (the kernels serve: {known})"
    if combo.block_tokens <= 0:
        return f"block of {combo.block_tokens} tokens"
    return None
