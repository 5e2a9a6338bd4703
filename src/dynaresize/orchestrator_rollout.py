"""The orchestrator's rollout loop (a mixin of `Orchestrator`; see `dynaresize.orchestrator`).

For each step k: wait for the policy version k - s, apply the controller's step-start moves,
load the version on the rollout engines, run the step's requests (`RolloutRun`), then hand the
completed, rewarded samples to the train loop and apply the rollout-end moves.

**Pipelined rollouts** (`pipelined`: staleness >= 1, streaming training and
`controller.pipeline_rollouts`): step k + 1's rollout does not wait for step k's tail. Once
every request of step k is on an engine (its queue is empty) the loop moves on to step k + 1;
as soon as version k + 1 - s is published, step k + 1's run starts on the rollout engines step
k no longer uses, and every engine step k's tail empties joins it after loading the new
version (`RolloutRun.hand_off`; the last engine of step k stays until its run ends, so work
requeued there always has an engine). An engine serves one version at a time and every request
still runs with the version its step is owed, so the samples are those of the plain loop
(DESIGN §2); only the time the tail leaves idle is used. At most two steps roll out at once
(step k + 2 needs version k + 2 - s, which needs all of step k's samples when s = 1), and
never while a resize is pending: a resize first waits until one step rolls out
(`settle_rollouts`), so its stop / requeue / start-serving hooks act on the one running step.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from dynaresize.orchestrator_engines import EngineMoves
from dynaresize.rollout.scheduler import RolloutRun
from dynaresize.samples import assemble_step
from dynaresize.stream import StepStream
from dynaresize.types import Completion, RequestSpec, request_seed

if TYPE_CHECKING:
    from dynaresize.protocols import Device


class RolloutLoop(EngineMoves):
    """Mixin: needs the `Orchestrator` state (cfg, clock, source, controller, allocation,
    versions, engine versions, rundir, the sample and stream futures, recovery, injector)."""

    def _init_rollout_loop(self) -> None:
        cfg = self.cfg
        self.pipelined = bool(self.streaming and cfg.run.staleness >= 1
                              and cfg.controller.pipeline_rollouts and self.injector is None)
        """Step k + 1's rollout starts on the engines step k's tail has emptied (module doc)."""
        self._run: RolloutRun | None = None
        """The newest step's rollout (what controllers see and resizes act on)."""
        self._tail_run: RolloutRun | None = None
        """The previous step's rollout while its tail still runs (pipelined only)."""
        self._tail_devices: set[int] = set()
        """Devices still in `_tail_run` or on their way from it to the newest run."""
        self._settled = asyncio.Event()
        self._settled.set()
        self._failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Set with the error of a background part of the loop (it fails the run)."""
        self._rollout_version = 0
        self._rollout_started_s = 0.0
        self.num_migrated = 0
        """Requests moved to another engine by tail packing (`RolloutRun.pack_batch`)."""

    async def settle_rollouts(self) -> None:
        """Return once a single step rolls out (no previous tail, no engine in transit)."""
        while self._tail_run is not None or self._tail_devices:
            self._settled.clear()
            await self._settled.wait()

    def tail_busy(self) -> set[int]:
        """Rollout devices the previous step's tail still holds or that are on their way
        from it to the newest run (pipelined; empty otherwise)."""
        busy = set(self._tail_devices)
        if self._tail_run is not None:
            busy.update(self._tail_run.devices())
        return busy

    def _check_settled(self) -> None:
        if self._tail_run is None and not self._tail_devices:
            self._settled.set()

    def _background(self, coro: Any) -> asyncio.Task[Any]:
        """Run `coro` beside the loop; its error fails the run (`_failed`)."""
        def done(task: asyncio.Task[Any]) -> None:
            if not task.cancelled() and task.exception() is not None \
                    and not self._failed.done():
                self._failed.set_exception(task.exception())  # type: ignore[arg-type]
        task = asyncio.ensure_future(coro)
        task.add_done_callback(done)
        return task

    # ------------------------------------------------------------------ the loop
    async def _rollout_loop(self) -> None:
        """Consumes prompt batches; waits for version max(0, k - s); produces samples[k]."""
        cfg = self.cfg
        ending: asyncio.Task[None] | None = None
        for step in range(self.start_step, cfg.run.steps):
            self._step = step
            fired: list[asyncio.Future[Any]] = []
            version = max(0, step - cfg.run.staleness)
            handle = await self.versions.wait(version)  # the controller sees that step's timing
            # what a device a step-start resize brings to the rollout loads (`current_weights`;
            # the previous step's version may be gone from the store by now)
            self._rollout_version = version
            for move in self.controller.at_step_start(self.view()):
                if move.blocking:  # applied before the step's rollout starts
                    if ending is not None:
                        await ending
                        ending = None
                    await self.resize(move.move, move.num_devices, step)
                else:  # applied when the boundary comes; devices join the running step
                    fired.append(self._resize_soon(move, step))
            if ending is not None and self._resizes_requested:
                await ending  # no pipelining while a resize is pending
                ending = None
            busy = self.tail_busy()
            engines = [d for d in self._rollout_devices() if d.index not in busy]
            await self._load_version(version, handle, engines)
            # a resize may have taken an engine out while the weights loaded
            engines = [d for d in engines if d.index not in self._leaving]
            run, started_s, by_id, rewards = self._start_run(step, version, fired, engines)
            self._adopt_free_engines(run)
            if self._tail_run is not None:
                self._tail_run.hand_off(self._join_newest)
            if self.pipelined and step + 1 < cfg.run.steps:
                await run.drained.wait()
            if ending is not None:
                await ending  # at most two steps roll out at once
                ending = None
            if self.pipelined and step + 1 < cfg.run.steps and not self._resizes_requested:
                self._tail_run = run  # the loop moves on; this step ends in the background
                ending = self._background(self._end_rollout(step, version, run, started_s,
                                                            by_id, rewards, fired))
            else:
                await self._end_rollout(step, version, run, started_s, by_id, rewards, fired)
        if ending is not None:
            await ending
        if not self._failed.done():
            self._failed.set_result(None)

    def _start_run(self, step: int, version: int, fired: list[asyncio.Future[Any]],
                   engines: list[Device]) -> tuple[RolloutRun, float, dict, dict]:
        """Create step `step`'s RolloutRun on `engines` (others join later)."""
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
            self._stream_future(step).set_result(stream)
        holder: list[RolloutRun] = []

        def on_done(done: list[Completion]) -> None:
            for c in done:
                key = (c.spec.prompt, c.spec.sample)
                rewards[key] = self.source.reward(by_id[c.spec.prompt], list(c.tokens))
                if stream is not None and stream.add(c, rewards[key], self.clock.now()):
                    self._stream_changed.set()
            if self.injector is not None:
                self.injector.at_rollout(step, holder[0].num_finished / holder[0].total)
            if not getattr(self.controller, "needs_progress", True) or holder[0] is not self._run:
                return
            for move in self.controller.on_rollout_progress(self.view()):
                fired.append(self._resize_soon(move, step))

        started_s = self._rollout_started_s = self.clock.now()
        run = RolloutRun(self.clock, specs, cfg.rollout.max_running_requests,
                         cfg.rollout.slice_s, on_done, self._on_lost(holder, version),
                         drain=self._may_drain)
        holder.append(run)
        run.version = version
        run.light_batch = cfg.controller.tail_batch
        run.pack_batch = cfg.rollout.pack_batch  # acts once the run hands off
        self._run = run
        if self.pipelined:  # the previous tail's engines join later: keep their share queued
            run.expected_devices = self._num_rollout_devices
        run.add_devices(engines)
        self._rollout_width[step] = len(self.allocation.rollout) if self.pipelined \
            else len(engines)
        return run, started_s, by_id, rewards

    async def _end_rollout(self, step: int, version: int, run: RolloutRun, started_s: float,
                           by_id: dict, rewards: dict, fired: list[asyncio.Future[Any]]) -> None:
        """Wait for the step's last request, hand its samples to the train loop, apply the
        rollout-end moves and wait for every resize the step fired."""
        cfg = self.cfg
        await run.wait()
        if self._tail_run is run:  # its last engines go to the newest step
            for index in run.devices():
                self._join_newest(self.devices[index])
            self._tail_run = None
            self._check_settled()
        if self._run is run:
            self._run = None
        rollout_s = self.clock.now() - started_s
        for device, (a, b) in run.busy_s.items():
            self.rundir.event(a, b, device, "rollout", critical=True, step=step)
        expected = {(p, j) for p in by_id for j in range(cfg.task.samples_per_prompt)}
        fut = self._streams.get(step)
        built = fut.result().samples if fut is not None and fut.done() else None
        got = assemble_step(step, version, expected, run.completions, rewards, rollout_s,
                            cfg.output.record_tokens, built)
        got.rollout_device_s = sum(b - a for a, b in run.busy_s.values())
        got.rollout_tail_device_s = run.tail_device_s()
        if built is not None:
            got.ready_profile = fut.result().ready_profile(started_s, self.clock.now())
        self.num_migrated += run.num_migrated
        self.rundir.samples(got.records)
        self._future(step).set_result(got)
        run.close()
        pending = [f for f in fired if not f.done()]
        if pending:  # the controller decides on the allocation they leave (errors: below)
            await asyncio.wait(pending)
        for move in self.controller.at_rollout_end(self.view()):
            fired.append(self._resize_soon(move, step))
        await asyncio.gather(*fired)
