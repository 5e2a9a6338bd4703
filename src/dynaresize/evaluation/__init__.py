"""Held-out evaluation: the schedule and the `Evaluator` (pure asyncio, `evaluator`) and the
process that generates and scores (`worker`: torch, hosted in a Ray actor)."""

from dynaresize.evaluation.evaluator import (
    EVAL_KEYS,
    Evaluator,
    eval_version,
    eval_versions,
    score_responses,
)

__all__ = ["EVAL_KEYS", "Evaluator", "eval_version", "eval_versions", "score_responses"]
