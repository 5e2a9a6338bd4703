"""The resizer: applies moves at the optimizer-step boundary (see `resize.executor`).

`resize(move, n, step)` waits until one step rolls out (`EnginePool.settle`) and for the
boundary (the train lock; streaming training yields it between micro-batches), plans the
move, runs it through the executor (whose hooks are `ResizeHooks`) and, if it committed,
installs the new allocation. `resize_soon` starts one in the background. The resizer is the
only writer of the resize ledger (reports, skipped moves, measured times, pending counts).

`deep` (pipelined rollouts at staleness >= 2): a resize does not drain the pipeline first.
It takes the boundary, and a rollout -> train move takes devices the pool can stop where they
are (`ResizeHooks.movable_to_train`: free, or in a run that keeps another engine; the hooks
requeue each device's requests in the run that held it). Only if there are not enough does
it wait, as at staleness 0 and 1, until one step rolls out (`num_settling`: the rollout loop
then stops pipelining).
"""

from __future__ import annotations

import asyncio
from typing import Any

from dynaresize.control.base import Move
from dynaresize.core.allocation import Allocation
from dynaresize.core.types import Role
from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.boundary import OptimizerBoundary
from dynaresize.orchestrator.engine_hooks import ResizeHooks
from dynaresize.orchestrator.engine_pool import EnginePool
from dynaresize.orchestrator.recovery import NullRecovery, Recovery
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock
from dynaresize.resize.executor import CommittedResizeError, ResizeExecutor, ResizeReport
from dynaresize.resize.planner import plan_resize, target_allocation


