"""Rollout engines between runs (a mixin of the orchestrator's rollout loop, see
`dynaresize.orchestrator_rollout`): loading a step's version on engines, an engine leaving
the previous step's tail for the newest run (`_join_newest`), free rollout devices joining a
new run (`_adopt_free_engines`), and rescuing the previous step's requests when its last
engine dies. Invariant: an engine joins a run only once it serves that run's version, and
every rollout device not in transit is in the running step's run.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from dynaresize.rollout.scheduler import RolloutRun

if TYPE_CHECKING:
    from dynaresize.protocols import Device, WeightHandle


class EngineMoves:
    """Mixin: needs the `Orchestrator` state (devices, allocation, versions, engine versions,
    the running and tail runs, devices in transit and leaving, recovery, rundir, clock) and
    the rollout loop's `tail_busy`, `_background` and `_check_settled`."""

    def _on_lost(self, holder: list[RolloutRun], version: int) -> Any:
        """RolloutRun's `on_device_lost`: recovery decides; if the device was the previous
        step's last engine and work is left there, an engine of the newest step takes over."""
        if self.recovery is None:
            return None

        def lost(device: Device, exc: BaseException) -> bool:
            if not self.recovery.on_rollout_lost(device, exc):
                return False
            run = holder[0]
            if run is self._tail_run and run.remaining and not run.devices():
                self._tail_devices.add(-1 - device.index)  # no resize until it is rescued
                self._background(self._rescue_tail(run, version, -1 - device.index))
            return True
        return lost

    async def _rescue_tail(self, tail: RolloutRun, version: int, token: int) -> None:
        """The previous step lost its last engine with requests left: the newest step's
        highest-index engine leaves it (its requests migrate to the others), loads the
        previous version and finishes the previous step's requests there."""
        try:
            newest = self._run
            donors = newest.devices() if newest is not None else []
            if not donors:
                raise RuntimeError(f"step {self._step - 1}'s last rollout engine died and no "
                                   "engine is left to finish its requests")
            device = self.devices[donors[-1]]
            await newest.stop_admission(device)
            newest.requeue(device, await device.export_inflight())
            await self._load_version(version, self.versions.get(version), [device])
            tail.add_devices([device])
        finally:
            self._tail_devices.discard(token)
            self._check_settled()

    def _adopt_free_engines(self, run: RolloutRun) -> None:
        """Rollout devices in no run and not on their way to one join `run` (after loading its
        version): those freed while its weights loaded, e.g. the previous step's last tail
        engines when that run ended just before this one existed, or a device a resize
        brought while no step rolled out."""
        busy = self.tail_busy() | set(run.devices())
        for device in self._rollout_devices():
            if device.index not in busy:
                self._join_newest(device)

    def _join_newest(self, device: Device) -> None:
        """`RolloutRun.hand_off`'s callback: `device` left the previous step's tail."""
        self._tail_devices.add(device.index)
        self._background(self._move_to_newest(device))

    async def _move_to_newest(self, device: Device) -> None:
        """Load the newest step's version on `device` and add it to that step's run (if
        that run ended meanwhile, the device waits, free, for the next one; if a resize took
        it out meanwhile, it stays out)."""
        try:
            while True:
                run = self._run
                if run is None or run.finished.is_set() or device.index in self._leaving:
                    return
                if self.engine_version[device.index] != run.version:
                    await self._load_version(run.version, self.versions.get(run.version),
                                             [device])
                if self._run is run and not run.finished.is_set() \
                        and device.index not in self._leaving:
                    run.add_devices([device])
                    return
        finally:
            self._tail_devices.discard(device.index)
            self._check_settled()

    def _may_drain(self) -> bool:
        """Whether rollout devices may run until empty without reporting each completion:
        nobody watches progress (controller, fault injector, streaming training) and no resize
        is pending."""
        return (not getattr(self.controller, "needs_progress", True) and self.injector is None
                and self._num_pending_resizes == 0 and not self.streaming)

    async def _load_version(self, version: int, handle: WeightHandle,
                            engines: list[Device]) -> None:
        stale = [d for d in engines if self.engine_version[d.index] != version]
        if not stale:
            return
        t0 = self.clock.now()
        if len(stale) == 1:  # an engine joining from the previous tail (the common case)
            await stale[0].load_weights(version, handle)
        else:
            await asyncio.gather(*(d.load_weights(version, handle) for d in stale))
        t1 = self.clock.now()
        for d in stale:
            self.engine_version[d.index] = version
            self.rundir.event(t0, t1, d.index, "load_weights", critical=True, version=version)
