"""Rollout engines: the built-in batch-invariant torch engine (a vLLM backend comes later)."""

from dynaresize.rollout.engine import EngineStats, RolloutEngine, sample_token

__all__ = ["EngineStats", "RolloutEngine", "sample_token"]
