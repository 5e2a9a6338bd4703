"""The evaluation worker dies mid-evaluation (SIGKILL of its process, as Ray's memory monitor
does): Ray restarts the actor and retries the evaluation on it; training is never involved."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_checkpoint import tiny_arithmetic_config  # noqa: E402

pytestmark = pytest.mark.ray
pytest.importorskip("reasoning_gym")


def test_killed_eval_worker_restarts_and_evaluates(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    from dynaresize.evaluation.worker import start_ray_evaluator, stop_ray_evaluator

    cfg = tiny_arithmetic_config(tmp_path, 4)
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
