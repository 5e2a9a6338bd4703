"""The orchestrator's components on their own (no devices): the step board hands a step from
rollout to training, the optimizer-step boundary makes streaming training yield to a resize,
background errors fail the run."""

from __future__ import annotations

import asyncio

import pytest

from dynaresize.core.samples import assemble_step
from dynaresize.core.stream import Holdings, StepStream
from dynaresize.core.types import Completion, RequestSpec
from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.board import StepBoard
from dynaresize.orchestrator.boundary import OptimizerBoundary


def _completion(prompt: int, sample: int, length: int = 3) -> Completion:
    spec = RequestSpec(step=0, prompt=prompt, sample=sample, version=0, prompt_tokens=(1, 2),
                       max_new_tokens=8, seed=prompt * 100 + sample, temperature=1.0)
    return Completion(spec, [prompt + sample + i for i in range(length)], [-0.5] * length,
                      "eos", device=0, engine_version=0)


def test_the_train_loop_waits_on_the_board_until_the_rollout_posts_the_step() -> None:
    async def scenario() -> list[str]:
        board, seen = StepBoard(), []

        async def train() -> None:
            stream = await board.stream(0)
            seen.append(f"stream {stream.step}")
            got = await board.samples(0)
            seen.append(f"samples {len(got.samples)}")

        task = asyncio.ensure_future(train())
        await asyncio.sleep(0)
        assert not seen  # nothing posted yet: the train side waits
        board.post_stream(0, StepStream(0, 0, [0], 2, 2))
        await asyncio.sleep(0)
        assert seen == ["stream 0"]
        assert board.posted_stream(0) is not None and board.posted_stream(1) is None
        expected = {(0, 0), (0, 1)}
        board.post_samples(0, assemble_step(0, 0, expected, [_completion(0, 0),
                                                             _completion(0, 1)],
                                            {k: 1.0 for k in expected}, 1.0))
        await task
        board.done(0)
        assert board.posted_stream(0) is None  # cleared once trained
        return seen

    assert asyncio.run(scenario()) == ["stream 0", "samples 2"]


def test_train_todo_is_the_share_of_the_streamed_step_nobody_holds() -> None:
    board = StepBoard()
    assert board.train_todo() == 0.0  # nothing streamed
    stream = StepStream(0, 0, [0, 1], 2, 2)  # two micro-batches of one group each
    for p in (0, 1):
        for j in range(2):
            stream.add(_completion(p, j, length=4), 1.0)
    holdings = Holdings()
    board.hold(holdings, stream)
    assert board.train_todo() == pytest.approx(1.0)
    holdings.held_by[0] = 5
    assert board.train_todo() == pytest.approx(stream.todo_fraction({0: 5}))
    assert 0.0 < board.train_todo() < 1.0


def test_the_board_keeps_each_steps_rollout_width_until_taken() -> None:
    board = StepBoard()
    board.post_width(3, 7)
    assert board.take_width(3, 1) == 7
    assert board.take_width(3, 1) == 1  # taken once


def test_a_waiting_resize_is_announced_and_gets_the_boundary_next() -> None:
    """A resize counts as waiting and sets `changed` before it queues for the lock (so
    streaming training ends its session), and holds the lock once training releases it."""
    async def scenario() -> list[str]:
        changed = asyncio.Event()
        boundary = OptimizerBoundary(changed)
        log: list[str] = []

        async def resize() -> None:
            await boundary.acquire_for_resize()
            log.append(f"resize holds (busy={boundary.busy()})")
            boundary.release()

        await boundary.lock.acquire()  # a training session
        task = asyncio.ensure_future(resize())
        await asyncio.sleep(0)
        log.append(f"waiting={boundary.resize_waits()} changed={changed.is_set()}")
        boundary.lock.release()
        await task
        log.append(f"waiting={boundary.resize_waits()} busy={boundary.busy()}")
        return log

    assert asyncio.run(scenario()) == ["waiting=True changed=True",
                                       "resize holds (busy=True)",
                                       "waiting=False busy=False"]


def test_a_cancelled_resize_stops_counting_as_waiting() -> None:
    async def scenario() -> int:
        boundary = OptimizerBoundary(asyncio.Event())
        await boundary.lock.acquire()
        task = asyncio.ensure_future(boundary.acquire_for_resize())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return boundary.resizes_waiting

    assert asyncio.run(scenario()) == 0


def test_a_background_error_fails_the_run_and_success_resolves_it() -> None:
    async def scenario(fail: bool) -> str:
        background = Background()
        failed = background.start()

        async def work() -> None:
            if fail:
                raise RuntimeError("engine lost")

        await asyncio.gather(background.spawn(work()), return_exceptions=True)
        background.finish()
        try:
            await failed
        except RuntimeError as exc:
            return str(exc)
        return "ok"

    assert asyncio.run(scenario(True)) == "engine lost"
    assert asyncio.run(scenario(False)) == "ok"


def test_a_device_joining_between_runs_loads_the_loops_version_or_the_newest_kept() -> None:
    """`ResizeHooks.current_weights` (what a resize loads on a device joining the rollout):
    the running step's version; between runs the rollout loop's, unless training ran ahead
    and the store already dropped it (then the newest)."""
    from types import SimpleNamespace

    from dynaresize.orchestrator.engine_hooks import ResizeHooks
    from dynaresize.orchestrator.engine_pool import EnginePool
    from dynaresize.orchestrator.engine_transit import EngineTransit
    from dynaresize.orchestrator.state import VersionStore

    async def scenario() -> list[int]:
        versions = VersionStore()
        state = SimpleNamespace(devices=[SimpleNamespace(index=0)], versions=versions,
                                rollout_version=1, allocation=None)
        transit = EngineTransit()
        pool = EnginePool(state, None, Background(), None, transit)  # type: ignore[arg-type]
        hooks = ResizeHooks(pool, transit, state, None, None)  # type: ignore[arg-type]
        for v in (1, 2):
            await versions.publish(v, f"w{v}")
        got = [hooks.current_weights(())[0]]            # v1 still kept (the two newest are)
        await versions.publish(3, "w3")
        got.append(hooks.current_weights(())[0])      # v1 dropped: the newest
        pool.start_run(SimpleNamespace(version=2))    # type: ignore[arg-type]
        got.append(hooks.current_weights(())[0])      # a step rolls out: its version
        return got

    assert asyncio.run(scenario()) == [1, 3, 2]


def test_summary_rates_count_only_the_steps_this_process_trained() -> None:
    # a run resumed at step 2 keeps steps 0-1's records; its 10 s trained steps 2 and 3
    from types import SimpleNamespace

    from dynaresize.core.allocation import Allocation
    from dynaresize.orchestrator.state import RunState
    from dynaresize.orchestrator.summary import run_summary

    class Trainer:
        async def param_checksum(self) -> tuple[float, str]:
            return 1.0, "sha"

    state = RunState([Trainer(), Trainer()], Allocation.initial(1, 1), start_step=2)
    state.step_trained(None, 10.0)  # type: ignore[arg-type]
    written: list[dict] = []
    rundir = SimpleNamespace(metrics=[{"step": s, "tokens": 100, "reward_mean": 0.5}
                                      for s in range(4)], events=[], summary=written.append)
    resizer = SimpleNamespace(reports=[], skipped=[])
    got = asyncio.run(run_summary(state, resizer, None, rundir, 8))  # type: ignore[arg-type]
    assert got["steps"] == 4 and got["wall_s"] == 10.0
    assert got["samples_per_s"] == 2 * 8 / 10 and got["tokens_per_s"] == 200 / 10
    assert written == [got]
