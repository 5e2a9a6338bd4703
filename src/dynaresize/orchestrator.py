"""The orchestrator: the RL loop over Device objects and a Clock (DESIGN §3).

```
 start devices ─► join training group
        │
        ▼
 rollout_loop  (task 1)                         train_loop  (task 2)
  for step k:                                    for step k:
    wait version v = max(0, k - s) ◄──────┐        wait samples of B_k ◄─────┐
    engines load v                        │        plan micro-batches         │
    RolloutScheduler: B_k × n requests    │        train_step on every rank   │
    rewards, advantages ─► samples[k] ────┼───────►publish_weights(k + 1) ────┘
                                          └──────── versions[k + 1]
```

- The rollout loop consumes prompt batches (seeded, a function of (seed, step)), waits for the
  policy version its step needs (staleness `s`: 0 = on-policy, 1 = one-step-off; fixed, not
  "up to s"), and produces the step's completed, rewarded samples.
- The train loop (`orchestrator_train`) consumes a step's samples once every group is
  complete, or, streaming (`dynaresize.stream`), its micro-batches as their groups complete;
  it unblocks the rollout of step k + 1 + s by publishing version k + 1.
- Resizes (`orchestrator_resize`; forced by `[[resize.schedule]]`, or decided by a controller)
  hold the train lock: a plain training step never sees its group change; a streamed one only
  between micro-batches, and the optimizer step combines them in order whichever device held
  them. A rollout device that leaves mid-step exports its requests, which finish elsewhere.
- Shutdown: on success both loops return after `run.steps`; on failure the first exception
  cancels the other loop, the run directory keeps every record already written, and the
  exception propagates to the caller, which owns (and stops) the devices.

The orchestrator never imports Ray or torch; SimDevice + VirtualClock run it unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dynaresize.allocation import Allocation
from dynaresize.config import Config
from dynaresize.controller import Controller, RunView, StepTiming, make_controller
from dynaresize.orchestrator_resize import ResizeHooks
from dynaresize.orchestrator_rollout import RolloutLoop
from dynaresize.orchestrator_train import TrainLoop
from dynaresize.protocols import Clock, Device, WeightHandle
from dynaresize.resize.executor import ResizeExecutor, ResizeReport
from dynaresize.resize.planner import Op
from dynaresize.rollout.scheduler import RolloutRun
from dynaresize.rundir import RunDir
from dynaresize.samples import StepSamples
from dynaresize.stream import Holdings, StepStream
from dynaresize.timeline import bubble_fraction


class PromptLike(Protocol):
    id: int
    tokens: tuple[int, ...]


class PromptSource(Protocol):
    """A task as the orchestrator sees it: seeded prompt batches and a verifiable reward."""

    def batch(self, step: int, num_prompts: int, seed: int) -> Sequence[PromptLike]: ...

    def reward(self, prompt: Any, response_tokens: list[int]) -> float: ...


class VersionStore:
    """Published policy versions: version → weight handle; waiters block until published."""

    def __init__(self) -> None:
        self._handles: dict[int, WeightHandle] = {0: None}
        self.latest = 0
        self._changed = asyncio.Condition()

    async def publish(self, version: int, handle: WeightHandle) -> None:
        async with self._changed:
            self._handles[version] = handle
            self.latest = max(self.latest, version)
            for old in [v for v in self._handles if v < version - 1]:
                del self._handles[old]
            self._changed.notify_all()

    async def wait(self, version: int) -> WeightHandle:
        async with self._changed:
            await self._changed.wait_for(lambda: version in self._handles)
            return self._handles[version]

    def get(self, version: int) -> WeightHandle:
        return self._handles[version]

    def has(self, version: int) -> bool:
        """Whether `version` is still kept (the two newest are)."""
        return version in self._handles


class Orchestrator(RolloutLoop, TrainLoop, ResizeHooks):
    def __init__(self, cfg: Config, devices: Sequence[Device], clock: Clock,
                 source: PromptSource, rundir: RunDir,
                 on_step: Callable[[dict[str, Any]], None] | None = None,
                 fail_op: Callable[[int, Op], bool] | None = None,
                 controller: Controller | None = None, checkpointer: Any = None,
                 resume_from: tuple[Any, Any] | None = None) -> None:
        if len(devices) != cfg.num_devices:
            raise ValueError(f"config wants {cfg.num_devices} devices, got {len(devices)}")
        self.cfg = cfg
        self.devices = list(devices)
        self.clock = clock
        self.source = source
        self.rundir = rundir
        self.on_step = on_step or (lambda record: None)
        self.allocation = Allocation.initial(cfg.allocation.num_rollout_devices,
                                             cfg.allocation.num_train_devices)
        self.versions = VersionStore()
        self.engine_version = {d.index: 0 for d in self.devices}
        self.executor = ResizeExecutor(self.devices, clock, rundir, self,
                                       cfg.resize.staging_bytes, fail=fail_op)
        self.resizes: list[ResizeReport] = []
        self.skipped_resizes: list[str] = []
        self._run: RolloutRun | None = None
        self._rollout_version = 0
        self.pipelined = False
        """Step k + 1's rollout may start during step k's tail (set by `run`)."""
        self._resizes_requested = 0
        """Resizes asked for and not yet done: no rollout pipelining meanwhile."""
        self._served_version = 0
        self.controller = controller or make_controller(cfg)
        self.history: list[StepTiming] = []
        self._step = 0
        self._num_pending_resizes = 0
        self._serving_early: set[int] = set()
        """train → rollout devices serving before their resize committed."""
        self._leaving: set[int] = set()
        """rollout → train devices stopped by a resize in progress: no new rollout work."""
        self._resize_critical_s: list[float] = []
        self._resize_wall_s: list[float] = []
        self._rollout_started_s = 0.0
        self._train_lock = asyncio.Lock()
        self._optimizer_step = 0
        self._resizes_in_step: dict[int, int] = {}
        self._samples: dict[int, asyncio.Future[StepSamples]] = {}
        self._train_end_s: list[float] = []
        self.t_start_s = 0.0
        self.checkpointer = checkpointer
        """Saves every `run.checkpoint_every` steps and restores (checkpoint.Checkpointer)."""
        self.resume_from = resume_from
        """(checkpoint path, CheckpointState) to continue from, or None."""
        self.start_step = resume_from[1].num_steps if resume_from else 0
        self.recovery: Any = None
        """recovery.Recovery: device deaths (fence, rebuild the world, restore); set by the
        runner of a backend that can lose devices."""
        self.injector: Any = None
        """faults.FaultInjector: `[[faults.kill]]` (kills for real)."""
        self.evaluator: Any = None
        """evaluation.Evaluator: held-out evaluation, called once per step record (issue 18)."""
        self._optimizer_step = self.start_step
        self.streaming = bool(getattr(self.controller, "streams_training", False)
                              and cfg.controller.stream_training and cfg.train.exact_reduction)
        """Training streams over completed groups (`dynaresize.stream`)."""
        self._idle_matters = cfg.run.staleness == 0 and self.streaming
        """`RunView.rollout_idle` is read at staleness 0 with streaming only (O(devices))."""
        self._streams: dict[int, asyncio.Future[StepStream]] = {}
        self._stream_changed = asyncio.Event()
        self._holdings: tuple[Holdings, StepStream] | None = None
        """The streamed step being trained (what `RunView.train_todo` reads), else None."""
        self.resizes_waiting = 0
        """Resizes queued for the train lock: streaming training yields to them."""
        self._rollout_width: dict[int, int] = {}
        """Rollout devices each step's rollout started with (what its bulk ran on)."""

    # ------------------------------------------------------------------ setup
    def _rollout_devices(self) -> list[Device]:
        """The rollout pool, plus devices that serve ahead of their resize's commit, minus
        devices on their way to training (stopped, not yet committed)."""
        indices = sorted((set(self.allocation.rollout) | self._serving_early) - self._leaving)
        return [self.devices[i] for i in indices]

    def _num_rollout_devices(self) -> int:
        """len(self._rollout_devices()) in O(1): devices serving early are training devices,
        devices leaving are rollout devices."""
        return len(self.allocation.rollout) + len(self._serving_early) - len(self._leaving)

    def _train_devices(self) -> list[Device]:
        return [self.devices[i] for i in self.allocation.train]

    train_devices = _train_devices

    @property
    def train_lock(self) -> asyncio.Lock:
        """Held by a training round or step and by a resize: the optimizer-step boundary."""
        return self._train_lock

    def _train_todo(self) -> float:
        if self._holdings is None or not self._holdings[1].num_micro_batches:
            return 0.0
        holdings, stream = self._holdings
        return stream.todo_fraction(holdings.held_by)

    def _stream_future(self, step: int) -> asyncio.Future[StepStream]:
        if step not in self._streams:
            self._streams[step] = asyncio.get_running_loop().create_future()
        return self._streams[step]

    def _future(self, step: int) -> asyncio.Future[StepSamples]:
        if step not in self._samples:
            self._samples[step] = asyncio.get_running_loop().create_future()
        return self._samples[step]

    # ------------------------------------------------------------------ main
    async def run(self) -> dict[str, Any]:
        t0 = self.clock.now()
        await asyncio.gather(*(d.start() for d in self.devices))
        members = self.allocation.train
        await asyncio.gather(*(d.join_train_group(members, 0) for d in self.devices))
        self.t_start_s = self.clock.now()
        for d in self.devices:
            self.rundir.event(t0, self.t_start_s, d.index, "start", critical=True)
        if self.resume_from is not None:
            train_path = await self.checkpointer.restore(self, *self.resume_from)
            if self.recovery is not None:
                self.recovery.checkpointed(self.start_step, train_path)
        self._init_rollout_loop()
        tasks = [asyncio.ensure_future(self._rollout_loop()),
                 asyncio.ensure_future(self._train_loop()), self._failed]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return await self._finish()

    def view(self) -> RunView:
        """What controllers decide from (its lists are the orchestrator's: read-only)."""
        run = self._run
        return RunView(step=self._step, now_s=self.clock.now(), allocation=self.allocation,
                       staleness=self.cfg.run.staleness,
                       rollout_total=run.total if run else 0,
                       rollout_finished=run.num_finished if run else 0,
                       rollout_started_s=self._rollout_started_s,
                       history=self.history, resize_critical_s=self._resize_critical_s,
                       resize_wall_s=self._resize_wall_s,
                       num_pending_resizes=self._num_pending_resizes,
                       train_busy=self._train_lock.locked(),
                       train_todo=self._train_todo(), pipelined=self.pipelined,
                       rollout_idle=len(run.idle_devices()) if run and self._idle_matters
                       else 0)

    # ------------------------------------------------------------------ end
    async def _finish(self) -> dict[str, Any]:
        if self.checkpointer is not None:
            await self.checkpointer.drain()
        trainers = self._train_devices()
        sums = await asyncio.gather(*(d.param_checksum() for d in trainers))
        param_sum, param_sha = sums[0]
        end_s = self._train_end_s[-1] if self._train_end_s else self.clock.now()
        wall_s = end_s - self.t_start_s
        metrics = self.rundir.metrics
        total_tokens = sum(m["tokens"] for m in metrics)
        num_samples = len(metrics) * self.cfg.global_batch_size
        num_resizes = sum(r.ok for r in self.resizes)
        summary = {
            "wall_s": round(wall_s, 4), "steps": len(metrics),
            "samples_per_s": round(num_samples / wall_s, 4) if wall_s > 0 else 0.0,
            "tokens_per_s": round(total_tokens / wall_s, 4) if wall_s > 0 else 0.0,
            "bubble_fraction": round(bubble_fraction(self.rundir.events, self.t_start_s, end_s,
                                                     len(self.devices)), 4),
            "num_resizes": num_resizes,
            "num_failed_resizes": len(self.resizes) - num_resizes,
            "num_skipped_resizes": len(self.skipped_resizes),
            "final_reward": metrics[-1]["reward_mean"] if metrics else 0.0,
            "param_sum": param_sum, "param_sha256": param_sha,
        }
        self.rundir.summary(summary)
        return summary
