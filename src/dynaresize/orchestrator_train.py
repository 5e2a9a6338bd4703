"""The orchestrator's train loop (a mixin of `Orchestrator`; see `dynaresize.orchestrator`).

For each step: with streaming, accumulate its micro-batches as its groups complete
(`stream_train.accumulate`); then, under the train lock (the optimizer-step boundary), either
finish the streamed step or run the plain step (`Device.train_step` on the dealt
micro-batches), gather the weights and publish version k + 1. A device death mid-step is
repaired (`recovery`) and the step rerun the plain way; checkpoints are taken at the boundary.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from dynaresize.controller import StepTiming
from dynaresize.samples import StepSamples
from dynaresize.stream import Holdings
from dynaresize.stream_train import accumulate, finish
from dynaresize.train.batching import global_num_tokens, plan_step

if TYPE_CHECKING:
    from dynaresize.protocols import Device


class TrainLoop:
    """Mixin: needs the `Orchestrator` state (cfg, clock, devices, allocation, versions,
    rundir, the train lock, the sample and stream futures, recovery, checkpointer)."""

    async def _train_loop(self) -> None:
        """Consumes samples[k]; holds the train lock for the step; publishes version k + 1."""
        cfg = self.cfg
        prev_end_s = self.t_start_s
        for step in range(self.start_step, cfg.run.steps):
            stream, holdings = None, Holdings()
            accumulated_s = 0.0
            if self.streaming:
                stream = await self._stream_future(step)
                self._holdings = (holdings, stream)
                try:
                    accumulated_s = await accumulate(self, step, stream, holdings,
                                                     self._stream_changed)
                except Exception:
                    if self.recovery is None or not self.recovery.find_dead(
                            f"died in train step {step}"):
                        raise
                    stream = None  # the plain path below reruns the step after the repair
            got = await self._future(step)
            async with self._train_lock:
                t0 = self.clock.now()  # streaming: train_s is what the rollout end waits for
                while True:  # a device death mid-step: recover, then rerun the step
                    try:
                        if self.recovery is not None:
                            await self.recovery.repair()
                        trainers = self._train_devices()
                        if stream is not None:
                            stats, t1, handles, finish_s = await finish(
                                self, trainers, step, stream, holdings,
                                global_num_tokens(got.samples))
                            train_device_s = accumulated_s + finish_s
                        else:
                            stats, t1, handles = await self._train_once(trainers, step, got,
                                                                        True)
                            train_device_s = (self.clock.now() - t0) * len(trainers)
                        break
                    except Exception:
                        if self.recovery is None or not self.recovery.find_dead(
                                f"died in train step {step}"):
                            raise
                        stream = None  # rerun the whole step the plain way
                t2 = self.clock.now()
                self._optimizer_step += 1
                if self.recovery is not None:
                    self.recovery.retain(step, got)
                if self.checkpointer is not None and self.checkpointer.due(step + 1):
                    await self.versions.publish(step + 1, handles[0])
                    train_path = await self.checkpointer.save(self, step + 1)
                    if self.recovery is not None:
                        self.recovery.checkpointed(step + 1, train_path)
            for d in trainers:
                if stream is None:  # streaming wrote one event per micro-batch
                    self.rundir.event(t0, t1, d.index, "train", critical=True, step=step)
                self.rundir.event(t1, t2, d.index, "weight_sync", critical=True, step=step)
            await self.versions.publish(step + 1, handles[0])
            del self._samples[step]
            self._streams.pop(step, None)
            self._holdings = None
            record = {
                "step": step, "reward_mean": round(got.reward_mean, 6),
                "rollout_s": round(got.rollout_s, 4), "train_s": round(t2 - t0, 4),
                "step_s": round(t2 - prev_end_s, 4),
                "num_rollout_devices": len(self.allocation.rollout),
                "num_train_devices": len(self.allocation.train),
                "num_resizes": self._resizes_in_step.get(step, 0),
                "tokens": got.num_tokens, "policy_version": got.version,
                "loss": round(float(stats[0].get("loss", 0.0)), 6),
            }
            prev_end_s = t2
            self._train_end_s.append(t2)
            self.history.append(StepTiming(
                step, got.rollout_s, t2 - t0, got.num_tokens,
                self._rollout_width.pop(step, len(self.allocation.rollout)), len(trainers),
                train_device_s, got.rollout_device_s, got.rollout_tail_device_s,
                got.ready_profile, got.response_cv))
            if self.evaluator is not None:  # held-out evaluation hook (evaluation.Evaluator)
                record.update(await self.evaluator.evaluate(step, self.versions.get))
            self.rundir.metric(record)
            self.on_step(record)

    async def _train_once(self, trainers: list[Device], step: int, got: StepSamples,
                          publish: bool = False) -> tuple[list[dict[str, float]], float, list]:
        """One optimizer step of `step` on `trainers` (+ the weight gather if `publish`);
        returns (stats, time training ended, handles). Also replays steps after a fault."""
        plan = plan_step(got.samples, self.cfg.train.micro_batch_size, len(trainers))
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
