"""The train loop's streaming path (see `dynaresize.core.stream`): `StreamTrainer`.

`accumulate(step, stream, holdings)` runs sessions: take the train lock; every training
device pulls the largest ready, not yet held micro-batch whenever it is free and accumulates
it (`Device.train_accumulate`: it computes and holds that micro-batch's gradients) and parks
while none is ready; the session ends when every micro-batch is held or a resize waits for
the lock. Once a resize waits, the session ends when the micro-batches in flight do, and a
trainer that is free before that only takes a micro-batch it is expected to finish by then
(backfill: seconds per token as measured in this step, `TrainRate`), so the devices waiting
for the slowest micro-batch keep working without delaying the resize. Between two sessions
a resize may change the training group: devices that joined take part in the next session;
what a device that left held is recomputed.
It returns once every micro-batch is held. `finish(...)` (under the lock, at the optimizer-step
boundary) recomputes what departed devices held, then `Device.train_finish` combines the held
gradients in micro-batch order and takes the optimizer step on every training device.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable
from typing import Any

from dynaresize.core.rundir import RunDir
from dynaresize.core.stream import Holdings, StepStream
from dynaresize.orchestrator.boundary import OptimizerBoundary
from dynaresize.orchestrator.fault_injection import FaultInjector
from dynaresize.orchestrator.state import RunState
from dynaresize.protocols import Clock, Device


class TrainRate:
    """Seconds per training token, as measured over a step's accumulated micro-batches."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.tokens = 0

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    def estimate_s(self, tokens: int) -> float | None:
        """Expected seconds for `tokens` (None before any measurement)."""
        return self.seconds / self.tokens * tokens if self.tokens else None


async def train_session(clock: Clock, rundir: RunDir, step: int, stream: StepStream,
                        holdings: Holdings, trainers: list[Device], changed: asyncio.Event,
                        stop: Callable[[], bool], rate: TrainRate | None = None) -> float:
    """Every trainer pulls the largest ready, unheld micro-batch as soon as it is free (no
    lock-step rounds: micro-batches differ a lot in length; largest first, as LPT, so what
    is left for the end is small: a step whose micro-batches are all ready at once, e.g. at
    staleness 1, trained 6% slower in readiness order than the same step planned by
    `train.balance`'s LPT) and parks when none is ready,
    until every micro-batch is held or `stop()` (a resize waits for the boundary; it sets
    `changed` too): then a free trainer only backfills (module docstring, `rate`). One
    watcher waits for `changed` and wakes as many parked trainers as there are new
    micro-batches (all of them on stop or once the stream is complete), so a ready
    micro-batch costs one wake-up, not one per idle trainer. Returns the device-seconds spent."""
    session = _Session(clock, rundir, step, stream, holdings, changed, stop, rate)
    watcher = asyncio.ensure_future(session.watch())
    pulls = [asyncio.ensure_future(session.pull(d)) for d in trainers]
    try:
        await asyncio.gather(*pulls)
    except BaseException:  # a trainer died: the others must not pull on (found live by the
        for pull in pulls:  # trap campaign: they held new micro-batches on the trainers the
            pull.cancel()  # repair had just rebuilt, and its replay met them)
        await asyncio.gather(*pulls, return_exceptions=True)
        raise
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    return session.busy_s


