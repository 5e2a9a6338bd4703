"""The orchestrator: the RL loop over Device objects and a Clock (design §3).

```
 start devices ─► join training group ─► (resume: restore the checkpoint)
        │
        ▼
 RolloutLoop  (task 1)                          TrainLoop  (task 2)
  for step k:                                    for step k:
    wait version v = max(0, k - s) ◄──────┐        wait samples of B_k ◄─────┐
    controller moves ─► Resizer           │        [streaming: micro-batches │
    EnginePool loads v                    │         as groups complete]      │
    RolloutRun: B_k × n requests          │        OptimizerBoundary (lock): │
    rewards, advantages ─► StepBoard ─────┼───────► train_step on every rank │
                                          │         publish_weights(k + 1) ──┘
                                          └──────── RunState.versions[k + 1]
 Resizer: waits for the OptimizerBoundary, runs ResizeExecutor (hooks: ResizeHooks)
 Recovery / Checkpointer: at the boundary (null objects when off)
```

- **RolloutLoop** (`rollout_loop`) consumes prompt batches (seeded, a function of (seed,
  step)); waits for the policy version its step needs (staleness `s`: 0 = on-policy, 1 =
  one-step-off; fixed, not "up to s"); is unblocked by the train loop publishing version
  k - s. It posts the step's completed, rewarded samples on the `StepBoard` (streaming: its
  micro-batches as their groups complete).
- **TrainLoop** (`train_loop`) consumes a step's samples from the board once every group is
  complete, or, streaming (`dynaresize.core.stream`), its micro-batches as their groups complete;
  waits for the train lock (`OptimizerBoundary`), which a resize may hold; is unblocked by the
  rollout loop posting samples and by a resize releasing the lock. Publishing version k + 1
  unblocks the rollout of step k + 1 + s.
- **Resizer** (`resizer`; moves forced by `[[resize.schedule]]` or decided by a controller
  over a `RunView`) consumes moves; waits until one step rolls out (`EnginePool.settle`)
  and for the optimizer-step boundary; is unblocked by the train loop releasing the lock
  between steps (a streamed step yields it between micro-batches, and the optimizer step
  combines them in order whichever device held them). A rollout device that leaves mid-step
  exports its requests, which finish elsewhere.
- Shutdown: on success both loops return after `run.steps`; on failure (in a loop or in a
  background task, `Background`) the first exception cancels the other loop, the run
  directory keeps every record already written, and the exception propagates to the caller,
  which owns (and stops) the devices.

Components get their collaborators here, never the orchestrator; each piece of run state has
one writer (`RunState` names them). The orchestrator never imports Ray or torch; SimDevice +
VirtualClock run it unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dynaresize.config import Config
from dynaresize.control.base import Controller
from dynaresize.control.registry import make_controller
from dynaresize.core.allocation import Allocation
from dynaresize.core.dynamic_sampling import resumed_filter_rates
from dynaresize.core.rundir import RunDir
from dynaresize.envs.setup import build_env
from dynaresize.evaluation.evaluator import Evaluator
from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.board import StepBoard
from dynaresize.orchestrator.boundary import OptimizerBoundary
from dynaresize.orchestrator.checkpoint import Checkpointer, CheckpointTarget, NullCheckpointer
from dynaresize.orchestrator.checkpoint_files import CheckpointState
from dynaresize.orchestrator.engine_hooks import ResizeHooks
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.engine_rescue import EngineRescue
from dynaresize.orchestrator.engine_transit import EngineTransit
from dynaresize.orchestrator.engine_versions import EngineVersions
from dynaresize.orchestrator.fault_injection import FaultInjector
from dynaresize.orchestrator.loop_parts import LoopParts, TrainSettings
from dynaresize.orchestrator.plain_step import PlainStep
from dynaresize.orchestrator.recovery import DeviceFaults, NullRecovery, Recovery
from dynaresize.orchestrator.resizer import Resizer
from dynaresize.orchestrator.rollout_loop import RolloutLoop
from dynaresize.orchestrator.source import PromptSource
from dynaresize.orchestrator.state import RunState
from dynaresize.orchestrator.step_rollout import RolloutSettings
from dynaresize.orchestrator.streaming import StreamTrainer
from dynaresize.orchestrator.summary import run_summary
from dynaresize.orchestrator.switch import NoSwitch, RoleSwitch
from dynaresize.orchestrator.train_loop import TrainLoop
from dynaresize.orchestrator.view import RunViews
from dynaresize.protocols import Clock, Device
from dynaresize.resize.executor import ResizeExecutor
from dynaresize.resize.planner import Op


class Orchestrator:
    """Wires the components for one run and runs the two loops (module docstring).

    `faults`: a backend that can lose devices (`is_alive`, `new_store`) turns recovery on;
    `checkpoints`: where and how often to checkpoint; `resume_from`: (checkpoint path,
    CheckpointState) to continue from; `injector`: `[[faults.kill]]` (kills for real);
    `fail_op(resize_index, op)`: failure injection into resizes (tests); `allocation` and
    `switch`: colocated runs (every device in both pools, role switches between the loops;
    default: the config's split, `NoSwitch`)."""

    def __init__(self, cfg: Config, devices: Sequence[Device], clock: Clock,
                 source: PromptSource, rundir: RunDir,
                 on_step: Callable[[dict[str, Any]], None] | None = None,
                 fail_op: Callable[[int, Op], bool] | None = None,
                 controller: Controller | None = None,
                 checkpoints: CheckpointTarget | None = None,
                 resume_from: tuple[Path, CheckpointState] | None = None,
                 faults: DeviceFaults | None = None, injector: FaultInjector | None = None,
                 allocation: Allocation | None = None, switch: RoleSwitch | None = None,
                 evaluator: Evaluator | None = None) -> None:
        if len(devices) != cfg.num_devices:
            raise ValueError(f"config wants {cfg.num_devices} devices, got {len(devices)}")
        self.cfg, self.clock, self.rundir = cfg, clock, rundir
        self.resume_from = resume_from
        self.state = state = RunState(
            devices, allocation or Allocation.initial(cfg.allocation.num_rollout_devices,
                                                      cfg.allocation.num_train_devices),
            resume_from[1].num_steps if resume_from else 0, cfg.run.staleness,
            resumed_filter_rates(rundir.resumed_samples, resume_from[1].filter_rates)
            if resume_from and cfg.train.dynamic_sampling.enabled else None)
        switch = switch or NoSwitch()
        self.versions = state.versions
        self.board = board = StepBoard()
        self.boundary = boundary = OptimizerBoundary(board.changed)
        self.background = Background()
        engine_versions = EngineVersions((d.index for d in state.devices), clock, rundir)
        transit = EngineTransit()
        self.engines = engines = EnginePool(state, clock, self.background, engine_versions,
                                            transit)
        rescue = EngineRescue(engines, transit, state, engine_versions, clock, self.background)
        self.hooks = hooks = ResizeHooks(engines, transit, state, engine_versions, rescue)
        self.executor = ResizeExecutor(state.devices, clock, rundir, hooks,
                                       cfg.resize.staging_bytes, fail=fail_op)
        stepper = PlainStep(cfg.train.micro_batch_size, clock, injector,
                            cfg.train.max_tokens_per_micro_batch)
        self.recovery: Recovery | NullRecovery = NullRecovery() if faults is None else \
            Recovery(faults, state, engines, hooks, lambda index: self.resizer.fence(index),
                     stepper, clock, rundir,
                     reassign=lambda index, role: self.resizer.reassign(index, role),
                     repair_soon=lambda: self.resizer.repair_soon())
        if isinstance(self.recovery, Recovery):  # an engine dying as it loads weights
            engine_versions.on_lost(self.recovery.on_rollout_lost)
        self.checkpointer: Checkpointer | NullCheckpointer = NullCheckpointer() \
            if checkpoints is None else Checkpointer(checkpoints, cfg, state, clock, rundir)
        controller = controller or make_controller(cfg)
        self.streaming = bool(controller.streams_training and not cfg.env.name
                              and cfg.controller.stream_training and cfg.train.exact_reduction
                              and not (cfg.train.dynamic_sampling.enabled
                                       and not cfg.train.max_tokens_per_micro_batch))
        """Training streams over completed groups (`dynaresize.core.stream`; not episodes)."""
        self.pipelined = bool(self.streaming and cfg.run.staleness >= 1
                              and cfg.controller.pipeline_rollouts and injector is None)
        """Step k + 1's rollout starts on the engines step k's tail has emptied."""
        self.resizer = Resizer(state, boundary, engines, hooks, self.executor, self.recovery,
                               clock, self.background,
                               deep=self.pipelined and cfg.run.staleness >= 2)
        self.views = RunViews(state, engines, self.resizer, boundary, board, clock,
                              cfg.run.staleness, self.pipelined,
                              cfg.run.staleness == 0 and self.streaming)
        parts = LoopParts(state, board, self.resizer, self.recovery, clock, rundir, switch)
        self.rollout = RolloutLoop(
            RolloutSettings.from_config(
                cfg, self.streaming, self.pipelined,
                build_env(cfg.env, source, clock) if cfg.env.name else None), parts,
            engines=engines, rescue=rescue, controller=controller, view=self.views, source=source,
            background=self.background, injector=injector)
        self.train = TrainLoop(
            TrainSettings(cfg.run.steps, self.streaming), parts, boundary=boundary,
            stepper=stepper, streamer=StreamTrainer(clock, rundir, boundary, state,
                                                    board.changed, injector),
            checkpointer=self.checkpointer, on_step=on_step or (lambda record: None),
            evaluator=evaluator)

    async def run(self) -> dict[str, Any]:
        state, clock = self.state, self.clock
        t0 = clock.now()
        await asyncio.gather(*(d.start() for d in state.devices))
        members = state.allocation.train
        await asyncio.gather(*(d.join_train_group(members, 0) for d in state.devices))
        state.started(clock.now())
        for d in state.devices:
            self.rundir.event(t0, state.t_start_s, d.index, "start", critical=True)
        if self.resume_from is not None:
            train_path, published = await self.checkpointer.restore(*self.resume_from)
            await self.train.publish_restored(published)
            self.recovery.checkpointed(state.start_step, train_path)
        failed = self.background.start()
        tasks = [asyncio.ensure_future(self.rollout.run()),
                 asyncio.ensure_future(self.train.run()), failed]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # a checkpoint whose shards are saved still gets its state.json and `latest`, so
            # `--resume` starts from it (its own write error, if any, is not the run's)
            await asyncio.gather(self.checkpointer.drain(), return_exceptions=True)
            raise
        await self.checkpointer.drain()
        return await run_summary(state, self.resizer, clock, self.rundir,
                                 self.cfg.global_batch_size,
                                 self.rollout.episode_totals.summary())
