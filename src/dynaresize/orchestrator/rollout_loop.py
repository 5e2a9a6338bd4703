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
(design §2); only the time the tail leaves idle is used. At most two steps roll out at once
(step k + 2 needs version k + 2 - s, which needs all of step k's samples when s = 1), and
never while a resize is pending: a resize first waits until one step rolls out
(`EnginePool.settle`), so its stop / requeue / start-serving hooks act on the one running step.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dynaresize.config import Config
from dynaresize.control.base import Controller
from dynaresize.core.rundir import RunDir
from dynaresize.core.samples import assemble_step
from dynaresize.core.stream import StepStream
from dynaresize.core.types import Completion, RequestSpec, request_seed
from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.board import StepBoard
from dynaresize.orchestrator.engines import EnginePool
from dynaresize.orchestrator.faults import FaultInjector
from dynaresize.orchestrator.recovery import NullRecovery, Recovery
from dynaresize.orchestrator.resizer import Resizer
from dynaresize.orchestrator.source import PromptSource
from dynaresize.orchestrator.state import RunState, sample_version
from dynaresize.orchestrator.switch import RoleSwitch
from dynaresize.orchestrator.view import RunViews
from dynaresize.protocols import Clock, Device
from dynaresize.rollout.scheduler import RolloutRun
from dynaresize.rollout.tail import TailPolicy


class RolloutLoop:
    def __init__(self, cfg: Config, state: RunState, board: StepBoard, engines: EnginePool,
                 resizer: Resizer, recovery: Recovery | NullRecovery, controller: Controller,
                 view: RunViews, source: PromptSource, clock: Clock, rundir: RunDir,
                 background: Background, injector: FaultInjector | None, streaming: bool,
                 pipelined: bool, switch: RoleSwitch) -> None:
        self.cfg = cfg
        self.state = state
        self.board = board
        self.engines = engines
        self.resizer = resizer
        self.recovery = recovery
        self.controller = controller
        self.view = view
        self.source = source
        self.clock = clock
        self.rundir = rundir
        self.background = background
        self.injector = injector
        self.streaming = streaming
        self.pipelined = pipelined
        """Step k + 1's rollout starts on the engines step k's tail has emptied (module doc)."""
        self.switch = switch
        self.num_migrated = 0
        """Requests moved to another engine by tail packing (`RolloutRun.pack_batch`)."""

    async def run(self) -> None:
        """Consumes prompt batches; waits for version max(0, k - s); produces samples[k]."""
        cfg, state, engines, resizer = self.cfg, self.state, self.engines, self.resizer
        ending: asyncio.Task[None] | None = None
        for step in range(state.start_step, cfg.run.steps):
            state.step = step
            fired: list[asyncio.Future[Any]] = []
            version = sample_version(step, cfg.run.staleness)
            handle = await state.versions.wait(version)  # the controller sees that step's timing
            # what a device a step-start resize brings to the rollout loads (`current_weights`;
            # the previous step's version may be gone from the store by now)
            state.rollout_version = version
            for move in self.controller.at_step_start(self.view()):
                if move.blocking:  # applied before the step's rollout starts
                    if ending is not None:
                        await ending
                        ending = None
                    await resizer.resize(move.move, move.num_devices, step)
                else:  # applied when the boundary comes; devices join the running step
                    fired.append(resizer.resize_soon(move, step))
            if ending is not None and resizer.num_requested:
                await ending  # no pipelining while a resize is pending
                ending = None
            await self.switch.to_rollout(step)  # colocated: the devices become engines
            busy = engines.tail_busy()
            ready = [d for d in engines.rollout_devices() if d.index not in busy]
            await engines.load_version(version, handle, ready)
            # a resize may have taken an engine out while the weights loaded
            ready = [d for d in ready if d.index not in engines.leaving]
            run, started_s, by_id, rewards = self._start_run(step, version, fired, ready)
            engines.adopt_free_engines(run)
            engines.hand_off_tail()
            if self.pipelined and step + 1 < cfg.run.steps:
                await run.drained.wait()
            if ending is not None:
                await ending  # at most two steps roll out at once
                ending = None
            if self.pipelined and step + 1 < cfg.run.steps and not resizer.num_requested:
                engines.keep_tail(run)  # the loop moves on; this step ends in the background
                ending = self.background.spawn(self._end_rollout(step, version, run, started_s,
                                                                 by_id, rewards, fired))
            else:
                await self._end_rollout(step, version, run, started_s, by_id, rewards, fired)
        if ending is not None:
            await ending
        self.background.finish()

    def _start_run(self, step: int, version: int, fired: list[asyncio.Future[Any]],
                   ready: list[Device]) -> tuple[RolloutRun, float, dict, dict]:
        """Create step `step`'s RolloutRun on `ready` engines (others join later)."""
        cfg = self.cfg
        prompts = list(self.source.batch(step, cfg.task.prompts_per_step, cfg.run.seed))
        by_id = {p.id: p for p in prompts}
        specs = [RequestSpec(step=step, prompt=p.id, sample=j, version=version,
                             prompt_tokens=tuple(p.tokens),
                             max_new_tokens=cfg.task.max_new_tokens,
                             seed=request_seed(cfg.run.seed, step, p.id, j),
                             temperature=cfg.rollout.temperature)
                 for p in prompts for j in range(cfg.task.samples_per_prompt)]
        rewards: dict[tuple[int, int], float] = {}
        stream = None
        if self.streaming:
            stream = StepStream(step, version, list(by_id), cfg.task.samples_per_prompt,
                                cfg.train.micro_batch_size,
                                cfg.train.max_tokens_per_micro_batch)
            self.board.post_stream(step, stream)
        holder: list[RolloutRun] = []
        changed = self.board.changed

        def on_done(done: list[Completion]) -> None:
            for c in done:
                key = (c.spec.prompt, c.spec.sample)
                rewards[key] = self.source.reward(by_id[c.spec.prompt], list(c.tokens))
                if stream is not None and stream.add(c, rewards[key], self.clock.now()):
                    changed.set()
            if self.injector is not None:
                self.injector.at_rollout(step, holder[0].num_finished / holder[0].total)
            if not getattr(self.controller, "needs_progress", True) \
                    or holder[0] is not self.engines.run:
                return
            for move in self.controller.on_rollout_progress(self.view()):
                fired.append(self.resizer.resize_soon(move, step))

        started_s = self.state.rollout_started_s = self.clock.now()
        run = RolloutRun(self.clock, specs, cfg.rollout.max_running_requests,
                         cfg.rollout.slice_s, on_done, self._on_lost(holder, version),
                         drain=self._may_drain)
        holder.append(run)
        run.version = version
        run.light_batch = cfg.controller.hysteresis.tail_batch
        run.pack_batch = cfg.rollout.pack_batch  # acts once the run hands off
        if cfg.rollout.tail_policy != "off":
            run.tail = TailPolicy(run, spread=cfg.rollout.tail_policy == "spread"
                                  and not self.pipelined, may_spread=self._may_spread)
        self.engines.start_run(run)
        if self.pipelined:  # the previous tail's engines join later: keep their share queued
            run.expected_devices = self.engines.num_rollout_devices
            run.arriving = self.engines.arriving
        run.add_devices(ready)
        self.board.post_width(step, len(self.state.allocation.rollout) if self.pipelined
                              else len(ready))
        return run, started_s, by_id, rewards

    def _on_lost(self, holder: list[RolloutRun], version: int) -> Any:
        """RolloutRun's `on_device_lost`: recovery decides; if the device was the previous
        step's last engine and work is left there, an engine of the newest step takes over."""
        if not self.recovery.enabled:
            return None
        recovery, engines = self.recovery, self.engines

        def lost(device: Device, exc: BaseException) -> bool:
            if not recovery.on_rollout_lost(device, exc):
                return False
            run = holder[0]
            if run is engines.tail_run and run.remaining and not run.devices():
                engines.rescue_tail(run, version, device.index)
            return True
        return lost

    def _may_spread(self) -> bool:
        """Whether tail spreading may move requests now: no resize pending or under way (it
        would stop and export the same engines)."""
        return self.resizer.num_pending == 0 and not self.resizer.num_requested

    def _may_drain(self) -> bool:
        """Whether rollout devices may run until empty without reporting each completion:
        nobody watches progress (controller, fault injector, streaming training) and no resize
        is pending."""
        return (not getattr(self.controller, "needs_progress", True) and self.injector is None
                and self.resizer.num_pending == 0 and not self.streaming)

    async def _end_rollout(self, step: int, version: int, run: RolloutRun, started_s: float,
                           by_id: dict, rewards: dict, fired: list[asyncio.Future[Any]]) -> None:
        """Wait for the step's last request, post its samples for the train loop, apply the
        rollout-end moves and wait for every resize the step fired."""
        cfg = self.cfg
        await run.wait()
        self.engines.end_run(run)
        rollout_s = self.clock.now() - started_s
        for device, (a, b) in run.busy_s.items():
            self.rundir.event(a, b, device, "rollout", critical=True, step=step)
        expected = {(p, j) for p in by_id for j in range(cfg.task.samples_per_prompt)}
        stream = self.board.posted_stream(step)
        built = stream.samples if stream is not None else None
        got = assemble_step(step, version, expected, run.completions, rewards, rollout_s,
                            cfg.output.record_tokens, built)
        got.rollout_device_s = sum(b - a for a, b in run.busy_s.values())
        got.rollout_tail_device_s = run.tail_device_s()
        if built is not None:
            got.ready_profile = stream.ready_profile(started_s, self.clock.now())
        self.num_migrated += run.num_migrated
        self.rundir.samples(got.records)
        self.board.post_samples(step, got)
        run.close()
        pending = [f for f in fired if not f.done()]
        if pending:  # the controller decides on the allocation they leave (errors: below)
            await asyncio.wait(pending)
        for move in self.controller.at_rollout_end(self.view()):
            fired.append(self.resizer.resize_soon(move, step))
        await asyncio.gather(*fired)
