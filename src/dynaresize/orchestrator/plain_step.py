"""One optimizer step the plain way: the step's micro-batches dealt over the training ranks
(`plan_step`), `Device.train_step` on each, then (optionally) the weight gather. The train
loop runs steps so; recovery replays steps so after restoring a checkpoint."""

from __future__ import annotations

import asyncio

from dynaresize.core.samples import StepSamples
from dynaresize.orchestrator.fault_injection import FaultInjector
from dynaresize.protocols import Clock, Device
from dynaresize.train.batching import global_num_tokens, plan_step


class PlainStep:
    def __init__(self, micro_batch_size: int, clock: Clock,
                 injector: FaultInjector | None = None,
                 max_tokens_per_micro_batch: int = 0) -> None:
        self.micro_batch_size = micro_batch_size
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        """`train.max_tokens_per_micro_batch` (0: micro-batches of `micro_batch_size` samples)."""
        self.clock = clock
        self.injector = injector
        """faults.FaultInjector (`[[faults.kill]]`: kills during a published step), or None."""

    async def run(self, trainers: list[Device], step: int, got: StepSamples,
                  publish: bool = False) -> tuple[list[dict[str, float]], float, list]:
        """One optimizer step of `step` on `trainers` (+ the weight gather if `publish`);
        returns (stats, time training ended, handles)."""
        plan = plan_step(got.samples, self.micro_batch_size, len(trainers),
                         self.max_tokens_per_micro_batch)
        global_tokens = global_num_tokens(got.samples)
        train = asyncio.gather(*(d.train_step(step, plan[r], global_tokens)
                                 for r, d in enumerate(trainers)))
        if publish and self.injector is not None:
            await self.injector.during_train(step)
        stats = await train
        t1 = self.clock.now()
        handles = list(await asyncio.gather(*(d.publish_weights(step + 1) for d in trainers))) \
            if publish else []
        return list(stats), t1, handles
