"""Held-out evaluation schedule and the Evaluator's overlap (pure, asyncio, no devices)."""

from __future__ import annotations

import asyncio

from dynaresize.evaluation import (
    EVAL_KEYS,
    Evaluator,
    eval_version,
    eval_versions,
    score_responses,
)


def test_schedule_step0_every_n_and_final_weights() -> None:
    assert eval_versions(4, 10) == [0, 4, 8, 10]
    assert eval_versions(3, 10) == [0, 3, 6, 10]  # step 9's record: the final weights
    assert eval_versions(1, 3) == [0, 1, 3]
    assert eval_versions(0, 10) == []
    assert eval_version(4, 4, 10) == 4 and eval_version(5, 4, 10) is None
    assert eval_version(9, 4, 10) == 10


def test_score_responses() -> None:
    assert score_responses([1.0, 0.0, 0.5, 1.0]) == {"eval_accuracy": 0.5,
                                                      "eval_reward": 0.625}
    assert score_responses([]) == {"eval_accuracy": 0.0, "eval_reward": 0.0}


def test_evaluator_records_due_versions_and_prefetches_the_next() -> None:
    calls: list[tuple[str, int]] = []
    logged: list[dict] = []

    async def run_eval(version: int, weights: object) -> dict:
        calls.append(("start", version))
        assert weights == f"w{version}"
        await asyncio.sleep(0.001)
        calls.append(("end", version))
        return {"eval_accuracy": version / 10, "eval_reward": version / 20,
                "examples": ["x"]}

    async def drive() -> list[dict]:
        ev = Evaluator(2, 5, run_eval, logged.append)
        records = []
        for step in range(5):  # version step + 1 is published before the hook runs
            calls.append(("hook", step))
            records.append(await ev.evaluate(step, lambda v, s=step: (
                f"w{v}" if v <= s + 1 else pytest_fail(v))))
            calls.append(("record", step))
            await asyncio.sleep(0.005)  # the next step's training
        return records

    records = asyncio.run(drive())
    assert [r.get("eval_version") for r in records] == [0, None, 2, None, 5]
    assert records[2]["eval_accuracy"] == 0.2 and set(records[4]) <= set(EVAL_KEYS)
    assert "examples" not in records[0] and logged[0]["examples"] == ["x"]
    # version 2's evaluation ran during step 2 (its weights existed at step 1's hook)
    assert calls.index(("record", 1)) < calls.index(("end", 2)) < calls.index(("hook", 2))
    assert [v for kind, v in calls if kind == "start"] == [0, 2, 5]


def pytest_fail(version: int) -> None:
    raise AssertionError(f"weights of version {version} are not published yet")


def test_a_failed_evaluation_is_skipped_with_a_warning() -> None:
    """The evaluation worker died (killed, or taken by Ray's memory monitor) and did not come
    back: that evaluation is skipped, the warning says so, the next ones run."""
    warnings: list[str] = []

    async def run_eval(version: int, weights: object) -> dict:
        if version == 2:
            raise RuntimeError("The actor died unexpectedly (killed by the memory monitor)")
        return {"eval_accuracy": 0.5, "eval_reward": 0.5}

    async def drive() -> list[dict]:
        ev = Evaluator(1, 4, run_eval, warn=warnings.append)
        return [await ev.evaluate(step, lambda v: v) for step in range(4)], ev

    records, ev = asyncio.run(drive())
    assert [r.get("eval_version") for r in records] == [0, 1, None, 4]
    assert ev.skipped == [2] and sorted(ev.results) == [0, 1, 4]
    assert len(warnings) == 1 and "version 2 skipped" in warnings[0]
    assert "memory monitor" in warnings[0]
