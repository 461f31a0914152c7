"""Planned device bytes of DeepSeek-V4-Flash tiers (``impl.tiers.planned_bytes``) at 64K and 1M.

No allocation and no timing: the figure ``Tiers`` checks against ``memory_limit`` before it
allocates anything.  Run it with each build's interpreter to compare (the import resolves to
that build's sources):

    .venv/bin/python bench/planned_bytes.py
    /work/main/.venv/bin/python bench/planned_bytes.py
"""

from __future__ import annotations

from kvstate.impl.tiers import planned_bytes
from kvstate.spec import deepseek_v4_flash

GIB = 2**30
ROWS = (  # (label, max_requests or None for the geometry's, slots beyond the prefix's blocks)
    ("defaults (max_requests 256), slots = blocks + 64", None, 64),
    ("benches' (max_requests 4), slots = blocks + 8", 4, 8),
)


def main() -> None:
    for label, mr, margin in ROWS:
        for n in (1 << 16, 1 << 20):
            dev = n // 256 + margin
            g = deepseek_v4_flash()
            if mr is not None:
                g = g.with_changes(max_requests=mr, device_blocks=dev, pin_cap_blocks=dev)
            d, _ = planned_bytes(g, dev, 1)
            # absent where the SWA pool is sized per slot
            pool = getattr(g, "swa_pool_blocks", None)
            swa = f", SWA pool {pool(dev, g.max_requests)} blocks" if pool else ""
            print(f"{label}: {n // 1024}K, {dev} slots: device {d / GIB:.2f} GiB{swa}")


if __name__ == "__main__":
    main()
