"""The evaluation worker dies mid-evaluation (SIGKILL of its process, as Ray's memory monitor
does): Ray restarts the actor and retries the evaluation on it; training is never involved."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from dynaresize.config import load_config

pytestmark = pytest.mark.ray


def test_killed_eval_worker_restarts_and_evaluates(ray_cluster: Any) -> None:
    import ray

    from dynaresize.evaluation.worker import start_ray_evaluator, stop_ray_evaluator

    cfg = load_config(None, ["eval.every=1", "eval.num_prompts=4", "run.steps=2"],
                      check_machine=False)
    warnings: list[str] = []
    evaluator = start_ray_evaluator(cfg, warn=warnings.append)
    try:
        pid = ray.get(evaluator.actor.__ray_call__.remote(lambda self: os.getpid()))

        async def drive() -> dict:
            task = asyncio.ensure_future(evaluator.evaluate(0, lambda v: None))
            await asyncio.sleep(0.05)
            os.kill(pid, signal.SIGKILL)  # mid-evaluation (or just before it)
            return await task

        record = asyncio.run(drive())
        assert record.get("eval_version") == 0 and "eval_accuracy" in record, warnings
        new_pid = ray.get(evaluator.actor.__ray_call__.remote(lambda self: os.getpid()))
        assert new_pid != pid and not warnings
    finally:
        stop_ray_evaluator(evaluator)
