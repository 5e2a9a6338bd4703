"""The rollout loop (see the diagram in `dynaresize.orchestrator.orchestrator`).

For each step k: wait for the policy version k - s, apply the controller's step-start moves,
load the version on the rollout engines, run the step's requests (`RolloutRun`), then post
the completed, rewarded samples on the step board and apply the rollout-end moves.

**Pipelined rollouts** (`pipelined`: staleness >= 1, streaming training and
`controller.pipeline_rollouts`): step k + 1's rollout does not wait for step k's tail. Once
every request of step k is on an engine (its queue is empty) the loop moves on to step k + 1;
as soon as version k + 1 - s is published, step k + 1's run starts on the rollout engines step
k no longer uses, and every engine step k's tail empties joins it after loading the new
version (`RolloutRun.hand_off`; the last engine of step k stays until its run ends, so work
requeued there always has an engine). An engine serves one version at a time and every request
still runs with the version its step is owed, so the samples are those of the plain loop
(design §2); only the time the tail leaves idle is used. At most s + 1 steps roll out at once
(`pipeline.max_tails`: step k needs version k - s, which needs all of step k - s - 1's samples),
their ends are processed in step order (`pipeline.Endings`), and none is pipelined while a
resize is pending: a resize first waits until one step rolls out (`EnginePool.settle`), so its
stop / requeue / start-serving hooks act on the one running step. At staleness >= 2 a resize
that can stop its devices where they are does not wait (`Resizer.deep`), and the pipeline
stays s + 1 steps deep through it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dynaresize.control.base import Controller
from dynaresize.core.dynamic_sampling import rate_step
from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.engine_rescue import EngineRescue
from dynaresize.orchestrator.episodes import EpisodeTotals
from dynaresize.orchestrator.fault_injection import FaultInjector
from dynaresize.orchestrator.loop_parts import LoopParts
from dynaresize.orchestrator.pipeline import Endings, share_factor
from dynaresize.orchestrator.source import PromptLike, PromptSource
from dynaresize.orchestrator.step_rollout import RolloutSettings, StepRollout
from dynaresize.orchestrator.view import RunViews
from dynaresize.protocols import Device, RolloutOps
from dynaresize.rollout.run import RolloutRun, RunSettings


class RolloutLoop:
    def __init__(self, settings: RolloutSettings, parts: LoopParts, *, engines: EnginePool,
                 rescue: EngineRescue, controller: Controller, view: RunViews,
                 source: PromptSource, background: Background,
                 injector: FaultInjector | None) -> None:
        self.settings = settings
        self.state = parts.state
        self.board = parts.board
        self.engines = engines
        self.rescue = rescue
        """A tail that lost its last engine gets one of the newest run's (`_on_lost`)."""
        self.resizer = parts.resizer
        self.recovery = parts.recovery
        self.controller = controller
        self.view = view
        self.source = source
        self.clock = parts.clock
        self.rundir = parts.rundir
        self.background = background
        self.injector = injector
        self.streaming = settings.streaming
        self.pipelined = settings.pipelined
        self.switch = parts.switch
        self.num_migrated = 0
        """Requests moved to another engine by tail packing and spreading
        (`RunSettings.pack_batch`, `RunSettings.spread`)."""
        self.episode_totals = EpisodeTotals()
        """`[env]`: the run's episode figures (summary.json)."""

    async def run(self) -> None:
        """Consumes prompt batches; waits for version max(0, k - s); produces samples[k]."""
        settings, state, engines, resizer = self.settings, self.state, self.engines, self.resizer
        endings: Endings[asyncio.Task[None]] = Endings(
            settings.staleness if self.pipelined else 0)
        for step in range(state.start_step, settings.steps):
            state.enter_step(step)
            rollout = StepRollout(step, settings, self._prompts(step), self.source, self.clock,
                                  self.board.changed, self._watch, self._num_initial(step))
            version = rollout.version
            handle = await state.versions.wait(version)  # the controller sees that step's timing
            # what a device a step-start resize brings to the rollout loads (`current_weights`;
            # the previous step's version may be gone from the store by now)
            state.rollout_needs(version)
            for move in self.controller.at_step_start(self.view()):
                if move.blocking:  # applied before the step's rollout starts
                    await _wait(endings.take_all())
                    await resizer.resize(move.move, move.num_devices, step)
                else:  # applied when the boundary comes; devices join the running step
                    rollout.fire(resizer.resize_soon(move, step))
            if resizer.blocks_pipelining:  # no pipelining while a resize waits for it
                await _wait(endings.take_all())
            await self.switch.to_rollout(step)  # colocated: the devices become engines
            run = self._start(rollout, await engines.load_free(version, handle))
            engines.adopt_free_engines(run)
            engines.hand_off_tail()
            last = step + 1 >= settings.steps
            if self.pipelined and not last:  # s >= 2: `EnginePool.gathered`
                await (run.drained.wait() if settings.staleness < 2 else engines.gathered(run))
            await _wait(endings.over_bound())  # at most s + 1 steps roll out at once
            previous = endings.previous()
            if self.pipelined and not last and not resizer.blocks_pipelining:
                engines.keep_tail(run)  # the loop moves on; this step ends in the background
                endings.add(self.background.spawn(self._end(rollout, previous)))
            else:
                await self._end(rollout, previous)
                await _wait(endings.take_all())  # ended before it (done)
        await _wait(endings.take_all())
        self.background.finish()

    def _prompts(self, step: int) -> list[PromptLike]:
        """Step `step`'s prompts: its seeded batch or, with dynamic sampling, its seeded
        prompt stream (`core.dynamic_sampling`)."""
        settings, dynamic = self.settings, self.settings.dynamic
        num = settings.prompts_per_step if dynamic is None else dynamic.pool_size
        return list(self.source.batch(step, num, settings.seed))

    def _num_initial(self, step: int) -> int:
        """Dynamic sampling: the stream prompts step `step` dispatches up front, from the
        filter rate of an ended step (`rate_step`); 0 without."""
        dynamic = self.settings.dynamic
        if dynamic is None:
            return 0
        earlier = rate_step(step, self.settings.staleness)
        return dynamic.initial_for(self.state.filter_rates.get(earlier)
                                   if earlier is not None else None)

    def _start(self, rollout: StepRollout, ready: list[Device]) -> RolloutRun:
        """Start `rollout`'s RolloutRun on `ready` engines (others join later)."""
        settings = self.settings
        if rollout.stream is not None:
            self.board.post_stream(rollout.step, rollout.stream)

        def make_run(rollout: StepRollout) -> RolloutRun:
            policy = settings.tail_policy
            run_settings = RunSettings(
                rollout.version, settings.max_running_requests, settings.slice_s,
                light_batch=settings.tail_batch, pack_batch=settings.pack_batch,
                tail_order=policy != "off", spread=policy == "spread" and not self.pipelined,
                share_factor=share_factor(settings.staleness) if self.pipelined else 1)
            if rollout.episodes is not None:  # [env]: a HeldRun, open while episodes last
                return rollout.episodes.make_run(rollout.specs, run_settings,
                                                 rollout.receive, self._on_lost(rollout))
            return RolloutRun(self.clock, rollout.specs, run_settings,
                              rollout.receive, self._on_lost(rollout),
                              drain=self._may_drain, may_spread=self._may_spread,
                              arrivals=self.engines if self.pipelined else None)

        run = rollout.start(make_run)
        self.state.rollout_started(rollout.started_s)
        self.engines.start_run(run)
        run.add_devices(ready)  # pipelined: the previous tail's engines join later (arrivals)
        self.board.post_width(rollout.step, len(self.state.allocation.rollout) if self.pipelined
                              else len(ready))
        return run

    def _watch(self, rollout: StepRollout) -> None:
        """Progress for the watchers: fault kills at a share of the rollout, the
        controller's progress moves (only for the newest step's run)."""
        if self.injector is not None:
            self.injector.at_rollout(rollout.step, rollout.progress())
        if not self.controller.needs_progress \
                or rollout.run is not self.engines.run:
            return
        for move in self.controller.on_rollout_progress(self.view()):
            rollout.fire(self.resizer.resize_soon(move, rollout.step))

    def _on_lost(self, rollout: StepRollout
                 ) -> Callable[[RolloutOps, BaseException], bool] | None:
        """RolloutRun's `on_device_lost`: recovery decides; if the device was the previous
        step's last engine and work is left there, an engine of the newest step takes over."""
        if not self.recovery.enabled:
            return None
        recovery, engines, rescue = self.recovery, self.engines, self.rescue

        def lost(device: RolloutOps, exc: BaseException) -> bool:
            if not recovery.on_rollout_lost(device, exc):
                return False
            run = rollout.run
            if run is not None and engines.is_tail(run) and run.progress.remaining \
                    and not run.devices():
                rescue.rescue_tail(run, rollout.version, device.index)
            return True
        return lost

    def _may_spread(self) -> bool:
        """Whether tail spreading may move requests now: no resize pending or under way (it
        would stop and export the same engines)."""
        return self.resizer.num_pending == 0 and not self.resizer.num_requested

    def _may_drain(self) -> bool:
        """Whether rollout devices may run until empty without reporting each completion:
        nobody watches progress (controller, fault injector, streaming training, dynamic
        sampling's top-up) and no resize is pending."""
        return (not self.controller.needs_progress and self.injector is None
                and self.resizer.num_pending == 0 and not self.streaming
                and self.settings.dynamic is None)

    async def _end(self, rollout: StepRollout,
                   previous: asyncio.Task[None] | None = None) -> None:
        """Wait for the step's last request (its engines go to the newest step at once) and
        for the `previous` step's end, post its samples for the train loop, apply the
        rollout-end moves and wait for every resize the step fired."""
        run = rollout.run
        assert run is not None
        try:
            await run.wait()
        except BaseException:
            if rollout.episodes is not None:
                rollout.episodes.cancel()  # episodes still waiting for a turn
            raise
        self.engines.end_run(run)
        if previous is not None:
            await previous  # ends in step order (pipeline.Endings)
        for device, (a, b) in run.progress.busy_s.items():
            self.rundir.event(a, b, device, "rollout", critical=True, step=rollout.step)
        got = rollout.assemble()
        if rollout.filter_rate is not None:
            self.state.step_filtered(rollout.step, rollout.filter_rate)
        self.num_migrated += run.progress.num_migrated
        if rollout.episodes is not None:
            self.episode_totals.add(rollout.episodes)
        self.rundir.samples(got.records)
        self.board.post_samples(rollout.step, got)
        run.close()
        await rollout.settle_moves()  # the controller decides on the allocation they leave
        for move in self.controller.at_rollout_end(self.view()):
            rollout.fire(self.resizer.resize_soon(move, rollout.step))
        await rollout.finish_moves()


async def _wait(ends: list[asyncio.Task[None]]) -> None:
    for end in ends:
        await end
