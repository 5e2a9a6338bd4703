"""EngineVersions: which policy version each rollout engine serves, and the weight loads that
change it (`EnginePool`'s engines; design §2: an engine joins a run only once it serves that
run's version).

A load that fails because the device died meanwhile is the recovery's to fence
(`on_lost`): the device then keeps its old version here, and a run it joins anyway reruns its
requests elsewhere, as for any death. Every other error propagates.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from dynaresize.core.rundir import RunDir
from dynaresize.protocols import Clock, Device, WeightHandle

__all__ = ["NO_ENGINE", "EngineVersions"]

NO_ENGINE = -1
"""The version of a device that holds no engine (a trainer reassigned to the rollout pool,
or an engine released): whichever run it joins loads weights first."""


class EngineVersions:
    """The loaded version of every device's engine (0 at the start, `NO_ENGINE` without
    one) and the loads that change it."""

    def __init__(self, indices: Iterable[int], clock: Clock, rundir: RunDir) -> None:
        self.clock = clock
        self.rundir = rundir
        self._version = dict.fromkeys(indices, 0)
        self._lost_handler: Callable[[Device, BaseException], bool] | None = None

    def of(self, index: int) -> int:
        """The version device `index`'s engine serves (`NO_ENGINE` if it holds none)."""
        return self._version[index]

    def set_loaded(self, index: int, version: int) -> None:
        """Device `index` was loaded with `version` outside `load` (a resize's own load)."""
        self._version[index] = version

    def gone(self, index: int) -> None:
        """Device `index` holds no engine: `load_weights` (which builds one) comes first."""
        self._version[index] = NO_ENGINE

    def on_lost(self, handler: Callable[[Device, BaseException], bool]) -> None:
        """`handler(device, exc)`: whether a failed load was the device's death (recovery
        fences it; True) or an error (False: it propagates). Default: every error
        propagates."""
        self._lost_handler = handler

    def lost(self, device: Device, exc: BaseException) -> bool:
        """Whether a call on `device` failed with `exc` because the device died (recovery
        fences it): the `on_lost` handler's answer; False without one."""
        return self._lost_handler is not None and self._lost_handler(device, exc)

    async def load(self, version: int, handle: WeightHandle, engines: list[Device]) -> None:
        """Load `version` on every engine of `engines` that does not serve it yet, at once;
        each load is an event of the run directory (critical path)."""
        stale = [d for d in engines if self._version[d.index] != version]
        if not stale:
            return
        t0 = self.clock.now()
        if len(stale) == 1:  # an engine joining from the previous tail (the common case)
            got: list[Any] = [await self._load_or_lose(stale[0], version, handle)]
        else:
            got = await asyncio.gather(*(self._load_or_lose(d, version, handle)
                                         for d in stale))
        t1 = self.clock.now()
        for d in [d for d, ok in zip(stale, got, strict=True) if ok]:
            self._version[d.index] = version
            self.rundir.event(t0, t1, d.index, "load_weights", critical=True, version=version)

    async def _load_or_lose(self, device: Device, version: int, handle: WeightHandle) -> bool:
        """Load `version` on `device`; False if the device died meanwhile (fenced by the
        handler)."""
        try:
            await device.load_weights(version, handle)
        except Exception as exc:
            if not self.lost(device, exc):
                raise
            return False
        return True