class _Session:
    """The state of one `train_session` (its docstring), shared by its trainers' `pull`s and
    its `watch`er."""

    def __init__(self, clock: Clock, rundir: RunDir, step: int, stream: StepStream,
                 holdings: Holdings, changed: asyncio.Event, stop: Callable[[], bool],
                 rate: TrainRate | None) -> None:
        self.clock, self.rundir, self.step, self.stream = clock, rundir, step, stream
        self.holdings, self.changed, self.stop, self.rate = holdings, changed, stop, rate
        self.taken: set[int] = set()
        self.busy_s = 0.0
        self.cursor = 0
        """stream.ready[:cursor] is held or taken (both only grow within a session)."""
        self.parked: list[asyncio.Future[None]] = []
        self.loop = asyncio.get_running_loop()
        self.ends_s: dict[int, float] = {}
        """Trainer -> when its micro-batch in flight is expected to end (backfill only)."""
        self.largest: list[tuple[int, int]] = []
        """(-tokens, index) of the ready micro-batches seen so far: a trainer takes the
        largest one neither held nor taken (LPT order: what is left at the end is small)."""
        self.seen = 0

    def backfill(self) -> int | None:
        """Index in stream.ready of a micro-batch a free trainer can take while a resize
        waits: expected to end before the last micro-batch in flight does."""
        rate, stream = self.rate, self.stream
        if rate is None or not self.ends_s:
            return None
        deadline_s, now_s, ready = max(self.ends_s.values()), self.clock.now(), stream.ready
        for i in range(self.takeable(), len(ready)):
            m = ready[i]
            if m in self.holdings.held_by or m in self.taken:
                continue
            need_s = rate.estimate_s(stream.micro_batch_tokens(m))
            if need_s is not None and now_s + need_s <= deadline_s:
                return i
        return None

    def takeable(self) -> int:
        """Index in stream.ready of the first micro-batch neither held nor taken."""
        ready, i = self.stream.ready, self.cursor
        while i < len(ready) and (ready[i] in self.holdings.held_by or ready[i] in self.taken):
            i += 1
        self.cursor = i
        return i

    def next_largest(self) -> int | None:
        ready, largest = self.stream.ready, self.largest
        while self.seen < len(ready):
            m = ready[self.seen]
            self.seen += 1
            heapq.heappush(largest, (-self.stream.micro_batch_tokens(m), m))
        while largest and (largest[0][1] in self.holdings.held_by
                           or largest[0][1] in self.taken):
            heapq.heappop(largest)
        return largest[0][1] if largest else None

    def wake(self, n: int) -> None:
        parked = self.parked
        while parked and n > 0:
            fut = parked.pop()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    async def watch(self) -> None:
        changed, stream = self.changed, self.stream
        while True:
            await changed.wait()
            changed.clear()
            if self.stop() or stream.complete:
                self.wake(len(self.parked))
            else:
                self.wake(len(stream.ready) - self.takeable())

    async def pull(self, device: Device) -> None:
        stream = self.stream
        while True:
            if self.stop():
                found = self.backfill()
                if found is None:
                    return
                m: int | None = stream.ready[found]
            else:
                m = self.next_largest()
            if m is None:  # nothing ready and unheld: park
                if stream.complete:
                    return
                fut = self.loop.create_future()
                self.parked.append(fut)
                await fut
                continue
            await self.train(device, m)

    async def train(self, device: Device, m: int) -> None:
        """`device` accumulates micro-batch `m`'s gradient and holds it."""
        clock, rate = self.clock, self.rate
        self.taken.add(m)
        tokens = self.stream.micro_batch_tokens(m)
        t0 = clock.now()
        expected_s = rate.estimate_s(tokens) if rate is not None else None
        if expected_s is not None:
            self.ends_s[device.index] = t0 + expected_s
        await device.train_accumulate(self.step, [(m, self.stream.micro_batch(m))])
        t1 = clock.now()
        self.ends_s.pop(device.index, None)
        if rate is not None:
            rate.add(t1 - t0, tokens)
        self.holdings.hold(m, device.index)
        self.busy_s += t1 - t0
        self.rundir.event(t0, t1, device.index, "train", critical=True, step=self.step)


class StreamTrainer:
    """Trains a streamed step: `accumulate` (sessions between resizes), then `finish`."""

    def __init__(self, clock: Clock, rundir: RunDir, boundary: OptimizerBoundary,
                 state: RunState, changed: asyncio.Event,
                 injector: FaultInjector | None = None) -> None:
        self.clock = clock
        self.injector = injector
        """`[[faults.kill]]`: a `train` kill lands in the optimizer step, as unstreamed."""
        self.rundir = rundir
        self.boundary = boundary
        self.state = state
        self.changed = changed
        """Set whenever micro-batches become ready and whenever a resize starts waiting for
        the train lock (`StepBoard.changed`)."""

    async def accumulate(self, step: int, stream: StepStream, holdings: Holdings,
                         stop: Callable[[], bool] = lambda: False) -> float:
        """Sessions until every micro-batch of `step` is held (module docstring), or until
        `stop()` (checked as each session takes the train lock: a repair, e.g. by a resize
        that held the lock meanwhile, rebuilt the world and dropped the held gradients, so the
        step reruns the plain way and nothing more may be held); returns the device-seconds
        spent."""
        device_s = 0.0
        rate = TrainRate()
        boundary = self.boundary
        while holdings.todo(stream.ready) or not stream.complete:
            async with boundary.lock:
                if stop():
                    break
                trainers = self.state.train_devices()
                holdings.drop_devices((d.index for d in trainers), self.state.train_tenure)
                device_s += await train_session(self.clock, self.rundir, step, stream,
                                                holdings, trainers, self.changed,
                                                boundary.resize_waits, rate)
        return device_s

    async def finish(self, trainers: list[Device], step: int, stream: StepStream,
                     holdings: Holdings, global_tokens: int
                     ) -> tuple[list[dict[str, float]], float, list[Any], float]:
        """Under the train lock: recompute what left with departed devices, then the optimizer
        step and the weight gather. Returns (stats, time training ended, handles, device-s)."""
        holdings.drop_devices((d.index for d in trainers), self.state.train_tenure)
        device_s = await train_session(self.clock, self.rundir, step, stream, holdings,
                                       trainers, asyncio.Event(), lambda: False)
        t0 = self.clock.now()
        finishing = asyncio.gather(*(d.train_finish(step, stream.num_micro_batches,
                                                    global_tokens) for d in trainers))
        if self.injector is not None:
            await self.injector.during_train(step)
        stats = list(await finishing)
        t1 = self.clock.now()
        for d in trainers:
            self.rundir.event(t0, t1, d.index, "train", critical=True, step=step)
        handles = list(await asyncio.gather(*(d.publish_weights(step + 1) for d in trainers)))
        holdings.clear()
        return stats, t1, handles, device_s + (t1 - t0) * len(trainers)
