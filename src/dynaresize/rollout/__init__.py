"""Rollout: the scheduler (pure asyncio, no torch) and the built-in batch-invariant torch engine
(`rollout.engine`; a vLLM backend comes later). Import the engine from its module."""
