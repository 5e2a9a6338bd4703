"""A hung simulated device (`SimProcesses.hang`): who waits, who fails, and when (virtual
time, no orchestrator)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from dynaresize.sim.clock import VirtualClock
from dynaresize.sim.faults import CollectiveFailed, DeviceDied, SimProcesses
from dynaresize.sim.process import SimProcess


@dataclass
class Dev:
    index: int
    process: SimProcess
    train_members: tuple[int, ...] = field(default=(0, 1, 2))

    @property
    def alive(self) -> bool:
        return self.process.alive


def setup() -> tuple[VirtualClock, SimProcesses, list[Dev]]:
    clock = VirtualClock()
    procs = SimProcesses()
    devs = [Dev(i, SimProcess(i, clock)) for i in range(4)]
    devs[3].train_members = ()  # a rollout device
    for d in devs:
        procs.add(d)
    return clock, procs, devs


def start(clock: VirtualClock, process: SimProcess, seconds: float, collective: bool
          ) -> asyncio.Task[tuple[str, float]]:
    """An op of `process`: its task ends with (how it ended, virtual time it ended)."""
    async def op() -> tuple[str, float]:
        try:
            await process.spend(seconds, collective)
            return "done", clock.now()
        except (DeviceDied, CollectiveFailed) as exc:
            return type(exc).__name__, clock.now()

    return asyncio.ensure_future(op())


def test_a_hang_holds_the_group_until_the_watchdog_kills_it() -> None:
    clock, procs, devs = setup()

    async def main() -> list[tuple[str, float]]:
        ops = [start(clock, d.process, 5.0, d.index < 3) for d in devs]
        await asyncio.sleep(1.0)
        procs.hang(1, 20.0)
        procs.hang(1, 20.0)  # a second hang of the same device does nothing
        got = [await op for op in ops]
        return [*got, await start(clock, devs[0].process, 1.0, True)]  # held no more

    got = clock.run(main())
    assert got[0] == ("CollectiveFailed", 21.0) and got[2] == ("CollectiveFailed", 21.0)
    assert got[1] == ("DeviceDied", 21.0)  # killed by the watchdog, 20 s after it froze
    assert got[3] == ("done", 5.0)  # another pool's op goes on
    assert procs.cause(1) == "hung: answered no ping for 20.0 s, killed"
    assert got[4] == ("done", 22.0)  # the group's next collective is not held


def test_a_frozen_device_sees_no_other_death_and_another_kill_takes_it_first() -> None:
    clock, procs, devs = setup()

    async def main() -> list[tuple[str, float]]:
        ops = [start(clock, d.process, 5.0, True) for d in devs[:3]]
        procs.hang(1, 20.0)
        await asyncio.sleep(2.0)
        procs.kill(2)  # another member dies: the frozen one sees nothing yet
        await asyncio.sleep(1.0)
        assert not ops[1].done()
        procs.kill(1)  # an injected kill before the watchdog's
        return [await op for op in ops]

    got = clock.run(main())
    assert got[0] == ("CollectiveFailed", 2.0)
    assert got[1] == ("DeviceDied", 3.0) and got[2] == ("DeviceDied", 2.0)
    assert procs.cause(1) is None  # not the watchdog's kill
    assert not procs.is_frozen(1) and procs.killed == [2, 1]
