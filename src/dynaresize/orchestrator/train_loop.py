"""The train loop (see the diagram in `dynaresize.orchestrator.orchestrator`).

For each step: with streaming, accumulate its micro-batches as its groups complete
(`StreamTrainer.accumulate`); then, under the train lock (the optimizer-step boundary),
either finish the streamed step or run the plain step (`PlainStep`: `Device.train_step` on
the dealt micro-batches), gather the weights and publish version k + 1. A device death
mid-step is repaired (`Recovery`) and the step rerun the plain way; checkpoints are taken at
the boundary (`Checkpointer`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dynaresize.control.base import StepTiming
from dynaresize.core.samples import StepSamples
from dynaresize.core.stream import Holdings
from dynaresize.evaluation.evaluator import Evaluator
from dynaresize.orchestrator.boundary import OptimizerBoundary
from dynaresize.orchestrator.checkpoint import Checkpointer, NullCheckpointer
from dynaresize.orchestrator.loop_parts import LoopParts, TrainSettings
from dynaresize.orchestrator.plain_step import PlainStep
from dynaresize.orchestrator.streaming import StreamTrainer
from dynaresize.protocols import WeightHandle
from dynaresize.train.batching import global_num_tokens


class TrainLoop:
    def __init__(self, settings: TrainSettings, parts: LoopParts, *,
                 boundary: OptimizerBoundary, stepper: PlainStep, streamer: StreamTrainer,
                 checkpointer: Checkpointer | NullCheckpointer,
                 on_step: Callable[[dict[str, Any]], None],
                 evaluator: Evaluator | None = None) -> None:
        self.settings = settings
        self.state = parts.state
        self.board = parts.board
        self.boundary = boundary
        self.stepper = stepper
        self.streamer = streamer
        self.resizer = parts.resizer
        """Read only: the resizes each step committed (its metric record)."""
        self.recovery = parts.recovery
        self.checkpointer = checkpointer
        self.clock = parts.clock
        self.rundir = parts.rundir
        self.on_step = on_step
        self.streaming = settings.streaming
        self.switch = parts.switch
        self.evaluator = evaluator
        """Held-out evaluation (`evaluation.Evaluator`): its results join the step's record."""

    async def publish_restored(self, published: list[tuple[int, WeightHandle]]) -> None:
        """Resume: publish the versions the checkpoint restored (before the loops start)."""
        for version, handle in published:
            await self.state.versions.publish(version, handle)

    def _record(self, step: int, got: StepSamples, train_s: float, step_s: float,
                train_device_s: float, stats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The step's metrics.jsonl line (before evaluation's fields)."""
        allocation = self.state.allocation
        record: dict[str, Any] = {
            "step": step, "reward_mean": round(got.reward_mean, 6),
            "rollout_s": round(got.rollout_s, 4), "train_s": round(train_s, 4),
            "train_device_s": round(train_device_s, 4), "step_s": round(step_s, 4),
            "num_rollout_devices": len(allocation.rollout),
            "num_train_devices": len(allocation.train),
            "num_resizes": self.resizer.num_in_step.get(step, 0),
            "tokens": got.num_tokens, "policy_version": got.version,
            "loss": round(float(stats[0].get("loss", 0.0)), 6),
        }
        if got.tail_tokens_per_s is not None:
            record["tail_tokens_per_s"] = round(got.tail_tokens_per_s, 3)
        return record

    async def _checkpoint(self, step: int) -> None:
        """The checkpoint after `step` (train lock held). The save is a collective of the
        training group: a rank may die inside it. Then that save is no recovery point: the
        repair restores the last complete one, replays up to this step from the retained
        samples, and the save is taken again (also after the run's last step)."""
        recovery = self.recovery
        for _ in range(len(self.state.devices)):
            try:
                train_path = await self.checkpointer.save(step + 1)
            except Exception as exc:
                if recovery.find_dead(f"died in the checkpoint after step {step}"):
                    await recovery.repair()
                    continue
                if isinstance(exc, OSError):  # disk full, I/O error (Ray: its cause's type)
                    raise self.checkpointer.write_error(step + 1, exc) from exc
                raise
            else:
                recovery.checkpointed(step + 1, train_path)
                return
        raise RuntimeError(f"the checkpoint after step {step} failed on every try")

    async def run(self) -> None:
        """Consumes samples[k]; holds the train lock for the step; publishes version k + 1."""
        state, board, recovery = self.state, self.board, self.recovery
        prev_end_s = state.t_start_s
        for step in range(state.start_step, self.settings.steps):
            stream, holdings = None, Holdings()
            num_repairs = recovery.num_repairs
            accumulated_s = 0.0
            if self.streaming:
                stream = await board.stream(step)
                board.hold(holdings, stream)
                try:
                    accumulated_s = await self.streamer.accumulate(
                        step, stream, holdings,
                        stop=lambda n=num_repairs: recovery.num_repairs != n)
                except Exception:
                    if not recovery.find_dead(f"died in train step {step}"):
                        raise
                    stream = None  # the plain path below reruns the step after the repair
            got = await board.samples(step)
            await self.switch.to_train(step)  # colocated: the engines become trainers
            async with self.boundary.lock:
                t0 = self.clock.now()  # streaming: train_s is what the rollout end waits for
                while True:  # a device death mid-step: recover, then rerun the step
                    await recovery.repair()  # outside the try: a repair that fails (e.g. no
                    # device left for a pool) ends the run; retrying it would loop forever
                    if recovery.num_repairs != num_repairs:  # a rebuilt world (e.g. a
                        stream = None  # rollout death) dropped the held gradients
                    try:
                        trainers = state.train_devices()
                        if stream is not None:
                            stats, t1, handles, finish_s = await self.streamer.finish(
                                trainers, step, stream, holdings, global_num_tokens(got.samples))
                            train_device_s = accumulated_s + finish_s
                        else:
                            stats, t1, handles = await self.stepper.run(trainers, step, got, True)
                            train_device_s = (self.clock.now() - t0) * len(trainers)
                        break
                    except Exception:
                        if not recovery.find_dead(f"died in train step {step}"):
                            raise
                        stream = None  # rerun the whole step the plain way
                t2 = self.clock.now()
                state.optimizer_stepped()
                recovery.retain(step, got)
                if self.checkpointer.due(step + 1):
                    await state.versions.publish(step + 1, handles[0])
                    await self._checkpoint(step)
                    trainers = state.train_devices()
            for d in trainers:
                if stream is None:  # streaming wrote one event per micro-batch
                    self.rundir.event(t0, t1, d.index, "train", critical=True, step=step)
                self.rundir.event(t1, t2, d.index, "weight_sync", critical=True, step=step)
            await state.versions.publish(step + 1, handles[0])
            board.done(step)
            record = self._record(step, got, t2 - t0, t2 - prev_end_s, train_device_s, stats)
            prev_end_s = t2
            state.step_trained(StepTiming(
                step, got.rollout_s, t2 - t0, got.num_tokens,
                board.take_width(step, len(state.allocation.rollout)), len(trainers),
                train_device_s, got.rollout_device_s, got.rollout_tail_device_s,
                got.ready_profile, got.response_cv,
                stream.num_formed if stream is not None else 0), t2)
            if self.evaluator is not None:
                record.update(await self.evaluator.evaluate(step, state.versions.get))
            self.rundir.metric(record)
            self.on_step(record)
