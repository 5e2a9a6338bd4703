"""RolloutRun: one step's requests on the rollout devices, with devices joining and leaving.

One asyncio task per rollout device; each loops { submit what was dispatched to it →
`run_rollout(slice_s)` → hand completions back → dispatch more }. Queued requests go to the least-
loaded device that has a free slot (ties: lowest index). Which device runs a request never changes
its tokens (design §2.3), so dispatch is free to be greedy, and a device can leave mid-step: its
in-flight requests are exported (token prefix + sampler state) and requeued at the front, to finish
on the other engines.

Progress reaches `on_completions` in batches of at least `PROGRESS_FRACTION` (1%) of the requests
in flight, always before the run finishes; dispatch happens at every completion. A run is built
complete (`RunSettings`, callbacks, the pool's `Arrivals`) and changed only through its methods.
Its parts: `slots` (engines, dispatch), `run_progress` (request counts, completions and their
batches, busy spans, request lives), `tail_order` (`rollout.tail_policy`'s queue strategy),
`handoff` (when a pipelined run's engines leave), `run_moves` (moving requests off a live
engine, packing a handed-off tail or spreading a thin one: one routine, `_export_and_requeue`).
Consumes: one step's RequestSpecs. Waits for: device slices. Produces: Completions
(`on_completions`), busy intervals (`progress.busy_s`). Unblocked by: the last completion.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence

from dynaresize.core.types import Completion
from dynaresize.protocols import Clock, RolloutOps
from dynaresize.rollout.run_moves import RequestMoves
from dynaresize.rollout.run_progress import RunProgress
from dynaresize.rollout.run_settings import BULK_MIN_FREE, DRAIN_SLICES, Arrivals, RunSettings
from dynaresize.rollout.slots import EngineSlot, SlotTable, Work
from dynaresize.rollout.tail_order import TailOrder


class RolloutRun(RequestMoves):
    def __init__(self, clock: Clock, requests: Sequence[Work], settings: RunSettings,
                 on_completions: Callable[[list[Completion]], None],
                 on_device_lost: Callable[[RolloutOps, BaseException], bool] | None = None,
                 drain: Callable[[], bool] | None = None,
                 may_spread: Callable[[], bool] | None = None,
                 arrivals: Arrivals | None = None) -> None:
        """`on_device_lost(device, error)`: a device call failed; return True if the device is
        gone (its requests rerun elsewhere from scratch), False to fail the run. `drain()`:
        True when no one needs to see completions one by one (no controller watching progress,
        no resize pending): once the queue is empty, each device then runs until it is empty
        (at most `DRAIN_SLICES` slices) in one call (never when spreading: engines return at
        every completion, so a spread never waits long). `may_spread()`: whether tail
        spreading may move requests now. `arrivals` (pipelined runs): the run starts on a few
        engines and gains the rest; until it hands off, no engine gets more than its share,
        ceil(remaining / expected), also dealt to one joining early (`rollout.deal`)."""
        self.clock, self.settings, self.version = clock, settings, settings.version
        self.on_completions, self.on_device_lost = on_completions, on_device_lost
        self.tail = TailOrder(clock, len(requests), settings.spread) \
            if settings.tail_order else None
        self.drain = None if settings.spread and self.tail is not None else drain
        self.may_spread = may_spread
        self.arrivals = arrivals
        self.error: BaseException | None = None
        self.queue: deque[Work] = deque(requests if self.tail is None
                                        else self.tail.first_order(requests))
        self.progress = RunProgress(clock, len(requests))
        """Request counts, completions, busy spans, request lives (`rollout.run_progress`)."""
        self.finished = asyncio.Event()
        self.drained = asyncio.Event()
        """Set once every request has been dispatched to a device (the queue is empty)."""
        self._on_idle: Callable[[RolloutOps], None] | None = None
        """`hand_off`'s callback: where a device goes once nothing is left for it here."""
        self._packing: asyncio.Task[None] | None = None
        self._spreading: asyncio.Task[None] | None = None
        self._slots = SlotTable()
        if self.progress.remaining == 0:
            self._set_finished()

    def _set_finished(self) -> None:
        """Every request completed, or the run failed (a loop waiting for `drained` moves
        on, then sees the error)."""
        self.finished.set()
        self.drained.set()

    @property
    def num_spread(self) -> int:
        return self.tail.num_spread if self.tail is not None else 0

    def devices(self) -> list[int]:
        return sorted(s.index for s in self._slots.active())

    def held_devices(self) -> list[int]:
        """`devices()` and those leaving (packed, stopped): busy until their export returns."""
        return sorted(s.index for s in self._slots)

    def idle_devices(self) -> list[int]:
        """Devices with nothing left to run here: no request, and none queued for anyone."""
        return [] if self.queue else sorted(s.index for s in self._slots.active() if s.load == 0)

    def pending_of(self, index: int) -> list[Work]:
        """What was dispatched to engine `index` and not yet submitted (tests, reports)."""
        return list(slot.pending) if (slot := self._slots.get(index)) is not None else []
    # ------------------------------------------------------------------ membership
    def add_devices(self, devices: Sequence[RolloutOps]) -> None:
        """Start serving on `devices` (at step start, or joining mid-step)."""
        for device in devices:
            slot = self._slots.add(device)
            slot.start(asyncio.ensure_future(self._drive(slot)))
        self._dispatch(joined=True)

    async def stop_admission(self, device: RolloutOps) -> None:
        """Stop giving `device` work (`mark_leaving`); return once its current slice is over."""
        if (slot := self.mark_leaving(device)) is not None:
            await slot.stopped()

    def mark_leaving(self, device: RolloutOps) -> EngineSlot | None:
        """No more work for `device` from now (its slot, or None if it holds none)."""
        if (slot := self._slots.get(device.index)) is not None:
            slot.leave()
        return slot

    def requeue(self, device: RolloutOps, exported: Sequence[Work]) -> None:
        """Put a leaving device's unfinished work (exported + never submitted) back in front."""
        slot = self._slots.pop(device.index)
        work = list(exported) + (slot.pending if slot is not None else [])
        self.queue.extendleft(reversed(work))
        self._dispatch()

    def add_requests(self, requests: Sequence[Work]) -> None:
        """More requests, queued behind the others (dynamic sampling's top-up, next turns)."""
        self.queue.extend(requests)
        self.drained.clear()
        self.progress.add(len(requests))
        self._dispatch()

    def drop_lost(self, device: RolloutOps, exc: BaseException) -> None:
        """`device` died outside this run's calls: its requests rerun elsewhere (`_lose`)."""
        slot = self._slots.get(device.index)
        if slot is not None and self.on_device_lost is not None:
            self._lose(slot, exc)

    def hand_off(self, on_idle: Callable[[RolloutOps], None]) -> None:
        """From now on a device with nothing left to run here (the queue is empty and it
        holds no request) leaves this run for `on_idle(device)` (the next step's rollout),
        except the last one, which stays until the run ends (requeued work always has a
        device). The devices idle now leave at once. Devices no longer join, so no share cap
        applies (`arrivals`), and packing starts (`pack_batch`; `rollout.handoff`)."""
        self._on_idle = on_idle
        self.arrivals = None
        for slot in sorted(self._slots, key=lambda s: s.index, reverse=True):
            if slot.load == 0 and not slot.pending:
                self._maybe_release(slot)
        self._maybe_pack()

    def close(self) -> None:
        """Drop the callbacks and slots once the run ended and its results are read: they
        hold it in reference cycles; else it would wait for the cyclic GC (the twin's off)."""
        self.on_completions = lambda done: None
        self.on_device_lost = self.drain = self._on_idle = self.may_spread = None
        self.arrivals = None
        self._slots.clear()

    # ------------------------------------------------------------------ main
    async def wait(self) -> None:
        """Return when every request has completed."""
        await self.finished.wait()
        for moving in (self._packing, self._spreading):  # their devices first leave or return
            if moving is not None:
                await asyncio.gather(moving, return_exceptions=True)
        tasks = [s.task for s in self._slots if s.task is not None]
        for s in self._slots:
            s.wake.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.error is not None:
            raise self.error

    def _take(self, index: int) -> Work:
        return self.queue.popleft() if self.tail is None else self.tail.take(self.queue, index)

    def _dispatch(self, joined: bool = False) -> None:
        """Give queued work to the least-loaded device with a free slot (ties: lowest index);
        the queue's order is FIFO or `tail`'s. Devices that `joined` a FIFO run that waits
        for more (`arrivals`) are dealt their share (`rollout.deal`)."""
        if self.tail is not None and self.queue:
            self.tail.resort(self.queue)
        slots, limit = self._slots, self._limit()
        if joined and self.tail is None and self.arrivals is not None and self.queue:
            slots.deal_joined(self.queue, limit, slots.num_absent(self.arrivals.arriving()))
        elif len(self.queue) > len(slots) and slots.num_free() > BULK_MIN_FREE:
            slots.deal_bulk(self.queue, limit, self._take)
        else:
            slots.deal_greedy(self.queue, limit, self._take)
        if not self.queue:
            self.drained.set()
        elif not self.finished.is_set():  # work came back (requeued, rerun): not drained
            self.drained.clear()

    def _limit(self) -> int:
        """Most requests one device may hold now (`max_running`, or `share_cap`)."""
        return self.settings.max_running if self.arrivals is None else \
            self.share_cap(self.arrivals.num_rollout_devices())

    def share_cap(self, num_engines: int) -> int:
        """Its share of the remaining requests over `num_engines` (or the run's engines, if
        more) x `share_factor`, in 1..`max_running`: an engine's most while `arrivals`."""
        got, share = self.settings, max(num_engines, len(self._slots), 1)
        return max(1, min(got.max_running,
                          got.share_factor * -(-self.progress.remaining // share)))

    def _report(self, completions: list[Completion]) -> None:
        """Hand finished requests to `on_completions` in `RunProgress.to_report`'s batches."""
        if (batch := self.progress.to_report(completions, len(self.queue))) is not None:
            self.on_completions(batch)

    async def _drive(self, slot: EngineSlot) -> None:
        try:
            await self._serve(slot)
        except Exception as exc:
            self._device_failed(slot, exc)

    def _device_failed(self, slot: EngineSlot, exc: BaseException) -> None:
        """A call on `slot`'s device raised: without `on_device_lost` the run fails with this
        error (`wait()` raises it); else `_lose` decides."""
        if self.on_device_lost is None:
            if self.error is None:
                self.error = exc
            self._set_finished()
            return
        self._lose(slot, exc)

    def _lose(self, slot: EngineSlot, exc: BaseException) -> None:
        """A device call failed: rerun everything it held from scratch (the seeded sampler
        makes the tokens identical, design §2.3), or fail the run if the device is alive."""
        self._slots.pop(slot.index)
        lost = slot.lose()
        self.progress.rerun(len(lost))
        self.queue.extendleft(reversed(lost))
        assert self.on_device_lost is not None
        if not self.on_device_lost(slot.device, exc):
            self.error = exc
            self._set_finished()
        self._dispatch()

    async def _serve(self, slot: EngineSlot) -> None:
        device, clock, finished = slot.device, self.clock, self.finished
        slice_s = self.settings.slice_s
        span: list[float] | None = None
        while not finished.is_set() and not slot.leaving:
            if slot.load == 0:
                slot.wake.clear()
                await slot.wake.wait()
                continue
            if slot.pending:
                work = slot.to_submit()
                self.progress.submitted(work, clock.now())
                if self.tail is not None:
                    self.tail.submitted(work)
                await device.submit(work)
            t_slice = clock.now()
            if span is None:
                span = self.progress.busy_span(slot.index, t_slice)
            if not self.queue and self.drain is not None and self.drain():
                # nothing left to dispatch and nobody watching progress: one call per device
                completions = await device.run_rollout(slice_s * DRAIN_SLICES, True)
            else:
                completions = await device.run_rollout(slice_s)
            span[1] = clock.now()
            if slot.lost:  # fenced while the call ran: its requests rerun elsewhere already
                return
            self._sliced(t_slice, span[1])
            if completions and self._completed(slot, completions):
                return

    def _sliced(self, start_s: float, end_s: float) -> None:
        """A device's `run_rollout` call ran from `start_s` to `end_s` (`HeldRun` keeps it)."""

    def _completed(self, slot: EngineSlot, completions: list[Completion]) -> bool:
        """`slot`'s engine finished `completions`: count, report, dispatch, maybe hand the
        engine off (returns True: it left), pack or spread."""
        slot.finished(completions)
        self._slots.freed(slot)
        self.progress.completed(completions, self.clock.now(),
                                len(self._slots) * self.settings.light_batch)
        if self.tail is not None:
            self.tail.completed(completions)
        self._report(completions)
        if self.queue:
            self._dispatch()
        if self.progress.remaining == 0:
            self._set_finished()
        if slot.load == 0 and self._maybe_release(slot):
            return True
        self._maybe_pack()
        self._maybe_spread()
        return False
