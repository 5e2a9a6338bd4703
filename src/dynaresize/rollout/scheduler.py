"""RolloutScheduler: runs one step's requests on the rollout devices.

One asyncio task per rollout device; each loops { submit what was dispatched to it →
`run_rollout(slice_s)` → hand completions back → dispatch more }. Queued requests go to the
least-loaded device that has a free slot (ties: lowest index). Which device runs a request never
changes its tokens (DESIGN §2.3), so dispatch is free to be greedy.

Consumes: RequestSpecs of one step. Waits for: devices' slices. Produces: Completions through
`on_completions`, and per-device busy intervals.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dynaresize.protocols import Clock, Device
from dynaresize.types import Completion, InflightRequest, RequestSpec

Work = RequestSpec | InflightRequest


@dataclass
class _Slot:
    device: Device
    load: int = 0
    pending: list[Work] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    t_first: float | None = None
    t_last: float | None = None


@dataclass
class RolloutStepResult:
    completions: list[Completion]
    busy_s: dict[int, tuple[float, float]]
    """device → (first slice start, last slice end) during this step."""


class RolloutScheduler:
    def __init__(self, clock: Clock, max_running: int, slice_s: float) -> None:
        self.clock = clock
        self.max_running = max_running
        self.slice_s = slice_s

    async def run_step(self, devices: Sequence[Device], requests: Sequence[Work],
                       on_completions: Callable[[list[Completion]], None]
                       ) -> RolloutStepResult:
        """Run `requests` to completion on `devices`; call `on_completions` as they finish."""
        queue: deque[Work] = deque(requests)
        slots = [_Slot(d) for d in devices]
        remaining = len(requests)
        done: list[Completion] = []
        finished = asyncio.Event()
        if remaining == 0:
            finished.set()

        def dispatch() -> None:
            while queue:
                free = [s for s in slots if s.load < self.max_running]
                if not free:
                    return
                slot = min(free, key=lambda s: (s.load, s.device.index))
                slot.pending.append(queue.popleft())
                slot.load += 1
                slot.wake.set()

        async def drive(slot: _Slot) -> None:
            nonlocal remaining
            while not finished.is_set():
                if slot.load == 0:
                    slot.wake.clear()
                    waiter = asyncio.ensure_future(slot.wake.wait())
                    stopper = asyncio.ensure_future(finished.wait())
                    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    stopper.cancel()
                    continue
                if slot.pending:
                    work, slot.pending = slot.pending, []
                    await slot.device.submit(work)
                t0 = self.clock.now()
                if slot.t_first is None:
                    slot.t_first = t0
                completions = await slot.device.run_rollout(self.slice_s)
                slot.t_last = self.clock.now()
                if completions:
                    slot.load -= len(completions)
                    remaining -= len(completions)
                    done.extend(completions)
                    on_completions(completions)
                    dispatch()
                    if remaining == 0:
                        finished.set()

        dispatch()
        await asyncio.gather(*(drive(s) for s in slots))
        busy = {s.device.index: (s.t_first, s.t_last) for s in slots
                if s.t_first is not None and s.t_last is not None}
        return RolloutStepResult(done, busy)
