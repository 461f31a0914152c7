"""kvstate: provable prefix-cache hits for hybrid-attention KV caches."""

__version__ = "0.1.0"
