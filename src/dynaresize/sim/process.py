"""SimProcess: one simulated device's process, which charges its ops virtual time and can die.

Every op of a `SimDevice` that takes time waits `spend(seconds)` on the run's clock (a
`VirtualClock`'s frame-less `after`, else `clock.sleep`), counted in `busy_s`. A process killed
(`die`, from `SimProcesses.kill`) fails its pending waits and every later call with the error a
dead Ray actor's calls raise (`DeviceDied`); a collective's wait (`spend(..., collective=True)`:
train step, publish, reshard, checkpoint...) also fails when a peer of its training group dies
(`fail_collectives`, `CollectiveFailed`), the device itself staying alive (`sim.faults`).
"""

from __future__ import annotations

from typing import Any

from dynaresize.protocols import Clock
from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.faults import DeviceDied, fail_waits


class SimProcess:
    """The virtual-time waits and the life of one simulated device (module docstring)."""

    def __init__(self, index: int, clock: Clock) -> None:
        self._wait = clock.after if isinstance(clock, VirtualClock) else clock.sleep
        """`clock.sleep` (VirtualClock: its frame-less `after`)."""
        self.busy_s = 0.0
        """Virtual seconds this device spent charged with work (for utilisation checks)."""
        self.alive = True
        self._death: BaseException = DeviceDied(f"simulated device {index} died")
        """What its calls raise once it is dead (`die`)."""
        self._waits: set[Any] = set()
        """Pending virtual-time waits of this device's ops: a kill fails them."""
        self._collective_waits: set[Any] = set()
        """Those of collective ops: a peer's death fails them too (`sim.faults`)."""

    def die(self, exc: BaseException) -> None:
        """The process is gone: pending and later calls raise `exc` (`SimProcesses.kill`)."""
        self.alive, self._death = False, exc
        fail_waits(self._waits, exc)
        fail_waits(self._collective_waits, exc)

    def fail_collectives(self, exc: BaseException) -> None:
        """A peer of this device's training group died: its pending collectives fail."""
        fail_waits(self._collective_waits, exc)

    def check_alive(self) -> None:
        """Raise what a dead process's calls raise, if it is dead."""
        if not self.alive:
            raise self._death

    async def spend(self, seconds: float, collective: bool = False) -> None:
        """Charge `seconds` of virtual time (raises if the process is or becomes dead)."""
        if not self.alive:
            raise self._death
        self.busy_s += seconds
        wait = self._wait(seconds)
        waits = self._collective_waits if collective else self._waits
        waits.add(wait)
        try:
            await wait
        finally:  # a cancelled op forgets its wait too
            waits.discard(wait)
        if not self.alive:
            raise self._death
