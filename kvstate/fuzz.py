"""In-process fuzzing entry point: ``kvstate.fuzz.run(target=..., profile=...)``.

``target="vllm"`` fuzzes vLLM's ``KVCacheManager`` (``manager_cls=`` points it at any manager
class already imported, e.g. a patched one); see ``kvstate.targets.vllm.engine.run``.
"""

from __future__ import annotations

from typing import Any


def run(target: str = "vllm", profile: str = "ci", **kwargs: Any) -> Any:
    if target == "vllm":
        from kvstate.targets.vllm.engine import run as run_vllm

        return run_vllm(profile, **kwargs)
    from kvstate.impl.errors import InvalidArgument

    raise InvalidArgument(f"kvstate.fuzz.run: unknown target {target!r} (known: 'vllm')")
