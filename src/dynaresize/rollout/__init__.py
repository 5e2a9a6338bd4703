"""Rollout: one step's run on the engines (`run`, `slots`, `tail_order`, `handoff`; pure asyncio,
no torch), the built-in batch-invariant torch engine and
the vLLM engine (`rollout.engine`: `engine.py`, `vllm_engine.py`, which alone imports vLLM).
Import an engine from its module."""
