"""EngineRescue: a tail that lost its last engine with requests left borrows one of the
newest run's (`rescue_tail`; the rollout loop calls it when the tail's last engine dies, the
resize hooks when a resize took it). The donor leaves the newest run, loads the tail's
version and finishes its requests. Meanwhile the rescue counts as on its way to the newest run
(`EngineTransit.start_rescue`: no resize until it is rescued) and its donor is borrowed
(`EngineTransit.borrowing`, in `tail_busy`): in no run, but no other path takes it."""

from __future__ import annotations

from typing import Protocol

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


class RescuedPool(Protocol):
    """What the tail rescue needs of the engine pool (`EnginePool`)."""

    @property
    def run(self) -> RolloutRun | None: ...

    def is_tail(self, run: RolloutRun | None) -> bool: ...

    def join_newest(self, device: Device) -> None: ...

    def check_settled(self) -> None: ...

    async def load_version(self, version: int, handle: WeightHandle,
                           engines: list[Device]) -> None: ...


class EngineRescue:
    def __init__(self, pool: RescuedPool, transit: EngineTransit, state: RunState,
                 versions: EngineVersions, clock: Clock, background: Background) -> None:
        self.pool = pool
        self.transit = transit
        self.state = state
        self.versions = versions
        self.clock = clock
        self.background = background

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
            self.pool.check_settled()

    async def _donor(self, tail: RolloutRun) -> tuple[RolloutRun, Device] | None:
        """The newest run's highest-index engine, once it has one (if every rollout engine
        died, recovery refills the pool: a trainer reassigned, `repair_soon`, and the newest
        run gets it); None once `tail` finished without."""
        waited_s = 0.0
        while not tail.finished.is_set():
            newest = self.pool.run
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
        await self.pool.load_version(version, self.state.versions.get(version), [device])
        return self.versions.of(device.index) == version

    def _deliver(self, device: Device, tail: RolloutRun) -> None:
        """A rescue's donor, loaded with `tail`'s version, joins it; if the tail ended
        meanwhile (its requests done elsewhere), the newest step's run, like any engine a
        tail frees (`join_newest`)."""
        if tail.finished.is_set() or not self.pool.is_tail(tail):
            self.pool.join_newest(device)
        else:
            tail.add_devices([device])
