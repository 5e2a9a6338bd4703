"""The engine pool's side of device deaths, the part of `EnginePool` (a mixin) that recovery
and the runs call: a dead engine leaves every run (`drop_lost`), a tail that lost its last
engine borrows one of the newest run's (`rescue_tail`), and rollout devices in no run serve
again after a repair (`serve_idle`). An engine on its way by one of these paths is in no run
but not free (`EngineTransit.borrowing`, in `tail_busy`), so no other path takes it meanwhile. The
attributes below are `EnginePool`'s, set by its constructor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynaresize.orchestrator.background import Background
from dynaresize.orchestrator.engine_transit import EngineTransit
from dynaresize.orchestrator.engine_versions import EngineVersions
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock, Device, WeightHandle
from dynaresize.rollout.run import RolloutRun

RESCUE_POLL_S = 0.05
"""How often a tail that lost its last engine looks for one in the newest run."""
RESCUE_WAIT_S = 600.0
"""How long it waits for recovery to bring one (then the run fails, naming the step)."""


class EngineRescue:
    """`EnginePool`'s part in recovery (see the module docstring)."""

    state: RunState
    clock: Clock
    background: Background
    versions: EngineVersions
    transit: EngineTransit
    run: RolloutRun | None
    tails: list[RolloutRun]

    def rollout_devices(self) -> list[Device]:  # EnginePool's
        raise NotImplementedError

    def engaged(self) -> set[int]:  # EnginePool's
        raise NotImplementedError

    def serves_rollout(self, index: int) -> bool:  # EnginePool's
        raise NotImplementedError

    def is_tail(self, run: RolloutRun | None) -> bool:  # EnginePool's
        raise NotImplementedError

    def join_newest(self, device: Device) -> None:  # EnginePool's
        raise NotImplementedError

    def check_settled(self) -> None:  # EnginePool's
        raise NotImplementedError

    async def load_version(self, version: int, handle: WeightHandle,
                           engines: list[Device]) -> None:  # EnginePool's
        raise NotImplementedError

    if TYPE_CHECKING:  # ResizeHooks' (a stub here would come first in EnginePool's MRO)
        def current_weights(self) -> tuple[int, WeightHandle]: ...

        def _serve(self, device: Device, version: int) -> None: ...

    def rescue_tail(self, tail: RolloutRun, version: int, lost_index: int) -> None:
        """The previous step lost its last engine (`lost_index`) with requests left."""
        token = self.transit.start_rescue(lost_index)  # no resize until it is rescued
        self.background.spawn(self._rescue_tail(tail, version, token))

    async def _rescue_tail(self, tail: RolloutRun, version: int, token: int) -> None:
        """The newest step's highest-index engine leaves it (its requests migrate to the
        others), loads the previous version and finishes the previous step's requests. A
        donor that dies meanwhile is recovery's (its requests rerun); the next one goes."""
        try:
            for _ in range(len(self.state.devices)):
                got = await self._donor(tail)
                if got is None:  # an engine another tail freed finished it meanwhile
                    return
                newest, device = got
                with self.transit.borrowing(device.index):
                    if await self._borrow(newest, device, version):
                        self._deliver(device, tail)
                        return
            raise RuntimeError(f"the rollout of version {version} lost its last engine and "
                               "every engine that came to finish its requests died")
        finally:
            self.transit.end_rescue(token)
            self.check_settled()

    async def _donor(self, tail: RolloutRun) -> tuple[RolloutRun, Device] | None:
        """The newest run's highest-index engine, once it has one (if every rollout engine
        died, recovery refills the pool: a trainer reassigned, `repair_soon`, and the newest
        run gets it); None once `tail` finished without."""
        waited_s = 0.0
        while not tail.finished.is_set():
            newest = self.run
            donors = [i for i in newest.devices() if i not in self.transit.leaving] \
                if newest is not None else []
            if newest is not None and donors:
                return newest, self.state.devices[donors[-1]]
            if waited_s >= RESCUE_WAIT_S:
                raise RuntimeError(f"step {self.state.step - 1}'s last rollout engine died "
                                   f"and no engine came to finish its requests in "
                                   f"{RESCUE_WAIT_S:.0f} s")
            await self.clock.sleep(RESCUE_POLL_S)
            waited_s += RESCUE_POLL_S
        return None

    async def _borrow(self, newest: RolloutRun, device: Device, version: int) -> bool:
        """`device` leaves `newest` (its requests go back there) and loads `version`; False
        if it died meanwhile (fenced by recovery, its requests rerun)."""
        try:
            await newest.stop_admission(device)
            newest.requeue(device, await device.export_inflight())
        except Exception as exc:
            if not self.versions.lost(device, exc):
                raise
            return False
        await self.load_version(version, self.state.versions.get(version), [device])
        return self.versions.of(device.index) == version

    def _deliver(self, device: Device, tail: RolloutRun) -> None:
        """A rescue's donor, loaded with `tail`'s version, joins it; if the tail ended
        meanwhile (its requests done elsewhere), the newest step's run, like any engine a
        tail frees (`join_newest`)."""
        if tail.finished.is_set() or not self.is_tail(tail):
            self.join_newest(device)
        else:
            tail.add_devices([device])

    def drop_lost(self, device: Device, exc: BaseException) -> None:
        """A dead rollout device (fenced by recovery) leaves every run still holding it; its
        requests rerun on the others (a resize may have stopped it and met its death in
        `export_inflight`, before handing its requests back)."""
        for run in (self.run, *self.tails):
            if run is not None:
                run.drop_lost(device, exc)

    async def serve_idle(self) -> None:
        """Recovery, at its repair: rollout devices in no run and on their way to none (a
        failed resize lost track of them, a trainer reassigned to the rollout) load the
        running step's version and serve it. Each is in transit meanwhile (`tail_busy`), so
        no other path takes it too; one a resize took meanwhile stays out."""
        if self.run is None:
            return
        for device in self.rollout_devices():
            if device.index in self.engaged():
                continue
            with self.transit.borrowing(device.index):
                version, handle = self.current_weights()
                await device.alloc_kv()
                await device.load_weights(version, handle)
            if self.serves_rollout(device.index) and device.index not in self.engaged():
                self._serve(device, version)

