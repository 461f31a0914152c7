"""``kvstate fuzz --target sglang``: SGLang's unified radix cache and its KV pools, on a CPU."""
