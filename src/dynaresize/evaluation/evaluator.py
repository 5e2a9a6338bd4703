"""Held-out evaluation: greedy generation on a seeded set disjoint from the training prompts.

Which policy versions are evaluated (pure: `eval_versions`): version 0 and every
`eval.every`-th version, recorded in the metrics record of the step that starts from it
(step k holds the evaluation of version k, the weights after k optimizer steps), and the final
weights (version `run.steps`), recorded in the last step's record. Each of those records gets

    eval_version, eval_accuracy (share of exactly right answers), eval_reward (mean reward),
    eval_s (seconds the evaluation took)

The orchestrator calls `Evaluator.evaluate(step, weights_of)` from one place, just before it
writes step k's record (after publishing version k + 1). The evaluator then starts the next
due evaluation whose weights exist already, so it runs while the next step trains, and waits
for the one the record needs. The work itself (`run_eval(version, weights) -> result`) runs
elsewhere: `evaluation.worker.EvalWorker` in its own Ray actor, so evaluation never borrows a
rollout or training device and cannot change the run's samples.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

EVAL_KEYS = ("eval_version", "eval_accuracy", "eval_reward", "eval_s")


def eval_version(step: int, every: int, num_steps: int) -> int | None:
    """The policy version whose evaluation step `step`'s record holds, or None."""
    if every <= 0:
        return None
    if step == num_steps - 1:
        return num_steps
    return step if step % every == 0 else None


def eval_versions(every: int, num_steps: int) -> list[int]:
    """Every evaluated version of a run, in order."""
    out = [eval_version(k, every, num_steps) for k in range(num_steps)]
    return [v for v in out if v is not None]


def score_responses(rewards: list[float]) -> dict[str, float]:
    """accuracy (reward >= 1: exactly right) and mean reward of one evaluation."""
    if not rewards:
        return {"eval_accuracy": 0.0, "eval_reward": 0.0}
    return {"eval_accuracy": round(sum(r >= 1.0 for r in rewards) / len(rewards), 6),
            "eval_reward": round(sum(rewards) / len(rewards), 6)}


class Evaluator:
    """Schedules evaluations of published versions; `run_eval` does the work (awaitable)."""

    def __init__(self, every: int, num_steps: int,
                 run_eval: Callable[[int, Any], Awaitable[dict[str, Any]]],
                 log: Callable[[dict[str, Any]], None] | None = None,
                 warn: Callable[[str], None] | None = None) -> None:
        """`log(result)`: every full result (with decoded examples), e.g. to eval.jsonl.
        `warn(text)`: an evaluation that failed (its worker died: killed, or taken by Ray's
        memory monitor, and not brought back by its restarts) is skipped with a warning; the
        record goes without it and training goes on."""
        self.log = log
        self.warn = warn
        self.skipped: list[int] = []
        """Versions whose evaluation failed and was skipped."""
        self.every = every
        self.num_steps = num_steps
        self.run_eval = run_eval
        self._pending: dict[int, asyncio.Task[dict[str, Any]]] = {}
        self.results: dict[int, dict[str, Any]] = {}
        """version -> its evaluation (EVAL_KEYS), as recorded."""

    def _start(self, version: int, weights: Any) -> None:
        if version not in self._pending and version not in self.results:
            self._pending[version] = asyncio.ensure_future(self._run(version, weights))

    async def _run(self, version: int, weights: Any) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            result = dict(await self.run_eval(version, weights))
        except Exception as exc:  # evaluation is auxiliary: it never ends the run
            self.skipped.append(version)
            if self.warn is not None:
                self.warn(f"evaluation of version {version} skipped: "
                          f"{type(exc).__name__}: {str(exc)[:200]}")
            return {}
        result.setdefault("eval_s", round(loop.time() - t0, 3))
        full = {"eval_version": version, **result}
        if self.log is not None:
            self.log(full)
        return {k: full[k] for k in EVAL_KEYS if k in full}

    async def evaluate(self, step: int, weights_of: Callable[[int], Any]) -> dict[str, Any]:
        """The evaluation step `step`'s record holds ({} if none); `weights_of(v)` gives the
        published weights of version v (v <= step + 1)."""
        version = eval_version(step, self.every, self.num_steps)
        if version is not None:
            self._start(version, weights_of(version))
        upcoming = eval_version(step + 1, self.every, self.num_steps) \
            if step + 1 < self.num_steps else None
        if upcoming is not None and upcoming <= step + 1:
            self._start(upcoming, weights_of(upcoming))  # overlaps with the next step
        if version is None:
            return {}
        result = await self._pending.pop(version)
        if result:  # not skipped
            self.results[version] = result
        return result

    def cancel(self) -> None:
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()