class Resizer:
    def __init__(self, state: RunState, boundary: OptimizerBoundary, engines: EnginePool,
                 hooks: ResizeHooks, executor: ResizeExecutor,
                 recovery: Recovery | NullRecovery, clock: Clock, background: Background,
                 deep: bool = False) -> None:
        self.state = state
        self.background = background
        """Where moves started by the controller run (their error fails the run)."""
        self.deep = deep
        """Staleness >= 2, pipelined: resizes stop devices where they are (module doc)."""
        self.boundary = boundary
        self.engines = engines
        self.hooks = hooks
        """The rollout devices a resize takes or brings (`ResizeHooks`)."""
        self.executor = executor
        self.recovery = recovery
        self.clock = clock
        self.reports: list[ResizeReport] = []
        self.skipped: list[str] = []
        self.critical_s: list[float] = []
        """Measured critical-path time of each committed resize (`RunView`)."""
        self.wall_s: list[float] = []
        """Measured wall time of each committed resize (`RunView`)."""
        self.num_in_step: dict[int, int] = {}
        """Committed resizes per step (the step's metric record)."""
        self.num_pending = 0
        """Controller moves started in the background and not yet done."""
        self.num_requested = 0
        """Resizes asked for and not yet done: no rollout pipelining meanwhile (`deep`: see
        `num_settling`)."""
        self.num_settling = 0
        """`deep`: resizes that wait until one step rolls out: no pipelining meanwhile."""

    def fence(self, index: int) -> None:
        """Device `index` died: no pool and no resize op uses it again (recovery asks)."""
        self.executor.mark_lost(index)
        self.state.fence(index)

    async def reassign(self, index: int, role: Role) -> None:
        """Recovery, at the boundary: device deaths emptied the pool of `role`, live device
        `index` of the other pool moves to it. Into training: it stops serving, its requests
        go back to the queue and its engine is released (recovery's world rebuild makes it a
        trainer and restores the state). Into the rollout: only the allocation changes (the
        rebuild drops its trainer, `ResizeHooks.serve_idle` makes it serve)."""
        device = self.state.devices[index]
        if role is Role.TRAIN:
            await self.hooks.stop_admission(device)
            self.hooks.requeue(device, await device.export_inflight())
            await device.release_kv()
            await device.release_rollout_weights()
            self.hooks.forget_moved((), (index,))
        self.hooks.engine_gone(index)  # into the rollout: a trainer has no engine yet
        self.state.commit_allocation(self.state.allocation.with_roles({index: role}))

    def repair_soon(self) -> None:
        """Recovery: a death emptied the rollout pool, so no step reaches the boundary where
        repairs run (the train loop waits for that rollout). Repair at the boundary now, in
        the background (its error fails the run)."""
        async def go() -> None:
            await self.boundary.acquire_for_resize()
            try:
                await self.recovery.repair()
            finally:
                self.boundary.release()

        self.background.spawn(go())

    def resize_soon(self, move: Move, step: int) -> asyncio.Future[Any]:
        """Start a controller's move in the background (it waits for the next optimizer-step
        boundary)."""
        self.num_pending += 1

        async def go() -> None:
            try:
                await self.resize(move.move, move.num_devices, step, move.idle_first)
            finally:
                self.num_pending -= 1

        return asyncio.ensure_future(go())

    async def resize(self, move: str, num_devices: int, step: int,
                     idle_first: bool = False) -> ResizeReport | None:
        """Move `num_devices` devices (`move`: 'rollout->train' | 'train->rollout') at the next
        optimizer-step boundary; on failure the old allocation stays and the run goes on.
        `idle_first`: rollout devices with no request left go first (`Move.idle_first`).
        Returns None (and counts it as skipped) if the move would now empty a pool, e.g.
        because an earlier forced resize was rolled back."""
        self.num_requested += 1
        prefer: tuple[int, ...] | None = None
        try:
            if self.deep:
                prefer = await self._acquire_in_place(move, num_devices)
            if prefer is None:
                await self._settle()  # one step rolls out: the hooks act on its run
                await self.boundary.acquire_for_resize()
        except BaseException:
            self.num_requested -= 1
            raise
        try:
            return await self._resize_at_boundary(move, num_devices, step, idle_first, prefer)
        finally:
            self.num_requested -= 1
            self.boundary.release()

    @property
    def blocks_pipelining(self) -> bool:
        """Whether the rollout loop must stop pipelining: a resize waits until one step
        rolls out (every requested one, unless `deep`)."""
        return bool(self.num_settling if self.deep else self.num_requested)

    async def _settle(self) -> None:
        self.num_settling += 1
        try:
            await self.engines.settle()
        finally:
            self.num_settling -= 1

    async def _acquire_in_place(self, move: str, num_devices: int) -> tuple[int, ...] | None:
        """`deep`: take the boundary and return the devices to prefer (none for train ->
        rollout), or release it and return None if the pool cannot give `num_devices`
        where they are."""
        await self.boundary.acquire_for_resize()
        if move != "rollout->train":
            return ()
        prefer = self.hooks.movable_to_train(num_devices)
        if prefer is None:
            self.boundary.release()
        return prefer

    def _install(self, target: Allocation) -> None:
        """The resize's target allocation, minus the devices that died meanwhile (fenced)."""
        lost = self.executor.lost
        self.state.commit_allocation(
            target.with_roles({i: Role.IDLE for i in lost}) if lost else target)

    async def _resize_at_boundary(self, move: str, num_devices: int, step: int,
                                  idle_first: bool, prefer: tuple[int, ...] | None = None
                                  ) -> ResizeReport | None:
        state, recovery = self.state, self.recovery
        # first: the plan must not name a device that died before it (it would reshard from
        # a dead trainer); devices picked in place may have died meanwhile: pick again
        if await recovery.repair() and prefer:
            prefer = self.hooks.movable_to_train(num_devices)
            if prefer is None:
                self.skipped.append(f"step {step}: after device deaths the rollout cannot "
                                    f"give {num_devices} devices where they are")
                return None
        run = self.engines.run
        try:
            idle = tuple(run.idle_devices()) if idle_first and run else ()
            if prefer:  # `deep`: devices stopped where they are
                idle = tuple(d for d in idle if d in prefer) + tuple(
                    d for d in prefer if d not in idle)
            target = target_allocation(state.allocation, move, num_devices, idle)
        except ValueError as exc:
            self.skipped.append(f"step {step}: {exc}")
            return None
        plan = plan_resize(state.allocation, target)
        if prefer:  # no engine of their runs leaves meanwhile counting on them
            self.hooks.mark_leaving(plan.to_train)
        t_resize, installed = self.clock.now(), False
        try:
            report = await self.executor.execute(plan, state.optimizer_step)
            t_resize = self.clock.now() - t_resize
        except CommittedResizeError as exc:  # a death after the commit: the new group holds
            self._install(plan.target)  # the training state; the dead are fenced below
            if not recovery.find_dead(f"died in resize at step {step}"):
                raise
            report, t_resize = exc.report, self.clock.now() - t_resize
            installed = True
        except Exception as exc:  # the rollback itself met a dead device
            self.hooks.forget_moved(plan.to_rollout)
            if not recovery.find_dead(f"died in resize at step {step}"):
                raise
            report = ResizeReport(self.executor.num_resizes - 1, False, 0.0, 0.0, 0.0,
                                  error=f"{type(exc).__name__}: {exc}"[:300])
        if report.ok and not installed:  # before a repair: it rebuilds the new group
            self._install(plan.target)
        if recovery.find_dead(f"resize at step {step}"):
            await recovery.repair()
        self.hooks.forget_moved(plan.to_rollout, plan.to_train)
        if report.ok:
            self.critical_s.append(report.critical_path_s)
            self.wall_s.append(t_resize)
            self.num_in_step[step] = self.num_in_step.get(step, 0) + 1
        self.reports.append(report)
        return report
