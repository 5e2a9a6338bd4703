"""A streamed step stops accumulating once a repair has rebuilt the world (found live by the
chaos campaign, `bench/chaos_live.py --mode trap` seed 19): a resize that held the train lock
met a death and repaired; the stream, queued for the lock, then accumulated more micro-batches
on the rebuilt trainers, and the plain rerun of the step failed ("train_step while accumulated
gradients are held"). `StreamTrainer.accumulate` checks `stop()` as each session takes the
lock."""

from __future__ import annotations

import asyncio
from typing import Any

from dynaresize.core.stream import Holdings, StepStream
from dynaresize.orchestrator.boundary import OptimizerBoundary
from dynaresize.orchestrator.streaming import StreamTrainer


class NoTrainers:
    """The run state's one call here; a session would need trainers (it must not start)."""

    def train_devices(self) -> list[Any]:
        raise AssertionError("a session started after the repair")


def test_a_repair_while_the_stream_waits_for_the_lock_ends_the_stream() -> None:
    async def scenario() -> float:
        changed = asyncio.Event()
        boundary = OptimizerBoundary(changed)
        trainer = StreamTrainer(clock=None, rundir=None, boundary=boundary,  # type: ignore[arg-type]
                                state=NoTrainers(), changed=changed)  # type: ignore[arg-type]
        stream = StepStream(0, 0, [0, 1], samples_per_prompt=2, micro_batch_size=2)
        repairs = {"n": 0}
        await boundary.lock.acquire()  # a resize holds the lock ...
        accumulating = asyncio.ensure_future(
            trainer.accumulate(0, stream, Holdings(), stop=lambda: repairs["n"] != 0))
        await asyncio.sleep(0)  # ... the stream queues for it
        repairs["n"] += 1  # ... the resize met a death and repaired the world
        boundary.lock.release()
        return await asyncio.wait_for(accumulating, 5.0)

    assert asyncio.run(scenario()) == 0.0  # no session: nothing more is held
