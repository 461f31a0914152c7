"""The scheduler target (``kvstate fuzz --target vllm-scheduler``): vLLM's real ``Scheduler`` on a
CPU, driven as the engine core drives it.  ``standalone``: the part that needs only vLLM (config
with a stub model configuration, a scripted KV connector, the engine loop, the checks);
``configs``: layouts, pools, policies; ``driver``: operations and checks per step; ``engine``:
the Hypothesis machine, minimizer, reproducer and report; ``checks``: the table's invariants
each check class projects."""
