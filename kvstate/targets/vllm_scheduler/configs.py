"""The configurations the scheduler target runs: a layout of the manager-only target, a pool, the
scheduling policy and the KV connector's load failure policy.

The layouts are ``kvstate/targets/vllm/configs.py``'s (the same source text, so a reproducer
pastes them); the scheduler gets their groups through :func:`standalone.layout_of`.
DeepSeek-V4's layout is left out: its scheduler block is 256 tokens, so a pool small enough to
preempt needs prompts of thousands of tokens, which the ci budget cannot afford.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstate.targets.vllm.configs import CONFIGS, PRELUDE


@dataclass(frozen=True)
class Config:
    layout: str  # a key of kvstate.targets.vllm.configs.CONFIGS
    num_blocks: int  # blocks in the pool, vLLM's null block included
    policy: str = "fcfs"  # vLLM's scheduling policy: "fcfs" or "priority"
    connector: bool = True  # a ScriptedConnector offering sync, async and failing loads
    failure_policy: str = "recompute"  # kv_load_failure_policy: "recompute" or "fail"
    budget: int = 48  # max_num_batched_tokens: small, so prefills are chunked
    spec_tokens: int = 0  # EAGLE draft tokens per step (0: no speculative decoding)
    watermark: float = 0.0  # SchedulerConfig.watermark: pool fraction kept free for admissions
    reserve_full_isl: bool = True  # SchedulerConfig.scheduler_reserve_full_isl (vLLM's default)

    @property
    def label(self) -> str:
        kv = f"+kv({self.failure_policy})" if self.connector else ""
        eagle = f"+eagle{self.spec_tokens}" if self.spec_tokens else ""
        gate = f"+wm{self.watermark:g}" if self.watermark else ""
        gate += "" if self.reserve_full_isl else "+chunkgate"
        return f"{self.layout}{eagle}/pool{self.num_blocks}/{self.policy}{kv}{gate}"

    @property
    def layout_source(self) -> str:
        return PRELUDE + "\n" + CONFIGS[self.layout]

    def kwargs(self) -> dict[str, object]:
        """``make_scheduler``'s keyword arguments for this configuration."""
        return {
            "budget": self.budget,
            "policy": self.policy,
            "connector": self.connector,
            "failure_policy": self.failure_policy,
            "spec_tokens": self.spec_tokens,
            "watermark": self.watermark,
            "reserve_full_isl": self.reserve_full_isl,
        }


# Pools small enough that admission waits and running requests are preempted.
ALL: tuple[Config, ...] = (
    Config("full", 12),
    Config("full", 12, policy="priority", failure_policy="fail"),
    Config("full-2sizes", 14),
    Config("swa", 14),
    Config("swa", 14, policy="priority", reserve_full_isl=False),  # admission gates one chunk
    Config("mamba", 12),
    Config("mamba", 12, policy="priority", failure_policy="fail"),
    Config("mamba-prefix", 16),  # partial-block hits, copy-on-write, shared-prefix junctions
    Config("full", 12, connector=False, watermark=0.5),  # 6 blocks kept back from admissions
    Config("full", 12, connector=False, spec_tokens=2),
    Config("swa", 14, connector=False, spec_tokens=2),
)
