"""SimProcess: one simulated device's process, which charges its ops virtual time and can die.

Every op of a `SimDevice` that takes time waits `spend(seconds)` on the run's clock (a
`VirtualClock`'s frame-less `after`, else `clock.sleep`), counted in `busy_s`. A process killed
(`die`, from `SimProcesses.kill`) fails its pending waits and every later call with the error a
dead Ray actor's calls raise (`DeviceDied`); a collective's wait (`spend(..., collective=True)`:
train step, publish, reshard, checkpoint...) also fails when a peer of its training group dies
(`fail_collectives`, `CollectiveFailed`), the device itself staying alive (`sim.faults`).

A frozen process (`freeze`, a hang: SIGSTOP live) finishes nothing: each op's wait, when its
time is up, and every later op that charges time, waits on a gate that only its death fails.
A peer of a frozen device (`hold_collectives`) does the same with its collectives (a
collective with a frozen member never completes); its other ops go on. The peers are the
frozen device's training group when it froze. A frozen process's own collectives fail only
with its death, not when another member dies (a stopped process sees nothing). Ops that
charge no time still answer (live, every call of a frozen actor blocks): the twin's stand-in
is coarse there.
"""

from __future__ import annotations

import asyncio
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
        self.frozen = False
        """Hung (`freeze`): nothing it runs finishes until it is killed."""
        self._held_by: set[int] = set()
        """Frozen peers its collectives wait for (`hold_collectives`)."""

    def freeze(self) -> None:
        """The process hangs (module docstring); `SimProcesses.hang` kills it later."""
        self.frozen = True

    def hold_collectives(self, peer: int, held: bool = True) -> None:
        """Peer `peer` of its training group froze (or, `held=False`, is gone)."""
        if held:
            self._held_by.add(peer)
        else:
            self._held_by.discard(peer)

    def die(self, exc: BaseException) -> None:
        """The process is gone: pending and later calls raise `exc` (`SimProcesses.kill`)."""
        self.alive, self._death = False, exc
        fail_waits(self._waits, exc)
        fail_waits(self._collective_waits, exc)

    def fail_collectives(self, exc: BaseException) -> None:
        """A peer of this device's training group died: its pending collectives fail (not
        while it is frozen: a stopped process sees nothing until it is killed)."""
        if not self.frozen:
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
        if self.frozen or (collective and self._held_by):
            await self._gate(waits)

    @staticmethod
    async def _gate(waits: set[Any]) -> None:
        """Wait until a death fails this op (a frozen process, or a collective of one)."""
        gate = asyncio.get_running_loop().create_future()
        waits.add(gate)
        try:
            await gate
        finally:
            waits.discard(gate)
