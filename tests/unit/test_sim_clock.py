"""VirtualClock / VirtualEventLoop: asyncio primitives in virtual time, no wall time spent."""

from __future__ import annotations

import asyncio
import time

import pytest

from dynaresize.protocols import Clock
from dynaresize.sim.clock import VirtualClock, VirtualTimeDeadlock, run_virtual


def test_is_a_clock() -> None:
    assert isinstance(VirtualClock(), Clock)


def test_sleep_advances_virtual_time_not_wall_time() -> None:
    clock = VirtualClock()

    async def main() -> float:
        await clock.sleep(1000.0)
        await asyncio.sleep(500.0)
        return clock.now()

    t0 = time.monotonic()
    assert clock.run(main()) == pytest.approx(1500.0)
    assert time.monotonic() - t0 < 1.0


def test_gather_runs_concurrently() -> None:
    clock = VirtualClock()
    order: list[int] = []

    async def worker(i: int, delay_s: float) -> float:
        await clock.sleep(delay_s)
        order.append(i)
        return clock.now()

    async def main() -> list[float]:
        return await asyncio.gather(worker(0, 3.0), worker(1, 1.0), worker(2, 2.0))

    assert clock.run(main()) == pytest.approx([3.0, 1.0, 2.0])
    assert order == [1, 2, 0]
    assert clock.now() == pytest.approx(3.0)


def test_wait_for_times_out_in_virtual_time() -> None:
    clock = VirtualClock()

    async def main() -> float:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), timeout=7.5)
        return clock.now()

    assert clock.run(main()) == pytest.approx(7.5)


def test_event_and_queue() -> None:
    clock = VirtualClock()

    async def producer(q: asyncio.Queue[int], done: asyncio.Event) -> None:
        for i in range(5):
            await clock.sleep(2.0)
            await q.put(i)
        done.set()

    async def main() -> tuple[list[int], float]:
        q: asyncio.Queue[int] = asyncio.Queue()
        done = asyncio.Event()
        task = asyncio.create_task(producer(q, done))
        got = [await q.get() for _ in range(5)]
        await done.wait()
        await task
        return got, clock.now()

    got, end_s = clock.run(main())
    assert got == [0, 1, 2, 3, 4]
    assert end_s == pytest.approx(10.0)


def test_cancellation_and_long_runs() -> None:
    clock = VirtualClock()

    async def forever() -> None:
        while True:
            await clock.sleep(1.0)

    async def main() -> float:
        task = asyncio.create_task(forever())
        await clock.sleep(100_000.5)  # longer than asyncio's one-day select cap
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return clock.now()

    t0 = time.monotonic()
    assert clock.run(main()) == pytest.approx(100_000.5)
    assert time.monotonic() - t0 < 5.0


def test_deadlock_is_reported_not_hung() -> None:
    async def main() -> None:
        await asyncio.Event().wait()

    with pytest.raises(VirtualTimeDeadlock):
        VirtualClock().run(main())


def test_run_virtual_and_loop_clock() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(4.0)
        return loop.clock.now()  # type: ignore[attr-defined]

    result, end_s = run_virtual(main(), start_s=10.0)
    assert result == pytest.approx(14.0) and end_s == pytest.approx(14.0)


def test_call_soon_threadsafe_still_works() -> None:
    clock = VirtualClock()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        loop.call_soon_threadsafe(fut.set_result, 3)
        return await fut

    assert clock.run(main()) == 3
