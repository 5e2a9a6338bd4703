"""The orchestrator's side of resizing (a mixin of `Orchestrator`; see `resize.executor`).

`resize(move, n, step)` waits for the optimizer-step boundary (the train lock; streaming
training yields it between micro-batches), plans the move, runs it through the executor and,
if it committed, installs the new allocation. `_resize_soon` starts one in the background.
The executor calls back into `stop_admission`, `requeue`, `start_serving` and
`current_weights` to take rollout devices out of, and put them into, the running rollout.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from dynaresize.resize.executor import ResizeReport
from dynaresize.resize.planner import plan_resize, target_allocation

if TYPE_CHECKING:
    from dynaresize.controller import Move
    from dynaresize.protocols import Device, WeightHandle


class ResizeHooks:
    """Mixin: needs the `Orchestrator` state (allocation, executor, the train lock, the
    running rollout, versions, recovery)."""

    def _resize_soon(self, move: Move, step: int) -> asyncio.Future[Any]:
        """Start a controller's move in the background (it waits for the next optimizer-step
        boundary)."""
        self._num_pending_resizes += 1

        async def go() -> None:
            try:
                await self.resize(move.move, move.num_devices, step, move.idle_first)
            finally:
                self._num_pending_resizes -= 1

        return asyncio.ensure_future(go())

    async def resize(self, move: str, num_devices: int, step: int,
                     idle_first: bool = False) -> ResizeReport | None:
        """Move `num_devices` devices (`move`: 'rollout->train' | 'train->rollout') at the next
        optimizer-step boundary; on failure the old allocation stays and the run goes on.
        `idle_first`: rollout devices with no request left go first (`Move.idle_first`).
        Returns None (and counts it as skipped) if the move would now empty a pool, e.g.
        because an earlier forced resize was rolled back."""
        self._resizes_requested += 1
        try:
            await self.settle_rollouts()  # one step rolls out: the hooks act on its run
            self.resizes_waiting += 1
            self._stream_changed.set()  # streaming training yields the boundary
            try:
                await self._train_lock.acquire()
            finally:
                self.resizes_waiting -= 1
        except BaseException:
            self._resizes_requested -= 1
            raise
        try:
            try:
                idle = tuple(self._run.idle_devices()) if idle_first and self._run else ()
                target = target_allocation(self.allocation, move, num_devices, idle)
            except ValueError as exc:
                self.skipped_resizes.append(f"step {step}: {exc}")
                return None
            plan = plan_resize(self.allocation, target)
            try:
                if self.recovery is not None:
                    await self.recovery.repair()
                t_resize = self.clock.now()
                report = await self.executor.execute(plan, self._optimizer_step)
                t_resize = self.clock.now() - t_resize
            except Exception as exc:  # the rollback itself met a dead device
                self._serving_early -= set(plan.to_rollout)
                if self.recovery is None or not self.recovery.find_dead(f"died in resize "
                                                                        f"at step {step}"):
                    raise
                report = ResizeReport(self.executor.num_resizes - 1, False, 0.0, 0.0, 0.0,
                                      error=f"{type(exc).__name__}: {exc}"[:300])
            if self.recovery is not None and self.recovery.find_dead(f"resize at step {step}"):
                await self.recovery.repair()
            self._serving_early -= set(plan.to_rollout)
            self._leaving -= set(plan.to_train)
            if report.ok:
                self.allocation = plan.target
                self._resize_critical_s.append(report.critical_path_s)
                self._resize_wall_s.append(t_resize)
                self._resizes_in_step[step] = self._resizes_in_step.get(step, 0) + 1
            self.resizes.append(report)
            return report
        finally:
            self._resizes_requested -= 1
            self._train_lock.release()

    async def stop_admission(self, device: Device) -> None:
        self._leaving.add(device.index)
        if self._run is not None:
            await self._run.stop_admission(device)

    def requeue(self, device: Device, exported: list[Any]) -> None:
        if self._run is not None:
            self._run.requeue(device, exported)
        else:
            assert not exported, "requests in flight outside a rollout step"

    def start_serving(self, device: Device) -> None:
        """A device the resize loaded with `current_weights` joins the running rollout. If the
        rollout loop moved on to a step that needs another version meanwhile (pipelined
        rollouts: the next step's run may start while a resize loads weights), the device
        first loads that version (`_join_newest`), as an engine leaving a tail does."""
        self._leaving.discard(device.index)
        self.engine_version[device.index] = self._served_version
        if device.index not in self.allocation.rollout:
            self._serving_early.add(device.index)
        run = self._run
        if run is None:
            return
        if self._served_version == run.version:
            run.add_devices([device])
        else:
            self._join_newest(device)

    def current_weights(self) -> tuple[int, WeightHandle]:
        """The version a device joining the rollout loads: the running step's; between runs
        the step the rollout loop is at, or, if training ran ahead and the store dropped that
        one meanwhile, the newest (the next step's run loads its own on stale engines)."""
        run = self._run
        if run is not None:  # every run the loop holds carries its version (`_start_run`)
            version = run.version
        else:
            version = min(self._rollout_version, self.versions.latest)
            if not self.versions.has(version):
                version = self.versions.latest
        self._served_version = version
        return version, self.versions.get(version)
