"""RolloutRun: one step's requests on the rollout devices, with devices joining and leaving.

One asyncio task per rollout device; each loops { submit what was dispatched to it →
`run_rollout(slice_s)` → hand completions back → dispatch more }. Queued requests go to the
least-loaded device that has a free slot (ties: lowest index). Which device runs a request never
changes its tokens (design §2.3), so dispatch is free to be greedy, and a device can leave
mid-step: its in-flight requests are exported (token prefix + sampler state) and requeued at the
front, to finish on the other engines.

Progress is reported at a bounded granularity: completions reach `on_completions` in batches
of at least `PROGRESS_FRACTION` (1%) of the requests in flight (dispatched, unfinished), so one
by one while at most 100 are in flight, and always before the run finishes. Completions arrive
at about (requests in flight / mean request duration), so a watcher (controller, fault
injection) sees progress at most ~1% of a request's duration late, whatever the queue; an
8192-request step with every request in flight makes ~550 reports instead of 8192. Nothing
else waits for the reports: dispatch still happens at every completion.

Consumes: RequestSpecs of one step. Waits for: devices' slices. Produces: Completions through
`on_completions`, and per-device busy intervals. Unblocked by: the last completion.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dynaresize.core.types import Completion, InflightRequest, RequestSpec
from dynaresize.protocols import Clock, Device
from dynaresize.rollout.deal import seat_positions, seats
from dynaresize.rollout.handoff import HandOff

if TYPE_CHECKING:
    from dynaresize.rollout.tail import TailPolicy

Work = RequestSpec | InflightRequest
DRAIN_SLICES = 100
"""A draining `run_rollout` call lasts at most this many slices."""
BULK_MIN_FREE = 16
"""A long queue goes out in bulk (`_dispatch_bulk`, O(devices log devices)) only when at least
this many devices may take work; after a completion or two the greedy heap is cheaper."""
PROGRESS_FRACTION = 0.01
"""`on_completions` gets completions in batches of at least this share of the requests in
flight (module docstring); 0: every device return is reported."""


def _ignore(completions: list[Completion]) -> None:
    return None


@dataclass
class _Slot:
    device: Device
    load: int = 0
    pending: list[Work] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    leaving: bool = False
    task: asyncio.Task[None] | None = None
    inflight: dict[tuple[int, int, int], Work] = field(default_factory=dict)
    """Submitted to the device and not completed: what reruns elsewhere if it dies."""


class RolloutRun(HandOff):
    def __init__(self, clock: Clock, requests: Sequence[Work], max_running: int,
                 slice_s: float, on_completions: Callable[[list[Completion]], None],
                 on_device_lost: Callable[[Device, BaseException], bool] | None = None,
                 drain: Callable[[], bool] | None = None) -> None:
        """`on_device_lost(device, error)`: a device call failed; return True if the device
        is gone (its requests rerun elsewhere from scratch), False to fail the run.
        `drain()`: True when no one needs to see completions one by one (no controller
        watching progress, no resize pending): once the queue is empty, each device then runs
        until it is empty (at most `DRAIN_SLICES` slices) in one call."""
        self.clock = clock
        self.max_running = max_running
        self.slice_s = slice_s
        self.on_completions = on_completions
        self.on_device_lost = on_device_lost
        self.drain = drain
        self.num_rerun = 0
        """Requests restarted from scratch because their device died."""
        self.error: BaseException | None = None
        self.version = -1
        """The policy version every request of this run needs (set by the orchestrator; an
        engine joins only once it serves it)."""
        self.queue: deque[Work] = deque(requests)
        self.total = len(requests)
        self.remaining = len(requests)
        self.completions: list[Completion] = []
        self._unreported: list[Completion] = []
        """Finished, not yet handed to `on_completions` (PROGRESS_FRACTION)."""
        self.busy_s: dict[int, list[float]] = {}
        """device → [first slice start, last slice end] in this step."""
        self.finished = asyncio.Event()
        self.drained = asyncio.Event()
        """Set once every request has been dispatched to a device (the queue is empty)."""
        self.light_batch = 8
        """Requests per engine below which the run counts as in its tail (`light_s`)."""
        self.light_s: float | None = None
        """When the remaining requests first fit on the run's engines at `light_batch` each:
        from then on engines wait for their last requests (`tail_device_s`)."""
        self.expected_devices: Callable[[], int] | None = None
        """How many devices this run will have once every device meant for it joined (a
        pipelined run starts on a few and gains the rest from the previous step's tail):
        until then no device gets more than its share, ceil(remaining / expected), so the
        work waits in the queue for the devices still to come instead of in a few engines'
        waiting lists. None: up to `max_running` each."""
        self.arriving: Callable[[], set[int]] | None = None
        """Devices on their way to this run (left the previous step's tail or were free,
        loading its version; pipelined): a device that joins while they are coming is dealt
        its share over them too (`rollout.deal`). None: plain dispatch."""
        self._on_idle: Callable[[Device], None] | None = None
        """`hand_off`'s callback: where a device goes once nothing is left for it here."""
        self.pack_batch = 0
        """Once handing off: keep this run on as few engines as hold its remaining requests
        at `pack_batch` each; the least-loaded engine beyond that migrates its requests to
        the others (export, requeue) and is handed off (0: engines leave only when empty)."""
        self.num_migrated = 0
        """Requests packing moved to another engine."""
        self._packing: asyncio.Task[None] | None = None
        self.tail: TailPolicy | None = None
        """`rollout.tail_policy` (rollout/tail.py): dispatch order by predicted length and
        tail spreading; None: FIFO."""
        self._slots: dict[int, _Slot] = {}
        self._free: list[tuple[int, int]] = []
        """Heap of (load, device) candidates; stale entries are skipped when popped."""
        self._free_below = sys.maxsize
        """Every serving device whose load is below this has its (load, device) in `_free`
        (the dispatches that leave a full device out lower it), so a bulk dispatch under a
        limit no higher reads its candidates from `_free`, not from every device."""
        if self.remaining == 0:
            self._set_finished()

    def _set_finished(self) -> None:
        """Every request completed, or the run failed: either way nothing waits to be
        dispatched any more (a loop waiting for `drained` moves on, then sees the error)."""
        self.finished.set()
        self.drained.set()

    @property
    def num_finished(self) -> int:
        return self.total - self.remaining

    def tail_device_s(self) -> float:
        """Device-seconds engines were held in the run's tail (after `light_s`)."""
        start = self.light_s if self.light_s is not None else self.clock.now()
        return sum(max(0.0, b - max(a, start)) for a, b in self.busy_s.values())

    def devices(self) -> list[int]:
        return sorted(i for i, s in self._slots.items() if not s.leaving)

    def idle_devices(self) -> list[int]:
        """Devices with nothing left to run here: no request, and none queued for anyone."""
        if self.queue:
            return []
        return sorted(i for i, s in self._slots.items() if not s.leaving and s.load == 0)

    # ------------------------------------------------------------------ membership
    def add_devices(self, devices: Sequence[Device]) -> None:
        """Start serving on `devices` (at step start, or joining mid-step)."""
        for device in devices:
            slot = _Slot(device)
            self._slots[device.index] = slot
            heapq.heappush(self._free, (0, device.index))
            slot.task = asyncio.ensure_future(self._drive(slot))
        self._dispatch(joined=True)

    async def stop_admission(self, device: Device) -> None:
        """Stop giving `device` work; return once its current slice is over."""
        slot = self._slots.get(device.index)
        if slot is None:
            return
        slot.leaving = True
        slot.wake.set()
        assert slot.task is not None
        await slot.task

    def requeue(self, device: Device, exported: list[Work]) -> None:
        """Put a leaving device's unfinished work (exported + never submitted) back in front."""
        slot = self._slots.pop(device.index, None)
        work = list(exported) + (slot.pending if slot is not None else [])
        self.queue.extendleft(reversed(work))
        self._dispatch()

    def close(self) -> None:
        """Drop the callbacks and device slots once the run has ended and its results are
        read: they hold the run in reference cycles (a closure over it), so without this a
        step's requests and completions would wait for the cyclic GC (the twin pauses it)."""
        self.on_completions = _ignore
        self.on_device_lost = self.drain = self._on_idle = self.expected_devices = None
        self.arriving = None
        self._slots.clear()
        self._free = []

    # ------------------------------------------------------------------ main
    async def wait(self) -> None:
        """Return when every request has completed."""
        await self.finished.wait()
        if self._packing is not None:  # its device is handed off before the run ends
            await asyncio.gather(self._packing, return_exceptions=True)
        if self.tail is not None:
            await self.tail.wait()
        tasks = [s.task for s in self._slots.values() if s.task is not None]
        for s in self._slots.values():
            s.wake.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.error is not None:
            raise self.error

    def _dispatch(self, joined: bool = False) -> None:
        """Give queued work to the least-loaded device with a free slot (ties: lowest index);
        the queue's order is FIFO or `tail`'s. Devices that `joined` a FIFO run that waits
        for more (`expected_devices`) are dealt their share (`rollout.deal`)."""
        if self.tail is not None and self.queue:
            self.tail.before_dispatch()
        if joined and self.tail is None and self.arriving is not None and self.queue:
            self._dispatch_bulk(len(self.arriving() - self._slots.keys()))
        elif len(self.queue) > len(self._slots) and len(self._free) > BULK_MIN_FREE:
            self._dispatch_bulk()
        else:
            self._dispatch_greedy()
        if not self.queue:
            self.drained.set()

    def _limit(self) -> int:
        """Most requests one device may hold now (`max_running`, or its share)."""
        if self.expected_devices is None:
            return self.max_running
        share = max(self.expected_devices(), len(self._slots), 1)
        return max(1, min(self.max_running, -(-self.remaining // share)))

    def _dispatch_greedy(self) -> None:
        limit = self._limit()
        while self.queue and self._free:
            load, index = heapq.heappop(self._free)
            slot = self._slots.get(index)
            if slot is None or slot.leaving or slot.load != load:
                continue  # stale entry
            if load >= limit:  # full: left out of the heap
                self._free_below = min(self._free_below, load)
                continue
            slot.pending.append(self.queue.popleft() if self.tail is None
                                else self.tail.take(index))
            slot.load += 1
            slot.wake.set()
            if slot.load < limit:
                heapq.heappush(self._free, (slot.load, index))
            else:
                self._free_below = min(self._free_below, slot.load)

    def _dispatch_bulk(self, num_coming: int = 0) -> None:
        """`_dispatch` for a long queue, the greedy's assignment in O(dispatched + devices log
        devices): the greedy fills device slots in (load, device index) order, i.e. level by
        level from the lowest load, each level in device order (`rollout.deal.seats`);
        `num_coming` devices on their way hold seats whose requests stay queued for them.
        Rebuilds the candidate heap."""
        limit, slots, queue, tail = self._limit(), self._slots, self.queue, self.tail
        if limit <= self._free_below:  # every candidate is in the heap: O(heap), not O(slots)
            loads = {}
            for load, index in self._free:
                slot = slots.get(index)
                if slot is not None and not slot.leaving and slot.load == load < limit:
                    loads[index] = load
        else:
            loads = {index: slot.load for index, slot in slots.items()
                     if not slot.leaving and slot.load < limit}
        if num_coming and tail is None:
            self._deal_with_seats_to_come(loads, num_coming, limit)
        else:
            kept: list[Work] = []
            for index in seats(loads, num_coming, limit, len(queue)):
                if index is None:  # a seat to come: the request waits for it, in queue order
                    kept.append(queue.popleft())
                    continue
                slot = slots[index]
                slot.pending.append(queue.popleft() if tail is None else tail.take(index))
                slot.load += 1
                slot.wake.set()
            queue.extendleft(reversed(kept))
        self._free = [(slots[index].load, index) for index in loads
                      if slots[index].load < limit]
        heapq.heapify(self._free)
        self._free_below = limit

    def _deal_with_seats_to_come(self, loads: dict[int, int], num_coming: int,
                                 limit: int) -> None:
        """The bulk dispatch's deal with seats to come (FIFO): the same assignment, the
        requests left for the seats to come kept in queue order, with list slices (one
        pass at C speed) instead of a pop and a push per kept request."""
        queue, slots = self.queue, self._slots
        taken = seat_positions(loads, num_coming, limit, len(queue))
        if not taken:
            return
        items = list(queue)
        kept, prev = [], 0
        for pos, index in taken:
            kept.append(items[prev:pos])
            slot = slots[index]
            slot.pending.append(items[pos])
            slot.load += 1
            slot.wake.set()
            prev = pos + 1
        kept.append(items[prev:])
        queue.clear()
        queue.extend(itertools.chain.from_iterable(kept))

    def _report(self, completions: list[Completion]) -> None:
        """Hand finished requests to `on_completions` at the PROGRESS_FRACTION granularity
        (all of them once none is left)."""
        batch = self._unreported
        batch.extend(completions)
        in_flight = self.remaining - len(self.queue) + len(batch)
        if self.remaining and len(batch) < PROGRESS_FRACTION * in_flight:
            return
        self._unreported = []
        self.on_completions(batch)

    async def _drive(self, slot: _Slot) -> None:
        try:
            await self._serve(slot)
        except Exception as exc:
            self._device_failed(slot, exc)

    def _device_failed(self, slot: _Slot, exc: BaseException) -> None:
        """A call on `slot`'s device raised: without `on_device_lost` the run fails with this
        error (`wait()` raises it); else `_lose` decides."""
        if self.on_device_lost is None:
            if self.error is None:
                self.error = exc
            self._set_finished()
            return
        self._lose(slot, exc)

    def _lose(self, slot: _Slot, exc: BaseException) -> None:
        """A device call failed: rerun everything it held from scratch (the seeded sampler
        makes the tokens identical, design §2.3), or fail the run if the device is alive."""
        slot.leaving = True
        self._slots.pop(slot.device.index, None)
        lost = [w.spec if isinstance(w, InflightRequest) else w
                for w in [*slot.inflight.values(), *slot.pending]]
        slot.inflight, slot.pending = {}, []
        lost.sort(key=lambda spec: spec.key)
        self.num_rerun += len(lost)
        self.queue.extendleft(reversed(lost))
        assert self.on_device_lost is not None
        if not self.on_device_lost(slot.device, exc):
            self.error = exc
            self._set_finished()
        self._dispatch()

    async def _serve(self, slot: _Slot) -> None:
        device, clock, inflight, finished = slot.device, self.clock, slot.inflight, self.finished
        index = device.index
        span: list[float] | None = None
        while not finished.is_set() and not slot.leaving:
            if slot.load == 0:
                slot.wake.clear()
                await slot.wake.wait()
                continue
            if slot.pending:
                work, slot.pending = slot.pending, []
                for w in work:
                    inflight[w.spec.key if isinstance(w, InflightRequest) else w.key] = w
                if self.tail is not None:
                    self.tail.submitted(work)
                await device.submit(work)
            if span is None:
                t0 = clock.now()
                span = self.busy_s.setdefault(index, [t0, t0])
            if not self.queue and self.drain is not None and self.drain():
                # nothing left to dispatch and nobody watching progress: one call per device
                completions = await device.run_rollout(self.slice_s * DRAIN_SLICES, True)
            else:
                completions = await device.run_rollout(self.slice_s)
            span[1] = clock.now()
            if completions:
                for c in completions:
                    inflight.pop(c.spec.key, None)
                slot.load -= len(completions)
                heapq.heappush(self._free, (slot.load, index))
                self.remaining -= len(completions)
                self.completions.extend(completions)
                if self.tail is not None:
                    self.tail.completed(completions)
                if self.light_s is None and \
                        self.remaining <= len(self._slots) * self.light_batch:
                    self.light_s = clock.now()
                self._report(completions)
                if self.queue:
                    self._dispatch()
                if self.remaining == 0:
                    self._set_finished()
                if slot.load == 0 and self._maybe_release(slot):
                    return
                self._maybe_pack()
                if self.tail is not None:
                    self.tail.maybe_spread()

